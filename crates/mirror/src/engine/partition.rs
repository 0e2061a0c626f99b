//! One source partition's task: where it starts (the stored position, or `auto.offset.reset`),
//! its subscription to the flow's fetcher and its producer lane, and what happens after a
//! failure (back off, a new producer id, resume from the first unacknowledged offset). The
//! forwarding itself is [`super::forward`]. Several produces stay in flight (the lane keeps
//! order), so a high-latency link does not serialize on round trips.

use super::forward::{Failure, Forwarder, Gauges};
use super::offset_syncs::Outbox;
use super::positions::Board;
use super::Shutdown;
use crate::config::model::FlowConfig;
use crate::metrics::{FlowLabels, Metrics, PartitionLabels};
use crate::offsets::runs::Runs;
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::fetcher::{Fetcher, Subscription};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::{AutoOffsetReset, KafkaError};
use std::sync::{Arc, Mutex};

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
}

impl PartitionTask {
    /// Runs until stopped; returns why the partition stopped for good, if it did.
    pub(super) async fn run(self) -> Result<(), Stopped> {
        let labels = self.ctx.labels.partition(&self.remote, self.partition);
        // A task started again (a re-created topic, a restarted flow) is no longer stopped.
        self.ctx
            .metrics
            .partition_stopped
            .get_or_create(&labels)
            .set(0);
        let result = self.copy(&labels).await;
        if let Err(e) = &result {
            tracing::error!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, error = %e, "partition stopped");
            self.ctx
                .metrics
                .partition_stopped
                .get_or_create(&labels)
                .set(1);
        }
        result
    }

    async fn copy(&self, labels: &PartitionLabels) -> Result<(), Stopped> {
        let g = Gauges::new(&self.ctx.metrics, &self.ctx.labels, labels);
        let mut acked_through = self.stored.filter(|o| *o >= 0);
        let mut producer = self.ctx.producer.clone();
        if self.own_producer {
            loop {
                match self.ctx.producer.fresh().await {
                    Ok(p) => {
                        producer = p;
                        break;
                    }
                    Err(e) => {
                        let mut attempt = 0;
                        if self.retry_wait(&e, &mut attempt).await {
                            return Ok(());
                        }
                    }
                }
            }
        }
        let mut attempt = 0u32;
        // Without a stored position the start is looked up once: a retry before the first
        // acknowledgement must not jump to a newer `latest` and skip what arrived meanwhile.
        let mut start: Option<i64> = None;
        let mut sub: Option<Subscription> = None;
        loop {
            let next = match (acked_through, start) {
                (Some(o), _) => o + 1,
                (None, Some(s)) => s,
                (None, None) => match self.start_offset().await {
                    Ok(o) => {
                        start = Some(o);
                        o
                    }
                    Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                        if self.retry_wait(&e, &mut attempt).await {
                            return Ok(());
                        }
                        continue;
                    }
                    Err(e) => return Err(self.forwarder(&g).fatal(next_or(acked_through), e)),
                },
            };
            let flow = &self.ctx.flow;
            let mut lane = producer.lane(&self.remote, self.partition).with_limits(
                flow.clients.producer_tuning.max_request_size as usize,
                16 << 20,
            );
            // The target partition first, the data after: fetched data waiting for a target
            // partition that is not there yet (just created) would hold the flow's memory
            // budget, and partitions whose targets are ready would wait behind it.
            if let Err(e) = lane.prepare().await {
                if !(e.is_retriable() || e.is_stale_metadata()) {
                    return Err(self.forwarder(&g).fatal(next, e));
                }
                sub = None;
                if self.retry_wait(&e, &mut attempt).await {
                    return Ok(());
                }
                continue;
            }
            // One subscription while the task makes progress; after truncation with `continue`
            // it seeks to the log start (a seek starts a new generation: whatever was delivered
            // for the old position is dropped).
            let feed = match &mut sub {
                Some(feed) => {
                    feed.seek(next);
                    feed
                }
                None => match self
                    .ctx
                    .fetcher
                    .subscribe(&self.topic, self.partition, next)
                {
                    Ok(feed) => sub.insert(feed),
                    Err(e) => return Err(self.forwarder(&g).fatal(next, e)),
                },
            };
            tracing::debug!(topic = %self.topic, partition = self.partition, next, "copying");
            match self
                .forwarder(&g)
                .run(feed, &mut lane, next, &mut acked_through)
                .await
            {
                Ok(()) => return Ok(()),
                Err(Failure::Retry(e)) => {
                    // Let go of what the fetcher holds for this partition while it backs off (up
                    // to two responses, a quarter of the flow's budget each): a target that is
                    // away for some partitions must not starve the healthy ones. It subscribes
                    // again at the first unacknowledged offset.
                    sub = None;
                    if acked_through.map(|o| o + 1) != Some(next) && acked_through.is_some() {
                        attempt = 0; // progress since the last failure: back off from the start
                    }
                    if self.retry_wait(&e, &mut attempt).await {
                        return Ok(());
                    }
                    // The lane gave up in the middle of a sequence: resume from the last
                    // acknowledged offset with a new producer id, so sequences start afresh.
                    // Records in flight may be written twice (at-least-once), never lost.
                    match self.ctx.producer.fresh().await {
                        Ok(p) => producer = p,
                        Err(e) => tracing::warn!(error = %e, "new producer id failed; retrying"),
                    }
                }
                Err(Failure::Continue { log_start }) => acked_through = Some(log_start - 1),
                Err(Failure::Stop(s)) => return Err(s),
            }
        }
    }

    fn forwarder<'a>(&'a self, g: &'a Gauges) -> Forwarder<'a> {
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
            g,
        }
    }

    async fn start_offset(&self) -> Result<i64, KafkaError> {
        let tuning = &self.ctx.flow.clients.consumer_tuning;
        // MM2 resumes at stored + 1; without a position, auto.offset.reset decides.
        let at = match tuning.auto_offset_reset {
            AutoOffsetReset::Latest => LATEST,
            _ => EARLIEST,
        };
        // Asked together with the flow's other partitions starting now (one request per broker).
        self.ctx
            .source
            .list_offset_batched(&self.topic, self.partition, at, tuning.isolation_level)
            .await
    }

    /// Logs a transient failure and waits with backoff; true if stopped meanwhile.
    async fn retry_wait(&self, e: &KafkaError, attempt: &mut u32) -> bool {
        tracing::warn!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, error = %e, "partition interrupted; retrying");
        self.stop.retry_after(attempt).await
    }
}

fn next_or(acked: Option<i64>) -> i64 {
    acked.map_or(-1, |o| o + 1)
}
