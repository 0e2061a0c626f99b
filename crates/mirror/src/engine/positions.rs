//! Source positions in MM2's Connect offsets topic (`mm2-offsets.<source>.internal`, mm2-spec §2):
//! read once at flow start, written through the flow's idempotent producer (the same path as
//! the data, so exactly-once can later put both in one transaction).
//!
//! Partition tasks report the last source offset the target acknowledged; a writer stores the
//! newest per partition every [`FLUSH_INTERVAL`] and once more after the tasks stopped. MM2
//! flushes every `offset.flush.interval.ms` (60 s by default); storing four times a second costs one
//! small batch per positions partition and bounds what a crash copies twice to about 250 ms of
//! data.

use super::Shutdown;
use crate::metrics::{FlowLabels, Metrics};
use crate::wire::positions::{positions_partition, SourcePosition};
use bytes::Bytes;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// Reads every position of `cluster` from the positions topic (the last record per key wins).
pub async fn load(
    k: &KafkaCluster,
    topic: &str,
    cluster: &str,
) -> Result<HashMap<(String, i32), i64>, KafkaError> {
    let mut out = HashMap::new();
    let partitions = k
        .metadata()
        .topics
        .get(topic)
        .map_or(0, |t| t.partitions.len() as i32);
    for p in 0..partitions {
        let (records, _) = super::log_reader::read_to_end(k, topic, p, None).await?;
        for r in records {
            if let Some(pos) = r
                .key
                .as_deref()
                .and_then(|key| SourcePosition::decode(key, r.value.as_deref()))
            {
                if pos.cluster == cluster {
                    out.insert((pos.topic, pos.partition), pos.offset);
                }
            }
        }
    }
    Ok(out)
}

/// The newest acknowledged source offset per partition, and which ones are not stored yet.
#[derive(Debug, Default)]
pub(super) struct Board {
    inner: Mutex<BTreeMap<(String, i32), (i64, bool)>>,
}

impl Board {
    /// Records that everything up to `offset` (inclusive) is on the target.
    pub(super) fn acknowledged(&self, topic: &str, partition: i32, offset: i64) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let e = m
            .entry((topic.to_string(), partition))
            .or_insert((offset, true));
        if offset >= e.0 {
            *e = (offset, true);
        }
    }

    /// Drops a topic's positions (it was re-created: its old offsets mean nothing now).
    pub(super) fn forget(&self, topic: &str) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(t, _), _| t != topic);
    }

    /// The positions not stored yet (marked stored; [`Board::unstored`] puts back failures).
    fn take_dirty(&self) -> Vec<(String, i32, i64)> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.iter_mut()
            .filter(|(_, v)| v.1)
            .map(|((t, p), v)| {
                v.1 = false;
                (t.clone(), *p, v.0)
            })
            .collect()
    }

    fn unstored(&self, failed: &[(String, i32, i64)]) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (t, p, o) in failed {
            if let Some(v) = m.get_mut(&(t.clone(), *p)) {
                if v.0 == *o {
                    v.1 = true;
                }
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
    lanes: HashMap<i32, PartitionLane>,
}

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
        Writer {
            cluster_alias,
            topic,
            target,
            producer,
            board,
            metrics,
            labels,
            lanes: HashMap::new(),
        }
    }

    /// Stores positions every [`FLUSH_INTERVAL`] until `stop`, then once more.
    pub(super) async fn run(mut self, stop: Shutdown) {
        loop {
            let stopping = stop.sleep(FLUSH_INTERVAL).await;
            self.store_dirty().await;
            if stopping {
                return;
            }
        }
    }

    /// Stores every position not stored yet; failures are logged and retried next time.
    pub(super) async fn store_dirty(&mut self) {
        let dirty = self.board.take_dirty();
        if dirty.is_empty() {
            return;
        }
        if let Err(e) = self.store(&dirty).await {
            tracing::warn!(topic = %self.topic, error = %e, "storing source positions failed; will retry");
            self.metrics
                .errors
                .get_or_create(&self.labels.error("positions"))
                .inc();
            self.board.unstored(&dirty);
            // A lane that failed may hold a broken sequence: start over with fresh lanes.
            self.lanes.clear();
            if let Ok(p) = IdempotentProducer::new(self.target.clone()).await {
                self.producer = p;
            }
        }
    }

    async fn store(&mut self, positions: &[(String, i32, i64)]) -> Result<(), KafkaError> {
        let partitions = self
            .target
            .metadata()
            .topics
            .get(&self.topic)
            .map_or(1, |t| t.partitions.len() as i32);
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        let now = super::now_ms();
        for (topic, partition, offset) in positions {
            let pos = SourcePosition {
                cluster: self.cluster_alias.clone(),
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
            };
            let key = pos.key();
            let records = by_partition
                .entry(positions_partition(&key, partitions))
                .or_default();
            records.push(Record {
                offset: records.len() as i64,
                timestamp: now,
                key: Some(Bytes::from(key)),
                value: Some(Bytes::from(pos.value())),
                headers: vec![],
            });
        }
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
        self.metrics
            .positions_stored
            .get_or_create(&self.labels)
            .inc_by(positions.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_keeps_the_newest_position_and_puts_back_failed_stores() {
        let b = Board::default();
        b.acknowledged("t", 0, 10);
        b.acknowledged("t", 0, 5); // out-of-order report: ignored
        b.acknowledged("t", 1, 3);
        let d = b.take_dirty();
        assert_eq!(d, vec![("t".into(), 0, 10), ("t".into(), 1, 3)]);
        assert!(b.take_dirty().is_empty());
        b.unstored(&d);
        b.acknowledged("t", 1, 4);
        assert_eq!(
            b.take_dirty(),
            vec![("t".into(), 0, 10), ("t".into(), 1, 4)]
        );
    }
}
