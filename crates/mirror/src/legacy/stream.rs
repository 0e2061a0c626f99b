//! One MM1 stream (`--num.streams` of them per process, each its own member of the source
//! consumer group, as MM1's consumer threads were): a membership task keeps the member alive
//! with heartbeats and rejoins on rebalances or when the matching topics change; a copy task
//! copies the assigned partitions and commits, to the group, only offsets whose records the
//! target acknowledged. Before each rejoin the copy task flushes and commits with the generation
//! it still holds (a Java consumer's revocation), so the next owner starts where this one ended.

use super::ledger::{Key, Ledger};
use super::route::{encode, route};
use super::targets::Targets;
use super::LegacyError;
use crate::config::legacy::LegacyConfig;
use crate::engine::Shutdown;
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::group::consumer_protocol::{parse_assignment, RangeAssignor};
use kmirror_kafka::group::{GroupConfig, GroupMember};
use kmirror_kafka::producer::{Acked, IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{decode_batch, Record};
use kmirror_kafka::{AutoOffsetReset, IsolationLevel, KafkaError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Matching source topics and their partition counts, as discovery last saw them.
pub(super) type TopicSet = Arc<BTreeMap<String, i32>>;

/// The longest an idle stream waits before fetching again (the latency it adds).
const IDLE_BACKOFF: Duration = Duration::from_millis(100);

/// What every stream of the process shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) cfg: Arc<LegacyConfig>,
    pub(super) source: Arc<KafkaCluster>,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) targets: Arc<Targets>,
    pub(super) topics: watch::Receiver<TopicSet>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    pub(super) shutdown: Shutdown,
}

#[derive(Debug)]
struct Assigned {
    generation: i32,
    member_id: String,
    partitions: Vec<Key>,
}

#[derive(Debug)]
enum Control {
    Assigned(Assigned),
    /// Stop copying, flush, commit, then answer.
    Revoke(oneshot::Sender<()>),
}

/// Runs one stream until shutdown (or a failure that stops the process).
pub(super) async fn run(shared: Arc<Shared>, index: u32) -> Result<(), LegacyError> {
    let (tx, rx) = mpsc::channel(2);
    let copier = tokio::spawn(Copier::new(shared.clone(), index).run(rx));
    let membership = membership(&shared, index, tx).await;
    let copied = copier
        .await
        .map_err(|e| LegacyError::Panicked(e.to_string()))?;
    membership.and(copied)
}

fn assignor(shared: &Shared, topics: &TopicSet) -> Arc<RangeAssignor> {
    // The leader assigns every member's topics, not only ours (a Java consumer may share the
    // group): counts of all source topics.
    let mut counts: BTreeMap<String, i32> = shared
        .source
        .metadata()
        .topics
        .iter()
        .map(|(t, m)| (t.clone(), m.partitions.len() as i32))
        .collect();
    counts.extend(topics.iter().map(|(t, n)| (t.clone(), *n)));
    Arc::new(RangeAssignor {
        topics: topics.keys().cloned().collect(),
        partition_counts: counts,
    })
}

async fn membership(
    shared: &Shared,
    index: u32,
    tx: mpsc::Sender<Control>,
) -> Result<(), LegacyError> {
    let cfg = &shared.cfg;
    let group = || cfg.group_id.clone();
    let mut topics_rx = shared.topics.clone();
    let mut subscribed = topics_rx.borrow_and_update().clone();
    let config = GroupConfig {
        group_id: cfg.group_id.clone(),
        protocol_type: "consumer".into(),
        session_timeout: cfg.session_timeout,
        rebalance_timeout: cfg.rebalance_timeout,
    };
    let mut attempt = 0;
    let mut member = loop {
        match GroupMember::join(
            shared.source.clone(),
            config.clone(),
            assignor(shared, &subscribed),
        )
        .await
        {
            Ok(m) => break m,
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "joining the group failed; retrying");
                attempt += 1;
                if shared
                    .shutdown
                    .sleep(crate::engine::backoff(attempt - 1))
                    .await
                {
                    return Ok(());
                }
            }
            Err(source) => {
                shared.shutdown.trigger();
                return Err(LegacyError::Group {
                    group: group(),
                    source,
                });
            }
        }
    };
    loop {
        let partitions: Vec<Key> = parse_assignment(member.assignment())
            .map_err(|source| LegacyError::Group {
                group: group(),
                source,
            })?
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .collect();
        tracing::info!(stream = index, group = %cfg.group_id, generation = member.generation(), leader = member.is_leader(), partitions = partitions.len(), "partitions assigned");
        let assigned = Assigned {
            generation: member.generation(),
            member_id: member.member_id().to_string(),
            partitions,
        };
        if tx.send(Control::Assigned(assigned)).await.is_err() {
            break; // the copy task stopped (a send failure)
        }
        loop {
            tokio::select! {
                _ = shared.shutdown.wait() => break,
                changed = topics_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let now = topics_rx.borrow_and_update().clone();
                    if now != subscribed {
                        tracing::info!(stream = index, topics = now.len(), "matching topics changed; rejoining");
                        subscribed = now;
                        break;
                    }
                }
                _ = tokio::time::sleep(cfg.heartbeat_interval) => match member.heartbeat().await {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(stream = index, group = %cfg.group_id, "group rebalancing");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "heartbeat failed; rejoining");
                        break;
                    }
                },
            }
        }
        let (ack, done) = oneshot::channel();
        if tx.send(Control::Revoke(ack)).await.is_ok() {
            let _ = done.await;
        }
        if shared.shutdown.is_triggered() {
            break;
        }
        member.set_assignor(assignor(shared, &subscribed));
        let mut attempt = 0;
        loop {
            match member.rejoin().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "rejoining the group failed; retrying");
                    attempt += 1;
                    if shared
                        .shutdown
                        .sleep(crate::engine::backoff(attempt - 1))
                        .await
                    {
                        return Ok(());
                    }
                }
            }
        }
    }
    drop(tx);
    if let Err(e) = member.leave().await {
        tracing::debug!(error = %e, "leaving the group failed (the session timeout will remove the member)");
    }
    Ok(())
}

#[derive(Debug)]
struct LaneState {
    lane: PartitionLane,
    /// The batches sent and not yet acknowledged, with their tags, in send order (acks come in
    /// order): what is sent again after a failure that `--abort.on.send.failure false` skips.
    unacked: VecDeque<(i64, RawBatch)>,
}

/// Where a source partition is copied from.
#[derive(Debug)]
struct Position {
    topic: String,
    partition: i32,
    next: i64,
}

struct Copier {
    sh: Arc<Shared>,
    index: u32,
    producer: Option<Arc<IdempotentProducer>>,
    lanes: HashMap<Key, LaneState>,
    ledger: Ledger,
    sticky: u32,
    generation: Option<(i32, String)>,
    positions: Vec<Position>,
    codec: Codec,
}

impl Copier {
    fn new(sh: Arc<Shared>, index: u32) -> Copier {
        let codec = Codec::from(sh.cfg.producer_tuning.compression);
        Copier {
            sh,
            index,
            producer: None,
            lanes: HashMap::new(),
            ledger: Ledger::default(),
            sticky: rand::random(),
            generation: None,
            positions: Vec::new(),
            codec,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Control>) -> Result<(), LegacyError> {
        let result = self.serve(&mut rx).await;
        if let Err(e) = &result {
            tracing::error!(stream = self.index, error = %e, "stopping");
            // Store what the target acknowledged before the process stops.
            let _ = self.finish().await;
            self.sh.shutdown.trigger();
        }
        result
    }

    async fn serve(&mut self, rx: &mut mpsc::Receiver<Control>) -> Result<(), LegacyError> {
        while let Some(msg) = rx.recv().await {
            let a = match msg {
                Control::Assigned(a) => a,
                Control::Revoke(ack) => {
                    let _ = ack.send(());
                    continue;
                }
            };
            self.generation = Some((a.generation, a.member_id));
            if !self.start(&a.partitions, rx).await? {
                continue;
            }
            let mut last_commit = Instant::now();
            loop {
                match rx.try_recv() {
                    Ok(Control::Revoke(ack)) => {
                        self.finish().await?;
                        let _ = ack.send(());
                        break;
                    }
                    Ok(Control::Assigned(_)) => {}
                    Err(mpsc::error::TryRecvError::Empty) => {}
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.finish().await?;
                        return Ok(());
                    }
                }
                let mut moved = false;
                for i in 0..self.positions.len() {
                    moved |= self.copy_once(i).await?;
                }
                if last_commit.elapsed() >= self.sh.cfg.offset_commit_interval {
                    self.flush_all().await?;
                    self.commit().await;
                    last_commit = Instant::now();
                }
                if !moved {
                    self.flush_all().await?;
                    self.sh.shutdown.sleep(IDLE_BACKOFF).await;
                }
            }
        }
        Ok(())
    }

    /// Looks up where each assigned partition starts: the group's committed offset, or
    /// `auto.offset.reset`. False when a revocation came first (it was answered).
    async fn start(
        &mut self,
        partitions: &[Key],
        rx: &mut mpsc::Receiver<Control>,
    ) -> Result<bool, LegacyError> {
        let cfg = &self.sh.cfg;
        let mut attempt = 0;
        let committed = loop {
            match self.sh.source.fetch_group_offsets(&cfg.group_id).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(stream = self.index, error = %e, "reading committed offsets failed; retrying");
                    attempt += 1;
                    self.sh
                        .shutdown
                        .sleep(crate::engine::backoff(attempt - 1))
                        .await;
                    if let Ok(Control::Revoke(ack)) = rx.try_recv() {
                        let _ = ack.send(());
                        return Ok(false);
                    }
                }
            }
        };
        self.positions.clear();
        for (topic, partition) in partitions {
            let next = match committed.get(topic).and_then(|m| m.get(partition)) {
                Some(c) => c.offset,
                None => self.reset(topic, *partition, None).await?,
            };
            tracing::debug!(topic, partition, next, "starting");
            self.positions.push(Position {
                topic: topic.clone(),
                partition: *partition,
                next,
            });
        }
        Ok(true)
    }

    /// `auto.offset.reset` for a partition without a usable position; `bounds` are the log's
    /// start and end when known (after OFFSET_OUT_OF_RANGE).
    async fn reset(
        &self,
        topic: &str,
        partition: i32,
        bounds: Option<(i64, i64)>,
    ) -> Result<i64, LegacyError> {
        let tuning = &self.sh.cfg.consumer_tuning;
        let at = match tuning.auto_offset_reset {
            AutoOffsetReset::Earliest => EARLIEST,
            AutoOffsetReset::Latest => LATEST,
            AutoOffsetReset::None => {
                return Err(LegacyError::NoOffset {
                    group: self.sh.cfg.group_id.clone(),
                    topic: topic.into(),
                    partition,
                })
            }
        };
        if let Some((start, end)) = bounds {
            return Ok(if at == EARLIEST { start } else { end });
        }
        let mut attempt = 0;
        loop {
            match self
                .sh
                .source
                .list_offset(topic, partition, at, tuning.isolation_level)
                .await
            {
                Ok(o) => return Ok(o),
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "looking up the start offset failed; retrying");
                    attempt += 1;
                    if self
                        .sh
                        .shutdown
                        .sleep(crate::engine::backoff(attempt - 1))
                        .await
                    {
                        return Ok(0);
                    }
                }
            }
        }
    }

    fn count_error(&self, kind: &str) {
        self.sh
            .metrics
            .errors
            .get_or_create(&self.sh.labels.error(kind))
            .inc();
    }

    /// Fetches once from position `i` and sends what it got; true if the position moved.
    async fn copy_once(&mut self, i: usize) -> Result<bool, LegacyError> {
        let cfg = self.sh.cfg.clone();
        let tuning = &cfg.consumer_tuning;
        let (topic, partition, next) = {
            let p = &self.positions[i];
            (p.topic.clone(), p.partition, p.next)
        };
        let fetched = self
            .sh
            .source
            .fetch(
                &topic,
                partition,
                next,
                tuning.max_partition_fetch_bytes,
                // Partitions share a connection per broker, and a broker answers one request per
                // connection at a time: no long poll (see engine::partition).
                Duration::ZERO,
                tuning.isolation_level,
            )
            .await;
        let f = match fetched {
            Ok(f) => f,
            Err(KafkaError::OffsetOutOfRange {
                requested,
                log_start,
                log_end,
                ..
            }) => {
                let to = self
                    .reset(&topic, partition, Some((log_start, log_end)))
                    .await?;
                if requested < log_start {
                    self.count_error("truncation");
                    tracing::error!(topic, partition, requested, log_start, lost = log_start - requested, "the source deleted records before they were copied; continuing per auto.offset.reset");
                } else {
                    tracing::warn!(
                        topic,
                        partition,
                        requested,
                        log_end,
                        "position outside the source log; continuing per auto.offset.reset"
                    );
                }
                self.positions[i].next = to;
                return Ok(true);
            }
            Err(e) => {
                self.count_error("fetch");
                tracing::debug!(topic, partition, error = %e, "fetch failed; will retry");
                return Ok(false);
            }
        };
        let batches: Vec<&RawBatch> = match tuning.isolation_level {
            IsolationLevel::ReadCommitted => f.committed_batches(),
            IsolationLevel::ReadUncommitted => {
                f.batches.iter().filter(|b| !b.is_control()).collect()
            }
        };
        let mut records: Vec<(String, Record)> = Vec::new();
        let mut newest_ts = None;
        for b in batches {
            let decoded = decode_batch(b).map_err(|e| LegacyError::Records {
                topic: topic.clone(),
                partition,
                offset: b.base_offset(),
                message: e.to_string(),
            })?;
            for r in decoded.into_iter().filter(|r| r.offset >= next) {
                newest_ts = Some(r.timestamp);
                if let Some((t, r)) = cfg.transforms.apply(&topic, r) {
                    records.push((t.into_owned(), r));
                }
            }
        }
        let Some(end) = f.batches.last().map(|b| (b.last_offset() + 1).max(next)) else {
            return Ok(false);
        };
        let labels = self.sh.labels.partition(&topic, partition);
        let log_end = match tuning.isolation_level {
            IsolationLevel::ReadCommitted => f.last_stable_offset,
            IsolationLevel::ReadUncommitted => f.high_watermark,
        };
        self.sh
            .metrics
            .lag_records
            .get_or_create(&labels)
            .set((log_end - end).max(0));
        if let Some(ts) = newest_ts {
            self.sh
                .metrics
                .record_age_ms
                .get_or_create(&labels)
                .set(crate::engine::now_ms() - ts);
        }
        // Partition counts of the target topics named, creating missing topics.
        let mut counts: HashMap<String, i32> = HashMap::new();
        for (t, _) in &records {
            if counts.contains_key(t) {
                continue;
            }
            match self.sh.targets.partitions(t, &topic).await {
                Ok(n) => {
                    counts.insert(t.clone(), n);
                }
                Err(e) => {
                    self.count_error("target_topic");
                    tracing::warn!(stream = self.index, error = %e, "cannot write to the target topic yet; will retry");
                    self.sh.shutdown.sleep(Duration::from_secs(1)).await;
                    return Ok(false);
                }
            }
        }
        let copied = records.len() as u64;
        let routed = route(records, &counts, self.sticky);
        self.sticky = self.sticky.wrapping_add(1);
        let prod = &cfg.producer_tuning;
        let mut out: Vec<(Key, RawBatch)> = Vec::new();
        for (key, recs) in routed {
            let batches = encode(
                &recs,
                self.codec,
                prod.batch_size.max(1) as usize,
                prod.max_request_size as usize,
            )
            .map_err(|message| LegacyError::Records {
                topic: topic.clone(),
                partition,
                offset: next,
                message,
            })?;
            out.extend(batches.into_iter().map(|b| (key.clone(), b)));
        }
        let tag = self
            .ledger
            .open(&(topic.clone(), partition), end, out.len() as u32);
        for (key, batch) in out {
            self.sh
                .metrics
                .byte_count
                .get_or_create(&labels)
                .inc_by(batch.bytes().len() as u64);
            self.send(key, tag, batch).await?;
        }
        self.sh
            .metrics
            .record_count
            .get_or_create(&labels)
            .inc_by(copied);
        self.positions[i].next = end;
        Ok(true)
    }

    async fn producer(&mut self) -> Result<Arc<IdempotentProducer>, LegacyError> {
        if let Some(p) = &self.producer {
            return Ok(p.clone());
        }
        let mut attempt = 0;
        loop {
            match IdempotentProducer::new(self.sh.target.clone()).await {
                Ok(p) => {
                    self.producer = Some(p.clone());
                    return Ok(p);
                }
                Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                    tracing::warn!(error = %e, "initialising the producer failed; retrying");
                    attempt += 1;
                    self.sh
                        .shutdown
                        .sleep(crate::engine::backoff(attempt - 1))
                        .await;
                }
                Err(source) => {
                    return Err(LegacyError::Send {
                        topic: "(producer)".into(),
                        partition: -1,
                        source,
                    })
                }
            }
        }
    }

    /// Sends a batch; with `--abort.on.send.failure false`, a batch the target refuses is given
    /// up and the batches sent after it go again on a fresh lane.
    async fn send(&mut self, key: Key, tag: i64, batch: RawBatch) -> Result<(), LegacyError> {
        let mut queue: VecDeque<(i64, RawBatch)> = VecDeque::from([(tag, batch)]);
        while let Some((tag, batch)) = queue.pop_front() {
            let producer = self.producer().await?;
            let max = self.sh.cfg.producer_tuning.max_request_size as usize;
            let st = self.lanes.entry(key.clone()).or_insert_with(|| LaneState {
                lane: producer.lane(&key.0, key.1).with_limits(max, 4 << 20),
                unacked: VecDeque::new(),
            });
            st.unacked.push_back((tag, batch.clone()));
            match st.lane.send(tag, batch).await {
                Ok(acked) => self.acked(&key, acked),
                Err(e) => {
                    let again = self.send_failed(&key, e)?;
                    queue = again.into_iter().chain(queue).collect();
                }
            }
        }
        Ok(())
    }

    fn acked(&mut self, key: &Key, acked: Vec<Acked>) {
        if let Some(st) = self.lanes.get_mut(key) {
            for a in acked {
                st.unacked.pop_front();
                self.ledger.ack(a.tag);
            }
        }
    }

    /// A batch the target refused, or did not acknowledge within the delivery timeout. Stops
    /// the stream (`--abort.on.send.failure true`), or gives that batch up, logged and counted,
    /// and returns the later unacknowledged batches to send again.
    fn send_failed(
        &mut self,
        key: &Key,
        e: KafkaError,
    ) -> Result<Vec<(i64, RawBatch)>, LegacyError> {
        self.count_error("send");
        if self.sh.cfg.abort_on_send_failure {
            return Err(LegacyError::Send {
                topic: key.0.clone(),
                partition: key.1,
                source: e,
            });
        }
        let reason = e.to_string();
        let (failed, again) = match e {
            // Refused before sending: the batch just queued; the lane itself is fine.
            KafkaError::BatchTooLarge { .. } => {
                let failed = self.lanes.get_mut(key).and_then(|st| st.unacked.pop_back());
                (failed, Vec::new())
            }
            // The oldest unacknowledged batch failed, and the lane gave up: the broker wrote
            // none of the later ones (their sequence numbers follow the refused batch), so they
            // go again under a new producer id.
            _ => {
                let mut unacked = self
                    .lanes
                    .remove(key)
                    .map(|s| s.unacked)
                    .unwrap_or_default();
                self.producer = None;
                (unacked.pop_front(), unacked.into_iter().collect())
            }
        };
        if let Some((tag, batch)) = failed {
            self.ledger.ack(tag);
            self.sh
                .metrics
                .errors
                .get_or_create(&self.sh.labels.error("records_skipped"))
                .inc_by(batch.record_count().max(0) as u64);
            tracing::error!(topic = %key.0, partition = key.1, records = batch.record_count(), error = %reason, "send failed; records skipped (--abort.on.send.failure false)");
        }
        Ok(again)
    }

    async fn flush_all(&mut self) -> Result<(), LegacyError> {
        loop {
            let keys: Vec<Key> = self
                .lanes
                .iter()
                .filter(|(_, s)| !s.unacked.is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            if keys.is_empty() {
                return Ok(());
            }
            for key in keys {
                let Some(st) = self.lanes.get_mut(&key) else {
                    continue;
                };
                match st.lane.flush().await {
                    Ok(acked) => self.acked(&key, acked),
                    Err(e) => {
                        for (tag, batch) in self.send_failed(&key, e)? {
                            self.send(key.clone(), tag, batch).await?;
                        }
                    }
                }
            }
        }
    }

    /// Commits the offsets whose records the target acknowledged, as this member.
    async fn commit(&mut self) {
        let Some((generation, member_id)) = self.generation.clone() else {
            return;
        };
        let ready = self.ledger.take_commits();
        if ready.is_empty() {
            return;
        }
        let offsets: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = ready
            .iter()
            .map(|(t, ps)| {
                (
                    t.clone(),
                    ps.iter()
                        .map(|(p, o)| {
                            (
                                *p,
                                CommittedOffset {
                                    offset: *o,
                                    leader_epoch: -1,
                                    metadata: String::new(),
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        match self
            .sh
            .source
            .commit_member_offsets(&self.sh.cfg.group_id, generation, &member_id, &offsets)
            .await
        {
            Ok(()) => {
                self.sh
                    .metrics
                    .positions_stored
                    .get_or_create(&self.sh.labels)
                    .inc();
                tracing::debug!(
                    stream = self.index,
                    partitions = offsets.values().map(BTreeMap::len).sum::<usize>(),
                    "offsets committed"
                );
            }
            Err(e) => {
                self.count_error("commit");
                tracing::warn!(stream = self.index, error = %e, "offset commit refused; the records after the last commit may be copied again");
                self.ledger.restore(ready);
            }
        }
    }

    /// Flushes and commits everything, then forgets the assignment.
    async fn finish(&mut self) -> Result<(), LegacyError> {
        let flushed = self.flush_all().await;
        self.commit().await;
        self.ledger.clear();
        self.positions.clear();
        flushed
    }
}
