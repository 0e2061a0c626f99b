//! Which source offsets MM1 mode may commit. One fetched chunk of a source partition fans out
//! into batches for many target partitions, acknowledged independently; a source offset is
//! committable only once every batch of every chunk before it was acknowledged (or, with
//! `--abort.on.send.failure false`, given up). The copy core's progress keeps that order per
//! partition; this adds the stream's tag space and the commits not yet taken. Pure.

use crate::copy::progress::{ChunkId, Progress};
use std::collections::{BTreeMap, HashMap};

/// A source partition.
pub(crate) type Key = (String, i32);

/// The copy core's progress of every source partition of the stream, and the lane tags that
/// name their chunks (one tag space for the stream, since one lane carries chunks of many
/// source partitions).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    next_tag: i64,
    owner: HashMap<i64, Key>,
    /// Each partition's chunks; a chunk's payload is its tag.
    parts: HashMap<Key, Progress<i64>>,
    /// Committable positions not yet taken by [`Ledger::take_commits`].
    ready: BTreeMap<Key, i64>,
}

impl Ledger {
    /// Registers a chunk of `key` ending before `end`, written as `sends` target batches; returns
    /// the tag its batches carry. A chunk with no batches (all records filtered out) is done.
    pub(crate) fn open(&mut self, key: &Key, end: i64, sends: u32) -> i64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.parts
            .entry(key.clone())
            .or_default()
            .open(ChunkId(tag), end - 1, sends, tag);
        self.owner.insert(tag, key.clone());
        self.collect(key);
        tag
    }

    /// One batch of chunk `tag` was acknowledged (or given up).
    pub(crate) fn ack(&mut self, tag: i64) {
        let Some(key) = self.owner.get(&tag).cloned() else {
            return;
        };
        if let Some(p) = self.parts.get_mut(&key) {
            p.ack(ChunkId(tag));
        }
        self.collect(&key);
    }

    fn collect(&mut self, key: &Key) {
        let Some(p) = self.parts.get_mut(key) else {
            return;
        };
        let done = p.take_done();
        for tag in done.payloads {
            self.owner.remove(&tag);
        }
        if let Some(through) = done.through {
            // A consumer commits the offset after the last one it processed.
            self.ready.insert(key.clone(), through + 1);
        }
    }

    /// Positions that moved since the last call: topic → partition → offset to commit.
    pub(crate) fn take_commits(&mut self) -> BTreeMap<String, BTreeMap<i32, i64>> {
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for ((t, p), o) in std::mem::take(&mut self.ready) {
            out.entry(t).or_default().insert(p, o);
        }
        out
    }

    /// Puts back positions whose commit failed, unless they moved on meanwhile.
    pub(crate) fn restore(&mut self, commits: BTreeMap<String, BTreeMap<i32, i64>>) {
        for (t, ps) in commits {
            for (p, o) in ps {
                self.ready.entry((t.clone(), p)).or_insert(o);
            }
        }
    }

    /// How many chunks still wait for acknowledgements.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.parts.values().map(Progress::pending).sum()
    }

    /// Forgets everything (the partitions were revoked).
    pub(crate) fn clear(&mut self) {
        self.owner.clear();
        self.parts.clear();
        self.ready.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> Key {
        ("t".into(), p)
    }

    #[test]
    fn a_position_moves_only_past_fully_acknowledged_chunks_in_order() {
        let mut l = Ledger::default();
        let a = l.open(&key(0), 10, 2);
        let b = l.open(&key(0), 20, 1);
        l.ack(b);
        assert!(l.take_commits().is_empty(), "b is done but a is not");
        l.ack(a);
        assert!(l.take_commits().is_empty(), "a has one batch left");
        l.ack(a);
        assert_eq!(l.take_commits()["t"][&0], 20);
        assert_eq!(l.pending(), 0);
        assert!(l.take_commits().is_empty(), "taken once");
    }

    #[test]
    fn partitions_are_independent_and_empty_chunks_are_done_at_once() {
        let mut l = Ledger::default();
        let a = l.open(&key(0), 5, 1);
        l.open(&key(1), 7, 0);
        let c = l.take_commits();
        assert_eq!(c["t"].get(&1), Some(&7));
        assert_eq!(c["t"].get(&0), None);
        l.ack(a);
        l.ack(a); // a late duplicate changes nothing
        assert_eq!(l.take_commits()["t"][&0], 5);
        l.ack(999); // unknown tags are ignored
        l.open(&key(0), 9, 3);
        l.clear();
        assert_eq!(l.pending(), 0);
        assert!(l.take_commits().is_empty());
    }
}
