//! One source partition copied to the same partition of its remote topic: fetch, forward each
//! batch (batch mode, or record mode when records must change), and report every acknowledged
//! source offset to the positions board. Several produces stay in flight (the lane keeps order),
//! so a high-latency link does not serialize on round trips.

use super::offset_syncs::Outbox;
use super::positions::Board;
use super::Shutdown;
use crate::config::model::{FlowConfig, OnTruncation};
use crate::metrics::{FlowLabels, Metrics, PartitionLabels};
use crate::offsets::runs::Runs;
use crate::offsets::sync_rules::{SourceOffsets, SyncRules};
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::fetcher::{BufferShare, FetchEvent, Fetcher, Subscription};
use kmirror_kafka::producer::{Acked, IdempotentProducer};
use kmirror_kafka::records::{decode_batch, encode_within, BatchOptions, Record};
use kmirror_kafka::{AutoOffsetReset, IsolationLevel, KafkaError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Source batches smaller than this that follow each other in a response are merged into one
/// target batch. A producer with `linger.ms=0` at a moderate rate writes a batch per record or
/// two, and the target takes one produce request per batch and partition (at most five in
/// flight): forwarded one by one they would cap a partition at a few thousand records per
/// second. Large batches are always forwarded untouched.
const SMALL_BATCH: usize = 16 * 1024;

/// A merged run stays below this (and below half of `max.request.size`).
const MERGED_MAX: usize = 256 * 1024;

/// How a source batch reached the target (the `mode` label of `kmirror_batches_total`).
#[derive(Clone, Copy)]
enum Mode {
    /// Forwarded as fetched.
    Batch,
    /// Small batches merged, records re-encoded with their codec.
    Merged,
    /// Decoded, filtered or transformed, re-encoded with the producer's codec.
    Record,
}

/// How many batches from the start of `batches` form a run to merge: consecutive, each
/// forwardable as is, small, with the same codec, with no offset gap between them, and
/// together within `limit` bytes. 1 when there is nothing to merge.
fn small_run(
    batches: &[&RawBatch],
    forwardable: &dyn Fn(&RawBatch) -> bool,
    limit: usize,
) -> usize {
    let Some(first) = batches.first() else {
        return 0;
    };
    let mut total = 0;
    let mut n = 0;
    let mut prev_end = first.base_offset();
    for b in batches {
        let size = b.bytes().len();
        if size >= SMALL_BATCH
            || total + size > limit
            || b.record_count() <= 0
            || b.codec() != first.codec()
            || b.base_offset() != prev_end
            || !forwardable(b)
        {
            break;
        }
        total += size;
        prev_end = b.last_offset() + 1;
        n += 1;
    }
    n.max(1)
}

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

/// Why a partition stopped for good (until restart or an operator acts).
#[derive(Debug, thiserror::Error)]
pub(super) enum Stopped {
    #[error("{topic}-{partition}: the source deleted offsets {requested}..{log_start} before they were copied ({lost} records lost; the log now spans {log_start}..{log_end}); set kmirror.source.truncation=continue to go on from the log start")]
    Truncated {
        topic: String,
        partition: i32,
        requested: i64,
        log_start: i64,
        log_end: i64,
        lost: i64,
    },
    #[error("{topic}-{partition}: the stored position {requested} is beyond the source log end {log_end}: the topic was deleted and re-created, or the source lost data (unclean leader election); positions no longer match this log")]
    BeyondEnd {
        topic: String,
        partition: i32,
        requested: i64,
        log_end: i64,
    },
    #[error("{topic}-{partition} at source offset {first}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        first: i64,
        #[source]
        source: KafkaError,
    },
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

struct Gauges {
    records: Counter,
    bytes: Counter,
    age: Gauge,
    latency: Gauge,
    lag: Gauge,
    batch_mode: Counter,
    record_mode: Counter,
    merged_mode: Counter,
    buffered: Gauge,
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
        let m = &self.ctx.metrics;
        // One statement per lookup: a family's guard lives to the end of its statement, and a
        // second lookup in the same family within it would deadlock on the family's lock.
        let records = m.record_count.get_or_create(labels).clone();
        let bytes = m.byte_count.get_or_create(labels).clone();
        let age = m.record_age_ms.get_or_create(labels).clone();
        let latency = m.replication_latency_ms.get_or_create(labels).clone();
        let lag = m.lag_records.get_or_create(labels).clone();
        let batch_mode = m
            .batches
            .get_or_create(&self.ctx.labels.mode("batch"))
            .clone();
        let record_mode = m
            .batches
            .get_or_create(&self.ctx.labels.mode("record"))
            .clone();
        let buffered = m.buffered_bytes.get_or_create(&self.ctx.labels).clone();
        let merged_mode = m
            .batches
            .get_or_create(&self.ctx.labels.mode("merged"))
            .clone();
        let g = Gauges {
            buffered,
            merged_mode,
            records,
            bytes,
            age,
            latency,
            lag,
            batch_mode,
            record_mode,
        };
        let mut acked_through = self.stored.filter(|o| *o >= 0);
        let mut producer = self.ctx.producer.clone();
        if self.own_producer {
            loop {
                match IdempotentProducer::new(self.ctx.target.clone()).await {
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
                    Err(e) => return Err(self.fatal(next_or(acked_through), e)),
                },
            };
            // One subscription for the task's life: after a failure it seeks back to the first
            // unacknowledged offset, and whatever the fetcher delivered for the old position is
            // dropped (the seek starts a new generation).
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
                    Err(e) => return Err(self.fatal(next, e)),
                },
            };
            match self
                .copy_from(feed, next, &producer, &g, &mut acked_through)
                .await
            {
                Ok(()) => return Ok(()),
                Err(Failure::Retry(e)) => {
                    if acked_through.map(|o| o + 1) != Some(next) && acked_through.is_some() {
                        attempt = 0; // progress since the last failure: back off from the start
                    }
                    if self.retry_wait(&e, &mut attempt).await {
                        return Ok(());
                    }
                    // The lane gave up in the middle of a sequence: resume from the last
                    // acknowledged offset with a new producer id, so sequences start afresh.
                    // Records in flight may be written twice (at-least-once), never lost.
                    match IdempotentProducer::new(self.ctx.target.clone()).await {
                        Ok(p) => producer = p,
                        Err(e) => tracing::warn!(error = %e, "new producer id failed; retrying"),
                    }
                }
                Err(Failure::Continue { log_start }) => acked_through = Some(log_start - 1),
                Err(Failure::Stop(s)) => return Err(s),
            }
        }
    }

    /// Copies what `feed` delivers from `next` on until stopped, with acknowledgements taken as
    /// they arrive (several produces stay in flight while the partition waits for data). On
    /// return, everything acknowledged is on the board.
    async fn copy_from(
        &self,
        feed: &mut Subscription,
        mut next: i64,
        producer: &Arc<IdempotentProducer>,
        g: &Gauges,
        acked_through: &mut Option<i64>,
    ) -> Result<(), Failure> {
        let start = next;
        let flow = &self.ctx.flow;
        let isolation = flow.clients.consumer_tuning.isolation_level;
        let codec = Codec::from(flow.clients.producer_tuning.compression);
        let mut lane = producer.lane(&self.remote, self.partition).with_limits(
            flow.clients.producer_tuning.max_request_size as usize,
            16 << 20,
        );
        // The source offsets of each batch in flight, in send order (acks come back in order),
        // to turn acknowledgements into exact offset syncs; the last batch of each response
        // carries the response's share of the memory budget, released with its ack.
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let mut rules = SyncRules::new(&self.topic, self.partition, flow.offset_lag_max);
        let mut report =
            |acked: Vec<Acked>, through: &mut Option<i64>, in_flight: &mut VecDeque<InFlight>| {
                if let Some(last) = acked.last() {
                    *through = Some(last.tag);
                    self.ctx
                        .board
                        .acknowledged(&self.topic, self.partition, last.tag);
                }
                for a in &acked {
                    g.records.inc_by(a.records.max(0) as u64);
                    if let Some((ups, _released)) = in_flight.pop_front() {
                        if let Some(outbox) = &self.ctx.offset_syncs {
                            outbox.push(rules.on_batch(&ups, a.base_offset));
                        }
                        self.ctx
                            .runs
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .record(&self.topic, self.partition, &ups, a.base_offset);
                    }
                }
            };
        // Waits for every batch in flight and reports what was acknowledged.
        macro_rules! flush_and_report {
            () => {
                report(
                    lane.flush()
                        .await
                        .map_err(|e| self.lane_failure(acked_through, start, e))?,
                    acked_through,
                    &mut in_flight,
                )
            };
        }
        let fetcher = &self.ctx.fetcher;
        let merge_limit = self.merge_limit();
        // The newest record's timestamp, and whether everything fetched so far was the log's
        // end: the replication latency is measured when such a batch is acknowledged.
        let mut batch_age_ts = None;
        let mut caught_up = false;
        loop {
            let event = tokio::select! {
                biased;
                _ = self.stop.wait() => break,
                _ = lane.answered() => {
                    let acked = lane
                        .take_answered()
                        .await
                        .map_err(|e| self.lane_failure(acked_through, start, e))?;
                    report(acked, acked_through, &mut in_flight);
                    if in_flight.is_empty() && caught_up {
                        if let Some(ts) = batch_age_ts {
                            g.latency.set(super::now_ms() - ts);
                        }
                    }
                    g.buffered.set(fetcher.buffered() as i64);
                    continue;
                }
                event = feed.recv() => event,
            };
            let (f, share) = match event {
                Some(FetchEvent::Data { data, share }) => (data, share),
                Some(FetchEvent::OutOfRange {
                    requested,
                    log_start,
                    log_end,
                }) => {
                    flush_and_report!();
                    return Err(self.out_of_range(requested, log_start, log_end));
                }
                Some(FetchEvent::Failed(e)) => {
                    flush_and_report!();
                    return Err(Failure::Stop(self.fatal(next, e)));
                }
                // The fetcher stopped: the flow is ending.
                None => break,
            };
            g.buffered.set(fetcher.buffered() as i64);
            if !self.ctx.limiters.is_empty() {
                for l in &self.ctx.limiters {
                    l.acquire(share.bytes(), &self.stop).await;
                }
            }
            let end = match isolation {
                IsolationLevel::ReadCommitted => f.last_stable_offset,
                IsolationLevel::ReadUncommitted => f.high_watermark,
            };
            let batches: Vec<&RawBatch> = match isolation {
                IsolationLevel::ReadCommitted => f.committed_batches(),
                IsolationLevel::ReadUncommitted => {
                    f.batches.iter().filter(|b| !b.is_control()).collect()
                }
            };
            let forwardable = |b: &RawBatch| {
                flow.batch_mode
                    && flow.transforms.is_empty()
                    && b.base_offset() >= next
                    && b.offsets_contiguous()
                    && !b.is_log_append_time()
            };
            let mut share = Some(share);
            let mut i = 0;
            while i < batches.len() {
                let b = batches[i];
                let as_is = forwardable(b);
                let run = if as_is {
                    small_run(&batches[i..], &forwardable, merge_limit)
                } else {
                    1
                };
                let last = batches[i + run - 1];
                // (batch, its records' source offsets, the tag: the source offset the position
                // may move to once the target acknowledged it)
                let (sent, mode) = if run > 1 {
                    (self.merge(&batches[i..i + run])?, Mode::Merged)
                } else if as_is {
                    let ups = SourceOffsets::Contiguous {
                        first: b.base_offset(),
                        count: b.record_count() as i64,
                    };
                    (vec![(b.clone(), ups, b.last_offset())], Mode::Batch)
                } else {
                    (self.reencode(b, next, codec)?, Mode::Record)
                };
                i += run;
                if sent.is_empty() && b.last_offset() >= next {
                    // Every record was filtered out (or compacted away): once what is in flight
                    // is acknowledged, the position may pass this batch.
                    flush_and_report!();
                    *acked_through = Some(b.last_offset());
                    self.ctx
                        .board
                        .acknowledged(&self.topic, self.partition, b.last_offset());
                }
                for (batch, ups, tag) in sent {
                    in_flight.push_back((ups, Vec::new()));
                    let size = batch.bytes().len() as u64;
                    let acked = lane.send(tag, batch).await.map_err(|e| match e {
                        // Refused before sending: this batch, not an earlier one.
                        KafkaError::BatchTooLarge { .. } => {
                            self.lane_failure(&Some(b.base_offset() - 1), start, e)
                        }
                        e => self.lane_failure(acked_through, start, e),
                    })?;
                    report(acked, acked_through, &mut in_flight);
                    g.bytes.inc_by(size);
                    match mode {
                        Mode::Batch => g.batch_mode.inc(),
                        Mode::Merged => g.merged_mode.inc(),
                        Mode::Record => g.record_mode.inc(),
                    };
                }
                batch_age_ts = Some(last.max_timestamp());
                g.age.set(super::now_ms() - last.max_timestamp());
            }
            // The response's memory goes back once everything now in flight is acknowledged
            // (acknowledgements come in order, so with the newest batch in flight); with
            // nothing in flight it goes back now.
            if let (Some(share), Some((_, held))) = (share.take(), in_flight.back_mut()) {
                held.push(share);
            }
            if let Some(e) = f.batches.last().map(|b| b.last_offset() + 1) {
                // Also past control batches and aborted data at the end of the response.
                next = next.max(e);
            }
            g.lag.set((end - next).max(0));
            caught_up = next >= end;
            if caught_up && in_flight.is_empty() {
                if let Some(ts) = batch_age_ts {
                    g.latency.set(super::now_ms() - ts);
                }
            }
            g.buffered.set(fetcher.buffered() as i64);
        }
        flush_and_report!();
        Ok(())
    }

    /// Record mode: decode, keep the records at or after `next`, re-encode with the producer's
    /// codec, in as many batches as `max.request.size` needs (a compressed source batch may not
    /// fit once re-encoded with another codec). The last batch carries the source batch's last
    /// offset as its tag, so the position passes records compaction removed at its end.
    fn reencode(
        &self,
        b: &RawBatch,
        next: i64,
        codec: Codec,
    ) -> Result<Vec<(RawBatch, SourceOffsets, i64)>, Failure> {
        let bad = |e: String| Failure::Stop(self.fatal(b.base_offset(), KafkaError::Config(e)));
        let transforms = &self.ctx.flow.transforms;
        let kept: Vec<Record> = decode_batch(b)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .filter(|r| r.offset >= next)
            // MM2 mode refuses renaming transforms, so the topic stays the remote one.
            .filter_map(|r| transforms.apply(&self.topic, r).map(|(_, r)| r))
            .collect();
        let limit = self.ctx.flow.clients.producer_tuning.max_request_size as usize;
        let mut out = Vec::new();
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        for (batch, range) in
            encode_within(&kept, &options, limit).map_err(|e| bad(e.to_string()))?
        {
            let ups: Vec<i64> = kept[range].iter().map(|r| r.offset).collect();
            let Some(&tag) = ups.last() else { continue };
            out.push((batch, SourceOffsets::Listed(ups), tag));
        }
        if let Some(last) = out.last_mut() {
            last.2 = b.last_offset();
        }
        Ok(out)
    }

    /// Merges a run of small consecutive batches (see [`small_run`]) into as few target batches
    /// as `max.request.size` allows, each record re-encoded with its source codec and its own
    /// timestamp. The offsets stay contiguous, so translation stays exact.
    fn merge(&self, run: &[&RawBatch]) -> Result<Vec<(RawBatch, SourceOffsets, i64)>, Failure> {
        let first = run[0];
        let bad = |e: String| Failure::Stop(self.fatal(first.base_offset(), KafkaError::Config(e)));
        let mut records: Vec<Record> = Vec::new();
        for b in run {
            records.extend(decode_batch(b).map_err(|e| bad(e.to_string()))?);
        }
        let options = BatchOptions {
            codec: first.codec().unwrap_or(Codec::None),
            ..BatchOptions::default()
        };
        let limit = self.ctx.flow.clients.producer_tuning.max_request_size as usize;
        let mut out = Vec::new();
        for (batch, range) in
            encode_within(&records, &options, limit).map_err(|e| bad(e.to_string()))?
        {
            let Some(r) = records.get(range.start) else {
                continue;
            };
            let count = range.len() as i64;
            let ups = SourceOffsets::Contiguous {
                first: r.offset,
                count,
            };
            out.push((batch, ups, r.offset + count - 1));
        }
        Ok(out)
    }

    /// The most bytes a run of merged batches may hold.
    fn merge_limit(&self) -> usize {
        let max_request = self.ctx.flow.clients.producer_tuning.max_request_size as usize;
        MERGED_MAX.min(max_request / 2)
    }

    async fn start_offset(&self) -> Result<i64, KafkaError> {
        let tuning = &self.ctx.flow.clients.consumer_tuning;
        // MM2 resumes at stored + 1; without a position, auto.offset.reset decides.
        let at = match tuning.auto_offset_reset {
            AutoOffsetReset::Latest => LATEST,
            _ => EARLIEST,
        };
        self.ctx
            .source
            .list_offset(&self.topic, self.partition, at, tuning.isolation_level)
            .await
    }

    fn out_of_range(&self, requested: i64, log_start: i64, log_end: i64) -> Failure {
        let labels = self.ctx.labels.partition(&self.remote, self.partition);
        if requested > log_end {
            self.count_error("position_beyond_end");
            return Failure::Stop(Stopped::BeyondEnd {
                topic: self.topic.clone(),
                partition: self.partition,
                requested,
                log_end,
            });
        }
        // Never skip silently (issue 4): report how many offsets were lost.
        let lost = (log_start - requested).max(0);
        self.ctx
            .metrics
            .truncated_offsets
            .get_or_create(&labels)
            .inc_by(lost as u64);
        self.count_error("truncation");
        let stopped = Stopped::Truncated {
            topic: self.topic.clone(),
            partition: self.partition,
            requested,
            log_start,
            log_end,
            lost,
        };
        match self.ctx.flow.on_truncation {
            OnTruncation::Stop => Failure::Stop(stopped),
            OnTruncation::Continue => {
                tracing::error!(flow = %self.ctx.flow.id, error = %stopped, "records lost; continuing from the source log start (kmirror.source.truncation=continue)");
                Failure::Continue { log_start }
            }
        }
    }

    /// A produce failure. The lane acknowledges in order, so the batch that failed is the
    /// oldest unacknowledged one: it starts after the last acknowledged offset.
    fn lane_failure(&self, acked_through: &Option<i64>, start: i64, e: KafkaError) -> Failure {
        if e.is_retriable() || e.is_stale_metadata() {
            self.count_error("produce");
            Failure::Retry(e)
        } else {
            self.count_error("fatal");
            let first = acked_through.map_or(start, |o| o + 1);
            Failure::Stop(Stopped::Kafka {
                topic: self.topic.clone(),
                partition: self.partition,
                first,
                source: e,
            })
        }
    }

    fn fatal(&self, offset: i64, e: KafkaError) -> Stopped {
        self.count_error("fatal");
        Stopped::Kafka {
            topic: self.topic.clone(),
            partition: self.partition,
            first: offset,
            source: e,
        }
    }

    fn count_error(&self, kind: &str) {
        self.ctx
            .metrics
            .errors
            .get_or_create(&self.ctx.labels.error(kind))
            .inc();
    }

    /// Logs a transient failure and waits with backoff; true if stopped meanwhile.
    async fn retry_wait(&self, e: &KafkaError, attempt: &mut u32) -> bool {
        tracing::warn!(flow = %self.ctx.flow.id, topic = %self.topic, partition = self.partition, error = %e, "partition interrupted; retrying");
        *attempt += 1;
        self.stop.sleep(super::backoff(*attempt - 1)).await
    }
}

/// A batch sent and not yet acknowledged: its source offsets, and the shares of the memory
/// budget (fetched responses) its acknowledgement releases.
type InFlight = (SourceOffsets, Vec<BufferShare>);

enum Failure {
    /// Transient: resume from the last acknowledged offset.
    Retry(KafkaError),
    /// Source truncated and `kmirror.source.truncation=continue`.
    Continue {
        log_start: i64,
    },
    Stop(Stopped),
}

fn next_or(acked: Option<i64>) -> i64 {
    acked.map_or(-1, |o| o + 1)
}
