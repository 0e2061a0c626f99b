//! kmirror's Schema Registry client. Every registry kmirror meets (Confluent's, Apicurio's
//! `/apis/ccompat/v7`, Karapace, Redpanda's) speaks the Confluent Schema Registry REST API, and
//! this crate speaks only that (docs/schemas.md):
//! - [`client`]: the REST calls schema sync needs (subjects, versions, schemas by id, register,
//!   look up, modes, compatibility, deletes), with bounded, checked answers;
//! - [`model`]: the API's types (schemas, references, modes, compatibility levels);
//! - [`wire`]: the Confluent wire format of a record key or value (a zero byte, then a 4-byte
//!   schema id), read and rewritten.
//!
//! It knows nothing of Kafka's protocol or of replication.

pub mod client;
pub mod error;
pub mod model;
pub mod wire;

pub use client::{Auth, RegistryClient, RegistrySettings};
pub use error::RegistryError;
pub use model::{Compatibility, Mode, Reference, Registered, Schema, SchemaId, SchemaType};
