//! Exact translation from what this process copied: per source partition, the runs of records it
//! forwarded where source and target offsets advance together (a batch continuing the previous
//! one extends the run; a gap upstream or a re-encoded batch with gaps starts a new one).
//!
//! Offset syncs in the topic cannot say that the records between two syncs were copied one for
//! one (another writer, a lost sync or a restart may hide a gap), so translation from syncs must
//! use MM2's +1 rule and may re-deliver records. Runs recorded in this process are known to be
//! contiguous, so a group whose offset falls inside or between them translates exactly: to the
//! target offset of the first record at or after its position. Older positions fall back to the
//! syncs.

use crate::offsets::sync_rules::SourceOffsets;
use std::collections::{HashMap, VecDeque};

/// Runs kept per partition (only gaps upstream start new ones, so steady data needs one).
pub const MAX_RUNS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first_up: i64,
    first_down: i64,
    count: i64,
}

impl Run {
    fn last_up(&self) -> i64 {
        self.first_up + self.count - 1
    }
    fn next_down(&self) -> i64 {
        self.first_down + self.count
    }
}

/// Every partition's runs since this process started copying it.
#[derive(Debug, Default)]
pub struct Runs {
    partitions: HashMap<(String, i32), VecDeque<Run>>,
}

impl Runs {
    /// A batch the target acknowledged: records from `ups`, written from `base_down` on.
    pub fn record(&mut self, topic: &str, partition: i32, ups: &SourceOffsets, base_down: i64) {
        let runs = self
            .partitions
            .entry((topic.to_string(), partition))
            .or_default();
        let mut add = |first_up: i64, first_down: i64, count: i64| {
            if let Some(last) = runs.back_mut() {
                if first_up == last.last_up() + 1 && first_down == last.next_down() {
                    last.count += count;
                    return;
                }
                if first_up <= last.last_up() || first_down < last.next_down() {
                    // Copied again (a restart) or the target went back: older runs no longer
                    // describe the target log.
                    runs.clear();
                }
            }
            runs.push_back(Run {
                first_up,
                first_down,
                count,
            });
            if runs.len() > MAX_RUNS {
                runs.pop_front();
            }
        };
        match ups {
            SourceOffsets::Contiguous { first, count } if *count > 0 => {
                add(*first, base_down, *count)
            }
            SourceOffsets::Contiguous { .. } => {}
            SourceOffsets::Listed(v) => {
                let mut i = 0;
                while i < v.len() {
                    let mut j = i + 1;
                    while j < v.len() && v[j] == v[j - 1] + 1 {
                        j += 1;
                    }
                    add(v[i], base_down + i as i64, (j - i) as i64);
                    i = j;
                }
            }
        }
    }

    /// Drops a topic's runs (it was re-created).
    pub fn forget(&mut self, topic: &str) {
        self.partitions.retain(|(t, _), _| t != topic);
    }

    /// The exact target offset for a group at source offset `g`, when this process copied the
    /// records around it: the target offset of the first copied record at or after `g`, or the
    /// next target offset when the group is past everything copied.
    pub fn translate(&self, topic: &str, partition: i32, g: i64) -> Option<i64> {
        let runs = self.partitions.get(&(topic.to_string(), partition))?;
        let first = runs.front()?;
        if g < first.first_up {
            return None;
        }
        for r in runs {
            if g <= r.last_up() {
                // Inside this run, or in the gap before it (nothing there was copied).
                return Some(r.first_down + (g - r.first_up).max(0));
            }
        }
        runs.back().map(Run::next_down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_inside_and_between_runs_none_before_them() {
        let mut r = Runs::default();
        let c = |first, count| SourceOffsets::Contiguous { first, count };
        r.record("t", 0, &c(100, 50), 0); // 100..149 -> 0..49
        r.record("t", 0, &c(150, 50), 50); // continues: one run 100..199 -> 0..99
        r.record("t", 0, &c(201, 10), 100); // a marker at 200: 201..210 -> 100..109
        r.record("t", 0, &SourceOffsets::Listed(vec![211, 212, 215]), 110);
        assert_eq!(r.translate("t", 0, 99), None, "before this process copied");
        assert_eq!(r.translate("t", 0, 100), Some(0));
        assert_eq!(r.translate("t", 0, 175), Some(75), "inside a batch: exact");
        assert_eq!(
            r.translate("t", 0, 200),
            Some(100),
            "at the marker: the next record"
        );
        assert_eq!(r.translate("t", 0, 205), Some(104));
        assert_eq!(
            r.translate("t", 0, 213),
            Some(112),
            "compacted away: the next kept"
        );
        assert_eq!(r.translate("t", 0, 215), Some(112));
        assert_eq!(
            r.translate("t", 0, 216),
            Some(113),
            "past everything copied"
        );
        assert_eq!(r.translate("t", 1, 5), None);
        // A restart copies 150.. again at target 113..: older runs are dropped.
        r.record("t", 0, &c(150, 10), 113);
        assert_eq!(r.translate("t", 0, 120), None);
        assert_eq!(r.translate("t", 0, 155), Some(118));
    }
}
