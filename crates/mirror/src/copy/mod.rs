//! The copy core: the decisions both modes make for each source partition, apart from any I/O
//! (no tokio, no `async fn`, no sockets), as quinn-proto keeps QUIC's state apart from its
//! sockets. The shells that fetch, send and store, `engine::forward` (MM2 mode) and
//! `legacy::stream` (MM1 mode), feed it what arrived and do what it decided:
//!
//! - [`progress`]: how far a partition is copied, whatever order acknowledgements come in, with
//!   the skipped tail and the held state of an open transaction;
//! - the planners, one per mode: [`batches`] (the same partition of the remote topic: as
//!   fetched, merged, or record mode) and [`route`] (MM1's decode, Java's partitioner,
//!   re-encode);
//! - the send gate: [`lease`], the write lease of a process that shares its work through a
//!   group;
//! - [`schema_ids`]: schema ids in records translated to the target registry's, or the batch
//!   held back until its schemas are there;
//! - the batch filters: what a reader at an isolation level sees
//!   (`kmirror_kafka::cluster::PartitionFetch::visible`) and [`origins`], the loop guard's
//!   verdicts.
//!
//! Where progress is stored differs per mode (the positions topic, an exactly-once slot, the
//! MM1 group's offsets) and stays with the shells.

pub mod batches;
pub mod lease;
pub mod origins;
pub mod progress;
pub mod route;
pub mod schema_ids;
