//! kmirror's Kafka client.
//!
//! `settings` holds what every other part of kmirror hands to the client (where the brokers are,
//! how to authenticate, the consumer/producer tuning replication needs). On it: connections and
//! their security (`conn`, `oauth`, `kerberos`, `aws_*`), one cluster's metadata and requests
//! (`cluster`), record batches (`codec`), the per-broker data path (`fetcher`, `producer`), admin
//! calls, consumer groups and transactions.

pub mod admin;
pub mod aws;
pub mod cluster;
pub mod codec;
pub mod committed;
pub mod conn;
mod coordinator;
pub mod error;
pub mod fetch_session;
pub mod fetcher;
pub mod group;
mod http;
pub mod kerberos;
pub mod oauth;
pub mod partitioner;
pub mod producer;
pub mod secret;
pub mod settings;
pub mod tls;
mod token_cache;
pub mod txn;
pub mod txn_state;

pub use codec::{batch, records};
pub use error::{KafkaError, Refusal, Result};

pub use secret::Secret;
pub use settings::{
    Acks, AutoOffsetReset, BrokerAddress, ClientSettings, Compression, ConsumerTuning,
    IsolationLevel, KeyMaterial, ProducerTuning, SaslCredentials, SaslMechanism, SecurityProtocol,
    TlsSettings, TrustMaterial,
};
