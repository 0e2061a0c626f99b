//! The positions writer: stores the board's dirty positions in the positions topic (MM2's Connect
//! offsets format) every flush interval, at least once, holding writes while a shared flow's lease
//! is in doubt, and publishes this process's exact-translation runs for the flow's leader.

use crate::engine::positions::*;
use crate::engine::Shutdown;
use crate::events::{Emitter, Event, InternalWrite, InternalWriteFailed};
use crate::metrics::{FlowLabels, Metrics};
use crate::names::{ClusterAlias, FlowId};
use crate::offsets::runs::{Exported, Publication, Runs};
use crate::wire::positions::{
    positions_partition, runs_key, runs_value, source_log_key, source_log_value, SourcePosition,
};
use bytes::Bytes;
use kmirror_kafka::cluster::{topic_id_text, KafkaCluster};
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Writes positions from a [`Board`] to the positions topic.
pub(crate) struct Writer {
    pub(crate) cluster_alias: String,
    pub(crate) topic: String,
    pub(crate) target: Arc<KafkaCluster>,
    pub(crate) producer: Arc<IdempotentProducer>,
    pub(crate) board: Arc<Board>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) labels: FlowLabels,
    /// The flow the labels name, for the events a failed store emits.
    pub(crate) flow: FlowId,
    pub(crate) lanes: HashMap<i32, PartitionLane>,
    /// With sharing: nothing is stored while this process cannot tell it still owns its
    /// partitions (their new owner's positions are newer; docs/sharing.md).
    pub(crate) lease: Option<Arc<crate::engine::sharing::Shared>>,
    /// With sharing and checkpoints: this process's runs, published for the flow's leader.
    pub(crate) publisher: Option<RunsPublisher>,
    /// The last flush request a store saw.
    pub(crate) flushes_seen: u64,
    /// How often positions are stored (`kmirror.positions.interval.ms`).
    pub(crate) interval: Duration,
}

/// This process's runs and what of them is published (docs/sharing.md, "Exact checkpoints").
pub(crate) struct RunsPublisher {
    pub(crate) runs: Arc<Mutex<Runs>>,
    pub(crate) member: String,
    pub(crate) published: Option<u64>,
    pub(crate) at: Option<Instant>,
}

/// Runs are published at most this often, and at once when a flush is asked for (a partition
/// handed over): the leader reads them once per checkpoint round.
pub(crate) const RUNS_INTERVAL: Duration = Duration::from_secs(1);

/// A publication is one record: it must stay below the broker's default `message.max.bytes`
/// (1 MiB). Partitions that do not fit are left out (their groups are translated through the
/// offset syncs), with a warning.
pub(crate) const MAX_PUBLICATION_BYTES: usize = 900_000;

impl Writer {
    pub(crate) fn new(
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

    pub(crate) fn with_interval(mut self, interval: Duration) -> Writer {
        self.interval = interval;
        self
    }

    /// Publishes `runs` under `member`'s key with the positions (and a tombstone for it when
    /// the writer stops).
    pub(crate) fn with_runs(mut self, runs: Arc<Mutex<Runs>>, member: String) -> Writer {
        self.publisher = Some(RunsPublisher {
            runs,
            member,
            published: None,
            at: None,
        });
        self
    }

    pub(crate) fn with_lease(
        mut self,
        lease: Option<Arc<crate::engine::sharing::Shared>>,
    ) -> Writer {
        self.lease = lease;
        self
    }

    /// Stores positions every interval (default [`FLUSH_INTERVAL`]) until `stop`, then once
    /// more; a process
    /// that published runs removes them (its partitions' next owners publish theirs).
    pub(crate) async fn run(mut self, stop: Shutdown) {
        loop {
            let stopping = stop.sleep(self.interval).await;
            self.store_dirty().await;
            if stopping {
                break;
            }
        }
        if let Some(p) = self.publisher.as_ref().filter(|p| p.published.is_some()) {
            let key = runs_key(&self.cluster_alias, &p.member);
            if let Err(e) = self.write(vec![(key, None)], crate::engine::now_ms()).await {
                tracing::debug!(topic = %self.topic, error = %e, "removing this process's published runs failed");
            }
        }
    }

    /// Stores every position not stored yet; failures are logged and retried next time.
    pub(crate) async fn store_dirty(&mut self) {
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
    pub(crate) async fn publish_runs(&mut self, flush: bool) -> Result<(), KafkaError> {
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
        self.write(vec![(key, Some(value))], crate::engine::now_ms())
            .await?;
        if let Some(p) = &mut self.publisher {
            p.published = Some(version);
            p.at = Some(Instant::now());
        }
        Ok(())
    }

    pub(crate) async fn store(&mut self, dirty: &Dirty) -> Result<(), KafkaError> {
        let now = crate::engine::now_ms();
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
    pub(crate) async fn write(
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
pub(crate) fn records_by_partition(
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
pub(crate) fn position_batches(
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
pub(crate) const PUBLISHED_RUNS: usize = 4;

/// The publication's value, within [`MAX_PUBLICATION_BYTES`]: with fewer runs per partition,
/// then without the partitions that do not fit (their number is returned).
pub(crate) fn fit_publication(
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
