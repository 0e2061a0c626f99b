//! Forwarding one source partition: what arrives from the fetcher goes to the target (batch
//! mode, merged small batches, or record mode when records must change), acknowledgements move
//! the position on the board and feed offset syncs and checkpoints, and failures are sorted
//! into retry, continue and stop. The I/O sits behind two seams, [`Feed`] (the fetcher's
//! subscription) and [`Sink`] (the producer's lane for the remote partition), so these
//! decisions are unit-tested without brokers.
//!
//! The decisions are the copy core's (`crate::copy`): how far the partition is copied
//! (`Progress`, `Held`) and how batches go (`BatchPlanner`). This file is the shell that feeds
//! them and does the I/O; `copy`'s `report` closure and `commit_point!` / `flush_and_report!`
//! macros share its locals and `?`/return out of it, so they stay inside it.

mod failure;
mod gauges;
mod seams;

use super::offset_syncs::Outbox;
use super::positions::Board;
use super::slots::{Admit, Member, Outcome, Slot};
use super::throttle::RateLimiter;
use super::Shutdown;
use crate::config::model::{FlowConfig, OnTruncation};
use crate::copy::batches::{BatchPlanner, Mode, Outgoing, PlanError};
use crate::copy::progress::{ChunkId, Held, Progress};
use crate::copy::schema_ids::Rewrite;
use crate::events::copy::{At, CopyFailed, PositionBeyondEnd, SourceTruncated, TransactionFailed};
use crate::events::{Emitter, Event};
use crate::metrics::{FlowLabels, Metrics};
use crate::offsets::runs::Runs;
use crate::offsets::sync_rules::{SourceOffsets, SyncRules};
pub(super) use failure::{Failure, Rewound, Stopped};
pub(super) use gauges::Gauges;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::fetcher::{BufferShare, FetchEvent};
use kmirror_kafka::producer::Acked;
use kmirror_kafka::KafkaError;
pub(super) use seams::{Feed, Sink};
use std::sync::{Arc, Mutex};

/// What the schema gate made of a planned batch.
enum Checked {
    Send(Vec<Outgoing>),
    Wait(
        Outgoing,
        std::collections::BTreeSet<kmirror_registry::SchemaId>,
    ),
}

/// Forwards one source partition to the same partition of its remote topic.
pub(super) struct Forwarder<'a> {
    pub(super) flow: &'a FlowConfig,
    pub(super) topic: &'a str,
    pub(super) remote: &'a str,
    pub(super) partition: i32,
    pub(super) board: &'a Board,
    /// Where offset syncs go (`emit.offset-syncs.enabled`).
    pub(super) offset_syncs: Option<&'a Outbox>,
    /// What this process copied, for exact checkpoints.
    pub(super) runs: &'a Mutex<Runs>,
    pub(super) metrics: &'a Metrics,
    pub(super) labels: &'a FlowLabels,
    /// The flow's and the process's rate limits, paid for each fetched response.
    pub(super) limiters: &'a [Arc<RateLimiter>],
    pub(super) stop: &'a Shutdown,
    /// With sharing: hold writes while membership is in doubt (see `Shared::may_write`).
    pub(super) lease: Option<&'a super::sharing::Shared>,
    /// Loop prevention: leaves out what kmirror copied into the source from the target.
    pub(super) loop_guard: Option<&'a super::loop_guard::LoopGuard>,
    /// Schema sync: the target registry's ids of the ids records name (docs/schemas.md).
    pub(super) schemas: Option<&'a super::schemas::IdMap>,
    /// Exactly-once: the slot whose transactions this partition writes in.
    pub(super) slot: Option<&'a Arc<Slot>>,
    pub(super) g: &'a Gauges,
    /// What the partition waits for until it copies (`engine/waiting.rs`).
    pub(super) watch: &'a super::waiting::Watch,
}

impl Forwarder<'_> {
    /// Copies what `feed` delivers from `next` on until stopped, with acknowledgements taken as
    /// they arrive (several produces stay in flight while the partition waits for data). On
    /// return, everything acknowledged is on the board.
    pub(super) async fn run<F: Feed, S: Sink>(
        &self,
        feed: &mut F,
        lane: &mut S,
        next: i64,
        acked_through: &mut Option<i64>,
    ) -> Result<(), Failure> {
        // Exactly-once: this run's place in its slot.
        let mut member = self.slot.map(|s| s.gate.member(self.topic, self.partition));
        let result = self
            .copy(feed, lane, next, acked_through, &mut member)
            .await;
        if let (Err(Failure::Rewind(cause)), Some(m)) = (&result, member.as_mut()) {
            match cause {
                // Nothing of this run reached the open transaction.
                Rewound::Stale => m.forget(),
                // Fenced from outside: the open transaction is dead, and the committer counts
                // the fence (a second one soon after stops the flow).
                Rewound::Fenced => m.fenced(),
                // A member dropped with data in the open transaction dooms it.
                Rewound::Aborted | Rewound::Failed => {}
            }
        }
        result
    }

    async fn copy<F: Feed, S: Sink>(
        &self,
        feed: &mut F,
        lane: &mut S,
        mut next: i64,
        acked_through: &mut Option<i64>,
        member: &mut Option<Member>,
    ) -> Result<(), Failure> {
        let start = next;
        let g = self.g;
        let flow = self.flow;
        let isolation = flow.clients.consumer_tuning.isolation_level;
        let planner = BatchPlanner {
            batch_mode: flow.batch_mode,
            merge_small: flow.merge_small_batches,
            max_request: flow.clients.producer_tuning.max_request_size as usize,
            max_decompressed: flow.max_decompressed_bytes,
            codec: Codec::from(flow.clients.producer_tuning.compression),
            topic: self.topic,
            transforms: &flow.transforms,
        };
        // Each batch in flight is a chunk of the partition's progress (copy/progress.rs); its
        // lane tag, its name, is its last source offset. Batches with nothing to copy (every record filtered out;
        // transaction markers and aborted transactions at the end of a response) are skipped
        // chunks: the position passes them once everything sent before is acknowledged.
        // Without that, a transactional source's position would stay on its last record, one
        // offset short of the end, and `verify` would wait forever.
        let mut progress: Progress<Sent> = Progress::starting_after(*acked_through);
        let mut rules = SyncRules::new(self.topic, self.partition, flow.offset_lag_max);
        // Exactly-once: what was acknowledged since the last commit, held until the transaction
        // commits. A Mutex, not a RefCell: the forwarder's future must be Send.
        let held: Mutex<Option<Held<Copied>>> = Mutex::new(member.is_some().then(Held::default));
        // The source's end in the last answer: the lag counts from what the target
        // acknowledged, so a partition whose sends are never answered does not show as
        // caught up. (An atomic, not a Cell: the forwarder's future must be Send.)
        let seen_end = std::sync::atomic::AtomicI64::new(-1);
        let mut report =
            |acked: Vec<Acked>, through: &mut Option<i64>, progress: &mut Progress<Sent>| {
                for a in &acked {
                    g.records.inc_by(a.records.max(0) as u64);
                    if let Some(sent) = progress.ack(ChunkId(a.tag)) {
                        sent.target_base = a.base_offset;
                    }
                }
                let done = progress.take_done();
                if done.through.is_some() {
                    self.watch.copying();
                }
                // The memory shares go back here, with the acknowledgement.
                let copied = done.payloads.into_iter().map(|s| {
                    let syncs = match self.offset_syncs {
                        Some(_) => rules.on_batch(&s.ups, s.target_base),
                        None => Vec::new(),
                    };
                    Copied {
                        ups: s.ups,
                        base: s.target_base,
                        syncs,
                    }
                });
                let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                match held.as_mut() {
                    Some(h) => h.add(done.through, copied),
                    None => {
                        if let Some(t) = done.through {
                            *through = Some(t);
                            self.board.acknowledged(self.topic, self.partition, t);
                            let end = seen_end.load(std::sync::atomic::Ordering::Relaxed);
                            if end >= 0 {
                                g.lag.set((end - (t + 1)).max(0));
                            }
                        }
                        self.record_copied(copied);
                    }
                }
            };
        // Waits for every batch in flight and reports what was acknowledged.
        macro_rules! flushed_and_reported {
            () => {
                report(
                    lane.flush()
                        .await
                        .map_err(|e| self.lane_failure(acked_through, start, e))?,
                    acked_through,
                    &mut progress,
                );
            };
        }
        // Exactly-once: flushes the lane, hands the position reached to the slot and waits for
        // the transaction's outcome; committed, what was held counts as copied, aborted, the
        // partition goes back to its last committed position. `hurry` asks for the commit now.
        macro_rules! commit_point {
            ($hurry:expr) => {
                if member.is_some() {
                    flushed_and_reported!();
                    let h = held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .replace(Held::default())
                        .unwrap_or_default();
                    if let Some(m) = member.as_mut() {
                        if h.moved_past(*acked_through) && !m.joined() {
                            // Only the position moved (everything filtered): it is stored with
                            // the next commit too.
                            match m.admit(0, self.stop).await {
                                Admit::Go => {}
                                Admit::Leave => return Ok(()),
                                Admit::Stopped(e) => return self.slot_stopped(next, e),
                                Admit::Flush | Admit::Rewind => {
                                    return Err(Failure::Rewind(Rewound::Aborted))
                                }
                            }
                        }
                        match m.flush(h.through, $hurry, self.stop).await {
                            Outcome::Committed => self.release(h, acked_through),
                            Outcome::Aborted => return Err(Failure::Rewind(Rewound::Aborted)),
                        }
                    }
                }
            };
        }
        // Flushes, reports and (exactly-once) commits before the partition stops or returns.
        macro_rules! flush_and_report {
            () => {
                flushed_and_reported!();
                commit_point!(true);
            };
        }
        // The newest record's timestamp, and whether everything fetched so far was the log's
        // end: the replication latency is measured when such a batch is acknowledged.
        let mut batch_age_ts = None;
        let mut caught_up = false;
        loop {
            let event = tokio::select! {
                biased;
                _ = self.stop.wait() => break,
                _ = lane.answered() => {
                    let acked = lane.take_answered()
                        .await
                        .map_err(|e| self.lane_failure(acked_through, start, e))?;
                    report(acked, acked_through, &mut progress);
                    if progress.is_idle() && caught_up {
                        if let Some(ts) = batch_age_ts {
                            g.latency.set(super::now_ms() - ts);
                        }
                    }
                    g.buffered.set(feed.buffered() as i64);
                    continue;
                }
                a = async {
                    match member.as_mut() {
                        Some(m) => m.ending().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match a {
                        Admit::Flush => {
                            commit_point!(false);
                        }
                        Admit::Rewind | Admit::Go | Admit::Leave => {
                            return Err(Failure::Rewind(Rewound::Aborted))
                        }
                        Admit::Stopped(e) => return self.slot_stopped(next, e),
                    }
                    continue;
                }
                event = feed.recv() => event,
            };
            tracing::trace!(topic = self.topic, partition = self.partition, next, in_flight = progress.pending(), event = ?event.as_ref().map(|e| match e {
                FetchEvent::Data { data, .. } => format!("data {} batches from {:?}", data.batches.len(), data.batches.first().map(|b| b.base_offset())),
                other => format!("{other:?}"),
            }), "fetched");
            if let Some(lease) = self.lease {
                // The lease is a send gate: a process that wakes from a pause longer than its
                // session writes nothing until it knows it still owns the partition.
                if !lease.hold_writes(self.stop).await {
                    break;
                }
            }
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
                // The fetcher stopped: the flow is ending, or a fetcher task panicked.
                None if self.stop.is_triggered() => break,
                None => {
                    flush_and_report!();
                    return Err(Failure::Stop(self.fatal(
                        next,
                        KafkaError::Config(
                            "the source fetcher stopped unexpectedly (see the log)".into(),
                        ),
                    )));
                }
            };
            g.buffered.set(feed.buffered() as i64);
            if !self.limiters.is_empty() {
                for l in self.limiters {
                    l.acquire(share.bytes(), self.stop).await;
                }
            }
            let end = f.readable_end(isolation);
            // The batch filters: the isolation level's, then the loop guard's, whose batches
            // are left out like aborted data (the position passes them with the next batch
            // copied, or at the end of the response).
            let batches = f.visible(isolation);
            let batches = match self.loop_guard {
                Some(guard) => match guard.keep(batches, self.stop).await {
                    Some((kept, skipped)) => {
                        if skipped > 0 {
                            g.loop_skipped.inc_by(skipped);
                        }
                        kept
                    }
                    None => break,
                },
                None => batches,
            };
            let mut share = Some(share);
            let mut i = 0;
            while i < batches.len() {
                let b = batches[i];
                let planned = match planner.plan(&batches[i..], next) {
                    Ok(p) => p,
                    Err(e) => {
                        // What came before the bad batch is delivered and its position
                        // stored, so the partition stops exactly at the batch it names.
                        flush_and_report!();
                        return Err(Failure::Stop(self.refused(e)));
                    }
                };
                let last = batches[i + planned.covers - 1];
                i += planned.covers;
                if planned.sends.is_empty() && b.last_offset() >= next {
                    // Every record was filtered out (or compacted away).
                    progress.skip(b.last_offset());
                    report(Vec::new(), acked_through, &mut progress);
                }
                // The send gate for schemas: each batch goes once the schemas its records name
                // are on the target, with their ids rewritten where the target's differ.
                let sends = match self.schemas {
                    None => planned.sends,
                    Some(map) => {
                        let mut checked = Vec::with_capacity(planned.sends.len());
                        for out in planned.sends {
                            let mut out = Some(out);
                            while let Some(o) = out.take() {
                                match self.schema_ids(map, o) {
                                    Err(e) => {
                                        flush_and_report!();
                                        return Err(Failure::Stop(self.refused(e)));
                                    }
                                    Ok(Checked::Send(ready)) => checked.extend(ready),
                                    Ok(Checked::Wait(o, ids)) => {
                                        // What is in flight is acknowledged (and committed)
                                        // first: the wait may be long.
                                        flush_and_report!();
                                        if !self.wait_for_schemas(map, &ids, &o).await {
                                            return Ok(());
                                        }
                                        out = Some(o);
                                    }
                                }
                            }
                        }
                        checked
                    }
                };
                for (batch, ups, tag) in sends {
                    let size = batch.bytes().len() as u64;
                    // Exactly-once: into the open transaction, after the gate.
                    while let Some(m) = member.as_mut() {
                        match m.admit(size, self.stop).await {
                            Admit::Go => break,
                            Admit::Flush => {}
                            Admit::Leave => return Ok(()),
                            Admit::Rewind => return Err(Failure::Rewind(Rewound::Aborted)),
                            Admit::Stopped(e) => return self.slot_stopped(b.base_offset(), e),
                        }
                        commit_point!(false);
                    }
                    let sent = Sent {
                        ups,
                        shares: Vec::new(),
                        target_base: -1,
                    };
                    progress.open(ChunkId(tag), tag, 1, sent);
                    self.watch.stage(super::waiting::Stage::Send);
                    let acked = lane.send(tag, batch).await.map_err(|e| match e {
                        // Refused before sending: this batch, not an earlier one.
                        KafkaError::BatchTooLarge { .. } => {
                            self.lane_failure(&Some(b.base_offset() - 1), start, e)
                        }
                        e => self.lane_failure(acked_through, start, e),
                    })?;
                    report(acked, acked_through, &mut progress);
                    g.bytes.inc_by(size);
                    match planned.mode {
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
            if let (Some(share), Some(sent)) = (share.take(), progress.newest_pending()) {
                sent.shares.push(share);
            }
            if let Some(tail) = f.batches.last().map(|b| b.last_offset()) {
                // Also past control batches and aborted data at the end of the response.
                next = next.max(tail + 1);
                let copied_to = batches.last().map_or(-1, |b| b.last_offset());
                if tail > copied_to && tail >= start {
                    progress.skip(tail);
                    report(Vec::new(), acked_through, &mut progress);
                }
            }
            if let Some(m) = member.as_mut() {
                // Only the position moved (everything filtered, markers): it joins the open
                // transaction so the commit stores it.
                let moved = held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|h| h.moved_past(*acked_through));
                if moved && !m.joined() {
                    match m.admit(0, self.stop).await {
                        Admit::Go => {}
                        Admit::Flush => {
                            commit_point!(false);
                        }
                        Admit::Leave => return Ok(()),
                        Admit::Rewind => return Err(Failure::Rewind(Rewound::Aborted)),
                        Admit::Stopped(e) => return self.slot_stopped(next, e),
                    }
                }
            }
            seen_end.store(end, std::sync::atomic::Ordering::Relaxed);
            g.lag
                .set((end - acked_through.map_or(start, |a| a + 1)).max(0));
            self.watch.lag_shown();
            caught_up = next >= end;
            if caught_up && progress.is_idle() {
                // Nothing left to copy: it copies, with nothing to send.
                self.watch.copying();
                if let Some(ts) = batch_age_ts {
                    g.latency.set(super::now_ms() - ts);
                }
            }
            g.buffered.set(feed.buffered() as i64);
        }
        flush_and_report!();
        Ok(())
    }

    /// One planned batch through the schema gate: as it is, rewritten, or held for ids the
    /// target lacks.
    fn schema_ids(&self, map: &super::schemas::IdMap, out: Outgoing) -> Result<Checked, PlanError> {
        let g = self.g;
        let rewrite = crate::copy::schema_ids::rewrite(
            &out,
            &|id| map.target(id),
            self.flow.max_decompressed_bytes,
            self.flow.clients.producer_tuning.max_request_size as usize,
        )?;
        Ok(match rewrite {
            Rewrite::AsIs { passed } => {
                g.schema_unknown.inc_by(passed);
                Checked::Send(vec![out])
            }
            Rewrite::Rewritten {
                sends,
                translated,
                passed,
            } => {
                g.schema_unknown.inc_by(passed);
                g.schema_translated.inc_by(translated);
                Checked::Send(sends)
            }
            Rewrite::Waiting(ids) => Checked::Wait(out, ids),
        })
    }

    /// Waits (shown in `kmirror_records_waiting_for_schema`) until the schema task has looked
    /// for `ids`; false when the partition stops first.
    async fn wait_for_schemas(
        &self,
        map: &super::schemas::IdMap,
        ids: &std::collections::BTreeSet<kmirror_registry::SchemaId>,
        held: &Outgoing,
    ) -> bool {
        let n = held.0.record_count().max(0) as i64;
        self.g.schema_waiting.inc_by(n);
        let go = map.wait_for(ids, self.stop).await;
        self.g.schema_waiting.dec_by(n);
        go
    }

    /// Offset syncs and exact-translation runs of batches now copied.
    fn record_copied(&self, copied: impl IntoIterator<Item = Copied>) {
        let mut syncs = Vec::new();
        let mut runs = None;
        for c in copied {
            syncs.extend(c.syncs);
            runs.get_or_insert_with(|| self.runs.lock().unwrap_or_else(|p| p.into_inner()))
                .record(self.topic, self.partition, &c.ups, c.base);
        }
        if let (Some(outbox), false) = (self.offset_syncs, syncs.is_empty()) {
            outbox.push(syncs);
        }
    }

    /// A batch the planner could not prepare: the partition stops at it.
    fn refused(&self, e: PlanError) -> Stopped {
        match e {
            PlanError::Corrupt { offset, message } => self.fatal(
                offset,
                KafkaError::CorruptBatch {
                    topic: self.topic.to_string(),
                    partition: self.partition,
                    offset,
                    message,
                },
            ),
            PlanError::Refused { offset, message } => {
                self.fatal(offset, KafkaError::Config(message))
            }
        }
    }

    fn out_of_range(&self, requested: i64, log_start: i64, log_end: i64) -> Failure {
        if requested > log_end {
            PositionBeyondEnd {
                at: self.at(),
                requested,
                log_end,
            }
            .emit(self.emitter());
            return Failure::Stop(Stopped::BeyondEnd {
                topic: self.topic.to_string(),
                partition: self.partition,
                requested,
                log_end,
            });
        }
        // Never skip silently: report how many offsets were lost.
        let lost = (log_start - requested).max(0);
        let stopped = Stopped::Truncated {
            topic: self.topic.to_string(),
            partition: self.partition,
            requested,
            log_start,
            log_end,
            lost,
        };
        let continuing = self.flow.on_truncation == OnTruncation::Continue;
        SourceTruncated {
            at: self.at(),
            lost: lost as u64,
            continuing,
            error: &stopped,
        }
        .emit(self.emitter());
        if continuing {
            Failure::Continue { log_start }
        } else {
            Failure::Stop(stopped)
        }
    }

    /// Exactly-once: what a committed transaction held becomes copied (position, offset syncs,
    /// runs), as acknowledgements do in at-least-once mode.
    fn release(&self, h: Held<Copied>, through: &mut Option<i64>) {
        if let Some(t) = h.through {
            *through = Some(t);
            self.board.committed(self.topic, self.partition, t);
        }
        self.record_copied(h.done);
    }

    /// A produce failure. The lane acknowledges in order, so the batch that failed is the
    /// oldest unacknowledged one: it starts after the last acknowledged offset.
    fn lane_failure(&self, acked_through: &Option<i64>, start: i64, e: KafkaError) -> Failure {
        if self.slot.is_some() && e.ends_transaction() {
            // The transaction cannot go on (the coordinator aborted it at its timeout, another
            // process took the id, the broker lost the producer's state): it is aborted as a
            // whole and the slot's partitions copy again from the last commit.
            let cause = match e {
                KafkaError::StaleProducer { .. } => return Failure::Rewind(Rewound::Stale),
                KafkaError::Fenced { .. } => Rewound::Fenced,
                _ => Rewound::Failed,
            };
            TransactionFailed {
                at: self.at(),
                error: &e,
            }
            .emit(self.emitter());
            return Failure::Rewind(cause);
        }
        let retrying = e.is_retriable() || e.is_stale_metadata();
        let first = acked_through.map_or(start, |o| o + 1);
        if retrying {
            CopyFailed {
                at: self.at(),
                offset: first,
                retrying,
                error: &e,
            }
            .emit(self.emitter());
            Failure::Retry(e)
        } else {
            Failure::Stop(self.fatal(first, e))
        }
    }

    /// The slot stopped committing: the partition stops with the error, unless it is stopping
    /// itself (its slot given up, the membership lost, the flow ending), which ends it quietly.
    fn slot_stopped(&self, offset: i64, e: KafkaError) -> Result<(), Failure> {
        if self.stop.is_triggered() {
            return Ok(());
        }
        Err(Failure::Stop(self.fatal(offset, e)))
    }

    pub(super) fn fatal(&self, offset: i64, e: KafkaError) -> Stopped {
        CopyFailed {
            at: self.at(),
            offset,
            retrying: false,
            error: &e,
        }
        .emit(self.emitter());
        Stopped::Kafka {
            topic: self.topic.to_string(),
            partition: self.partition,
            first: offset,
            source: e,
        }
    }

    fn at(&self) -> At<'_> {
        At {
            flow: &self.flow.id,
            topic: self.topic,
            remote: self.remote,
            partition: self.partition,
        }
    }

    fn emitter(&self) -> Emitter<'_> {
        Emitter {
            metrics: self.metrics,
            labels: self.labels,
        }
    }
}

/// A batch in flight: its records' source offsets, the shares of the memory budget (fetched
/// responses) its acknowledgement releases, and where the target put its first record.
struct Sent {
    ups: SourceOffsets,
    shares: Vec<BufferShare>,
    target_base: i64,
}

/// A batch the target acknowledged: its records' source offsets, where the target put the
/// first, and the offset syncs it calls for. With exactly-once it counts as copied only once
/// the transaction commits.
#[derive(Debug)]
pub(super) struct Copied {
    ups: SourceOffsets,
    base: i64,
    syncs: Vec<crate::wire::internal::OffsetSync>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::FlowLabels;
    use crate::test_support::flow;
    use bytes::{Bytes, BytesMut};
    use kmirror_kafka::batch::RawBatch;
    use kmirror_kafka::cluster::PartitionFetch;
    use kmirror_kafka::fetcher::BufferShare;
    use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
    use std::collections::VecDeque;
    use std::future::Future;

    /// A scripted subscription: its events in order, then the task's stop (as the engine's
    /// shutdown would), so the forwarder flushes and returns.
    struct FakeFeed {
        events: VecDeque<FetchEvent>,
        stop: Shutdown,
    }

    impl Feed for FakeFeed {
        // Taken when polled, not when the future is made: cancel-safe, as the real one.
        async fn recv(&mut self) -> Option<FetchEvent> {
            match self.events.pop_front() {
                Some(e) => Some(e),
                None => {
                    self.stop.trigger();
                    std::future::pending().await
                }
            }
        }
        fn buffered(&self) -> usize {
            0
        }
    }

    /// A target partition: a batch is appended at the log end when it is acknowledged, and
    /// every answer is there at once, unless `fail_send` names a send (0-based) to refuse.
    #[derive(Default)]
    struct FakeSink {
        log_end: i64,
        queued: VecDeque<(i64, RawBatch)>,
        /// (tag, records, codec) of every batch sent.
        sent: Vec<(i64, i32, Option<Codec>)>,
        /// Every batch sent, as sent.
        bodies: Vec<RawBatch>,
        fail_send: Option<(usize, fn() -> KafkaError)>,
    }

    impl FakeSink {
        fn ack_all(&mut self) -> Vec<Acked> {
            let mut out = Vec::new();
            while let Some((tag, b)) = self.queued.pop_front() {
                out.push(Acked {
                    tag,
                    base_offset: self.log_end,
                    records: b.record_count(),
                });
                self.log_end += b.record_count() as i64;
            }
            out
        }
    }

    impl Sink for FakeSink {
        fn send(
            &mut self,
            tag: i64,
            batch: RawBatch,
        ) -> impl Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
            let n = self.sent.len();
            self.sent.push((tag, batch.record_count(), batch.codec()));
            self.bodies.push(batch.clone());
            let result = match self.fail_send {
                Some((i, e)) if i == n => Err(e()),
                _ => {
                    self.queued.push_back((tag, batch));
                    Ok(Vec::new())
                }
            };
            std::future::ready(result)
        }
        fn flush(&mut self) -> impl Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
            std::future::ready(Ok(self.ack_all()))
        }
        fn answered(&mut self) -> impl Future<Output = ()> + Send {
            let any = !self.queued.is_empty();
            async move {
                if !any {
                    std::future::pending::<()>().await
                }
            }
        }
        fn take_answered(&mut self) -> impl Future<Output = Result<Vec<Acked>, KafkaError>> + Send {
            std::future::ready(Ok(self.ack_all()))
        }
    }

    /// `n` records of `size` bytes from source offset `base`, in one batch.
    fn batch(base: i64, n: usize, size: usize, codec: Codec) -> RawBatch {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                offset: i as i64,
                timestamp: 1_700_000_000_000 + base + i as i64,
                key: Some(Bytes::from(format!("k{}", base + i as i64))),
                value: Some(Bytes::from(vec![b'v'; size])),
                headers: vec![],
            })
            .collect();
        let b = encode_batch(
            &records,
            &BatchOptions {
                codec,
                ..BatchOptions::default()
            },
        )
        .unwrap();
        // The base offset is outside the CRC: set it as a broker would.
        let mut bytes = BytesMut::from(b.bytes().as_ref());
        bytes[..8].copy_from_slice(&base.to_be_bytes());
        RawBatch::new(bytes.freeze()).unwrap()
    }

    fn data(batches: Vec<RawBatch>, high_watermark: i64) -> FetchEvent {
        let bytes = batches.iter().map(|b| b.bytes().len()).sum();
        FetchEvent::Data {
            data: PartitionFetch {
                high_watermark,
                last_stable_offset: high_watermark,
                log_start_offset: 0,
                batches,
                aborted: vec![],
            },
            share: BufferShare::detached(bytes),
        }
    }

    struct Rig {
        flow: FlowConfig,
        board: Board,
        outbox: Outbox,
        runs: Mutex<Runs>,
        metrics: Metrics,
        labels: FlowLabels,
        stop: Shutdown,
        g: Gauges,
        schemas: Option<std::sync::Arc<crate::engine::schemas::IdMap>>,
        watch: crate::engine::waiting::Watch,
    }

    impl Rig {
        fn new(extra: &str) -> Rig {
            let metrics = Metrics::new();
            let labels = FlowLabels {
                source: "A".into(),
                target: "B".into(),
            };
            let g = Gauges::new(&metrics, &labels, &labels.partition("A.t", 0));
            Rig {
                flow: flow(extra),
                board: Board::default(),
                outbox: Outbox::default(),
                runs: Mutex::new(Runs::default()),
                metrics,
                labels,
                stop: Shutdown::default(),
                g,
                schemas: None,
                watch: crate::engine::waiting::Watch::new(tokio::time::Instant::now(), None),
            }
        }

        fn forwarder(&self) -> Forwarder<'_> {
            Forwarder {
                flow: &self.flow,
                topic: "t",
                remote: "A.t",
                partition: 0,
                board: &self.board,
                offset_syncs: Some(&self.outbox),
                runs: &self.runs,
                metrics: &self.metrics,
                labels: &self.labels,
                limiters: &[],
                stop: &self.stop,
                lease: None,
                loop_guard: None,
                schemas: self.schemas.as_deref(),
                slot: None,
                g: &self.g,
                watch: &self.watch,
            }
        }

        /// Runs the forwarder over `events` from `next` into `sink`.
        async fn run(
            &self,
            events: Vec<FetchEvent>,
            sink: &mut FakeSink,
            next: i64,
            acked_through: &mut Option<i64>,
        ) -> Result<(), Failure> {
            let mut feed = FakeFeed {
                events: events.into(),
                stop: self.stop.clone(),
            };
            let forwarder = self.forwarder();
            let run = forwarder.run(&mut feed, sink, next, acked_through);
            tokio::time::timeout(std::time::Duration::from_secs(10), run)
                .await
                .expect("the forwarder returns once its feed is done")
        }

        fn batches(&self, mode: &str) -> f64 {
            self.metrics.sum("kmirror_batches_total", &[("mode", mode)])
        }
    }

    /// `n` records whose values are in the Confluent wire format with schema `id`.
    fn framed_batch(base: i64, n: usize, id: i32, codec: Codec) -> RawBatch {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                // Deltas: the broker's base offset is set below.
                offset: i as i64,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(
                    [&[0u8][..], &id.to_be_bytes(), &[b'x'; 64]].concat(),
                )),
                headers: vec![],
            })
            .collect();
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        let b = encode_batch(&records, &options).unwrap();
        let mut bytes = BytesMut::from(b.bytes().as_ref());
        bytes[..8].copy_from_slice(&base.to_be_bytes());
        RawBatch::new(bytes.freeze()).unwrap()
    }

    #[tokio::test]
    async fn a_batch_waits_for_its_schema_then_goes_with_the_targets_id_and_its_own_codec() {
        use crate::engine::schemas::IdMap;
        use kmirror_registry::SchemaId;
        let mut rig = Rig::new("");
        let map = std::sync::Arc::new(IdMap::default());
        rig.schemas = Some(map.clone());
        // Source id 1 is not on the target yet; id 2 is, under the same number.
        map.publish_ids(&[(2, 2)]);
        let waiting = rig.g.schema_waiting.clone();
        let publisher = {
            let map = map.clone();
            tokio::spawn(async move {
                // Published only once the partition waits: nothing may be sent before.
                while waiting.get() == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                let held = waiting.get();
                map.publish_ids(&[(1, 11), (2, 2)]);
                held
            })
        };
        let mut sink = FakeSink::default();
        let mut acked = None;
        let events = vec![
            data(vec![framed_batch(0, 3, 2, Codec::Gzip)], 3),
            data(vec![framed_batch(3, 4, 1, Codec::Lz4)], 7),
        ];
        assert!(rig.run(events, &mut sink, 0, &mut acked).await.is_ok());
        assert_eq!(
            publisher.await.unwrap(),
            4,
            "the second batch's records waited"
        );
        assert_eq!(rig.g.schema_waiting.get(), 0);
        assert_eq!(acked, Some(6));
        assert_eq!(sink.bodies.len(), 2);
        // Id 2 maps to itself: the batch went as fetched, byte for byte.
        assert_eq!(
            sink.bodies[0].bytes(),
            framed_batch(0, 3, 2, Codec::Gzip).bytes()
        );
        // Id 1 became 11, re-encoded with the batch's own codec.
        assert_eq!(sink.bodies[1].codec(), Some(Codec::Lz4));
        let values = kmirror_kafka::records::decode_batch_within(&sink.bodies[1], 1 << 20).unwrap();
        assert_eq!(values.len(), 4);
        for r in &values {
            let v = r.value.as_ref().unwrap();
            assert_eq!(kmirror_registry::wire::schema_id(v), Some(SchemaId(11)));
            assert_eq!(&v[5..], &[b'x'; 64][..]);
        }
        assert_eq!(
            rig.metrics.sum("kmirror_schema_ids_translated_total", &[]),
            4.0
        );
    }

    #[tokio::test]
    async fn small_batches_back_to_back_are_merged_and_large_ones_forwarded_as_they_are() {
        let rig = Rig::new("");
        let mut sink = FakeSink::default();
        let mut acked = None;
        let events = vec![
            data(
                vec![
                    batch(0, 2, 10, Codec::Lz4),
                    batch(2, 3, 10, Codec::Lz4),
                    batch(5, 1, 10, Codec::Lz4),
                    // Large: forwarded untouched, and it ends the run of small ones.
                    batch(6, 40, 1000, Codec::None),
                ],
                46,
            ),
            // Another codec starts a run of its own.
            data(
                vec![batch(46, 2, 10, Codec::Zstd), batch(48, 2, 10, Codec::Zstd)],
                50,
            ),
        ];
        rig.run(events, &mut sink, 0, &mut acked)
            .await
            .ok()
            .unwrap();
        assert_eq!(
            sink.sent,
            vec![
                (5, 6, Some(Codec::Lz4)),
                (45, 40, Some(Codec::None)),
                (49, 4, Some(Codec::Zstd)),
            ],
            "(tag = last source offset, records, codec) of each send"
        );
        assert_eq!(acked, Some(49));
        assert_eq!(rig.batches("merged"), 2.0);
        assert_eq!(rig.batches("batch"), 1.0);
        assert_eq!(sink.log_end, 50, "every record once");
        // Offsets stay contiguous, so each source offset has its exact target offset.
        let runs = rig.runs.lock().unwrap();
        for (source, target) in [(0, 0), (5, 5), (6, 6), (45, 45), (49, 49)] {
            assert_eq!(runs.translate("t", 0, source), Some(target), "{source}");
        }
    }

    #[tokio::test]
    async fn with_merging_off_small_batches_go_as_they_are() {
        let rig = Rig::new("kmirror.batch.merge.enabled = false");
        let mut sink = FakeSink::default();
        let mut acked = None;
        let events = vec![data(
            vec![
                batch(0, 2, 10, Codec::Lz4),
                batch(2, 3, 10, Codec::Lz4),
                batch(5, 1, 10, Codec::Lz4),
            ],
            6,
        )];
        rig.run(events, &mut sink, 0, &mut acked)
            .await
            .ok()
            .unwrap();
        assert_eq!(
            sink.sent,
            vec![
                (1, 2, Some(Codec::Lz4)),
                (4, 3, Some(Codec::Lz4)),
                (5, 1, Some(Codec::Lz4)),
            ]
        );
        assert_eq!(rig.batches("merged"), 0.0);
        assert_eq!(rig.batches("batch"), 3.0);
        assert_eq!(acked, Some(5));
    }

    #[tokio::test]
    async fn a_batch_starting_before_the_position_goes_through_record_mode_from_the_position() {
        let rig = Rig::new("");
        let mut sink = FakeSink::default();
        let mut acked = Some(2);
        // Fetched from offset 3, the broker returns the whole batch 0..=9.
        rig.run(
            vec![data(vec![batch(0, 10, 20, Codec::None)], 10)],
            &mut sink,
            3,
            &mut acked,
        )
        .await
        .ok()
        .unwrap();
        assert_eq!(sink.sent, vec![(9, 7, Some(Codec::None))]);
        assert_eq!(rig.batches("record"), 1.0);
        assert_eq!(acked, Some(9));
    }

    #[tokio::test]
    async fn a_retriable_send_failure_asks_for_a_retry_from_the_last_acknowledged_offset() {
        let rig = Rig::new("");
        let mut sink = FakeSink {
            fail_send: Some((1, || KafkaError::Disconnected { broker: "b".into() })),
            ..FakeSink::default()
        };
        let mut acked = None;
        let events = vec![
            data(vec![batch(0, 100, 200, Codec::None)], 300),
            data(vec![batch(100, 100, 200, Codec::None)], 300),
        ];
        let result = rig.run(events, &mut sink, 0, &mut acked).await;
        assert!(matches!(result, Err(Failure::Retry(_))));
        assert_eq!(acked, Some(99), "the first batch was acknowledged before");
        assert_eq!(
            rig.metrics
                .sum("kmirror_errors_total", &[("kind", "produce")]),
            1.0
        );
    }

    #[tokio::test]
    async fn a_batch_larger_than_max_request_size_is_split_with_its_own_codec() {
        let rig = Rig::new("B.producer.max.request.size = 4000");
        let mut sink = FakeSink::default();
        let mut acked = None;
        // About 20 KB uncompressed, LZ4 barely helps with these values: over the limit.
        let big = batch(10, 100, 200, Codec::None);
        assert!(big.bytes().len() > 4000);
        let events = vec![data(vec![batch(0, 10, 20, Codec::None), big], 110)];
        rig.run(events, &mut sink, 0, &mut acked)
            .await
            .ok()
            .unwrap();
        assert_eq!(sink.log_end, 110, "every record once");
        assert_eq!(acked, Some(109));
        let split: Vec<_> = sink.sent[1..].to_vec();
        assert!(split.len() >= 5, "{split:?}");
        assert_eq!(split.iter().map(|(_, n, _)| *n).sum::<i32>(), 100);
        assert!(split.iter().all(|(_, _, c)| *c == Some(Codec::None)));
        assert_eq!(
            split.last().unwrap().0,
            109,
            "the last part carries the batch's end"
        );
        // Contiguous, so translation stays exact across the split.
        let runs = rig.runs.lock().unwrap();
        for o in [10, 55, 109] {
            assert_eq!(runs.translate("t", 0, o), Some(o));
        }
    }

    #[tokio::test]
    async fn a_batch_too_large_for_the_target_stops_the_partition_at_that_batch() {
        let rig = Rig::new("");
        let mut sink = FakeSink {
            fail_send: Some((1, || KafkaError::BatchTooLarge {
                topic: "A.t".into(),
                partition: 0,
                size: 2_000_000,
                limit: 1_048_576,
            })),
            ..FakeSink::default()
        };
        let mut acked = None;
        let events = vec![data(
            vec![
                batch(0, 100, 200, Codec::None),
                batch(100, 100, 200, Codec::None),
            ],
            200,
        )];
        match rig.run(events, &mut sink, 0, &mut acked).await {
            Err(Failure::Stop(Stopped::Kafka { first, .. })) => assert_eq!(first, 100),
            Err(Failure::Stop(other)) => panic!("{other}"),
            _ => panic!("expected a stop"),
        }
    }

    #[tokio::test]
    async fn a_batch_the_target_finds_corrupt_stops_the_partition_instead_of_retrying() {
        let rig = Rig::new("");
        let mut sink = FakeSink {
            fail_send: Some((1, || KafkaError::Broker {
                broker: "produce".into(),
                api: kafka_protocol::messages::ApiKey::Produce,
                error: kafka_protocol::error::ResponseError::CorruptMessage,
                message: None,
            })),
            ..FakeSink::default()
        };
        let mut acked = None;
        let events = vec![data(
            vec![
                batch(0, 100, 200, Codec::None),
                batch(100, 100, 200, Codec::None),
            ],
            200,
        )];
        match rig.run(events, &mut sink, 0, &mut acked).await {
            Err(Failure::Stop(Stopped::Kafka { source, .. })) => {
                assert!(format!("{source}").contains("CorruptMessage"), "{source}")
            }
            Err(Failure::Stop(other)) => panic!("{other}"),
            _ => panic!("expected a stop, not a retry"),
        }
        assert_eq!(
            rig.metrics
                .sum("kmirror_errors_total", &[("kind", "fatal")]),
            1.0
        );
    }

    #[tokio::test]
    async fn out_of_range_is_truncation_or_a_position_beyond_the_end() {
        let out_of_range = |requested, log_start, log_end| FetchEvent::OutOfRange {
            requested,
            log_start,
            log_end,
        };
        let rig = Rig::new("");
        let mut acked = Some(9);
        match rig
            .run(
                vec![out_of_range(10, 50, 80)],
                &mut FakeSink::default(),
                10,
                &mut acked,
            )
            .await
        {
            Err(Failure::Stop(Stopped::Truncated { lost, .. })) => assert_eq!(lost, 40),
            _ => panic!("truncation stops by default"),
        }
        assert_eq!(
            rig.metrics
                .sum("kmirror_source_truncated_offsets_total", &[]),
            40.0
        );
        let rig = Rig::new("kmirror.source.truncation = continue\n");
        match rig
            .run(
                vec![out_of_range(10, 50, 80)],
                &mut FakeSink::default(),
                10,
                &mut acked,
            )
            .await
        {
            Err(Failure::Continue { log_start }) => assert_eq!(log_start, 50),
            _ => panic!("continue goes on from the log start"),
        }
        let rig = Rig::new("");
        match rig
            .run(
                vec![out_of_range(100, 0, 80)],
                &mut FakeSink::default(),
                100,
                &mut acked,
            )
            .await
        {
            Err(Failure::Stop(Stopped::BeyondEnd { log_end, .. })) => assert_eq!(log_end, 80),
            _ => panic!("a position past the end stops"),
        }
    }

    #[tokio::test]
    async fn the_position_passes_markers_and_aborted_batches_at_the_end_of_a_response() {
        use kmirror_kafka::committed::Marker;
        use kmirror_kafka::records::encode_marker;
        let at = |offset: i64, b: RawBatch| {
            let mut bytes = BytesMut::from(b.bytes().as_ref());
            bytes[..8].copy_from_slice(&offset.to_be_bytes());
            RawBatch::new(bytes.freeze()).unwrap()
        };
        let aborted = {
            let records: Vec<Record> = (0..10)
                .map(|i| Record {
                    offset: i,
                    timestamp: 1_700_000_000_000,
                    key: None,
                    value: Some(Bytes::from_static(b"aborted")),
                    headers: vec![],
                })
                .collect();
            let options = BatchOptions {
                producer_id: 9,
                producer_epoch: 0,
                base_sequence: 0,
                transactional: true,
                ..BatchOptions::default()
            };
            at(51, encode_batch(&records, &options).unwrap())
        };
        let rig = Rig::new("");
        let mut sink = FakeSink::default();
        let mut acked = None;
        // 50 committed records and their marker, then an aborted transaction and its marker:
        // the log ends at 62 with 50 records a reader sees.
        let mut end = data(
            vec![
                batch(0, 50, 100, Codec::None),
                at(50, encode_marker(Marker::Commit, 7, 0, 0).unwrap()),
                aborted,
                at(61, encode_marker(Marker::Abort, 9, 0, 0).unwrap()),
            ],
            62,
        );
        if let FetchEvent::Data { data, .. } = &mut end {
            data.aborted = vec![(9, 51)];
        }
        rig.run(vec![end], &mut sink, 0, &mut acked)
            .await
            .ok()
            .unwrap();
        assert_eq!(sink.log_end, 50, "only the committed records are copied");
        assert_eq!(acked, Some(61), "the position passes the last marker");
        // A response holding nothing but a marker moves the position too (a new rig: the
        // first run's feed ended with the stop).
        let rig = Rig::new("");
        let mut acked = Some(61);
        rig.run(
            vec![data(
                vec![at(62, encode_marker(Marker::Commit, 7, 0, 0).unwrap())],
                63,
            )],
            &mut sink,
            62,
            &mut acked,
        )
        .await
        .ok()
        .unwrap();
        assert_eq!(acked, Some(62));
    }

    #[tokio::test]
    async fn positions_and_offset_syncs_follow_acknowledgements_only() {
        let rig = Rig::new("");
        let mut sink = FakeSink::default();
        let mut acked = None;
        // The target already holds 1000 records: translation is not the identity.
        sink.log_end = 1000;
        rig.run(
            vec![data(vec![batch(0, 50, 500, Codec::None)], 50)],
            &mut sink,
            0,
            &mut acked,
        )
        .await
        .ok()
        .unwrap();
        assert_eq!(acked, Some(49));
        assert_eq!(
            rig.runs.lock().unwrap().translate("t", 0, 20),
            Some(1020),
            "source 20 is target 1020"
        );
        let syncs = rig.outbox.take(10);
        assert!(
            syncs
                .iter()
                .any(|s| s.upstream_offset == 0 && s.downstream_offset == 1000),
            "{syncs:?}"
        );
        assert_eq!(
            rig.metrics
                .sum("kmirror_record_count_total", &[("topic", "A.t")]),
            50.0
        );
    }
}
