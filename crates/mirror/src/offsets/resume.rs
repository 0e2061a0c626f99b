//! Where an at-least-once partition resumes, from what the target already holds
//! (docs/engine.md, "Resuming from what the target holds"): pure logic, no I/O. The caller
//! reads the target's records from an anchor (an offset sync the flow wrote: source record `u`
//! is at target offset `d`) to the target's end, and the source's records from `u` on; this
//! walks both in lockstep and says where copying continues, or why it cannot tell (then the
//! stored position is used, as before).
//!
//! A record counts as already copied only if it is on the target in order, directly after the
//! anchor, equal to the next source record (key, value, headers, and the timestamp unless the
//! remote topic stamps its own). Anything else is a fallback, so a resume never skips a record.
//! The I/O around it (reading the syncs, the target's tail and the source) is
//! `engine/partition/resume.rs`.

use kmirror_kafka::records::Record;

/// Why the stored position is used instead of what the target shows (the metric's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No offset sync of this partition near enough to the stored position.
    NoAnchor,
    /// The anchor's target record is not in the target's log any more (retention, truncation).
    AnchorGone,
    /// The anchor's source record is not in the source's log any more (retention, compaction).
    SourceGone,
    /// A target record after the anchor that is not the next source record: another writer, a
    /// transform, a compaction since, or records copied twice before.
    Mismatch { target_offset: i64 },
    /// The target holds more after the anchor than the walk may read.
    Bound,
    /// The flow transforms records (SMTs): a copy cannot be recognised by its records.
    Transforms,
    /// Reading the syncs, the source or the target failed.
    Error,
}

impl Fallback {
    pub fn label(self) -> &'static str {
        match self {
            Fallback::NoAnchor => "no_anchor",
            Fallback::AnchorGone => "anchor_gone",
            Fallback::SourceGone => "source_gone",
            Fallback::Mismatch { .. } => "mismatch",
            Fallback::Bound => "bound",
            Fallback::Transforms => "transforms",
            Fallback::Error => "error",
        }
    }
}

/// Where copying continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The next source offset to copy: never before the stored position.
    pub next: i64,
    /// Records at or after the stored position found on the target (not copied again).
    pub already_copied: u64,
    /// The target ends before the stored position's record: it lost records the position says
    /// were copied (an unclean election, a truncation); copying continues from the position.
    pub target_behind: bool,
    /// Every record matched, from the anchor on: (source offset, target offset).
    pub matched: Vec<(i64, i64)>,
}

/// The matched records as runs for exact checkpoints (`offsets/runs.rs`): stretches whose
/// target offsets follow one another, each as its source offsets and its first target offset.
pub fn runs_of(matched: &[(i64, i64)]) -> Vec<(Vec<i64>, i64)> {
    let mut out: Vec<(Vec<i64>, i64)> = Vec::new();
    let mut last_down = None;
    for &(up, down) in matched {
        match out.last_mut() {
            Some((ups, _)) if last_down == Some(down - 1) => ups.push(up),
            _ => out.push((vec![up], down)),
        }
        last_down = Some(down);
    }
    out
}

/// The anchor for a walk: the newest sync (in the order the sync topic holds them) at or before
/// the stored position, and no more than `window` records before it. Not a sync ahead of the
/// position: the records between the position and such a sync would be skipped unseen (a sync
/// says where its own record is, not that every record before it was copied, once an operator
/// moved a position back or another process copied in between). From an anchor at or before the
/// position, every record skipped is one the walk saw on the target.
pub fn anchor(
    syncs: impl IntoIterator<Item = (i64, i64)>,
    stored: i64,
    window: i64,
) -> Option<(i64, i64)> {
    syncs
        .into_iter()
        .filter(|(u, d)| *u >= 0 && *d >= 0 && *u <= stored && *u >= stored.saturating_sub(window))
        .last()
}

/// Syncs kept in full, newest last.
const RECENT: u64 = 8;
/// Older syncs: for each power of two of distance back, this many buckets, the oldest sync of
/// each kept.
const SPREAD: u64 = 4;
/// Syncs held before thinning (thinned, at most `RECENT + SPREAD * 64`, in practice
/// `SPREAD * log2(syncs)`).
const CAP: usize = 128;

/// A partition's offset syncs in the order the sync topic holds them, kept so that an anchor
/// at or before any recent position exists in little space: the newest [`RECENT`] in full;
/// older ones in buckets whose width grows with their distance back (a quarter of each power
/// of two), the oldest of each kept. A position n syncs back finds an anchor within about
/// 2n / 3 more; a hundred syncs cover millions. (A partition copying fast acknowledges many
/// batches between two position stores, a sync each.)
#[derive(Debug, Default, Clone)]
pub struct SyncHistory {
    count: u64,
    /// (number, upstream, downstream), oldest first.
    kept: Vec<(u64, i64, i64)>,
}

impl SyncHistory {
    pub fn push(&mut self, upstream: i64, downstream: i64) {
        self.kept.push((self.count, upstream, downstream));
        self.count += 1;
        if self.kept.len() > CAP {
            self.thin();
        }
    }

    fn bucket(back: u64) -> (u32, u64) {
        let k = 63 - back.leading_zeros();
        let width = ((1u64 << k) / SPREAD).max(1);
        (k, (back - (1u64 << k)) / width)
    }

    fn thin(&mut self) {
        let newest = self.count - 1;
        let mut last_bucket = None;
        // The oldest of each bucket: buckets slide as syncs arrive, and keeping the newest
        // would let the old end of the history drain away.
        self.kept.retain(|e| {
            let back = newest - e.0;
            if back < RECENT {
                return true;
            }
            let b = Self::bucket(back);
            let first = last_bucket != Some(b);
            last_bucket = Some(b);
            first
        });
    }

    /// The syncs kept, oldest first (in the order they were written).
    pub fn kept(&self) -> Vec<(i64, i64)> {
        self.kept.iter().map(|&(_, u, d)| (u, d)).collect()
    }
}

fn same(a: &Record, b: &Record, timestamps: bool) -> bool {
    a.key == b.key
        && a.value == b.value
        && a.headers == b.headers
        && (!timestamps || a.timestamp == b.timestamp)
}

/// Walks `target` (the target's records from the anchor's target offset to its end, control
/// records and aborted transactions left out) against `source` (the source's records from the
/// anchor's source offset on, as the flow copies them). `source` must hold at least as many
/// records as `target`, or reach the source's end. `timestamps`: compare timestamps (false when
/// the remote topic uses LogAppendTime).
pub fn walk(
    anchor: (i64, i64),
    source: &[Record],
    target: &[Record],
    stored: i64,
    timestamps: bool,
) -> Result<Resume, Fallback> {
    let (u, d) = anchor;
    match target.first() {
        Some(t) if t.offset == d => {}
        _ => return Err(Fallback::AnchorGone),
    }
    match source.first() {
        Some(s) if s.offset == u => {}
        _ => return Err(Fallback::SourceGone),
    }
    let mut already_copied = 0;
    let mut matched = Vec::with_capacity(target.len());
    for (i, t) in target.iter().enumerate() {
        match source.get(i) {
            Some(s) if same(s, t, timestamps) => {
                if s.offset >= stored {
                    already_copied += 1;
                }
                matched.push((s.offset, t.offset));
            }
            // More on the target than in the source, or a different record.
            _ => {
                return Err(Fallback::Mismatch {
                    target_offset: t.offset,
                })
            }
        }
    }
    let reached = source[target.len() - 1].offset + 1;
    Ok(Resume {
        next: reached.max(stored),
        already_copied,
        target_behind: reached < stored,
        matched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(offset: i64, n: i64) -> Record {
        Record {
            offset,
            timestamp: 1_000 + n,
            key: Some(Bytes::from(format!("k{n}"))),
            value: Some(Bytes::from(format!("v{n}"))),
            headers: vec![],
        }
    }

    /// Source records 100.. (record n at offset 100 + n) with a gap (a marker) at 105.
    fn source(n: i64) -> Vec<Record> {
        (0..n)
            .map(|i| rec(if i < 5 { 100 + i } else { 101 + i }, i))
            .collect()
    }

    /// The target: the first `n` source records, at offsets 40.. one after the other.
    fn target(n: i64) -> Vec<Record> {
        (0..n).map(|i| rec(40 + i, i)).collect()
    }

    #[test]
    fn the_newest_sync_near_enough_is_the_anchor() {
        let syncs = [(10, 1), (90, 30), (95, 33), (120, 50), (110, 45)];
        assert_eq!(
            anchor(syncs, 100, 1000),
            Some((95, 33)),
            "the last written at or before the position"
        );
        assert_eq!(anchor([(100, 7)], 100, 10), Some((100, 7)), "at it");
        assert_eq!(anchor([(101, 7)], 100, 10), None, "ahead: never");
        assert_eq!(anchor([(10, 1)], 100, 50), None, "too far behind");
        assert_eq!(anchor([(60, 1)], 100, 50), Some((60, 1)));
        assert_eq!(anchor([], 100, 50), None);
        assert_eq!(anchor([(-1, 5)], 0, 50), None, "not a record");
    }

    #[test]
    fn a_history_keeps_an_anchor_near_any_position_in_little_space() {
        let mut h = SyncHistory::default();
        // A sync every 500 records: source u at target u / 10.
        for i in 0..10_000i64 {
            h.push(i * 500, i * 50);
        }
        let kept = h.kept();
        assert!(kept.len() <= CAP, "{} kept", kept.len());
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "in write order");
        assert_eq!(kept.last(), Some(&(9_999 * 500, 9_999 * 50)), "the newest");
        // For a position n syncs back, an anchor no more than about n syncs before it.
        for back in [1i64, 7, 9, 30, 100, 1_000, 5_000, 9_999] {
            let position = (9_999 - back) * 500;
            let (u, _) = anchor(kept.iter().copied(), position, i64::MAX).unwrap();
            assert!(u <= position);
            assert!(
                position - u <= (back + back * 3 / 4 + 2) * 500,
                "{back} syncs back: anchor {u} for position {position}"
            );
        }
        // Written order wins over offsets: a later lifetime copying again from 0.
        h.push(0, 500_000);
        assert_eq!(anchor(h.kept(), 100, i64::MAX), Some((0, 500_000)));
    }

    #[test]
    fn records_after_the_stored_position_on_the_target_are_not_copied_again() {
        // Anchor: source 100 at target 40. Stored position 103; the target holds the seven
        // source records 100..=107 (105 is a gap in the source): continue at 108.
        let r = walk((100, 40), &source(20), &target(7), 103, true).unwrap();
        assert_eq!(r.next, 108);
        assert_eq!(r.already_copied, 4, "103, 104, 106, 107");
        assert!(!r.target_behind);
    }

    #[test]
    fn matched_records_become_runs_where_the_target_is_contiguous() {
        let r = walk((100, 40), &source(20), &target(7), 103, true).unwrap();
        assert_eq!(r.matched.first(), Some(&(100, 40)));
        assert_eq!(r.matched.last(), Some(&(107, 46)));
        // The source gap at 105 is one run (a listed run keeps gaps upstream).
        assert_eq!(
            runs_of(&r.matched),
            vec![(vec![100, 101, 102, 103, 104, 106, 107], 40)]
        );
        // A gap on the target (a marker between) starts a new run.
        assert_eq!(
            runs_of(&[(1, 10), (2, 11), (3, 13)]),
            vec![(vec![1, 2], 10), (vec![3], 13)]
        );
        assert!(runs_of(&[]).is_empty());
    }

    #[test]
    fn an_anchor_ahead_of_the_stored_position_counts_from_it() {
        let r = walk((100, 40), &source(3), &target(3), 90, true).unwrap();
        assert_eq!((r.next, r.already_copied), (103, 3));
    }

    #[test]
    fn a_target_ending_before_the_position_keeps_the_position() {
        let r = walk((100, 40), &source(10), &target(2), 106, true).unwrap();
        assert_eq!((r.next, r.already_copied, r.target_behind), (106, 0, true));
    }

    #[test]
    fn a_foreign_record_falls_back() {
        let mut t = target(6);
        t[3].value = Some(Bytes::from("someone else"));
        assert_eq!(
            walk((100, 40), &source(20), &t, 100, true),
            Err(Fallback::Mismatch { target_offset: 43 })
        );
    }

    #[test]
    fn more_on_the_target_than_in_the_source_falls_back() {
        assert_eq!(
            walk((100, 40), &source(3), &target(4), 100, true),
            Err(Fallback::Mismatch { target_offset: 43 })
        );
    }

    #[test]
    fn records_copied_twice_before_fall_back() {
        // Source 100..=102, then 101 again (an earlier crash's duplicate).
        let mut t = target(3);
        t.push(rec(43, 1));
        assert!(matches!(
            walk((100, 40), &source(10), &t, 100, true),
            Err(Fallback::Mismatch { target_offset: 43 })
        ));
    }

    #[test]
    fn a_missing_anchor_record_falls_back() {
        assert_eq!(
            walk((100, 40), &source(5), &target(5)[1..], 100, true),
            Err(Fallback::AnchorGone)
        );
        assert_eq!(
            walk((100, 40), &source(5), &[], 100, true),
            Err(Fallback::AnchorGone)
        );
        assert_eq!(
            walk((100, 40), &source(5)[1..], &target(5), 100, true),
            Err(Fallback::SourceGone)
        );
    }

    #[test]
    fn timestamps_are_compared_unless_the_target_stamps_its_own() {
        let mut t = target(3);
        for r in &mut t {
            r.timestamp = 9_999_999;
        }
        assert!(walk((100, 40), &source(5), &t, 100, true).is_err());
        assert_eq!(
            walk((100, 40), &source(5), &t, 100, false).unwrap().next,
            103
        );
    }

    #[test]
    fn headers_and_keys_count() {
        let mut t = target(2);
        t[1].headers.push((Bytes::from("h"), None));
        assert!(walk((100, 40), &source(5), &t, 100, true).is_err());
        let mut t = target(2);
        t[1].key = None;
        assert!(walk((100, 40), &source(5), &t, 100, true).is_err());
    }
}
