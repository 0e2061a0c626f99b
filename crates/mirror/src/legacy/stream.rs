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
//!

mod delivery;
mod feed;
mod membership;

use super::ledger::{Key, Ledger};
use super::targets::Targets;
use super::LegacyError;
use crate::config::legacy::LegacyConfig;
use crate::copy::lease::Lease;
use crate::copy::route::{encode, route};
use crate::engine::loop_guard::LoopGuard;
use crate::engine::throttle::RateLimiter;
use crate::engine::Shutdown;
use crate::events::legacy::{
    NotFetchedBecause, PartitionNotFetched, RecordsDeletedUncopied, TargetTopicUnavailable,
};
// `as _`: this module has an `Event` of its own (what a partition's fetch brought).
use crate::events::{Emitter, Event as _};
use crate::metrics::{FlowLabels, Metrics, PartitionSeries};
use feed::{forward, Event};
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, PartitionFetch, EARLIEST, LATEST};
use kmirror_kafka::fetcher::Fetcher;
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::records::{decode_batch_within, Record};
use kmirror_kafka::{AutoOffsetReset, IsolationLevel};
use membership::membership;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

/// How often a stream whose lease lapsed looks again.
const LEASE_RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

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
    /// `--loop.prevention`: the copy core's loop filter over what kmirror copied from the target.
    pub(super) loop_guard: Option<Arc<LoopGuard>>,
    /// Schema sync: what the target registry has of the ids records name (the send gate).
    pub(super) schemas: Option<Arc<crate::engine::schemas::IdMap>>,
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

/// What the schema gate of a chunk came to.
enum Gate {
    Go,
    Stopped,
    /// A revocation is coming: the chunk stays unsent.
    Revoked,
}

/// Raised by the membership just before it asks the copier to give its partitions back, so a
/// chunk waiting for a schema stops waiting; lowered once the revocation is answered. A copier
/// that left a chunk unsent this way takes no fetched chunk until the revocation came
/// (`Copier::abandoned`), so no later chunk of the partition passes the unsent one.
#[derive(Debug, Default)]
pub(super) struct Revoking {
    pending: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Revoking {
    pub(super) fn raise(&self) {
        self.pending
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn lower(&self) {
        self.pending
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_raised(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn raised(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }
}

/// Runs one stream until shutdown (or a failure that stops the process).
pub(super) async fn run(shared: Arc<Shared>, index: u32) -> Result<(), LegacyError> {
    let (tx, rx) = mpsc::channel(2);
    // The stream's write lease (copy/lease.rs): its membership renews it, its copy task sends
    // only while it holds.
    let lease = Arc::new(Mutex::new(Lease::new(
        shared.cfg.session_timeout,
        shared.cfg.rebalance_timeout,
    )));
    let revoking = Arc::new(Revoking::default());
    let copier =
        tokio::spawn(Copier::new(shared.clone(), index, lease.clone(), revoking.clone()).run(rx));
    let membership = membership(&shared, index, tx, &lease, &revoking).await;
    shared.record_share(index, &[]);
    let copied = copier
        .await
        .map_err(|e| LegacyError::Panicked(e.to_string()))?;
    membership.and(copied)
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
    /// The send gate: fetched data is taken only while the stream's membership holds it.
    lease: Arc<Mutex<Lease>>,
    /// A revocation is coming (see [`Revoking`]).
    revoking: Arc<Revoking>,
    /// A chunk was left unsent for the coming revocation: no fetched chunk is taken until it is
    /// answered.
    abandoned: bool,
}

impl Copier {
    fn new(
        sh: Arc<Shared>,
        index: u32,
        lease: Arc<Mutex<Lease>>,
        revoking: Arc<Revoking>,
    ) -> Copier {
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
            lease,
            revoking,
            abandoned: false,
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
                    self.revoking.lower();
                    self.abandoned = false;
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
                            self.revoking.lower();
                            self.abandoned = false;
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
                    // Woken from a pause past its session, the stream takes nothing fetched
                    // until a heartbeat says whether its partitions are still its own.
                    _ = tokio::time::sleep(LEASE_RECHECK), if !self.stopping && !self.may_send() => {}
                    Some((i, event)) = events.recv(), if !self.stopping && !self.abandoned && self.may_send() => {
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
                        self.revoking.lower();
                        self.abandoned = false;
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

    /// The stream's lease holds (copy/lease.rs).
    fn may_send(&self) -> bool {
        self.lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .may_write(std::time::Instant::now())
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

    /// The send gate for schemas: waits until every id the chunk's records name is on the
    /// target registry, then rewrites those that differ.
    async fn schema_ids(
        &self,
        map: &crate::engine::schemas::IdMap,
        records: &mut Vec<(String, Record)>,
    ) -> Gate {
        use crate::copy::schema_ids::{translate, Translated};
        let (topics, mut recs): (Vec<String>, Vec<Record>) =
            std::mem::take(records).into_iter().unzip();
        let m = &self.sh.metrics;
        let l = &self.sh.labels;
        let go = loop {
            match translate(&mut recs, &|id| map.target(id)) {
                Translated::AsIs { passed } => {
                    m.schema_ids_unknown.get_or_create(l).inc_by(passed);
                    break Gate::Go;
                }
                Translated::Rewritten { translated, passed } => {
                    m.schema_ids_unknown.get_or_create(l).inc_by(passed);
                    m.schema_ids_translated.get_or_create(l).inc_by(translated);
                    break Gate::Go;
                }
                Translated::Waiting(ids) => {
                    let waiting = m.records_waiting_for_schema.get_or_create(l).clone();
                    waiting.inc_by(recs.len() as i64);
                    // A rebalance does not wait for a registry: the chunk is left unsent and
                    // its position unmoved, so whoever owns the partition next copies it.
                    let outcome = tokio::select! {
                        go = map.wait_for(&ids, &self.sh.shutdown) => {
                            if go { None } else { Some(Gate::Stopped) }
                        }
                        _ = self.revoking.raised() => Some(Gate::Revoked),
                    };
                    waiting.dec_by(recs.len() as i64);
                    if let Some(o) = outcome {
                        break o;
                    }
                }
            }
        };
        *records = topics.into_iter().zip(recs).collect();
        go
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
        // Left out like aborted data: the chunk's end still passes them.
        let batches = match &self.sh.loop_guard {
            Some(guard) => match guard.keep(batches, &self.sh.shutdown).await {
                Some((kept, skipped)) => {
                    if skipped > 0 {
                        self.sh
                            .metrics
                            .loop_records_skipped
                            .get_or_create(&self.sh.labels)
                            .inc_by(skipped);
                    }
                    kept
                }
                None => {
                    // Stopping: nothing of this chunk was sent or committed.
                    self.stopping = true;
                    return Ok(());
                }
            },
            None => batches,
        };
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
        if let Some(map) = &self.sh.schemas {
            match self.schema_ids(map, &mut records).await {
                Gate::Go => {}
                // Stopping while waiting: nothing of this chunk was sent or committed.
                Gate::Stopped => {
                    self.stopping = true;
                    return Ok(());
                }
                // No later chunk is taken before the revocation is answered (see `serve`).
                Gate::Revoked => {
                    self.abandoned = true;
                    return Ok(());
                }
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use feed::reset_to;

    #[test]
    fn auto_offset_reset_picks_a_log_bound_or_none() {
        assert_eq!(reset_to(AutoOffsetReset::Earliest, 5, 9), Some(5));
        assert_eq!(reset_to(AutoOffsetReset::Latest, 5, 9), Some(9));
        assert_eq!(reset_to(AutoOffsetReset::None, 5, 9), None);
    }
}
