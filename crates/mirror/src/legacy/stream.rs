//! One MM1 stream (`--num.streams` of them per process, each its own member of the source
//! consumer group, as MM1's consumer threads were): a membership task keeps the member alive
//! with heartbeats and rejoins on rebalances or when the matching topics change; a copy task
//! copies the assigned partitions and commits, to the group, only offsets whose records the
//! target acknowledged. Before each rejoin the copy task flushes and commits with the generation
//! it still holds (a Java consumer's revocation), so the next owner starts where this one ended.
//!
//! The copy task reads through the process's [`Fetcher`] (one fetch session per source broker,
//! the broker's long poll while idle, `buffer.memory` as the bound on fetched data), as MM2 mode
//! does: each assigned partition's subscription is drained by a small forwarding task into one
//! queue the copy task takes from.
//!
//! Why one file of this size: the membership task and the `Copier` are the two sides of one
//! revoke handshake (`Control::Revoke` is answered only after a flush and a commit), and the
//! copier's methods share its lanes, ledger, positions and `stopping`/`cancelled` flags. Next to
//! split out: the membership side (`membership`, `assignor`) into `stream/membership.rs`.

use super::ledger::{Key, Ledger};
use super::targets::Targets;
use super::LegacyError;
use crate::config::legacy::LegacyConfig;
use crate::copy::route::{encode, route};
use crate::engine::throttle::RateLimiter;
use crate::engine::Shutdown;
use crate::events::legacy::{
    CommitRefused, NotFetchedBecause, PartitionNotFetched, RecordsDeletedUncopied, RecordsSkipped,
    SendFailed, TargetTopicUnavailable,
};
// `as _`: this module has an `Event` of its own (what a partition's fetch brought).
use crate::events::{Emitter, Event as _};
use crate::metrics::{FlowLabels, Metrics, PartitionSeries};
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, PartitionFetch, EARLIEST, LATEST};
use kmirror_kafka::fetcher::{BufferShare, FetchEvent, Fetcher, Subscription};
use kmirror_kafka::group::consumer_protocol::{parse_assignment, RangeAssignor};
use kmirror_kafka::group::{GroupConfig, GroupMember};
use kmirror_kafka::producer::{Acked, IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{decode_batch_within, Record};
use kmirror_kafka::{AutoOffsetReset, IsolationLevel, KafkaError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

/// Matching source topics and their partition counts, as discovery last saw them.
pub(super) type TopicSet = Arc<BTreeMap<String, i32>>;

/// What every stream of the process shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) cfg: Arc<LegacyConfig>,
    pub(super) source: Arc<KafkaCluster>,
    /// Every stream's partitions are fetched through it (one session per source broker).
    pub(super) fetcher: Arc<Fetcher>,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) targets: Arc<Targets>,
    pub(super) topics: watch::Receiver<TopicSet>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    pub(super) shutdown: Shutdown,
    /// `--rate.limit.bytes.per.second`, shared by every stream.
    pub(super) limiter: Option<Arc<RateLimiter>>,
    /// Each stream's partitions of its last assignment: `kmirror_topics` and
    /// `kmirror_partitions` count this process's share, not the group's.
    pub(super) shares: std::sync::Mutex<BTreeMap<u32, Vec<Key>>>,
}

impl Shared {
    /// Records stream `index`'s partitions and publishes the process's share.
    fn record_share(&self, index: u32, partitions: &[Key]) {
        let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        shares.insert(index, partitions.to_vec());
        let all: std::collections::BTreeSet<&Key> = shares.values().flatten().collect();
        let topics: std::collections::BTreeSet<&str> =
            all.iter().map(|(t, _)| t.as_str()).collect();
        self.metrics
            .topics
            .get_or_create(&self.labels)
            .set(topics.len() as i64);
        self.metrics
            .partitions
            .get_or_create(&self.labels)
            .set(all.len() as i64);
    }
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
    shared.record_share(index, &[]);
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
        instance_id: None,
    };
    let mut attempt = 0u32;
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
                if shared.shutdown.retry_after(&mut attempt).await {
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
        shared.record_share(index, &partitions);
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
        let mut attempt = 0u32;
        loop {
            match member.rejoin().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(stream = index, group = %cfg.group_id, error = %e, "rejoining the group failed; retrying");
                    if shared.shutdown.retry_after(&mut attempt).await {
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
    /// Its record, byte, lag and age series, taken once (a lookup takes the metrics' lock).
    series: PartitionSeries,
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
    /// The process is stopping and a chunk was left unsent: no later event may be handled, or
    /// a later chunk's commit would pass over the unsent one.
    stopping: bool,
    /// A send or flush was cancelled by the stop: the lanes' bookkeeping may be partial, so
    /// nothing is flushed any more (what was acknowledged and recorded is still committed).
    cancelled: bool,
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
            stopping: false,
            cancelled: false,
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
            let (mut events, mut forwarders) = self.subscribe();
            let interval = self.sh.cfg.offset_commit_interval;
            let mut next_commit = tokio::time::Instant::now() + interval;
            loop {
                tokio::select! {
                    biased;
                    msg = rx.recv() => match msg {
                        Some(Control::Revoke(ack)) => {
                            forwarders.abort_all();
                            self.finish().await?;
                            let _ = ack.send(());
                            break;
                        }
                        Some(Control::Assigned(_)) => {}
                        None => {
                            forwarders.abort_all();
                            self.finish().await?;
                            return Ok(());
                        }
                    },
                    Some(joined) = forwarders.join_next() => {
                        if let Err(e) = joined {
                            if e.is_panic() {
                                return Err(LegacyError::Panicked(e.to_string()));
                            }
                        }
                    }
                    Some((i, event)) = events.recv(), if !self.stopping => {
                        let stop = self.sh.shutdown.clone();
                        tokio::select! {
                            biased;
                            handled = self.handle(i, event) => handled?,
                            // Stopping while the target does not answer: a chunk not fully
                            // acknowledged is not committed, so it is copied again after a
                            // restart (at-least-once, nothing lost).
                            _ = stop.wait() => {
                                self.stopping = true;
                                self.cancelled = true;
                            }
                        }
                    }
                    _ = tokio::time::sleep_until(next_commit) => {
                        let stop = self.sh.shutdown.clone();
                        tokio::select! {
                            flushed = self.flush_all() => {
                                flushed?;
                                self.commit().await;
                            }
                            // A target that does not answer holds the flush for up to the
                            // delivery timeout: the revocation that follows a stop commits what
                            // was acknowledged (`finish`).
                            _ = stop.wait() => {
                                self.stopping = true;
                                self.cancelled = true;
                            }
                        }
                        next_commit = tokio::time::Instant::now() + interval;
                    }
                }
            }
        }
        Ok(())
    }

    /// Subscribes every assigned partition at its position; each subscription's events come
    /// out of the returned queue, tagged with the partition's index in `positions`.
    fn subscribe(&self) -> (mpsc::Receiver<(usize, Event)>, JoinSet<()>) {
        let (tx, rx) = mpsc::channel(16);
        let mut forwarders = JoinSet::new();
        let policy = self.sh.cfg.consumer_tuning.auto_offset_reset;
        for (i, p) in self.positions.iter().enumerate() {
            match self.sh.fetcher.subscribe(&p.topic, p.partition, p.next) {
                Ok(sub) => {
                    forwarders.spawn(forward(
                        i,
                        sub,
                        policy,
                        self.sh.limiter.clone(),
                        self.sh.shutdown.clone(),
                        tx.clone(),
                    ));
                }
                Err(e) => PartitionNotFetched {
                    topic: &p.topic,
                    partition: p.partition,
                    because: NotFetchedBecause::Subscribe,
                    error: &e,
                }
                .emit(self.emitter()),
            }
        }
        (rx, forwarders)
    }

    /// Looks up where each assigned partition starts: the group's committed offset, or
    /// `auto.offset.reset`. False when a revocation came first (it was answered).
    async fn start(
        &mut self,
        partitions: &[Key],
        rx: &mut mpsc::Receiver<Control>,
    ) -> Result<bool, LegacyError> {
        let cfg = &self.sh.cfg;
        let mut attempt = 0u32;
        let committed = loop {
            match self.sh.source.fetch_group_offsets(&cfg.group_id).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(stream = self.index, error = %e, "reading committed offsets failed; retrying");
                    // Stopping: the revocation that follows is answered by the caller.
                    if self.sh.shutdown.retry_after(&mut attempt).await {
                        return Ok(false);
                    }
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
                None => match self.reset(topic, *partition).await? {
                    Some(o) => o,
                    None => return Ok(false), // stopping
                },
            };
            tracing::debug!(topic, partition, next, "starting");
            let series = self
                .sh
                .metrics
                .partition_series(&self.sh.labels.partition(topic, *partition));
            self.positions.push(Position {
                topic: topic.clone(),
                partition: *partition,
                next,
                series,
            });
        }
        Ok(true)
    }

    /// `auto.offset.reset` for a partition without a committed offset; None when the process
    /// stops first.
    async fn reset(&self, topic: &str, partition: i32) -> Result<Option<i64>, LegacyError> {
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
        let mut attempt = 0u32;
        loop {
            match self
                .sh
                .source
                .list_offset_batched(topic, partition, at, tuning.isolation_level)
                .await
            {
                Ok(o) => return Ok(Some(o)),
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "looking up the start offset failed; retrying");
                    if self.sh.shutdown.retry_after(&mut attempt).await {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn emitter(&self) -> Emitter<'_> {
        Emitter {
            metrics: &self.sh.metrics,
            labels: &self.sh.labels,
        }
    }

    /// Takes one event of partition `i`.
    async fn handle(&mut self, i: usize, event: Event) -> Result<(), LegacyError> {
        let (topic, partition) = {
            let p = &self.positions[i];
            (p.topic.clone(), p.partition)
        };
        match event {
            Event::Data(f, share) => {
                self.copy(i, &f).await?;
                // Fetched bytes count against buffer.memory until their batches are handed to
                // the producer, whose lanes bound what is in flight.
                drop(share);
            }
            Event::Reset {
                requested,
                log_start,
                log_end,
                to,
            } => {
                if requested < log_start {
                    RecordsDeletedUncopied {
                        topic: &topic,
                        partition,
                        requested,
                        log_start,
                    }
                    .emit(self.emitter());
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
            }
            Event::NoOffset => {
                return Err(LegacyError::NoOffset {
                    group: self.sh.cfg.group_id.clone(),
                    topic,
                    partition,
                })
            }
            Event::Failed(e) => PartitionNotFetched {
                topic: &topic,
                partition,
                because: NotFetchedBecause::Failed,
                error: &e,
            }
            .emit(self.emitter()),
        }
        Ok(())
    }

    /// Sends what was fetched from position `i`, then moves the position past it.
    async fn copy(&mut self, i: usize, f: &PartitionFetch) -> Result<(), LegacyError> {
        let cfg = self.sh.cfg.clone();
        let tuning = &cfg.consumer_tuning;
        let (topic, partition, next) = {
            let p = &self.positions[i];
            (p.topic.clone(), p.partition, p.next)
        };
        let batches = f.visible(tuning.isolation_level);
        let mut records: Vec<(String, Record)> = Vec::new();
        let mut newest_ts = None;
        for b in batches {
            let limit = cfg.consumer_tuning.default_max_decompressed();
            let decoded = decode_batch_within(b, limit).map_err(|e| LegacyError::Records {
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
            return Ok(());
        };
        let series = self.positions[i].series.clone();
        let log_end = match tuning.isolation_level {
            IsolationLevel::ReadCommitted => f.last_stable_offset,
            IsolationLevel::ReadUncommitted => f.high_watermark,
        };
        series.lag.set((log_end - end).max(0));
        if let Some(ts) = newest_ts {
            series.age_ms.set(crate::engine::now_ms() - ts);
        }
        // Partition counts of the target topics named, creating missing topics.
        let mut counts: HashMap<String, i32> = HashMap::new();
        for (t, _) in &records {
            let mut attempt = 0u32;
            while !counts.contains_key(t) {
                match self.sh.targets.partitions(t, &topic).await {
                    Ok(n) => {
                        counts.insert(t.clone(), n);
                    }
                    Err(e) => {
                        TargetTopicUnavailable {
                            stream: self.index,
                            error: &e,
                        }
                        .emit(self.emitter());
                        // Stopping: nothing of this chunk was sent, and its position was not
                        // committed, so it is copied again after a restart.
                        if self.sh.shutdown.retry_after(&mut attempt).await {
                            self.stopping = true;
                            return Ok(());
                        }
                    }
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
            series.bytes.inc_by(batch.bytes().len() as u64);
            self.send(key, tag, batch).await?;
        }
        series.records.inc_by(copied);
        self.positions[i].next = end;
        Ok(())
    }

    /// The stream's producer; None when the process stops before the target answers.
    async fn producer(&mut self) -> Result<Option<Arc<IdempotentProducer>>, LegacyError> {
        if let Some(p) = &self.producer {
            return Ok(Some(p.clone()));
        }
        let mut attempt = 0u32;
        loop {
            match IdempotentProducer::new(self.sh.target.clone()).await {
                Ok(p) => {
                    self.producer = Some(p.clone());
                    return Ok(Some(p));
                }
                Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                    tracing::warn!(error = %e, "initialising the producer failed; retrying");
                    if self.sh.shutdown.retry_after(&mut attempt).await {
                        return Ok(None);
                    }
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
            // Stopping with no producer: the batch is not acknowledged, so its chunk's position
            // is not committed and it is copied again after a restart.
            let Some(producer) = self.producer().await? else {
                self.stopping = true;
                return Ok(());
            };
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
        SendFailed {
            topic: &key.0,
            partition: key.1,
            error: &e,
        }
        .emit(self.emitter());
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
            RecordsSkipped {
                topic: &key.0,
                partition: key.1,
                records: batch.record_count(),
                error: &reason,
            }
            .emit(self.emitter());
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
            let mut progress = false;
            for key in keys {
                let Some(st) = self.lanes.get_mut(&key) else {
                    continue;
                };
                match st.lane.flush().await {
                    Ok(acked) => {
                        progress |= !acked.is_empty();
                        self.acked(&key, acked)
                    }
                    Err(e) => {
                        progress = true;
                        for (tag, batch) in self.send_failed(&key, e)? {
                            self.send(key.clone(), tag, batch).await?;
                        }
                    }
                }
            }
            // A batch this stream recorded but its lane never took (a send cut short by the
            // stop): it will not be acknowledged, so its chunk is not committed. Never loop on it.
            if !progress {
                tracing::debug!(
                    stream = self.index,
                    "batches left unacknowledged at the flush"
                );
                return Ok(());
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
                CommitRefused {
                    stream: self.index,
                    error: &e,
                }
                .emit(self.emitter());
                self.ledger.restore(ready);
            }
        }
    }

    /// Flushes and commits everything, then forgets the assignment.
    async fn finish(&mut self) -> Result<(), LegacyError> {
        // When the process stops, the target gets one request timeout to acknowledge what is in
        // flight (a target that is down would otherwise hold the exit for the whole delivery
        // timeout); what it did not acknowledge is not committed.
        let flushed = if self.cancelled {
            self.lanes.clear();
            Ok(())
        } else if self.sh.shutdown.is_triggered() {
            let bound = self.sh.target.settings().request_timeout;
            match tokio::time::timeout(bound, self.flush_all()).await {
                Ok(flushed) => flushed,
                Err(_) => {
                    tracing::warn!(stream = self.index, "stopping before the target acknowledged every batch; the records after the last commit are copied again after a restart");
                    Ok(())
                }
            }
        } else {
            self.flush_all().await
        };
        self.commit().await;
        self.ledger.clear();
        self.positions.clear();
        flushed
    }
}

/// What a partition's forwarding task passes on to the copy task.
#[derive(Debug)]
enum Event {
    /// Batches from the partition's position on; the share counts against `buffer.memory`
    /// until dropped.
    Data(PartitionFetch, BufferShare),
    /// The position was outside the source log; fetching went on at `to` (`auto.offset.reset`).
    Reset {
        requested: i64,
        log_start: i64,
        log_end: i64,
        to: i64,
    },
    /// The position was outside the log and `auto.offset.reset` is none.
    NoOffset,
    /// The partition cannot be fetched (authorization, corrupt data, topic re-created).
    Failed(KafkaError),
}

/// Drains one subscription into the copy task's queue. It applies `auto.offset.reset` itself,
/// so that fetching goes on at once; the copy task learns the new position before any data
/// from it (one queue, in order).
async fn forward(
    i: usize,
    mut sub: Subscription,
    policy: AutoOffsetReset,
    limiter: Option<Arc<RateLimiter>>,
    stop: Shutdown,
    tx: mpsc::Sender<(usize, Event)>,
) {
    while let Some(ev) = sub.recv().await {
        let event = match ev {
            FetchEvent::Data { data, share } => {
                // Paid before the data reaches the stream, as MM2 mode pays before producing;
                // meanwhile the fetcher's buffer holds it, so fetching slows down too.
                if let Some(l) = &limiter {
                    if l.acquire(share.bytes(), &stop).await {
                        return;
                    }
                }
                Event::Data(data, share)
            }
            FetchEvent::OutOfRange {
                requested,
                log_start,
                log_end,
            } => match reset_to(policy, log_start, log_end) {
                Some(to) => {
                    sub.seek(to);
                    Event::Reset {
                        requested,
                        log_start,
                        log_end,
                        to,
                    }
                }
                None => Event::NoOffset,
            },
            FetchEvent::Failed(e) => Event::Failed(e),
        };
        let last = matches!(event, Event::NoOffset | Event::Failed(_));
        if tx.send((i, event)).await.is_err() || last {
            return;
        }
    }
}

/// Where `auto.offset.reset` continues in a log spanning `log_start..log_end`.
fn reset_to(policy: AutoOffsetReset, log_start: i64, log_end: i64) -> Option<i64> {
    match policy {
        AutoOffsetReset::Earliest => Some(log_start),
        AutoOffsetReset::Latest => Some(log_end),
        AutoOffsetReset::None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_offset_reset_picks_a_log_bound_or_none() {
        assert_eq!(reset_to(AutoOffsetReset::Earliest, 5, 9), Some(5));
        assert_eq!(reset_to(AutoOffsetReset::Latest, 5, 9), Some(9));
        assert_eq!(reset_to(AutoOffsetReset::None, 5, 9), None);
    }
}
