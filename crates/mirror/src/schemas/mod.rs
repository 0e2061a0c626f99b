//! Schema registries follow their clusters (docs/schemas.md): the subjects of a source registry
//! are registered on the target in order, and a map of source ids to target ids is kept for the
//! records that carry them.
//! - `order`: which version goes first (referenced versions before those that refer to them, a
//!   subject's history oldest first); pure.
//! - `keep`: whether a target registry keeps the ids it is given (IMPORT mode), probed under a
//!   throwaway subject before any record is written;
//! - `subjects`: one pass of subject sync through a registry seam ([`subjects::Registry`]),
//!   unit-tested against an in-memory registry and run against real ones.

pub mod keep;
pub mod order;
pub mod subjects;
