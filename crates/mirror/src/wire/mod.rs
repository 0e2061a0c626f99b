//! MM2's bytes on the wire: the internal record types (heartbeats, checkpoints, offset syncs) and
//! the Connect offset records that hold source positions. Pure encode/decode, byte for byte as the
//! Java classes write them (mm2-compatibility §0, §2, §3).

pub mod internal;
pub mod positions;
pub mod producers;
