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
use std::time::{Duration, Instant};

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

/// One partition's runs in this process, since it last began a stretch of copying.
#[derive(Debug, Default)]
struct Stretch {
    /// The first source offset of the stretch: it orders what several owners of a partition
    /// published, as a later owner always starts later in the source ([`Published`]).
    from: i64,
    runs: VecDeque<Run>,
    /// The partition started again here (assigned, handed back): what was copied meanwhile,
    /// by another process, is unknown, so a gap between the runs before and after cannot be
    /// trusted to hold no copied record.
    resumed: bool,
}

/// Every partition's runs since this process started copying it.
#[derive(Debug, Default)]
pub struct Runs {
    partitions: HashMap<(String, i32), Stretch>,
    /// Bumped by every change, so a publisher can tell whether there is anything new.
    version: u64,
}

impl Runs {
    /// A batch the target acknowledged: records from `ups`, written from `base_down` on.
    pub fn record(&mut self, topic: &str, partition: i32, ups: &SourceOffsets, base_down: i64) {
        let stretch = self
            .partitions
            .entry((topic.to_string(), partition))
            .or_default();
        let mut changed = false;
        let mut add = |first_up: i64, first_down: i64, count: i64| {
            changed = true;
            let runs = &mut stretch.runs;
            if let Some(last) = runs.back_mut() {
                if first_up == last.last_up() + 1 && first_down == last.next_down() {
                    // Continues exactly on both sides: nothing was written in between, even
                    // after a restart of the partition.
                    last.count += count;
                    stretch.resumed = false;
                    return;
                }
                if stretch.resumed || first_up <= last.last_up() || first_down < last.next_down() {
                    // Copied again (a restart), the target went back, or copying resumed here
                    // after another owner: older runs no longer describe the target log, or
                    // the gap before this batch may hold records that owner copied.
                    runs.clear();
                }
            }
            stretch.resumed = false;
            if runs.is_empty() {
                stretch.from = first_up;
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
        if changed {
            self.version += 1;
        }
    }

    /// The partition (re)starts copying here: see [`Stretch::resumed`].
    pub fn resumed(&mut self, topic: &str, partition: i32) {
        if let Some(s) = self.partitions.get_mut(&(topic.to_string(), partition)) {
            s.resumed = true;
        }
    }

    /// Drops a topic's runs (it was re-created).
    pub fn forget(&mut self, topic: &str) {
        self.partitions.retain(|(t, _), _| t != topic);
        self.version += 1;
    }

    /// Drops the runs of partitions this process no longer copies: their next owner's runs
    /// describe them from now on.
    pub fn release<'a>(&mut self, keys: impl IntoIterator<Item = &'a (String, i32)>) {
        for k in keys {
            self.partitions.remove(k);
        }
        self.version += 1;
    }

    /// A number that changes whenever the runs do.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The newest runs of every partition (at most `per_partition` each), to publish.
    pub fn export(&self, per_partition: usize) -> Vec<Exported> {
        let mut out: Vec<Exported> = self
            .partitions
            .iter()
            .filter(|(_, s)| !s.runs.is_empty())
            .map(|((topic, partition), s)| Exported {
                topic: topic.clone(),
                partition: *partition,
                from: s.from,
                runs: s
                    .runs
                    .iter()
                    .skip(s.runs.len().saturating_sub(per_partition))
                    .map(|r| [r.first_up, r.first_down, r.count])
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }

    /// The exact target offset for a group at source offset `g`, when this process copied the
    /// records around it: the target offset of the first copied record at or after `g`, or the
    /// next target offset when the group is past everything copied.
    pub fn translate(&self, topic: &str, partition: i32, g: i64) -> Option<i64> {
        let s = self.partitions.get(&(topic.to_string(), partition))?;
        translate_runs(s.runs.iter().copied(), g, true)
    }
}

/// Translation over one owner's runs, in order. Past the last run: its next target offset when
/// `past_end` (the runs are this process's own and current), else nothing.
fn translate_runs(runs: impl IntoIterator<Item = Run>, g: i64, past_end: bool) -> Option<i64> {
    let mut last = None;
    for (i, r) in runs.into_iter().enumerate() {
        if i == 0 && g < r.first_up {
            return None;
        }
        if g <= r.last_up() {
            // Inside this run, or in the gap before it (nothing there was copied).
            return Some(r.first_down + (g - r.first_up).max(0));
        }
        last = Some(r);
    }
    last.filter(|_| past_end).map(|r| r.next_down())
}

pub use crate::wire::positions::{Exported, Publication};

/// What every owner of a flow's partitions published, as the checkpointing leader reads it:
/// per partition, the stretch of the owner that started latest in the source (the current
/// owner, or the last one). Any owner's runs are true of the target log, but only the latest
/// stretch is known to have nothing copied by another owner after it in the source: an owner
/// that resumed a partition past what an intermediate owner had copied (it remembered its own
/// acknowledgements) leaves that owner's runs pointing after records it never copied again.
#[derive(Debug, Default)]
pub struct Published {
    partitions: HashMap<(String, i32), Entry>,
    /// Every member with a publication, and when it was last read.
    members: HashMap<String, Instant>,
}

#[derive(Debug)]
struct Entry {
    member: String,
    /// The source topic's log (topic id text) the runs belong to, when known.
    log: Option<String>,
    from: i64,
    runs: Vec<Run>,
}

impl Published {
    /// Applies one member's publication (`None`: its tombstone), read in log order: it
    /// replaces what that member published before.
    pub fn apply(&mut self, member: &str, publication: Option<&Publication>, now: Instant) {
        self.partitions.retain(|_, e| e.member != member);
        let Some(publication) = publication else {
            self.members.remove(member);
            return;
        };
        self.members.insert(member.to_string(), now);
        for x in &publication.partitions {
            let runs: Vec<Run> = x
                .runs
                .iter()
                .filter(|r| r[2] > 0)
                .map(|r| Run {
                    first_up: r[0],
                    first_down: r[1],
                    count: r[2],
                })
                .collect();
            if runs.is_empty() || !ordered(&runs) {
                continue; // bytes from the network: runs out of order say nothing certain
            }
            let key = (x.topic.clone(), x.partition);
            if self.partitions.get(&key).is_some_and(|e| e.from > x.from) {
                continue;
            }
            self.partitions.insert(
                key,
                Entry {
                    member: member.to_string(),
                    log: publication.logs.get(&x.topic).cloned().flatten(),
                    from: x.from,
                    runs,
                },
            );
        }
    }

    /// Members whose publication describes no partition any more (later owners' stretches
    /// replaced all of it) and that published nothing for `idle`: a process killed without
    /// removing its record, or one that serves nothing. Their records can be removed.
    pub fn stale(&self, idle: Duration, now: Instant) -> Vec<String> {
        let mut out: Vec<String> = self
            .members
            .iter()
            .filter(|(m, seen)| {
                now.saturating_duration_since(**seen) >= idle
                    && !self.partitions.values().any(|e| &e.member == *m)
            })
            .map(|(m, _)| m.clone())
            .collect();
        out.sort();
        out
    }

    /// The exact target offset for a group at `g` from the latest owner's runs, if they cover
    /// it (never past their end: what was copied since is not published yet), and if they
    /// belong to the topic's current log `log` (when both are known).
    pub fn translate(&self, topic: &str, partition: i32, g: i64, log: Option<&str>) -> Option<i64> {
        let e = self.partitions.get(&(topic.to_string(), partition))?;
        if let (Some(a), Some(b)) = (e.log.as_deref(), log) {
            if a != b {
                return None;
            }
        }
        translate_runs(e.runs.iter().copied(), g, false)
    }
}

/// Runs that advance on both sides (what one owner's copying produces).
fn ordered(runs: &[Run]) -> bool {
    runs.iter().all(|r| {
        r.first_up >= 0
            && r.first_down >= 0
            && r.first_up.checked_add(r.count).is_some()
            && r.first_down.checked_add(r.count).is_some()
    }) && runs
        .windows(2)
        .all(|w| w[1].first_up > w[0].last_up() && w[1].first_down >= w[0].next_down())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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

    #[test]
    fn a_resumed_partition_keeps_its_runs_only_when_copying_continues_exactly() {
        let c = |first, count| SourceOffsets::Contiguous { first, count };
        let mut r = Runs::default();
        r.record("t", 0, &c(0, 100), 0);
        r.resumed("t", 0);
        r.record("t", 0, &c(100, 10), 100); // nothing written by anyone in between
        assert_eq!(r.translate("t", 0, 50), Some(50));
        // Handed away, then back: another owner copied 110..149 meanwhile.
        r.resumed("t", 0);
        r.record("t", 0, &c(150, 10), 140);
        assert_eq!(
            r.translate("t", 0, 120),
            None,
            "the gap may hold the other owner's copies: never translated past them"
        );
        assert_eq!(r.translate("t", 0, 155), Some(145));
        assert_eq!(r.export(16)[0].from, 150);
        // Without a resume, a gap upstream (markers, compaction) stays a trusted gap.
        r.record("t", 0, &c(170, 10), 150);
        assert_eq!(r.translate("t", 0, 165), Some(150));
        let v = r.version();
        r.release(&[("t".to_string(), 0)]);
        assert!(r.version() > v);
        assert_eq!(r.translate("t", 0, 175), None);
        assert!(r.export(16).is_empty());
    }

    #[test]
    fn export_keeps_the_newest_runs_and_the_stretch_start() {
        let mut r = Runs::default();
        for i in 0..20 {
            // A marker after every batch: one run per batch.
            r.record(
                "t",
                1,
                &SourceOffsets::Contiguous {
                    first: i * 11,
                    count: 10,
                },
                i * 10,
            );
        }
        let x = r.export(3);
        assert_eq!(x.len(), 1);
        assert_eq!(
            (x[0].topic.as_str(), x[0].partition, x[0].from),
            ("t", 1, 0)
        );
        assert_eq!(
            x[0].runs,
            vec![[187, 170, 10], [198, 180, 10], [209, 190, 10]]
        );
    }

    fn exported(topic: &str, partition: i32, from: i64, runs: Vec<[i64; 3]>) -> Exported {
        Exported {
            topic: topic.into(),
            partition,
            from,
            runs,
        }
    }

    #[test]
    fn published_runs_of_the_latest_owner_win_and_stop_at_their_end() {
        let logs = BTreeMap::from([("t".to_string(), Some("L1".to_string()))]);
        let publ = |partitions| Publication {
            logs: logs.clone(),
            partitions,
        };
        let mut p = Published::default();
        let now = Instant::now();
        // X copied 0..999 to 0..999; Y took over at 800 after X crashed, at target 1000.
        p.apply(
            "x",
            Some(&publ(vec![exported("t", 0, 0, vec![[0, 0, 1000]])])),
            now,
        );
        assert_eq!(p.translate("t", 0, 850, Some("L1")), Some(850));
        p.apply(
            "y",
            Some(&publ(vec![exported("t", 0, 800, vec![[800, 1000, 100]])])),
            now,
        );
        assert_eq!(
            p.translate("t", 0, 850, Some("L1")),
            Some(1050),
            "Y's stretch"
        );
        assert_eq!(
            p.translate("t", 0, 500, Some("L1")),
            None,
            "before Y's stretch"
        );
        assert_eq!(
            p.translate("t", 0, 900, Some("L1")),
            None,
            "past what Y published"
        );
        // X publishes again (it still lists the partition from an older stretch): Y stays.
        p.apply(
            "x",
            Some(&publ(vec![exported("t", 0, 0, vec![[0, 0, 1000]])])),
            now,
        );
        assert_eq!(p.translate("t", 0, 850, Some("L1")), Some(1050));
        assert_eq!(
            p.translate("t", 0, 850, Some("L2")),
            None,
            "another log of t"
        );
        assert_eq!(
            p.translate("t", 0, 850, None),
            Some(1050),
            "log unknown here"
        );
        // Y's tombstone (it left): nothing is known of the partition until the next owner's.
        let later = now + Duration::from_secs(600);
        assert_eq!(
            p.stale(Duration::from_secs(600), later),
            vec!["x".to_string()],
            "x describes nothing now"
        );
        assert!(
            p.stale(Duration::from_secs(600), now).is_empty(),
            "not idle long enough"
        );
        p.apply("y", None, now);
        assert_eq!(p.translate("t", 0, 850, Some("L1")), None);
        assert_eq!(
            p.stale(Duration::from_secs(600), later),
            vec!["x".to_string()]
        );
        p.apply("x", None, now);
        assert!(p.stale(Duration::ZERO, later).is_empty());
    }

    #[test]
    fn published_runs_that_do_not_advance_or_overflow_are_ignored() {
        let mut p = Published::default();
        let bad = vec![
            exported("t", 0, 0, vec![[10, 10, 5], [12, 20, 5]]), // overlaps upstream
            exported("t", 1, 0, vec![[10, 10, 5], [20, 12, 5]]), // target goes back
            exported("t", 2, 0, vec![[i64::MAX - 1, 0, 5]]),
            exported("t", 3, 0, vec![[-5, 0, 5]]),
        ];
        p.apply(
            "m",
            Some(&Publication {
                logs: BTreeMap::new(),
                partitions: bad,
            }),
            Instant::now(),
        );
        for part in 0..4 {
            assert_eq!(p.translate("t", part, 12, None), None, "partition {part}");
        }
    }
}
