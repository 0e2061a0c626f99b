//! The harness against real brokers: plaintext, SASL-with-ACLs and SSL clusters create, produce
//! and consume; a three-broker cluster moves leaders and survives a crash; a schema registry
//! starts, answers, freezes and stops, and Confluent's serializers write and read Avro records
//! through it.

mod real_kafka_harness;
mod real_registry_harness;
