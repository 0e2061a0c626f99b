//! The `kmirror` binary's real-broker tests that run one at a time: kill -9 and restarts on a
//! timed stream, fault proxies, frozen brokers, deadlines, several processes sharing a flow,
//! 8-second SASL sessions whose renewals must stay quiet, and MirrorMaker 2 JVMs, whose bounds
//! and timings assume the machine is theirs. The other tests are in `tests/it`, which runs its
//! tests side by side.

/// Held by every test of this binary for its whole run: libtest runs tests on several threads,
/// and these must not share the machine with one another.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod real_kafka_crash;
mod real_kafka_eos_crash;
mod real_kafka_eos_sharing;
mod real_kafka_failover;
mod real_kafka_network_faults;
mod real_kafka_oauth;
mod real_kafka_sharing_processes;
mod real_kafka_shutdown;
mod real_kafka_soak;
