//! Consumer-offset translation, pure logic: when the data path emits offset syncs
//! ([`sync_rules`]), how syncs are kept and offsets translated ([`sync_store`]), and when a
//! checkpoint is worth writing ([`checkpoint_rules`]), and exact translation from what this
//! process copied ([`runs`]), and where a partition resumes from what the target holds
//! ([`resume`]). mm2-compatibility §5.7, §6.3, §6.4.

pub mod checkpoint_rules;
pub mod resume;
pub mod runs;
pub mod sync_rules;
pub mod sync_store;
