//! Writes offset syncs to `mm2-offset-syncs.<alias>.internal` (partition 0, compacted) on the
//! cluster `offset-syncs.topic.location` names, in MM2's format (mm2-compatibility §2, §3), so MM2's
//! checkpoint task and RemoteClusterUtils-based tooling can use them as well as kmirror's.
//! Partition tasks queue syncs; the writer sends what is queued every [`INTERVAL`] in one
//! request. Syncs that fail to send stay queued.

use super::{remote_topics, Shutdown};
use crate::config::model::FlowConfig;
use crate::events::{Emitter, Event, InternalWrite, InternalWriteFailed, LastError};
use crate::metrics::{FlowLabels, Metrics};
use crate::wire::internal::OffsetSync;
use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::KafkaError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) const INTERVAL: Duration = Duration::from_millis(100);
/// Syncs per produce request at most: a sync is 28 bytes plus its topic name (≤ 249), so a
/// request stays well below the broker's default max.message.bytes (1 MiB).
const PER_REQUEST: usize = 2_000;
/// Syncs queued at most; older ones are dropped first (safe: a missing sync only makes
/// translation less precise, never wrong).
const MAX_QUEUED: usize = 200_000;

/// Syncs queued by partition tasks.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: Mutex<Vec<OffsetSync>>,
}

impl Outbox {
    pub(super) fn push(&self, syncs: Vec<OffsetSync>) {
        if !syncs.is_empty() {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.extend(syncs);
            if q.len() > MAX_QUEUED {
                let excess = q.len() - MAX_QUEUED;
                q.drain(..excess);
            }
        }
    }
    pub(super) fn take(&self, max: usize) -> Vec<OffsetSync> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let n = q.len().min(max);
        q.drain(..n).collect()
    }
    fn put_back(&self, mut syncs: Vec<OffsetSync>) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        syncs.append(&mut q);
        if syncs.len() > MAX_QUEUED {
            let excess = syncs.len() - MAX_QUEUED;
            syncs.drain(..excess);
        }
        *q = syncs;
    }
}

/// Sends queued syncs until `stop`, then once more.
pub(super) async fn run(
    flow: FlowConfig,
    cluster: Arc<KafkaCluster>,
    outbox: Arc<Outbox>,
    metrics: Arc<Metrics>,
    labels: FlowLabels,
    stop: Shutdown,
) {
    let (topic, _) = flow.offset_syncs_topic();
    let mut created = false;
    let mut last_error = LastError::default();
    loop {
        let stopping = stop.sleep(INTERVAL).await;
        loop {
            let syncs = outbox.take(PER_REQUEST);
            if syncs.is_empty() {
                break;
            }
            let result = async {
                if !created {
                    remote_topics::create_internal(
                        &cluster,
                        NewTopic {
                            name: topic.clone(),
                            partitions: 1,
                            replication_factor: flow.internal.offset_syncs_replication_factor,
                            configs: vec![("cleanup.policy".into(), "compact".into())],
                        },
                    )
                    .await?;
                    created = true;
                }
                send(&cluster, &topic, &syncs).await
            }
            .await;
            match result {
                Ok(()) => {
                    last_error.clear();
                }
                Err(e) => {
                    if last_error.is_new(&e) {
                        InternalWriteFailed {
                            flow: &flow.id,
                            what: InternalWrite::OffsetSyncs,
                            topic: &topic,
                            error: &e,
                        }
                        .emit(Emitter {
                            metrics: &metrics,
                            labels: &labels,
                        });
                    }
                    outbox.put_back(syncs);
                    break;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

async fn send(cluster: &KafkaCluster, topic: &str, syncs: &[OffsetSync]) -> Result<(), KafkaError> {
    let now = super::now_ms();
    let records = syncs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Ok(Record {
                offset: i as i64,
                timestamp: now,
                key: Some(Bytes::from(
                    s.key().map_err(|e| KafkaError::Config(e.to_string()))?,
                )),
                value: Some(Bytes::from(s.value())),
                headers: vec![],
            })
        })
        .collect::<Result<Vec<_>, KafkaError>>()?;
    let batch = encode_batch(&records, &BatchOptions::default())
        .map_err(|e| KafkaError::Config(e.to_string()))?;
    cluster.produce(topic, 0, &batch).await?;
    Ok(())
}

/// Reads offset syncs from `from` to the end, if the topic exists; the offset to read from next.
pub(super) async fn read_syncs_from(
    cluster: &KafkaCluster,
    topic: &str,
    from: Option<i64>,
    mut apply: impl FnMut(OffsetSync),
) -> Result<Option<i64>, KafkaError> {
    if !cluster.metadata().topics.contains_key(topic) {
        cluster.refresh_metadata(Some(&[topic])).await?;
        if !cluster.metadata().topics.contains_key(topic) {
            return Ok(None); // nothing replicated yet
        }
    }
    let (records, next) = super::log_reader::read_to_end(cluster, topic, 0, from).await?;
    for r in records {
        if let (Some(k), Some(v)) = (r.key.as_deref(), r.value.as_deref()) {
            if let Ok(s) = OffsetSync::decode(k, v) {
                apply(s);
            }
        }
    }
    Ok(Some(next))
}
