//! Which source offsets may be committed. In MM1 mode one fetched chunk of a source partition
//! fans out into batches for many target partitions, acknowledged independently; a source
//! offset is committable only once every batch of every chunk before it was acknowledged (or,
//! with `--abort.on.send.failure false`, given up). Pure.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A source partition.
pub(crate) type Key = (String, i32);

#[derive(Debug)]
struct Chunk {
    tag: i64,
    /// The source offset after the chunk (what a consumer commits).
    end: i64,
    outstanding: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    next_tag: i64,
    owner: HashMap<i64, Key>,
    chunks: HashMap<Key, VecDeque<Chunk>>,
    /// Committable positions not yet taken by [`Ledger::take_commits`].
    ready: BTreeMap<Key, i64>,
}

impl Ledger {
    /// Registers a chunk of `key` ending before `end`, written as `sends` target batches; returns
    /// the tag its batches carry. A chunk with no batches (all records filtered out) is done.
    pub(crate) fn open(&mut self, key: &Key, end: i64, sends: u32) -> i64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.owner.insert(tag, key.clone());
        self.chunks
            .entry(key.clone())
            .or_default()
            .push_back(Chunk {
                tag,
                end,
                outstanding: sends,
            });
        self.advance(key);
        tag
    }

    /// One batch of chunk `tag` was acknowledged (or given up).
    pub(crate) fn ack(&mut self, tag: i64) {
        let Some(key) = self.owner.get(&tag).cloned() else {
            return;
        };
        if let Some(c) = self
            .chunks
            .get_mut(&key)
            .and_then(|q| q.iter_mut().find(|c| c.tag == tag))
        {
            c.outstanding = c.outstanding.saturating_sub(1);
        }
        self.advance(&key);
    }

    fn advance(&mut self, key: &Key) {
        let Some(q) = self.chunks.get_mut(key) else {
            return;
        };
        while q.front().is_some_and(|c| c.outstanding == 0) {
            if let Some(c) = q.pop_front() {
                self.owner.remove(&c.tag);
                self.ready.insert(key.clone(), c.end);
            }
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
        self.chunks.values().map(VecDeque::len).sum()
    }

    /// Forgets everything (the partitions were revoked).
    pub(crate) fn clear(&mut self) {
        self.owner.clear();
        self.chunks.clear();
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
