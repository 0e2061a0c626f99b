//! Offset syncs kept per source partition, and translation of a group's committed source offset
//! to a target offset (mm2-compatibility §6.3).
//!
//! Translation follows MM2's rule so results are never ahead of the truth: take the newest sync
//! at or below the group's offset g; g equal to its upstream offset translates to its downstream
//! offset, a larger g to downstream + 1 (records between may have been dropped or compacted, so
//! only the next target offset is safe). A group older than every kept sync gets no
//! translation.
//!
//! The history differs from MM2's 64-slot array (mm2-compatibility §0 allows it, provided translation stays
//! at or below the truth): the newest [`RECENT`] syncs are all kept, older ones thinned so that
//! their spacing grows with their distance from the newest, at most [`CAPACITY`] in all. A group
//! a little behind translates exactly at a sync; far behind, about as precisely as MM2.

use crate::wire::internal::OffsetSync;
use std::collections::HashMap;

/// Syncs kept in full per partition.
pub const RECENT: usize = 64;
/// Syncs kept at most per partition (older ones thinned logarithmically): 4 KiB each.
pub const CAPACITY: usize = 256;

/// The result of translating a group offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// No sync for the partition (not replicated, or nothing copied yet).
    NoSync,
    /// The group is behind every sync kept: translating could skip records.
    TooOld,
    /// The target offset to resume from.
    Offset(i64),
}

#[derive(Debug, Default, Clone)]
struct History {
    /// (upstream, downstream), oldest first.
    syncs: Vec<(i64, i64)>,
}

impl History {
    fn apply(&mut self, up: i64, down: i64) {
        if let Some(&(last_up, last_down)) = self.syncs.last() {
            // The source or the target went backwards (truncated, re-created): the older syncs
            // describe another log.
            if up < last_up || down < last_down {
                self.syncs.clear();
            } else if up == last_up {
                self.syncs.pop();
            }
        }
        self.syncs.push((up, down));
        if self.syncs.len() > CAPACITY {
            self.thin();
        }
    }

    /// Keeps the newest RECENT syncs; among older ones, a sync only when it is at least
    /// (distance to the newest) / 32 offsets older than the last one kept; if that is still
    /// too many, every other old one.
    fn thin(&mut self) {
        let newest = self.syncs.last().map_or(0, |s| s.0);
        let mut kept: Vec<(i64, i64)> = Vec::with_capacity(CAPACITY);
        for (i, &(up, down)) in self.syncs.iter().rev().enumerate() {
            let keep = i < RECENT
                || kept
                    .last()
                    .is_none_or(|&(prev, _)| prev - up >= ((newest - up) / 32).max(1));
            if keep {
                kept.push((up, down));
            }
        }
        while kept.len() > CAPACITY * 3 / 4 {
            let mut i = 0;
            kept.retain(|_| {
                i += 1;
                i <= RECENT || i % 2 == 0
            });
        }
        kept.reverse();
        self.syncs = kept;
    }

    fn translate(&self, g: i64) -> Translation {
        let i = self.syncs.partition_point(|&(up, _)| up <= g);
        match i.checked_sub(1).map(|i| self.syncs[i]) {
            Some((up, down)) if up == g => Translation::Offset(down),
            Some((_, down)) => Translation::Offset(down + 1),
            None if self.syncs.is_empty() => Translation::NoSync,
            None => Translation::TooOld,
        }
    }
}

/// Every partition's syncs.
#[derive(Debug, Default, Clone)]
pub struct SyncStore {
    partitions: HashMap<(String, i32), History>,
}

impl SyncStore {
    pub fn apply(&mut self, sync: &OffsetSync) {
        self.partitions
            .entry((sync.topic.clone(), sync.partition))
            .or_default()
            .apply(sync.upstream_offset, sync.downstream_offset);
    }

    /// The target offset for a group that committed source offset `g` on `topic`-`partition`.
    pub fn translate(&self, topic: &str, partition: i32, g: i64) -> Translation {
        self.partitions
            .get(&(topic.to_string(), partition))
            .map_or(Translation::NoSync, |h| h.translate(g))
    }

    /// Syncs kept for a partition (for tests and `status`).
    pub fn kept(&self, topic: &str, partition: i32) -> usize {
        self.partitions
            .get(&(topic.to_string(), partition))
            .map_or(0, |h| h.syncs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sync(up: i64, down: i64) -> OffsetSync {
        OffsetSync {
            topic: "t".into(),
            partition: 0,
            upstream_offset: up,
            downstream_offset: down,
        }
    }

    #[test]
    fn mm2_conformance_vectors() {
        // OffsetSyncStoreTest's single-sync vectors (mm2-compatibility §6.3).
        let mut s = SyncStore::default();
        assert_eq!(s.translate("t", 0, 5), Translation::NoSync);
        s.apply(&sync(100, 200));
        assert_eq!(s.translate("t", 0, 150), Translation::Offset(201));
        s.apply(&sync(150, 251));
        assert_eq!(s.translate("t", 0, 150), Translation::Offset(251));
        assert_eq!(s.translate("t", 0, 5), Translation::TooOld);
        // The upstream went backwards: older syncs are forgotten.
        s.apply(&sync(200, 10));
        assert_eq!(s.translate("t", 0, 200), Translation::Offset(10));
        s.apply(&sync(20, 20));
        assert_eq!(s.translate("t", 0, 20), Translation::Offset(20));
        assert_eq!(s.translate("t", 0, 150), Translation::Offset(21));
        assert_eq!(s.translate("u", 0, 20), Translation::NoSync);
    }

    #[test]
    fn recent_syncs_translate_exactly_and_history_stays_bounded() {
        let mut s = SyncStore::default();
        // A sync per 500-record batch, target offsets 1000 behind.
        for b in 0..100_000i64 {
            s.apply(&sync(b * 500 + 1499, b * 500 + 499));
        }
        assert!(s.kept("t", 0) <= CAPACITY, "{}", s.kept("t", 0));
        let newest = 99_999 * 500 + 1499;
        // A group at a batch boundary among the recent syncs: exact.
        assert_eq!(
            s.translate("t", 0, newest - 500 * 10 + 1),
            Translation::Offset(newest - 500 * 10 + 1 - 1000)
        );
        // Far behind: translated, below the truth, within a small fraction of its distance.
        let g = newest - 10_000_000;
        match s.translate("t", 0, g) {
            Translation::Offset(d) => {
                let truth = g - 1000;
                assert!(d <= truth && truth - d <= 10_000_000 / 8, "{d} vs {truth}");
            }
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Whatever the syncs (gaps upstream, fewer records downstream), a translation is never
        /// ahead of where the group's next record really is.
        #[test]
        fn never_ahead_of_the_truth(steps in proptest::collection::vec((1i64..50, 0i64..3), 1..2000), probes in proptest::collection::vec(0usize..2000, 1..50)) {
            // Build a log: each step advances upstream by `gap` offsets of which one record is
            // copied (the rest compacted away or markers), so down advances by 1.
            let mut s = SyncStore::default();
            let mut mapping = Vec::new(); // (up, down) of every copied record
            let (mut up, mut down) = (0i64, 0i64);
            for (gap, every) in &steps {
                up += gap;
                mapping.push((up, down));
                if every % 2 == 0 { s.apply(&sync(up, down)); }
                down += 1;
            }
            for p in probes {
                let g = mapping[p % mapping.len()].0 - 1 + (p as i64 % 3);
                // The truth: the target offset of the first copied record at or after g.
                let truth = mapping.iter().find(|(u, _)| *u >= g).map_or(down, |(_, d)| *d);
                if let Translation::Offset(d) = s.translate("t", 0, g) {
                    prop_assert!(d <= truth, "g={} translated {} truth {}", g, d, truth);
                }
            }
        }
    }
}
