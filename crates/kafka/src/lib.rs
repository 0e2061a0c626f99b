//! kmirror's Kafka client.
//!
//! This crate starts with the connection settings every other part of kmirror hands to the client:
//! where the brokers are, how to authenticate, and the consumer/producer tuning that replication
//! needs. The wire client (connections, fetch, produce, admin, groups) builds on these types.

pub mod admin;
pub mod aws_assume_role;
pub mod aws_iam;
pub mod aws_metadata;
pub mod aws_web_identity;
pub mod cluster;
pub mod codec;
pub mod committed;
pub mod conn;
pub mod error;
pub mod fetch_session;
pub mod fetcher;
pub mod group;
pub mod kerberos;
pub mod oauth;
mod offset_lookup;
pub mod partitioner;
pub mod producer;
pub mod secret;
pub mod settings;
pub mod txn;

pub use codec::{batch, records};
pub use error::{KafkaError, Result};

pub use secret::Secret;
pub use settings::{
    Acks, AutoOffsetReset, BrokerAddress, ClientSettings, Compression, ConsumerTuning,
    IsolationLevel, KeyMaterial, ProducerTuning, SaslCredentials, SaslMechanism, SecurityProtocol,
    TlsSettings, TrustMaterial,
};
