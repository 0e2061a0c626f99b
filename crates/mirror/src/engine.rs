//! The replication engine, first increment: for each served flow, discover topics, create the
//! remote topics on the target, and copy every source partition to the same partition of its
//! remote topic.
//!
//! - Batch mode (whole fetched batches forwarded with only their header rewritten, the compressed
//!   records untouched) whenever a batch can be forwarded as is; record mode (decode, re-encode
//!   with the producer's codec) for batches with offset gaps (compaction), LogAppendTime batches
//!   (so every record keeps its append time) and a first batch that starts before the position.
//! - read_committed by default: control batches and aborted transactions are not copied.
//! - Positions are stored in MM2's own topic and format (`mm2-offsets.<source>.internal`) only
//!   after the target acknowledged every record before them: nothing is lost across crashes, and
//!   MM2 and kmirror can take over from each other.
//!
//! Not yet (issue 4 continues): sharing partitions among processes, periodic re-discovery, topic
//! configs, heartbeats, offset syncs, metrics.

use crate::config::model::{FlowConfig, MirrorConfig};
use crate::discovery;
use crate::wire::positions::{positions_partition, SourcePosition};
use bytes::Bytes;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, EARLIEST, LATEST};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{decode_batch, encode_batch, BatchOptions, Record};
use kmirror_kafka::{AutoOffsetReset, IsolationLevel, KafkaError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Engine failures (configuration problems found at connect time, or fatal client errors).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("flow {flow}: {source}")]
    Kafka {
        flow: String,
        #[source]
        source: KafkaError,
    },
    #[error("flow {flow}: source and target are the same cluster (cluster id {cluster_id}) behind different addresses; replicating a cluster into itself would copy its data forever")]
    SameCluster { flow: String, cluster_id: String },
}

/// Counters the tests and (later) the metrics endpoint read.
#[derive(Debug, Default)]
pub struct Stats {
    pub batches_forwarded: AtomicU64,
    pub batches_reencoded: AtomicU64,
    pub records: AtomicU64,
    pub positions_stored: AtomicU64,
}

/// Stops the engine: set it, and every partition task drains and stores its position.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs every served, replicating flow until `shutdown` is triggered.
pub async fn run(
    config: &MirrorConfig,
    shutdown: Shutdown,
    stats: Arc<Stats>,
) -> Result<(), EngineError> {
    let mut tasks = Vec::new();
    for flow in config.served_flows().filter(|f| f.replication) {
        let flow = flow.clone();
        let (shutdown, stats) = (shutdown.clone(), stats.clone());
        tasks.push(tokio::spawn(async move {
            run_flow(flow, shutdown, stats).await
        }));
    }
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shutdown.trigger();
                first_error.get_or_insert(e);
            }
            Err(join) => tracing::error!(error = %join, "flow task panicked"),
        }
    }
    first_error.map_or(Ok(()), Err)
}

async fn run_flow(
    flow: FlowConfig,
    shutdown: Shutdown,
    stats: Arc<Stats>,
) -> Result<(), EngineError> {
    let name = flow.id.to_string();
    let k = |source| EngineError::Kafka {
        flow: name.clone(),
        source,
    };
    let source = Arc::new(
        KafkaCluster::connect(flow.clients.source_consumer.clone())
            .await
            .map_err(k)?,
    );
    let target = Arc::new(
        KafkaCluster::connect(flow.clients.target_producer.clone())
            .await
            .map_err(k)?,
    );
    let (src_id, tgt_id) = (
        source.metadata().cluster_id.clone(),
        target.metadata().cluster_id.clone(),
    );
    if let (Some(a), Some(b)) = (&src_id, &tgt_id) {
        if a == b {
            return Err(EngineError::SameCluster {
                flow: name,
                cluster_id: a.clone(),
            });
        }
    }
    tracing::info!(flow = %name, source_cluster = ?src_id, target_cluster = ?tgt_id, "flow started");

    // Positions topic (MM2's Connect offsets topic) and the positions stored in it.
    let positions_topic = flow.internal.positions_topic.clone();
    ensure_topic(
        &target,
        &positions_topic,
        flow.internal.positions_partitions,
        flow.internal.positions_replication_factor,
        &[("cleanup.policy", "compact")],
    )
    .await
    .map_err(k)?;
    let stored = load_positions(&target, &positions_topic, flow.id.source.as_str())
        .await
        .map_err(k)?;

    // Topics to replicate, and their remote topics on the target.
    let md = source.metadata();
    let decisions = discovery::decide(&flow, md.topics.keys().map(String::as_str));
    let producer = IdempotentProducer::new(target.clone()).await.map_err(k)?;
    let mut tasks = Vec::new();
    for d in decisions {
        let Some(remote) = d.remote else {
            tracing::debug!(flow = %name, topic = %d.source, skip = ?d.skip, "not replicated");
            continue;
        };
        let partitions = md.topics[&d.source].partitions.len() as i32;
        ensure_topic(&target, &remote, partitions, flow.replication_factor, &[])
            .await
            .map_err(k)?;
        tracing::info!(flow = %name, topic = %d.source, remote = %remote, partitions, "replicating topic");
        for p in 0..partitions {
            let task = PartitionTask {
                flow: flow.clone(),
                source: source.clone(),
                target: target.clone(),
                producer: producer.clone(),
                topic: d.source.clone(),
                remote: remote.clone(),
                partition: p,
                stored: stored.get(&(d.source.clone(), p)).copied(),
                positions_topic: positions_topic.clone(),
                shutdown: shutdown.clone(),
                stats: stats.clone(),
            };
            tasks.push(tokio::spawn(task.run()));
        }
    }
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(flow = %name, error = %e, "partition stopped"),
            Err(e) => tracing::error!(flow = %name, error = %e, "partition task panicked"),
        }
    }
    Ok(())
}

/// Creates a topic unless it exists; a remote topic with fewer partitions than its source is
/// grown.
async fn ensure_topic(
    k: &KafkaCluster,
    topic: &str,
    partitions: i32,
    rf: i16,
    configs: &[(&str, &str)],
) -> Result<(), KafkaError> {
    if let Some(t) = k.metadata().topics.get(topic) {
        if (t.partitions.len() as i32) < partitions {
            k.create_partitions(topic, partitions, false).await?;
        }
        return Ok(());
    }
    let new = NewTopic {
        name: topic.into(),
        partitions,
        replication_factor: rf,
        configs: configs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    };
    for (name, err) in k.create_topics(&[new], false).await? {
        match err {
            None => tracing::info!(topic = %name, partitions, "created topic"),
            Some(KafkaError::Broker {
                error: kafka_protocol::error::ResponseError::TopicAlreadyExists,
                ..
            }) => {}
            Some(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads every position of `cluster` from the positions topic (last record per key wins).
async fn load_positions(
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
        let end = k
            .list_offset(topic, p, LATEST, IsolationLevel::ReadUncommitted)
            .await?;
        let mut offset = k
            .list_offset(topic, p, EARLIEST, IsolationLevel::ReadUncommitted)
            .await?;
        while offset < end {
            let f = k
                .fetch(
                    topic,
                    p,
                    offset,
                    1 << 20,
                    Duration::from_millis(100),
                    IsolationLevel::ReadUncommitted,
                )
                .await?;
            if f.batches.is_empty() {
                break;
            }
            for b in &f.batches {
                offset = b.last_offset() + 1;
                if b.is_control() {
                    continue;
                }
                for r in decode_batch(b).map_err(|e| KafkaError::Config(e.to_string()))? {
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
        }
    }
    Ok(out)
}

struct PartitionTask {
    flow: FlowConfig,
    source: Arc<KafkaCluster>,
    target: Arc<KafkaCluster>,
    producer: Arc<IdempotentProducer>,
    topic: String,
    remote: String,
    partition: i32,
    stored: Option<i64>,
    positions_topic: String,
    shutdown: Shutdown,
    stats: Arc<Stats>,
}

impl PartitionTask {
    async fn run(self) -> Result<(), KafkaError> {
        let tuning = &self.flow.clients.consumer_tuning;
        let isolation = tuning.isolation_level;
        // MM2 resumes at stored + 1; without a position, auto.offset.reset decides.
        let mut next = match self.stored {
            Some(o) if o >= 0 => o + 1,
            _ => match tuning.auto_offset_reset {
                AutoOffsetReset::Latest => {
                    self.source
                        .list_offset(&self.topic, self.partition, LATEST, isolation)
                        .await?
                }
                _ => {
                    self.source
                        .list_offset(&self.topic, self.partition, EARLIEST, isolation)
                        .await?
                }
            },
        };
        let mut lane = self
            .producer
            .lane(&self.remote, self.partition)
            .with_limits(
                self.flow.clients.producer_tuning.max_request_size as usize,
                16 << 20,
            );
        let codec = Codec::from(self.flow.clients.producer_tuning.compression);
        while !self.shutdown.is_triggered() {
            let f = match self
                .source
                .fetch(
                    &self.topic,
                    self.partition,
                    next,
                    tuning.max_partition_fetch_bytes,
                    tuning.fetch_max_wait.min(Duration::from_millis(500)),
                    isolation,
                )
                .await
            {
                Ok(f) => f,
                Err(KafkaError::OffsetOutOfRange {
                    log_start,
                    log_end,
                    requested,
                    ..
                }) => {
                    // Never skip silently (issue 4): report how many offsets were lost and stop.
                    tracing::error!(topic = %self.topic, partition = self.partition, requested, log_start, log_end, lost = log_start - requested, "source position is below the log start: records were deleted before they were copied; partition stopped");
                    return Err(KafkaError::OffsetOutOfRange {
                        topic: self.topic.clone(),
                        partition: self.partition,
                        requested,
                        log_start,
                        log_end,
                    });
                }
                Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                    tracing::warn!(topic = %self.topic, partition = self.partition, error = %e, "fetch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let batches: Vec<&RawBatch> = match isolation {
                IsolationLevel::ReadCommitted => f.committed_batches(),
                IsolationLevel::ReadUncommitted => {
                    f.batches.iter().filter(|b| !b.is_control()).collect()
                }
            };
            let mut last_copied = None;
            for b in batches {
                let records = (b.last_offset() + 1 - next.max(b.base_offset())).max(0) as u64;
                if b.base_offset() >= next && b.offsets_contiguous() && !b.is_log_append_time() {
                    lane.send(b.last_offset(), b.clone()).await?;
                    self.stats.batches_forwarded.fetch_add(1, Ordering::Relaxed);
                } else {
                    let kept: Vec<Record> = decode_batch(b)
                        .map_err(|e| {
                            KafkaError::Config(format!("{}-{}: {e}", self.topic, self.partition))
                        })?
                        .into_iter()
                        .filter(|r| r.offset >= next)
                        .enumerate()
                        .map(|(i, mut r)| {
                            r.offset = i as i64;
                            r
                        })
                        .collect();
                    if !kept.is_empty() {
                        let batch = encode_batch(
                            &kept,
                            &BatchOptions {
                                codec,
                                ..BatchOptions::default()
                            },
                        )
                        .map_err(|e| KafkaError::Config(e.to_string()))?;
                        lane.send(b.last_offset(), batch).await?;
                        self.stats.batches_reencoded.fetch_add(1, Ordering::Relaxed);
                    }
                }
                self.stats.records.fetch_add(records, Ordering::Relaxed);
                last_copied = Some(b.last_offset());
            }
            // Also skip past control batches and aborted data at the end of the response.
            let fetched_end = f.batches.last().map(|b| b.last_offset() + 1);
            if let Some(last) = last_copied {
                // Store the position only once the target acknowledged everything before it.
                lane.flush().await?;
                self.store_position(last).await?;
            }
            match fetched_end {
                Some(end) => next = next.max(end),
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        lane.flush().await?;
        Ok(())
    }

    async fn store_position(&self, last: i64) -> Result<(), KafkaError> {
        let pos = SourcePosition {
            cluster: self.flow.id.source.to_string(),
            topic: self.topic.clone(),
            partition: self.partition,
            offset: last,
        };
        let key = pos.key();
        let partitions = self
            .target
            .metadata()
            .topics
            .get(&self.positions_topic)
            .map_or(1, |t| t.partitions.len() as i32);
        let record = Record {
            offset: 0,
            timestamp: now_ms(),
            key: Some(Bytes::from(key.clone())),
            value: Some(Bytes::from(pos.value())),
            headers: vec![],
        };
        let batch = encode_batch(&[record], &BatchOptions::default())
            .map_err(|e| KafkaError::Config(e.to_string()))?;
        self.target
            .produce(
                &self.positions_topic,
                positions_partition(&key, partitions),
                &batch,
            )
            .await?;
        self.stats.positions_stored.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
