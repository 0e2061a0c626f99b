//! One source partition's task: where it starts (the stored position, or `auto.offset.reset`),
//! its subscription to the flow's fetcher and its producer lane, and what happens after a
//! failure (back off, a new producer id, resume from the first unacknowledged offset). The
//! forwarding itself is [`super::forward`]. Several produces stay in flight (the lane keeps
//! order), so a high-latency link does not serialize on round trips.

use super::forward::{Failure, Forwarder, Gauges};
use super::offset_syncs::Outbox;
use super::positions::Board;
use super::slots::{Slot, SlotTable};
use super::waiting::{Stage, Watch, Watches};
use super::Shutdown;
use crate::config::model::FlowConfig;
use crate::config::model::StartPosition;
use crate::events::{Emitter, Event, PartitionPanicked, PartitionStopped};
use crate::metrics::{FlowLabels, Metrics, PartitionLabels};
use crate::offsets::runs::Runs;
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::fetcher::{Fetcher, Subscription};
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::KafkaError;
use std::future::Future;
use std::sync::{Arc, Mutex};

pub(super) mod resume;

pub(super) use super::forward::Stopped;

/// What a partition task needs from its flow.
pub(super) struct Context {
    pub(super) flow: FlowConfig,
    pub(super) source: Arc<KafkaCluster>,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) producer: Arc<IdempotentProducer>,
    pub(super) board: Arc<Board>,
    /// Where offset syncs go (`emit.offset-syncs.enabled`).
    pub(super) offset_syncs: Option<Arc<Outbox>>,
    /// What this process copied, for exact checkpoints.
    pub(super) runs: Arc<Mutex<Runs>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    /// The flow's and the process's rate limits, paid for each fetched response.
    pub(super) limiters: Vec<Arc<super::throttle::RateLimiter>>,
    /// One fetcher per source broker for all of the flow's partitions (one Fetch request per
    /// broker, in an incremental session, with the broker's own wait). Its buffer is the flow's
    /// memory budget: bytes fetched and not yet acknowledged by the target (`buffer.memory`).
    pub(super) fetcher: Arc<Fetcher>,
    /// With sharing: writes wait while this process cannot tell it still owns its partitions
    /// (docs/sharing.md).
    pub(super) lease: Option<Arc<super::sharing::Shared>>,
    /// Exactly-once: the flow's slots (a partition writes through the one it maps to).
    pub(super) slots: Option<Arc<SlotTable>>,
    /// At-least-once with offset syncs: what a starting partition reads to find the records
    /// after its stored position that are on the target already (`engine/partition/resume.rs`).
    pub(super) resume: Option<Arc<resume::SyncIndex>>,
    /// Loop prevention: which of the source's batches kmirror copied from the target.
    pub(super) loop_guard: Option<Arc<super::loop_guard::LoopGuard>>,
    /// Loop prevention: which of the target's batches this flow wrote (the resume walk leaves
    /// out what the target's own producers wrote in between).
    pub(super) own_copies: Option<Arc<super::loop_guard::LoopGuard>>,
    /// The flow's partitions' transient failures, logged as one WARN line per quiet period.
    pub(super) interruptions: super::interruptions::Interruptions,
    /// Schema sync: what the target registry has of the ids records name (the send gate).
    pub(super) schemas: Option<Arc<super::schemas::IdMap>>,
    /// What each partition assigned and not copying yet waits for (`engine/waiting.rs`).
    pub(super) waiting: Arc<Watches>,
}

impl Context {
    /// Where the flow's events are logged and counted.
    pub(super) fn emitter(&self) -> Emitter<'_> {
        Emitter {
            metrics: &self.metrics,
            labels: &self.labels,
        }
    }
}

pub(super) struct PartitionTask {
    pub(super) ctx: Arc<Context>,
    pub(super) topic: String,
    pub(super) remote: String,
    pub(super) partition: i32,
    pub(super) stored: Option<i64>,
    pub(super) stop: Shutdown,
    /// Start with a producer id of its own (the partition was copied before in this process,
    /// so the shared producer id's sequence for it has moved on).
    pub(super) own_producer: bool,
    /// What it waits for until it copies, from the moment it was assigned.
    pub(super) watch: Arc<Watch>,
}

impl PartitionTask {
    /// Runs until stopped; returns why the partition stopped for good, if it did.
    pub(super) async fn run(self) -> Result<(), Stopped> {
        let labels = self.ctx.labels.partition(&self.remote, self.partition);
        // A task started again (a re-created topic, a restarted flow) is no longer stopped.
        self.ctx.metrics.set_partition_stopped(&labels, false);
        let result = super::catch_panic(self.copy(&labels))
            .await
            .unwrap_or_else(|message| {
                PartitionPanicked.emit(self.ctx.emitter());
                Err(Stopped::Panicked {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    message,
                })
            });
        self.ctx
            .waiting
            .ended(&(self.topic.clone(), self.partition), &self.watch);
        if let Err(e) = &result {
            PartitionStopped {
                flow: &self.ctx.flow.id,
                topic: &self.topic,
                partition: &labels,
                error: e,
            }
            .emit(self.ctx.emitter());
        }
        result
    }

    async fn copy(&self, labels: &PartitionLabels) -> Result<(), Stopped> {
        let g = Gauges::new(&self.ctx.metrics, &self.ctx.labels, labels);
        let slot = match &self.ctx.slots {
            None => None,
            // Started only while its slot is held, and stopped before the slot is given up.
            Some(table) => match table.get(&self.topic, self.partition) {
                Some(s) => Some(s),
                None => {
                    tracing::warn!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, "not started: its exactly-once slot is not held by this process");
                    return Ok(());
                }
            },
        };
        let mut io = Io {
            task: self,
            g: &g,
            producer: slot
                .as_ref()
                .map_or_else(|| self.ctx.producer.clone(), |s| s.producer.clone()),
            slot,
        };
        // A transactional lane never starts over under an id of its own.
        let own_producer = self.own_producer && io.slot.is_none();
        drive(&mut io, self.stored, own_producer, &self.watch).await
    }

    fn forwarder<'a>(&'a self, g: &'a Gauges, slot: Option<&'a Arc<Slot>>) -> Forwarder<'a> {
        Forwarder {
            flow: &self.ctx.flow,
            topic: &self.topic,
            remote: &self.remote,
            partition: self.partition,
            board: &self.ctx.board,
            offset_syncs: self.ctx.offset_syncs.as_deref(),
            runs: &self.ctx.runs,
            metrics: &self.ctx.metrics,
            labels: &self.ctx.labels,
            limiters: &self.ctx.limiters,
            stop: &self.stop,
            lease: self.ctx.lease.as_deref(),
            loop_guard: self.ctx.loop_guard.as_deref(),
            schemas: self.ctx.schemas.as_deref(),
            slot,
            g,
            watch: &self.watch,
        }
    }

    async fn start_offset(&self) -> Result<i64, KafkaError> {
        let tuning = &self.ctx.flow.clients.consumer_tuning;
        // MM2 resumes at stored + 1; without a position, kmirror.start.position or
        // auto.offset.reset decides.
        let at = match self.ctx.flow.start {
            StartPosition::Earliest => EARLIEST,
            StartPosition::Latest => LATEST,
            StartPosition::Timestamp(ms) => ms,
            StartPosition::Fail => {
                return Err(KafkaError::Config(format!(
                    "{}-{}: no stored position and auto.offset.reset = none (set kmirror.start.position, or auto.offset.reset to earliest or latest)",
                    self.topic, self.partition
                )))
            }
        };
        let source = &self.ctx.source;
        // Asked together with the flow's other partitions starting now (one request per broker).
        let found = source
            .list_offset_batched(&self.topic, self.partition, at, tuning.isolation_level)
            .await?;
        if found < 0 {
            // No record at or after the time: everything written from now on is.
            return source
                .list_offset_batched(&self.topic, self.partition, LATEST, tuning.isolation_level)
                .await;
        }
        Ok(found)
    }

    /// Logs a transient failure and waits with backoff; true if stopped meanwhile.
    async fn retry_wait(&self, e: &KafkaError, attempt: &mut u32) -> bool {
        match self.ctx.interruptions.note(std::time::Instant::now()) {
            Some(folded) => {
                tracing::warn!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, error = %e, others_since_last_warning = folded, "partition interrupted; retrying (further interruptions of this flow are logged at debug level for a while; others_since_last_warning counts them)")
            }
            None => {
                tracing::debug!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, error = %e, "partition interrupted; retrying")
            }
        }
        self.stop.retry_after(attempt).await
    }
}

/// How long a starting partition waits for its source's end to show its lag.
const LAG_LOOKUP: std::time::Duration = std::time::Duration::from_secs(5);

fn next_or(acked: Option<i64>) -> i64 {
    acked.map_or(-1, |o| o + 1)
}

/// What a partition task does to the outside world. Its decisions (where to start, when to back
/// off, when to take a new producer id, where to resume) are [`drive`]'s, unit-tested against a
/// scripted double; [`Io`] is the real one (the flow's fetcher, producer and source cluster).
pub(super) trait PartitionIo: Send {
    type Feed: Send;
    type Lane: Send;
    /// Switches to a producer id of the partition's own, so its sequences start afresh.
    fn fresh_producer(&mut self) -> impl Future<Output = Result<(), KafkaError>> + Send;
    /// Where to start without a stored position (`auto.offset.reset`).
    fn start_offset(&mut self) -> impl Future<Output = Result<i64, KafkaError>> + Send;
    /// Shows the partition's lag as the source's end minus `next`, before anything it may
    /// wait for (its target partition's log, the resume walk, a backoff): until the fetcher's
    /// first answer, a partition assigned and not copying must not count as caught up. The lag
    /// shown, when the source's end was found in time.
    fn show_lag(&mut self, next: i64) -> impl Future<Output = Option<i64>> + Send;
    /// Where to start, `next` being where the stored position (`stored`) or the start
    /// lookup says: later, when the target holds the records from `next` on already. Never
    /// earlier.
    fn resume(&mut self, next: i64, stored: bool) -> impl Future<Output = i64> + Send;
    /// A lane of the current producer id whose target partition is ready (has a leader).
    fn lane(&mut self) -> impl Future<Output = Result<Self::Lane, KafkaError>> + Send;
    fn subscribe(&mut self, next: i64) -> Result<Self::Feed, KafkaError>;
    /// Moves a subscription (whatever it had fetched for its old position is dropped).
    fn seek(&mut self, feed: &mut Self::Feed, next: i64);
    /// Copies from `next` until stopped or failed; `acked` follows every acknowledgement.
    fn forward(
        &mut self,
        feed: &mut Self::Feed,
        lane: &mut Self::Lane,
        next: i64,
        acked: &mut Option<i64>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Counts and logs a failure that stops the partition.
    fn fatal(&self, next: i64, e: KafkaError) -> Stopped;
    /// Logs a transient failure and waits with backoff; true if stopped meanwhile.
    fn retry_wait(
        &mut self,
        e: &KafkaError,
        attempt: &mut u32,
    ) -> impl Future<Output = bool> + Send;
}

/// A partition's life: resume after the stored position (MM2 resumes at stored + 1), or look
/// the start up once; on a transient failure back off and resume from the first unacknowledged
/// offset under a new producer id; stop for good only on what retrying cannot fix. `Ok` when
/// stopped from outside.
///
/// `watch` follows what it waits for until it copies (`engine/waiting.rs`).
pub(super) async fn drive<I: PartitionIo>(
    io: &mut I,
    stored: Option<i64>,
    own_producer: bool,
    watch: &Watch,
) -> Result<(), Stopped> {
    let mut acked_through = stored.filter(|o| *o >= 0);
    if own_producer {
        let mut attempt = 0;
        while let Err(e) = io.fresh_producer().await {
            watch.failed(&e);
            if io.retry_wait(&e, &mut attempt).await {
                return Ok(());
            }
        }
    }
    if let Some(a) = acked_through {
        shown(watch, io.show_lag(a + 1).await);
        watch.stage(Stage::Resume);
        // Records after the stored position that the target holds already (written before a
        // crash, after the last store) are not copied again.
        let next = io.resume(a + 1, true).await;
        if next > a + 1 {
            acked_through = Some(next - 1);
        }
    }
    let mut attempt = 0u32;
    // Without a stored position the start is looked up once: a retry before the first
    // acknowledgement must not jump to a newer `latest` and skip what arrived meanwhile.
    let mut start: Option<i64> = None;
    let mut sub: Option<I::Feed> = None;
    loop {
        let next = match (acked_through, start) {
            (Some(o), _) => o + 1,
            (None, Some(s)) => s,
            (None, None) => {
                watch.stage(Stage::StartLookup);
                match io.start_offset().await {
                    Ok(o) => {
                        watch.starts_at(o);
                        shown(watch, io.show_lag(o).await);
                        watch.stage(Stage::Resume);
                        // Without a stored position too: a first run killed before its first store
                        // left records on the target that no position mentions.
                        let o = io.resume(o, false).await;
                        start = Some(o);
                        o
                    }
                    Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                        watch.failed(&e);
                        if io.retry_wait(&e, &mut attempt).await {
                            return Ok(());
                        }
                        continue;
                    }
                    Err(e) => return Err(io.fatal(next_or(acked_through), e)),
                }
            }
        };
        // The target partition first, the data after: fetched data waiting for a target
        // partition that is not there yet (just created) would hold the flow's memory budget,
        // and partitions whose targets are ready would wait behind it.
        watch.stage(Stage::TargetPartition);
        let mut lane = match io.lane().await {
            Ok(lane) => lane,
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                sub = None;
                watch.failed(&e);
                if io.retry_wait(&e, &mut attempt).await {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(io.fatal(next, e)),
        };
        // One subscription while the task makes progress; after truncation with `continue` it
        // seeks to the log start (a seek starts a new generation: whatever was delivered for
        // the old position is dropped).
        let feed = match &mut sub {
            Some(feed) => {
                io.seek(feed, next);
                feed
            }
            None => match io.subscribe(next) {
                Ok(feed) => sub.insert(feed),
                Err(e) => return Err(io.fatal(next, e)),
            },
        };
        watch.stage(Stage::Fetch);
        match io.forward(feed, &mut lane, next, &mut acked_through).await {
            Ok(()) => return Ok(()),
            Err(Failure::Retry(e)) => {
                // Let go of what the fetcher holds for this partition while it backs off (up to
                // two responses, a quarter of the flow's budget each): a target that is away for
                // some partitions must not starve the healthy ones. It subscribes again at the
                // first unacknowledged offset.
                sub = None;
                if acked_through.is_some_and(|o| o + 1 != next) {
                    attempt = 0; // progress since the last failure: back off from the start
                }
                watch.failed(&e);
                if io.retry_wait(&e, &mut attempt).await {
                    return Ok(());
                }
                // The lane gave up in the middle of a sequence: resume from the last
                // acknowledged offset with a new producer id, so sequences start afresh. Records
                // in flight may be written twice (at-least-once), never lost.
                if let Err(e) = io.fresh_producer().await {
                    tracing::warn!(error = %e, "new producer id failed; retrying");
                }
            }
            Err(Failure::Continue { log_start }) => acked_through = Some(log_start - 1),
            // Exactly-once: the slot's transaction was aborted (or its producer epoch changed):
            // again after the last committed position, with a new lane of the new epoch.
            Err(Failure::Rewind(_)) => {}
            Err(Failure::Stop(s)) => return Err(s),
        }
    }
}

/// A partition with nothing to copy when it starts (an empty or idle partition, one stopped at
/// its end) is not waiting for anything: the fetcher delivers nothing for it until records
/// arrive, and it would otherwise be reported as waiting for data.
fn shown(watch: &Watch, lag: Option<i64>) {
    match lag {
        Some(0) => watch.copying(),
        Some(_) => watch.lag_shown(),
        None => {}
    }
}

/// The real outside world of a partition task.
struct Io<'a> {
    task: &'a PartitionTask,
    g: &'a Gauges,
    producer: Arc<IdempotentProducer>,
    slot: Option<Arc<Slot>>,
}

impl PartitionIo for Io<'_> {
    type Feed = Subscription;
    type Lane = PartitionLane;

    async fn fresh_producer(&mut self) -> Result<(), KafkaError> {
        if self.slot.is_some() {
            // Exactly-once: the slot's epoch is the identity; an abort renews it.
            return Ok(());
        }
        // Boxed, as the lookups below: their futures are kilobytes, and inline they would size
        // every partition task for its whole life (docs/benchmarks.md, peak RSS at 10,000
        // partitions).
        self.producer = Box::pin(self.task.ctx.producer.fresh()).await?;
        Ok(())
    }

    async fn start_offset(&mut self) -> Result<i64, KafkaError> {
        Box::pin(self.task.start_offset()).await
    }

    async fn show_lag(&mut self, next: i64) -> Option<i64> {
        let t = self.task;
        let isolation = t.ctx.flow.clients.consumer_tuning.isolation_level;
        // Asked with the other partitions starting now; bounded, so a slow source delays the
        // start by seconds at most (the fetcher's answers set the lag from then on anyway).
        // Boxed with its timer: see `fresh_producer`.
        let end = Box::pin(tokio::time::timeout(
            LAG_LOOKUP,
            t.ctx
                .source
                .list_offset_batched(&t.topic, t.partition, LATEST, isolation),
        ))
        .await;
        match end {
            Ok(Ok(end)) => {
                let lag = (end - next).max(0);
                self.g.show_lag(lag);
                return Some(lag);
            }
            Ok(Err(e)) => {
                tracing::debug!(topic = %t.topic, partition = t.partition, error = %e, "source end not known; the flow's monitor looks it up")
            }
            Err(_) => {
                tracing::debug!(topic = %t.topic, partition = t.partition, "source end not known in time; the flow's monitor looks it up")
            }
        }
        None
    }

    async fn resume(&mut self, next: i64, stored: bool) -> i64 {
        // Exactly-once flows need none: their positions are committed with their data.
        let (None, Some(index)) = (&self.slot, &self.task.ctx.resume) else {
            return next;
        };
        let t = self.task;
        let starting = resume::Starting {
            topic: &t.topic,
            remote: &t.remote,
            partition: t.partition,
        };
        // Boxed: see `fresh_producer`.
        Box::pin(resume::resume(
            &t.ctx, index, starting, next, stored, &t.stop,
        ))
        .await
    }

    async fn lane(&mut self) -> Result<PartitionLane, KafkaError> {
        let tuning = &self.task.ctx.flow.clients.producer_tuning;
        let mut lane = self
            .producer
            .lane(&self.task.remote, self.task.partition)
            .with_limits(tuning.max_request_size as usize, 16 << 20);
        lane.prepare().await?;
        Ok(lane)
    }

    fn subscribe(&mut self, next: i64) -> Result<Subscription, KafkaError> {
        let t = self.task;
        t.ctx.fetcher.subscribe(&t.topic, t.partition, next)
    }

    fn seek(&mut self, feed: &mut Subscription, next: i64) {
        feed.seek(next);
    }

    async fn forward(
        &mut self,
        feed: &mut Subscription,
        lane: &mut PartitionLane,
        next: i64,
        acked: &mut Option<i64>,
    ) -> Result<(), Failure> {
        let t = self.task;
        tracing::debug!(topic = %t.topic, partition = t.partition, next, "copying");
        t.forwarder(self.g, self.slot.as_ref())
            .run(feed, lane, next, acked)
            .await
    }

    fn fatal(&self, next: i64, e: KafkaError) -> Stopped {
        self.task
            .forwarder(self.g, self.slot.as_ref())
            .fatal(next, e)
    }

    async fn retry_wait(&mut self, e: &KafkaError, attempt: &mut u32) -> bool {
        self.task.retry_wait(e, attempt).await
    }
}

#[cfg(test)]
mod tests;
