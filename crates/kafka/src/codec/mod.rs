//! The wire formats kmirror reads and writes, with no I/O: record batches as bytes (`batch`) and
//! the records inside them (`records`). Everything here takes bytes that came from the network
//! and must stay safe on any input, so it is the part of the client that fuzzing targets;
//! the I/O modules (`cluster`, `producer`, `conn`) only call into it.

pub mod batch;
mod compression;
mod crc;
pub mod records;
