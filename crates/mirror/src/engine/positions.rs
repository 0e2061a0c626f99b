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

use super::Shutdown;
use crate::events::{Emitter, Event, InternalWrite, InternalWriteFailed};
use crate::metrics::{FlowLabels, Metrics};
use crate::names::{ClusterAlias, FlowId};
use crate::offsets::runs::{Exported, Publication, Runs};
use crate::wire::positions::{
    positions_partition, runs_key, runs_value, source_log_key, source_log_value, SourcePosition,
    StoredRecord,
};
use bytes::Bytes;
use kmirror_kafka::cluster::{topic_id_text, KafkaCluster, TopicId};
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Writes positions from a [`Board`] to the positions topic.
pub(super) struct Writer {
    pub(super) cluster_alias: String,
    pub(super) topic: String,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) producer: Arc<IdempotentProducer>,
    pub(super) board: Arc<Board>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    /// The flow the labels name, for the events a failed store emits.
    flow: FlowId,
    lanes: HashMap<i32, PartitionLane>,
    /// With sharing: nothing is stored while this process cannot tell it still owns its
    /// partitions (their new owner's positions are newer; docs/sharing.md).
    lease: Option<Arc<super::sharing::Shared>>,
    /// With sharing and checkpoints: this process's runs, published for the flow's leader.
    publisher: Option<RunsPublisher>,
    /// The last flush request a store saw.
    flushes_seen: u64,
    /// How often positions are stored (`kmirror.positions.interval.ms`).
    interval: Duration,
}

/// This process's runs and what of them is published (docs/sharing.md, "Exact checkpoints").
struct RunsPublisher {
    runs: Arc<Mutex<Runs>>,
    member: String,
    published: Option<u64>,
    at: Option<Instant>,
}

/// Runs are published at most this often, and at once when a flush is asked for (a partition
/// handed over): the leader reads them once per checkpoint round.
const RUNS_INTERVAL: Duration = Duration::from_secs(1);

/// A publication is one record: it must stay below the broker's default `message.max.bytes`
/// (1 MiB). Partitions that do not fit are left out (their groups are translated through the
/// offset syncs), with a warning.
const MAX_PUBLICATION_BYTES: usize = 900_000;

impl Writer {
    pub(super) fn new(
        cluster_alias: String,
        topic: String,
        target: Arc<KafkaCluster>,
        producer: Arc<IdempotentProducer>,
        board: Arc<Board>,
        metrics: Arc<Metrics>,
        labels: FlowLabels,
    ) -> Writer {
        let flow = FlowId::new(
            ClusterAlias::new(&*labels.source),
            ClusterAlias::new(&*labels.target),
        );
        Writer {
            cluster_alias,
            topic,
            target,
            producer,
            board,
            metrics,
            labels,
            flow,
            lanes: HashMap::new(),
            lease: None,
            publisher: None,
            flushes_seen: 0,
            interval: FLUSH_INTERVAL,
        }
    }

    pub(super) fn with_interval(mut self, interval: Duration) -> Writer {
        self.interval = interval;
        self
    }

    /// Publishes `runs` under `member`'s key with the positions (and a tombstone for it when
    /// the writer stops).
    pub(super) fn with_runs(mut self, runs: Arc<Mutex<Runs>>, member: String) -> Writer {
        self.publisher = Some(RunsPublisher {
            runs,
            member,
            published: None,
            at: None,
        });
        self
    }

    pub(super) fn with_lease(mut self, lease: Option<Arc<super::sharing::Shared>>) -> Writer {
        self.lease = lease;
        self
    }

    /// Stores positions every interval (default [`FLUSH_INTERVAL`]) until `stop`, then once
    /// more; a process
    /// that published runs removes them (its partitions' next owners publish theirs).
    pub(super) async fn run(mut self, stop: Shutdown) {
        loop {
            let stopping = stop.sleep(self.interval).await;
            self.store_dirty().await;
            if stopping {
                break;
            }
        }
        if let Some(p) = self.publisher.as_ref().filter(|p| p.published.is_some()) {
            let key = runs_key(&self.cluster_alias, &p.member);
            if let Err(e) = self.write(vec![(key, None)], super::now_ms()).await {
                tracing::debug!(topic = %self.topic, error = %e, "removing this process's published runs failed");
            }
        }
    }

    /// Stores every position not stored yet; failures are logged and retried next time.
    pub(super) async fn store_dirty(&mut self) {
        // Read before the positions are taken: a flush asked for after this point may have
        // positions this store does not hold.
        let covers = self.board.lock().flush_requested;
        if self.lease.as_ref().is_some_and(|l| !l.may_write()) {
            // Nothing is stored now (they stay on the board); a flush waiting for a store is
            // not kept waiting for one that may never come (a process that never joined, or
            // lost its membership, while it shuts down).
            self.board.completed(covers);
            return;
        }
        let dirty = self.board.take_dirty();
        let mut result = Ok(());
        if !dirty.is_empty() {
            result = self.store(&dirty).await;
            if result.is_err() {
                self.board.unstored(dirty);
            }
        }
        if result.is_ok() {
            let flush = covers > self.flushes_seen;
            result = self.publish_runs(flush).await;
        }
        match result {
            Ok(()) => {
                self.flushes_seen = covers;
                self.board.completed(covers);
            }
            Err(e) => {
                InternalWriteFailed {
                    flow: &self.flow,
                    what: InternalWrite::Positions,
                    topic: &self.topic,
                    error: &e,
                }
                .emit(Emitter {
                    metrics: &self.metrics,
                    labels: &self.labels,
                });
                // A lane that failed may hold a broken sequence: start over with fresh lanes.
                self.lanes.clear();
                if let Ok(p) = IdempotentProducer::new(self.target.clone()).await {
                    self.producer = p;
                }
            }
        }
    }

    /// Publishes this process's runs when they changed since the last publication, at most
    /// every [`RUNS_INTERVAL`] unless `flush`.
    async fn publish_runs(&mut self, flush: bool) -> Result<(), KafkaError> {
        let Some(p) = &self.publisher else {
            return Ok(());
        };
        let (version, exported) = {
            let runs = p.runs.lock().unwrap_or_else(|e| e.into_inner());
            let version = runs.version();
            let due = flush || p.at.is_none_or(|t| t.elapsed() >= RUNS_INTERVAL);
            if p.published == Some(version) || !due {
                return Ok(());
            }
            (version, runs.export(PUBLISHED_RUNS))
        };
        let logs = self
            .board
            .log_ids()
            .into_iter()
            .map(|(t, id)| (t, Some(topic_id_text(&id))))
            .collect();
        let (value, left_out) = fit_publication(logs, exported);
        if left_out > 0 {
            tracing::warn!(topic = %self.topic, partitions = left_out, "published runs too large for one record: these partitions' groups are translated through the offset syncs");
        }
        let key = runs_key(&self.cluster_alias, &p.member);
        self.write(vec![(key, Some(value))], super::now_ms())
            .await?;
        if let Some(p) = &mut self.publisher {
            p.published = Some(version);
            p.at = Some(Instant::now());
        }
        Ok(())
    }

    async fn store(&mut self, dirty: &Dirty) -> Result<(), KafkaError> {
        let now = super::now_ms();
        let cluster = self.cluster_alias.clone();
        let tombstones = dirty.forget.iter().map(|(topic, partition)| {
            let key = crate::wire::positions::source_key(&cluster, topic, *partition);
            (key, None)
        });
        self.write(tombstones.collect(), now).await?;
        let logs = dirty
            .logs
            .iter()
            .map(|(topic, id)| (source_log_key(&cluster, topic), Some(source_log_value(id))));
        self.write(logs.collect(), now).await?;
        let positions = dirty.positions.iter().map(|(topic, partition, offset)| {
            let pos = SourcePosition {
                cluster: cluster.clone(),
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
            };
            (pos.key(), Some(pos.value()))
        });
        self.write(positions.collect(), now).await?;
        self.metrics
            .positions_stored
            .get_or_create(&self.labels)
            .inc_by(dirty.positions.len() as u64);
        Ok(())
    }

    /// Writes records (key, value; `None` is a tombstone) to the partitions their keys go to,
    /// and waits until all are acknowledged.
    async fn write(
        &mut self,
        records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        now: i64,
    ) -> Result<(), KafkaError> {
        if records.is_empty() {
            return Ok(());
        }
        let partitions = self
            .target
            .metadata()
            .partition_count(&self.topic)
            .unwrap_or(1);
        let by_partition = records_by_partition(records, partitions, now);
        for (p, records) in &by_partition {
            let batch = encode_batch(records, &BatchOptions::default())
                .map_err(|e| KafkaError::Config(e.to_string()))?;
            let lane = self
                .lanes
                .entry(*p)
                .or_insert_with(|| self.producer.lane(&self.topic, *p));
            lane.send(0, batch).await?;
        }
        for lane in self.lanes.values_mut() {
            lane.flush().await?;
        }
        Ok(())
    }
}

/// Records (key, value; `None` is a tombstone) grouped by the positions partition their keys
/// go to, as Connect's offset store partitions them.
fn records_by_partition(
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    partitions: i32,
    now: i64,
) -> BTreeMap<i32, Vec<Record>> {
    let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    for (key, value) in records {
        let batch = by_partition
            .entry(positions_partition(&key, partitions))
            .or_default();
        batch.push(Record {
            offset: batch.len() as i64,
            timestamp: now,
            key: Some(Bytes::from(key)),
            value: value.map(Bytes::from),
            headers: vec![],
        });
    }
    by_partition
}

/// One batch per positions partition holding the positions `(topic, partition, offset)` of
/// source cluster `cluster`, in MM2's format: what an exactly-once slot writes in its
/// transaction.
pub(super) fn position_batches(
    cluster: &str,
    positions: &[(String, i32, i64)],
    partitions: i32,
    now: i64,
) -> Result<BTreeMap<i32, kmirror_kafka::batch::RawBatch>, KafkaError> {
    let records = positions
        .iter()
        .map(|(topic, partition, offset)| {
            let pos = SourcePosition {
                cluster: cluster.to_string(),
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
            };
            (pos.key(), Some(pos.value()))
        })
        .collect();
    records_by_partition(records, partitions, now)
        .into_iter()
        .map(|(p, records)| {
            encode_batch(&records, &BatchOptions::default())
                .map(|b| (p, b))
                .map_err(|e| KafkaError::Config(e.to_string()))
        })
        .collect()
}

/// Runs published per partition: the stretch a group's committed offset falls in is almost
/// always the newest (a gap upstream, such as a transaction marker, starts a new run).
const PUBLISHED_RUNS: usize = 4;

/// The publication's value, within [`MAX_PUBLICATION_BYTES`]: with fewer runs per partition,
/// then without the partitions that do not fit (their number is returned).
fn fit_publication(
    logs: BTreeMap<String, Option<String>>,
    mut exported: Vec<Exported>,
) -> (Vec<u8>, usize) {
    let encode = |partitions: &[Exported]| {
        runs_value(&Publication {
            logs: logs.clone(),
            partitions: partitions.to_vec(),
        })
    };
    let value = encode(&exported);
    if value.len() <= MAX_PUBLICATION_BYTES {
        return (value, 0);
    }
    for x in &mut exported {
        let n = x.runs.len();
        x.runs.drain(..n.saturating_sub(1));
    }
    let total = exported.len();
    // About the same size per partition: keep the share that fits, then check.
    let value = encode(&exported);
    let mut keep = (total * MAX_PUBLICATION_BYTES / value.len().max(1)).min(total);
    loop {
        let value = encode(&exported[..keep]);
        if value.len() <= MAX_PUBLICATION_BYTES || keep == 0 {
            return (value, total - keep);
        }
        keep = keep * 9 / 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
