//! The harness against real brokers: plaintext, SASL-with-ACLs and SSL clusters create, produce
//! and consume; a three-broker cluster moves leaders and survives a crash; a schema registry
//! starts, answers, freezes and stops.

mod real_kafka_harness;
mod real_registry_harness;
