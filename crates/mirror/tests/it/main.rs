//! The engine's tests, in one test binary (one link of the workspace instead of one per file):
//! configuration files, plan names, Java interoperability and real-broker scenarios that can share
//! this machine with one other run side by side on libtest's threads; the ones that must run alone
//! are in `tests/serial`. Schema registry scenarios run real registries (Apicurio).

mod config_connector_legacy;
mod config_mm2;
mod java_interop;
mod java_regex_vs_java;
mod plan_names;
mod real_kafka_corrupt_source;
mod real_kafka_engine;
mod real_kafka_eos;
mod real_kafka_leader_moves;
mod real_kafka_minimal_acls;
mod real_kafka_positions_txn;
mod real_kafka_sharing;
mod real_kafka_source_changes;
mod real_kafka_start_position;
mod real_kafka_topic_sync;
mod real_kafka_topology;
mod real_kafka_unclean_election;
mod real_registry_subjects;
