//! The registry client against a real registry (Apicurio through the harness, its Confluent
//! API): every call schema sync makes, the errors it must tell apart, and what Apicurio does
//! with an import that asks for its own ids; and against a scripted HTTP peer: credentials,
//! TLS through a private CA, redirects, answers that are not the API's.

mod real_registry_client;
mod scripted_peer;
