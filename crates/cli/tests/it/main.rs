//! The `kmirror` binary's tests, in one test binary (one link of the workspace instead of one
//! per file). Tests without brokers and real-broker tests that can share this machine with one
//! other run side by side on libtest's threads; the ones that must run alone are in `tests/serial`.
//! Each module is one scenario; its own comment says what it proves.

mod cli_offline;
mod deploy_files;
mod real_kafka_active_active;
mod real_kafka_fleet_failover;
mod real_kafka_hostile_source;
mod real_kafka_kerberos;
mod real_kafka_legacy;
mod real_kafka_offsets;
mod real_kafka_operate;
mod real_kafka_topologies;
mod real_kafka_verify;
mod real_registry_mirror;
