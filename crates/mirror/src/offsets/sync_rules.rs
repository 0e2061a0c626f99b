//! When to send an offset sync (MM2's rules, mm2-spec §5.7, applied per acknowledged batch).
//!
//! kmirror knows where every forwarded batch landed, so a sync is the exact pair (source offset
//! of the batch's last record, target offset of that record). MM2 decides per record; deciding
//! per batch gives the same guarantees (a sync at least every `offset.lag.max` records, at every
//! upstream gap, whenever the target went backwards) and never more syncs than batches.

use crate::wire::internal::OffsetSync;

/// What to do with the sync for an acknowledged batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncDecision {
    /// Send now.
    Immediate(OffsetSync),
    /// Keep as the partition's latest; sent at the next flush so idle partitions translate to
    /// their newest position (KAFKA-15906).
    Delayed(OffsetSync),
}

/// Per source partition, for one lifetime of its task.
#[derive(Debug, Clone)]
pub struct SyncRules {
    topic: String,
    partition: i32,
    lag_max: i64,
    prev_up: i64,
    prev_down: i64,
    last_sync_down: i64,
}

impl SyncRules {
    pub fn new(topic: &str, partition: i32, offset_lag_max: i64) -> SyncRules {
        SyncRules {
            topic: topic.to_string(),
            partition,
            lag_max: offset_lag_max,
            prev_up: -1,
            prev_down: -1,
            last_sync_down: -1,
        }
    }

    /// A batch acknowledged: its records came from source offsets `first_up..=last_up` (with
    /// gaps if compacted) and its last record is at target offset `last_down`, its first at
    /// `first_down`.
    pub fn on_batch(
        &mut self,
        first_up: i64,
        last_up: i64,
        first_down: i64,
        last_down: i64,
    ) -> SyncDecision {
        let sync = OffsetSync {
            topic: self.topic.clone(),
            partition: self.partition,
            upstream_offset: last_up,
            downstream_offset: last_down,
        };
        let contiguous = last_up - first_up == last_down - first_down;
        let immediate = self.last_sync_down == -1
            || last_down - (self.last_sync_down + 1) >= self.lag_max
            || first_up - self.prev_up != 1
            || !contiguous
            || first_down < self.prev_down;
        self.prev_up = last_up;
        self.prev_down = last_down;
        if immediate {
            self.last_sync_down = last_down;
            SyncDecision::Immediate(sync)
        } else {
            SyncDecision::Delayed(sync)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_down(d: &SyncDecision) -> (bool, i64, i64) {
        match d {
            SyncDecision::Immediate(s) => (true, s.upstream_offset, s.downstream_offset),
            SyncDecision::Delayed(s) => (false, s.upstream_offset, s.downstream_offset),
        }
    }

    #[test]
    fn first_batch_gaps_lag_and_rewinds_send_at_once() {
        let mut r = SyncRules::new("t", 0, 100);
        // (a) the first batch of a lifetime.
        assert_eq!(up_down(&r.on_batch(0, 9, 0, 9)), (true, 9, 9));
        // Contiguous and within offset.lag.max: delayed.
        assert_eq!(up_down(&r.on_batch(10, 59, 10, 59)), (false, 59, 59));
        // (b) 100 or more records past the last sync.
        assert_eq!(up_down(&r.on_batch(60, 110, 60, 110)), (true, 110, 110));
        // (c) an upstream gap (a transaction marker at 111).
        assert_eq!(up_down(&r.on_batch(112, 120, 111, 119)), (true, 120, 119));
        // A batch with gaps inside (compaction): offsets no longer line up.
        assert_eq!(up_down(&r.on_batch(121, 140, 120, 129)), (true, 140, 129));
        // (d) the target went backwards (truncated or re-created).
        assert_eq!(up_down(&r.on_batch(141, 150, 0, 9)), (true, 150, 9));
    }
}
