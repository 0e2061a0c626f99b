//! The engine's real-broker tests that run one at a time: a frozen broker whose timings are
//! asserted, and MirrorMaker 2 JVMs taking over from kmirror within bounds. The other tests are in
//! `tests/it`, which runs its tests side by side.

/// Held by every test of this binary for its whole run: libtest runs tests on several threads,
/// and these must not share the machine with one another.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod real_kafka_silent_broker;
mod real_kafka_takeover;
