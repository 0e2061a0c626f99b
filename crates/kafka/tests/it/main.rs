//! The client's tests against real brokers, in one test binary (one link of the workspace instead
//! of one per file); they run side by side on libtest's threads. `hostile_batches` stays a binary
//! of its own: its limited global allocator must count no other test's allocations.

mod real_kafka_admin;
mod real_kafka_connect;
mod real_kafka_data;
mod real_kafka_fetcher;
mod real_kafka_group;
mod real_kafka_idempotent;
mod real_kafka_producer;
mod real_kafka_txn;
