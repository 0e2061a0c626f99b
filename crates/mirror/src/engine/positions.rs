//! Source positions in MM2's Connect offsets topic (`mm2-offsets.<source>.internal`, mm2-compatibility §2):
//! read once at flow start, written through the flow's idempotent producer (the same path as
//! the data, so exactly-once can later put both in one transaction).
//!
//! Partition tasks report the last source offset the target acknowledged; a writer stores the
//! newest per partition every [`FLUSH_INTERVAL`] and once more after the tasks stopped. MM2
//! flushes every `offset.flush.interval.ms` (60 s by default); storing four times a second costs one
//! small batch per positions partition and bounds what a crash copies twice to about 250 ms of
//! data.
//!
//! Why one file of this size: the `Board` and its `Writer` share the board's private state
//! (dirty marks, `unstored`, flush counters) and one write order (tombstones, logs, positions);
//! runs publication rides the same writes. Next to split out: runs publication
//! (`RunsPublisher`, `fit_publication`) or the reading side (`Stored`, `load`, `visit`).

use crate::wire::positions::StoredRecord;
use kmirror_kafka::cluster::{KafkaCluster, TopicId};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;
mod writer;
pub(crate) use writer::*;

pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// The configs of a positions topic kmirror creates. Compacted, as Connect requires; and with
/// 16 MiB segments rolled at least hourly, because the log cleaner never touches the active
/// segment: with Kafka's defaults (1 GiB, 7 days) a busy flow, which stores each partition's
/// position four times a second, leaves up to a GiB per partition uncompacted, and all of it is
/// read at every start. Writing less often would keep it smaller but copy more twice after a
/// crash. An existing topic (created by MM2) keeps its settings (docs/operating.md).
pub(super) fn topic_configs() -> Vec<(String, String)> {
    [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "16777216"),
        ("segment.ms", "3600000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// What a flow finds in the positions topic for its source cluster.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The last source offset copied, per source partition.
    pub positions: HashMap<(String, i32), i64>,
    /// The log (topic id) each topic's positions belong to, where kmirror recorded it; a topic
    /// without one (positions written by MM2, or by kmirror before it recorded logs) is trusted
    /// as it is.
    pub logs: HashMap<String, TopicId>,
}

impl Stored {
    /// Applies one record of the positions topic, read in log order (the last record per key
    /// wins; a tombstone removes what came before).
    pub fn apply(&mut self, cluster: &str, record: StoredRecord) {
        match record {
            StoredRecord::Position(p) if p.cluster == cluster => {
                self.positions.insert((p.topic, p.partition), p.offset);
            }
            StoredRecord::Forgotten {
                cluster: c,
                topic,
                partition,
            } if c == cluster => {
                self.positions.remove(&(topic, partition));
            }
            StoredRecord::Log {
                cluster: c,
                topic,
                id,
            } if c == cluster => match id {
                Some(id) => {
                    self.logs.insert(topic, id);
                }
                None => {
                    self.logs.remove(&topic);
                }
            },
            _ => {}
        }
    }
}

/// Reads every position of `cluster` from the positions topic, one fetch at a time: memory
/// grows with the number of keys, not with the length of a log compaction has not reached yet.
pub async fn load(k: &KafkaCluster, topic: &str, cluster: &str) -> Result<Stored, KafkaError> {
    let mut out = Stored::default();
    visit(k, topic, &mut HashMap::new(), |rec| out.apply(cluster, rec)).await?;
    Ok(out)
}

/// Hands on every record of the positions topic from where `next` says each partition's
/// reading continues (its start for a partition not in it), in log order per partition, and
/// records where the next read continues.
pub(super) async fn visit(
    k: &KafkaCluster,
    topic: &str,
    next: &mut HashMap<i32, i64>,
    mut f: impl FnMut(StoredRecord),
) -> Result<(), KafkaError> {
    let partitions = k.metadata().partition_count(topic).unwrap_or(0);
    for p in 0..partitions {
        let from = next.get(&p).copied();
        let resume = super::log_reader::visit_to_end(k, topic, p, from, |r| {
            if let Some(rec) = r
                .key
                .as_deref()
                .and_then(|key| StoredRecord::decode(key, r.value.as_deref()))
            {
                f(rec);
            }
        })
        .await?;
        next.insert(p, resume);
    }
    Ok(())
}

/// The newest acknowledged source offset per partition, and which ones are not stored yet;
/// also the log each topic's positions belong to, when that changed.
#[derive(Debug, Default)]
pub(super) struct Board {
    inner: Mutex<Inner>,
    /// Woken after each store that succeeded (see [`Board::flushed`]).
    stored: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Inner {
    positions: BTreeMap<(String, i32), (i64, bool)>,
    logs: BTreeMap<String, LogChange>,
    /// Flushes asked for, and the last one a successful store covered.
    flush_requested: u64,
    flush_completed: u64,
}

/// A topic's log to record, and the positions of its earlier log to remove first.
#[derive(Debug)]
struct LogChange {
    id: TopicId,
    forget: BTreeSet<i32>,
    dirty: bool,
}

/// What one store writes, in this order: tombstones, then logs, then positions. A log is
/// written only once the tombstones for its earlier log are acknowledged: written before them,
/// a crash in between would leave the old log's positions stored under the new log's id, and
/// the new log would be resumed at the old offsets (records skipped).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Dirty {
    pub(super) forget: Vec<(String, i32)>,
    pub(super) logs: Vec<(String, TopicId)>,
    pub(super) positions: Vec<(String, i32, i64)>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        self.forget.is_empty() && self.logs.is_empty() && self.positions.is_empty()
    }
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that everything up to `offset` (inclusive) is on the target.
    pub(super) fn acknowledged(&self, topic: &str, partition: i32, offset: i64) {
        let mut m = self.lock();
        let e = m
            .positions
            .entry((topic.to_string(), partition))
            .or_insert((offset, true));
        if offset >= e.0 {
            *e = (offset, true);
        }
    }

    /// Records a position an exactly-once slot committed with its data: already stored, so the
    /// writer leaves it alone (a later non-transactional copy could land after a newer commit).
    pub(super) fn committed(&self, topic: &str, partition: i32, offset: i64) {
        let mut m = self.lock();
        let e = m
            .positions
            .entry((topic.to_string(), partition))
            .or_insert((offset, false));
        if offset >= e.0 {
            *e = (offset, false);
        }
    }

    /// Waits until everything acknowledged before the call is stored (a store that began after
    /// it succeeded); false after `within`.
    pub(super) async fn flushed(&self, within: Duration) -> bool {
        let want = {
            let mut m = self.lock();
            m.flush_requested += 1;
            m.flush_requested
        };
        tokio::time::timeout(within, async {
            loop {
                let woken = self.stored.notified();
                let mut woken = std::pin::pin!(woken);
                woken.as_mut().enable();
                if self.lock().flush_completed >= want {
                    return;
                }
                woken.await;
            }
        })
        .await
        .is_ok()
    }

    /// Forgets partitions this process no longer serves (handed to another process): their
    /// positions are the new owner's to store from now on.
    pub(super) fn release(&self, keys: &BTreeSet<(String, i32)>) {
        let _ = self.take(keys);
    }

    /// Takes partitions off the board unstored, with their last acknowledged offsets (a
    /// process that lost its membership: see `Control::lose`).
    pub(super) fn take(&self, keys: &BTreeSet<(String, i32)>) -> HashMap<(String, i32), i64> {
        let mut m = self.lock();
        keys.iter()
            .filter_map(|k| m.positions.remove(k).map(|(o, _)| (k.clone(), o)))
            .collect()
    }

    /// The log (topic id) of every topic whose positions are recorded.
    pub(super) fn log_ids(&self) -> BTreeMap<String, TopicId> {
        self.lock()
            .logs
            .iter()
            .map(|(t, c)| (t.clone(), c.id))
            .collect()
    }

    /// Drops a topic's positions (it was re-created: its old offsets mean nothing now).
    pub(super) fn forget(&self, topic: &str) {
        self.lock().positions.retain(|(t, _), _| t != topic);
    }

    /// Records that `topic`'s positions belong to the log `id`; the stored positions of
    /// `forget` (partitions of an earlier log) are removed before that is written.
    pub(super) fn log(&self, topic: &str, id: TopicId, forget: impl IntoIterator<Item = i32>) {
        let mut m = self.lock();
        let e = m.logs.entry(topic.to_string()).or_insert(LogChange {
            id,
            forget: BTreeSet::new(),
            dirty: true,
        });
        e.id = id;
        e.dirty = true;
        e.forget.extend(forget);
    }

    fn completed(&self, covers: u64) {
        {
            let mut m = self.lock();
            m.flush_completed = m.flush_completed.max(covers);
        }
        self.stored.notify_waiters();
    }

    /// What is not stored yet (marked stored; [`Board::unstored`] puts back failures).
    fn take_dirty(&self) -> Dirty {
        let mut m = self.lock();
        let mut d = Dirty::default();
        for (t, c) in m.logs.iter_mut().filter(|(_, c)| c.dirty) {
            c.dirty = false;
            d.forget.extend(
                std::mem::take(&mut c.forget)
                    .into_iter()
                    .map(|p| (t.clone(), p)),
            );
            d.logs.push((t.clone(), c.id));
        }
        d.positions = m
            .positions
            .iter_mut()
            .filter(|(_, v)| v.1)
            .map(|((t, p), v)| {
                v.1 = false;
                (t.clone(), *p, v.0)
            })
            .collect();
        d
    }

    fn unstored(&self, failed: Dirty) {
        let mut m = self.lock();
        for (t, p, o) in failed.positions {
            if let Some(v) = m.positions.get_mut(&(t, p)) {
                if v.0 == o {
                    v.1 = true;
                }
            }
        }
        // Tombstones come back even when the topic's log changed again meanwhile: removing a
        // position costs a copy from the log start at worst, keeping an old one skips records.
        for (t, _) in failed.logs {
            if let Some(c) = m.logs.get_mut(&t) {
                c.dirty = true;
                c.forget.extend(
                    failed
                        .forget
                        .iter()
                        .filter(|(ft, _)| *ft == t)
                        .map(|(_, p)| *p),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::runs::{Exported, Publication};
    use crate::wire::positions::{runs_key, runs_value, SourcePosition};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_flush_waits_for_a_store_that_began_after_it_and_release_forgets() {
        let board = Arc::new(Board::default());
        board.acknowledged("t", 0, 10);
        // A store that took its positions before the flush was asked for does not count.
        let early = board.lock().flush_requested;
        let waiting = {
            let b = board.clone();
            tokio::spawn(async move { b.flushed(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        board.completed(early);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "an earlier store does not end the wait"
        );
        let covers = board.lock().flush_requested;
        board.completed(covers);
        assert!(waiting.await.unwrap(), "the store after it does");
        assert!(
            !board.flushed(Duration::from_millis(50)).await,
            "no store: the wait ends at its bound"
        );
        board.release(&[("t".to_string(), 0)].into());
        assert!(
            board.take_dirty().positions.is_empty(),
            "released: nothing to store"
        );
    }

    #[test]
    fn board_keeps_the_newest_position_and_puts_back_failed_stores() {
        let b = Board::default();
        b.acknowledged("t", 0, 10);
        b.acknowledged("t", 0, 5); // out-of-order report: ignored
        b.acknowledged("t", 1, 3);
        let d = b.take_dirty();
        assert_eq!(d.positions, vec![("t".into(), 0, 10), ("t".into(), 1, 3)]);
        assert!(b.take_dirty().is_empty());
        b.unstored(d);
        b.acknowledged("t", 1, 4);
        assert_eq!(
            b.take_dirty().positions,
            vec![("t".into(), 0, 10), ("t".into(), 1, 4)]
        );
    }

    #[test]
    fn a_new_log_carries_the_tombstones_of_the_old_one_until_both_are_stored() {
        let b = Board::default();
        let (old, new) = (TopicId::from_u128(1), TopicId::from_u128(2));
        b.log("t", old, []);
        assert_eq!(
            b.take_dirty(),
            Dirty {
                logs: vec![("t".into(), old)],
                ..Dirty::default()
            }
        );
        b.acknowledged("t", 0, 10);
        b.forget("t");
        b.log("t", new, [0, 1]);
        let d = b.take_dirty();
        assert_eq!(d.forget, vec![("t".into(), 0), ("t".into(), 1)]);
        assert_eq!(d.logs, vec![("t".into(), new)]);
        assert!(d.positions.is_empty(), "the old log's position was dropped");
        // The store failed: everything comes back, tombstones included.
        b.unstored(d);
        let d = b.take_dirty();
        assert_eq!(d.forget, vec![("t".into(), 0), ("t".into(), 1)]);
        assert_eq!(d.logs, vec![("t".into(), new)]);
        assert!(b.take_dirty().is_empty());
    }

    #[test]
    fn loading_applies_tombstones_and_logs_in_order_for_one_cluster_only() {
        let mut s = Stored::default();
        let pos = |cluster: &str, partition, offset| {
            StoredRecord::Position(SourcePosition {
                cluster: cluster.into(),
                topic: "t".into(),
                partition,
                offset,
            })
        };
        let log = |id| StoredRecord::Log {
            cluster: "A".into(),
            topic: "t".into(),
            id,
        };
        s.apply("A", pos("A", 0, 10));
        s.apply("A", pos("A", 1, 20));
        s.apply("A", pos("C", 2, 30)); // another flow's source cluster
        s.apply("A", log(Some(TopicId::from_u128(1))));
        s.apply(
            "A",
            StoredRecord::Forgotten {
                cluster: "A".into(),
                topic: "t".into(),
                partition: 0,
            },
        );
        s.apply("A", log(Some(TopicId::from_u128(2))));
        assert_eq!(s.positions, HashMap::from([(("t".into(), 1), 20)]));
        assert_eq!(s.logs, HashMap::from([("t".into(), TopicId::from_u128(2))]));
        s.apply("A", log(None));
        assert!(s.logs.is_empty());
    }

    #[test]
    fn a_publication_too_large_keeps_one_run_per_partition_then_what_fits() {
        let x = |partition, runs| Exported {
            topic: "orders".into(),
            partition,
            from: 0,
            runs,
        };
        let small: Vec<Exported> = (0..10).map(|p| x(p, vec![[0, 0, 5], [6, 5, 5]])).collect();
        let (value, left) = fit_publication(BTreeMap::new(), small.clone());
        assert_eq!(left, 0);
        assert_eq!(
            value,
            runs_value(&Publication {
                logs: BTreeMap::new(),
                partitions: small
            })
        );
        let big: Vec<Exported> = (0..40_000)
            .map(|p| {
                x(
                    p,
                    vec![[1 << 40, 1 << 40, 5], [(1 << 40) + 6, (1 << 40) + 5, 5]],
                )
            })
            .collect();
        let (value, left) = fit_publication(BTreeMap::new(), big);
        assert!(value.len() <= MAX_PUBLICATION_BYTES, "{}", value.len());
        assert!(left > 0 && left < 40_000, "{left}");
        let back = match StoredRecord::decode(&runs_key("A", "m"), Some(&value)) {
            Some(StoredRecord::Runs {
                publication: Some(p),
                ..
            }) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(back.partitions.len(), 40_000 - left);
        assert!(back
            .partitions
            .iter()
            .all(|p| p.runs.len() == 1 && p.runs[0][0] == (1 << 40) + 6));
    }
}
