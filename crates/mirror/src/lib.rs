//! kmirror's library: configuration, naming policy, filters, the plan, the replication engine
//! (MM2 mode and MM1 mode), offsets, status, verify and failover.
//!
//! Data flows one way: properties → validated configuration → plan → engine (flows → per-partition tasks).

pub mod config;
pub mod copy;
pub mod discovery;
pub mod engine;
pub mod events;
pub mod failover;
pub mod filter;
pub mod legacy;
pub mod metrics;
pub mod names;
pub mod offsets;
pub mod plan;
pub mod policy;
pub mod schemas;
pub mod status;
pub mod topic_sync;
pub mod transform;
pub mod verify;
pub mod wire;

#[cfg(test)]
mod test_support;
