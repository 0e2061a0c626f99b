//! The harness against real brokers: plaintext, SASL-with-ACLs and SSL clusters create, produce
//! and consume; a three-broker cluster moves leaders and survives a crash.

mod real_kafka_harness;
