//! The registry client against a real registry (Apicurio through the harness, its Confluent
//! API): every call schema sync makes, the errors it must tell apart, and what Apicurio does
//! with an import that asks for its own ids.

mod real_registry_client;
