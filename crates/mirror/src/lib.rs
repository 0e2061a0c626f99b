//! kmirror's engine: configuration, naming policy, filters and the plan.
//!
//! Data flows one way: properties → validated configuration → plan → (later) flows and tasks.

pub mod config;
pub mod discovery;
pub mod engine;
pub mod filter;
pub mod names;
pub mod plan;
pub mod policy;
pub mod wire;
