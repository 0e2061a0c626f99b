//! Which offset syncs the data path sends (mm2-compatibility §5.7 gives MM2's rules).
//!
//! kmirror knows where every record of an acknowledged batch landed, so each sync is an exact
//! (source offset, target offset) pair of one record. Per acknowledged batch it sends:
//! - a sync at the batch's first record when the mapping does not simply continue the previous
//!   batch (the first batch of a task's lifetime, a gap upstream such as a transaction marker or
//!   compaction, the target not directly following);
//! - a sync every `offset.lag.max` records inside the batch, so a group in the middle of a large
//!   batch re-reads no more than MM2 would let it;
//! - a sync at the batch's last record.
//!
//! So a group whose committed offset falls on a batch boundary (or on a sync inside one)
//! translates exactly, and any other never re-reads more than `offset.lag.max` records. MM2 sends
//! one sync per `offset.lag.max` records and delays the newest up to a minute; kmirror sends at
//! most a few per batch and never delays.

use crate::wire::internal::OffsetSync;

/// The source offsets of a batch's records, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceOffsets {
    /// `count` records at `first`, `first + 1`, ... (batch mode: the source batch as is).
    Contiguous { first: i64, count: i64 },
    /// Record mode: the offsets of the records kept, which may have gaps.
    Listed(Vec<i64>),
}

impl SourceOffsets {
    /// The offsets of records `range` (in batch order), None past the end.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<SourceOffsets> {
        if range.end as i64 > self.len() || range.is_empty() {
            return None;
        }
        Some(match self {
            SourceOffsets::Contiguous { first, .. } => SourceOffsets::Contiguous {
                first: first + range.start as i64,
                count: range.len() as i64,
            },
            SourceOffsets::Listed(v) => SourceOffsets::Listed(v[range].to_vec()),
        })
    }

    /// The first record's offset and the last one's.
    pub fn bounds(&self) -> Option<(i64, i64)> {
        (self.len() > 0).then(|| (self.at(0), self.at(self.len() - 1)))
    }

    pub(crate) fn len(&self) -> i64 {
        match self {
            SourceOffsets::Contiguous { count, .. } => *count,
            SourceOffsets::Listed(v) => v.len() as i64,
        }
    }
    fn at(&self, i: i64) -> i64 {
        match self {
            SourceOffsets::Contiguous { first, .. } => first + i,
            SourceOffsets::Listed(v) => v[i as usize],
        }
    }
}

/// Per source partition, for one lifetime of its task.
#[derive(Debug, Clone)]
pub struct SyncRules {
    topic: String,
    partition: i32,
    step: i64,
    prev_up: i64,
    prev_down: i64,
}

impl SyncRules {
    pub fn new(topic: &str, partition: i32, offset_lag_max: i64) -> SyncRules {
        SyncRules {
            topic: topic.to_string(),
            partition,
            step: offset_lag_max.max(1),
            prev_up: -1,
            prev_down: -1,
        }
    }

    /// The syncs for a batch whose records came from `ups` and were written from target offset
    /// `base_down` on.
    pub fn on_batch(&mut self, ups: &SourceOffsets, base_down: i64) -> Vec<OffsetSync> {
        let n = ups.len();
        if n == 0 {
            return vec![];
        }
        let sync = |i: i64| OffsetSync {
            topic: self.topic.clone(),
            partition: self.partition,
            upstream_offset: ups.at(i),
            downstream_offset: base_down + i,
        };
        let mut out = Vec::new();
        let continues =
            self.prev_up >= 0 && ups.at(0) == self.prev_up + 1 && base_down == self.prev_down + 1;
        if !continues {
            out.push(sync(0));
        }
        let mut i = self.step;
        while i < n - 1 {
            out.push(sync(i));
            i += self.step;
        }
        if n > 1 || continues {
            out.push(sync(n - 1));
        }
        self.prev_up = ups.at(n - 1);
        self.prev_down = base_down + n - 1;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: Vec<OffsetSync>) -> Vec<(i64, i64)> {
        v.into_iter()
            .map(|s| (s.upstream_offset, s.downstream_offset))
            .collect()
    }

    #[test]
    fn syncs_at_run_starts_every_lag_max_and_batch_ends() {
        let mut r = SyncRules::new("t", 0, 100);
        let c = |first, count| SourceOffsets::Contiguous { first, count };
        // The first batch of a lifetime: its first record, every 100, its last.
        assert_eq!(
            pairs(r.on_batch(&c(1000, 250), 0)),
            vec![(1000, 0), (1100, 100), (1200, 200), (1249, 249)]
        );
        // A batch that continues the previous one: only its end.
        assert_eq!(pairs(r.on_batch(&c(1250, 50), 250)), vec![(1299, 299)]);
        // A transaction marker at 1300: the next batch starts a new run.
        assert_eq!(
            pairs(r.on_batch(&c(1301, 10), 300)),
            vec![(1301, 300), (1310, 309)]
        );
        // Record mode with gaps: exact pairs of kept records.
        assert_eq!(
            pairs(r.on_batch(&SourceOffsets::Listed(vec![1313, 1315, 1320]), 310)),
            vec![(1313, 310), (1320, 312)]
        );
        // A single record continuing the run.
        assert_eq!(pairs(r.on_batch(&c(1321, 1), 313)), vec![(1321, 313)]);
        // The target went backwards (re-created).
        assert_eq!(pairs(r.on_batch(&c(1322, 1), 0)), vec![(1322, 0)]);
        // Nothing kept: nothing to say.
        assert!(r.on_batch(&SourceOffsets::Listed(vec![]), 5).is_empty());
    }
}
