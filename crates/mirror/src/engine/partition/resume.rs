//! Where an at-least-once partition resumes when it starts (docs/engine.md, "Resuming
//! from what the target holds"): the I/O around the pure lockstep of `offsets/resume.rs`. The
//! newest offset sync the flow's syncs topic holds for the partition at or before its stored
//! position is the anchor (source record `u` is at target offset `d`); the target's tail from
//! `d` and the source from `u` are read and
//! walked side by side, and copying continues after the last source record found on the target,
//! never before the stored position. Anything uncertain falls back to the stored position,
//! counted and logged with its reason. Runs only when a partition starts: the steady state does
//! not pay for it.

use super::Context;
use crate::engine::fresh_reads::FreshReads;
use crate::engine::log_reader;
use crate::engine::offset_syncs::read_syncs_from;
use crate::engine::Shutdown;
use crate::offsets::resume::{self, Fallback, Resume, SyncHistory};
use crate::offsets::sync_rules::SourceOffsets;
use crate::wire::internal::OffsetSync;
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::committed::CommittedView;
use kmirror_kafka::records::{decode_batch, Record};
use kmirror_kafka::Refusal;
use kmirror_kafka::{IsolationLevel, KafkaError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Bytes of the target's tail a walk reads at most (the source side twice that, for what the
/// flow leaves out there). After a crash the tail past the newest sync is what was in flight,
/// far less than this.
const MAX_TAIL_BYTES: usize = 4 << 20;
/// What a walk reads of the target's tail on its first try. Most tails are a few records
/// (whatever was copied after the newest sync), so most walks need only this much, and many
/// of them fit at once; a tail past it is walked again under [`MAX_TAIL_BYTES`].
const SMALL_TAIL_BYTES: usize = 128 << 10;
/// Records an anchor may lie before the stored position.
const WINDOW: i64 = 1_000_000;
/// The bytes all walks of a flow may hold at once, in KiB (a walk holds up to three times its
/// tail bound: the target's tail and twice that of the source). Four full walks, or 128 small
/// ones: at 1,000 partitions starting together, walks four at a time took seconds of
/// round trips.
const WALK_BUDGET_KIB: usize = 4 * 3 * (MAX_TAIL_BYTES >> 10);
/// How old a read of the syncs topic may be for a partition starting now.
const FRESH: Duration = Duration::from_secs(1);
/// Records held behind a transaction still open on the target (an MM2 with exactly-once left
/// it): more, and the walk gives up (`bound`).
const MAX_HELD: usize = 100_000;
/// Reads of `kmirror-producers.internal` a walk tries before it falls back (loop prevention).
const GUARD_ATTEMPTS: u32 = 3;

/// The newest offset syncs of every source partition, read from the flow's syncs topic when
/// partitions start (a partition taken over from another process finds that process's syncs).
/// Partitions starting together share one read, and wait for it together
/// (`engine/fresh_reads.rs`).
pub(crate) struct SyncIndex {
    cluster: Arc<KafkaCluster>,
    topic: String,
    state: FreshReads<IndexState>,
    walks: Semaphore,
}

#[derive(Default)]
struct IndexState {
    /// Where reading the syncs topic continues.
    next: Option<i64>,
    latest: HashMap<(String, i32), SyncHistory>,
}

impl SyncIndex {
    pub(crate) fn new(cluster: Arc<KafkaCluster>, topic: String) -> SyncIndex {
        SyncIndex {
            cluster,
            topic,
            state: FreshReads::new(FRESH, IndexState::default()),
            walks: Semaphore::new(WALK_BUDGET_KIB),
        }
    }

    /// The syncs kept of a partition, oldest first: those written up to [`FRESH`] before
    /// the call at least. An older read only makes the anchor older (the walk longer), never
    /// wrong.
    async fn latest(&self, topic: &str, partition: i32) -> Result<Vec<(i64, i64)>, KafkaError> {
        // The read's future is boxed inside `ensure`, so the thousands of partitions waiting
        // here hold small futures (tens of MB at 10,000 partitions otherwise).
        self.state
            .ensure(
                Instant::now(),
                |s| s.next,
                |from| async move {
                    let mut syncs = Vec::new();
                    let next = read_syncs_from(&self.cluster, &self.topic, from, |f| syncs.push(f))
                        .await?;
                    Ok::<_, KafkaError>((syncs, next))
                },
                |s, (syncs, next): (Vec<OffsetSync>, Option<i64>)| {
                    for f in syncs {
                        s.latest
                            .entry((f.topic, f.partition))
                            .or_default()
                            .push(f.upstream_offset, f.downstream_offset);
                    }
                    if next.is_some() {
                        s.next = next;
                    }
                },
            )
            .await?;
        Ok(self.state.with(|s| {
            s.latest
                .get(&(topic.to_string(), partition))
                .map(SyncHistory::kept)
                .unwrap_or_default()
        }))
    }
}

/// One partition about to start: its source topic, remote topic and partition.
pub(super) struct Starting<'a> {
    pub(super) topic: &'a str,
    pub(super) remote: &'a str,
    pub(super) partition: i32,
}

/// The first source offset to copy: `next` (after the stored position if `stored`, else where
/// the flow starts), or later when the target already holds the records from there on. Counts
/// and logs either way, except a first start with no sync to go by.
pub(super) async fn resume(
    ctx: &Context,
    index: &SyncIndex,
    p: Starting<'_>,
    next: i64,
    stored: bool,
    stop: &Shutdown,
) -> i64 {
    let found = if !ctx.flow.transforms.is_empty() {
        Err(Fallback::Transforms)
    } else {
        tokio::select! {
            r = find(ctx, index, &p, next) => r,
            _ = stop.wait() => return next,
        }
    };
    match found {
        Ok(r) => apply(ctx, &p, next, r),
        // A first start (no position; no sync of this partition at or before where it starts,
        // or only syncs of an earlier target): nothing to resume, nothing to report.
        Err(Fallback::NoAnchor | Fallback::AnchorGone) if !stored => next,
        Err(f) => {
            ctx.metrics
                .resume_fallbacks
                .get_or_create(&ctx.labels.reason(f.label()))
                .inc();
            match f {
                Fallback::Mismatch { target_offset } => {
                    tracing::warn!(flow = %ctx.flow.id, topic = p.topic, partition = p.partition, remote = p.remote, target_offset, next, "the target holds a record after the last offset sync that is not the next source record (another writer, a transform, a compaction, or records copied twice before); copying from the stored position, which may copy some records again")
                }
                f => {
                    tracing::info!(flow = %ctx.flow.id, topic = p.topic, partition = p.partition, reason = f.label(), next, "cannot tell what the target already holds; copying from the stored position, which may copy some records again")
                }
            }
            next
        }
    }
}

async fn find(
    ctx: &Context,
    index: &SyncIndex,
    p: &Starting<'_>,
    next: i64,
) -> Result<Resume, Fallback> {
    let error = |what: &str, e: KafkaError| read_failed(ctx, p, what, e);
    let newest = index
        .latest(p.topic, p.partition)
        .await
        .map_err(|e| error("the offset syncs", e))?;
    let anchor = resume::anchor(newest, next, WINDOW).ok_or(Fallback::NoAnchor)?;
    // The anchor's record must be on the target: a target emptied or replaced since the sync
    // (a fresh target for a flow whose source keeps the syncs topic) ends before it, a target
    // whose retention passed it starts after it. Asked together with the other partitions
    // starting now, before a walk's turn is waited for.
    let bound = |at| {
        ctx.target
            .list_offset_batched(p.remote, p.partition, at, IsolationLevel::ReadUncommitted)
    };
    let (start, end) = tokio::join!(bound(EARLIEST), bound(LATEST));
    let start = start.map_err(|e| error("the target", e))?;
    let end = end.map_err(|e| error("the target", e))?;
    if anchor.1 >= end || anchor.1 < start {
        return Err(Fallback::AnchorGone);
    }
    // Boxed: only a partition with something to walk pays for the reads' futures (see
    // `latest`).
    Box::pin(walk_from(ctx, index, p, anchor, next, end)).await
}

/// Reads the target from the anchor and the source from its record, and walks them.
async fn walk_from(
    ctx: &Context,
    index: &SyncIndex,
    p: &Starting<'_>,
    anchor: (i64, i64),
    next: i64,
    end: i64,
) -> Result<Resume, Fallback> {
    // A walk past its bound for another reason (a transaction held open, the loop guard
    // unsure) is tried once more in vain: rare, and only a few reads lost.
    match walk_within(ctx, index, p, anchor, next, end, SMALL_TAIL_BYTES).await {
        Err(Fallback::Bound) => walk_within(ctx, index, p, anchor, next, end, MAX_TAIL_BYTES).await,
        r => r,
    }
}

/// [`walk_from`] reading at most `limit` bytes of the target's tail (and twice that of the
/// source), with that much of the flow's walk budget held.
async fn walk_within(
    ctx: &Context,
    index: &SyncIndex,
    p: &Starting<'_>,
    anchor: (i64, i64),
    next: i64,
    end: i64,
    limit: usize,
) -> Result<Resume, Fallback> {
    let error = |what: &str, e: KafkaError| read_failed(ctx, p, what, e);
    let kib = ((3 * limit) >> 10) as u32;
    let _walk = index
        .walks
        .acquire_many(kib)
        .await
        .map_err(|_| Fallback::Error)?;
    let (target, timestamps) = read_target(
        &ctx.target,
        (p.remote, p.partition),
        (anchor.1, end),
        limit,
        ctx.own_copies.as_deref(),
    )
    .await
    .map_err(|e| e.fallback(|e| error("the target", e)))?;
    if target.is_empty() {
        return Err(Fallback::AnchorGone);
    }
    let isolation = ctx.flow.clients.consumer_tuning.isolation_level;
    let source = read_source(
        &ctx.source,
        (p.topic, p.partition),
        anchor.0,
        target.len(),
        (isolation, 2 * limit),
        ctx.loop_guard.as_deref(),
    )
    .await
    .map_err(|e| {
        e.fallback(|e| match e {
            // Retention or compaction removed the anchor's source record since its log start
            // was read (`KafkaCluster::fetch` says so with the log's bounds).
            e if e.is(Refusal::OffsetOutOfRange) => Fallback::SourceGone,
            e => error("the source", e),
        })
    })?;
    resume::walk(anchor, &source, &target, next, timestamps)
}

/// A read that failed after the client's retries: logged (debug: the fallback itself is
/// logged once), and the walk falls back.
fn read_failed(ctx: &Context, p: &Starting<'_>, what: &str, e: KafkaError) -> Fallback {
    tracing::debug!(flow = %ctx.flow.id, topic = p.topic, partition = p.partition, error = %e, "resume: reading {what} failed");
    Fallback::Error
}

/// A recognised tail: the position, the metric, an offset sync for checkpoints, and the
/// matched records as runs (exact checkpoints cover them).
fn apply(ctx: &Context, p: &Starting<'_>, next: i64, r: Resume) -> i64 {
    if r.next <= next {
        if r.target_behind {
            tracing::warn!(flow = %ctx.flow.id, topic = p.topic, partition = p.partition, next, "the target ends before the stored position (its log was truncated below records it had acknowledged); copying from the stored position");
        }
        return next;
    }
    ctx.board.acknowledged(p.topic, p.partition, r.next - 1);
    ctx.metrics
        .records_already_on_target
        .get_or_create(&ctx.labels)
        .inc_by(r.already_copied);
    if let (Some(outbox), Some(&(up, down))) = (&ctx.offset_syncs, r.matched.last()) {
        outbox.push(vec![OffsetSync {
            topic: p.topic.to_string(),
            partition: p.partition,
            upstream_offset: up,
            downstream_offset: down,
        }]);
    }
    {
        let mut runs = ctx.runs.lock().unwrap_or_else(|e| e.into_inner());
        for (ups, base) in resume::runs_of(&r.matched) {
            runs.record(p.topic, p.partition, &SourceOffsets::Listed(ups), base);
        }
    }
    tracing::info!(flow = %ctx.flow.id, topic = p.topic, partition = p.partition, stored = next, resume = r.next, already_copied = r.already_copied, "records after the stored position are on the target already; copying after them");
    r.next
}

/// The most one fetch of a walk asks for: a small walk's whole bound, else 1 MiB at a time.
fn fetch_size(limit: usize) -> i32 {
    limit.min(1 << 20) as i32
}

/// A read that failed, or went past its bound.
enum ReadError {
    Bound,
    Kafka(KafkaError),
}

impl ReadError {
    fn fallback(self, error: impl FnOnce(KafkaError) -> Fallback) -> Fallback {
        match self {
            ReadError::Bound => Fallback::Bound,
            ReadError::Kafka(e) => error(e),
        }
    }
}

impl From<KafkaError> for ReadError {
    fn from(e: KafkaError) -> ReadError {
        ReadError::Kafka(e)
    }
}

fn corrupt(topic: &str, partition: i32, offset: i64, message: String) -> ReadError {
    ReadError::Kafka(KafkaError::CorruptBatch {
        topic: topic.to_string(),
        partition,
        offset,
        message,
    })
}

/// The target's records from `from` to `end` as a read_committed reader sees them (aborted
/// transactions left out; what waits behind a transaction still open is not counted as there),
/// and whether their timestamps are the producer's (not the broker's `LogAppendTime`). At most
/// `limit` bytes read (then [`ReadError::Bound`]).
async fn read_target(
    k: &Arc<KafkaCluster>,
    (topic, partition): (&str, i32),
    (from, end): (i64, i64),
    limit: usize,
    own_copies: Option<&crate::engine::loop_guard::LoopGuard>,
) -> Result<(Vec<Record>, bool), ReadError> {
    let iso = IsolationLevel::ReadUncommitted;
    let mut out = Vec::new();
    let mut view = CommittedView::new(MAX_HELD);
    let mut producer_times = true;
    let mut offset = from;
    let mut read = 0usize;
    while offset < end {
        if read > limit {
            return Err(ReadError::Bound);
        }
        let f = k
            .fetch_batched(topic, partition, offset, fetch_size(limit), iso)
            .await?;
        if f.batches.is_empty() {
            break;
        }
        // Every byte fetched counts, kept or not: the bound is on the work, not on what matches.
        read += f.batches.iter().map(|b| b.bytes().len()).sum::<usize>();
        let batches: Vec<&_> = f.batches.iter().collect();
        // Loop prevention (identity both ways): the target's own producers write between this
        // flow's copies; the walk compares the copies only. Markers stay (they close
        // transactions for the view).
        let batches = match own_copies {
            Some(g) => {
                let data = batches
                    .iter()
                    .copied()
                    .filter(|b| !b.is_control())
                    .collect();
                let mine: std::collections::HashSet<i64> = g
                    .copies_within(data, GUARD_ATTEMPTS)
                    .await
                    .ok_or(ReadError::Bound)?
                    .iter()
                    .map(|b| b.base_offset())
                    .collect();
                batches
                    .into_iter()
                    .filter(|b| b.is_control() || mine.contains(&b.base_offset()))
                    .collect()
            }
            None => batches,
        };
        if let Some(last) = f.batches.last() {
            offset = last.last_offset() + 1;
        }
        for b in batches {
            producer_times &= b.is_control() || !b.is_log_append_time();
            let mut keep = |r: Record| {
                if r.offset >= from {
                    out.push(r);
                }
            };
            log_reader::show(&mut view, b, topic, partition, &mut keep).map_err(|e| match e {
                KafkaError::OpenTransaction { .. } => ReadError::Bound,
                e => ReadError::Kafka(e),
            })?;
        }
    }
    Ok((out, producer_times))
}

/// The source's records from `from` on, as the flow copies them (markers, and aborted
/// transactions when it reads read_committed, left out): at least `want` of them, or to the
/// end, reading at most `limit` bytes.
async fn read_source(
    k: &Arc<KafkaCluster>,
    (topic, partition): (&str, i32),
    from: i64,
    want: usize,
    (isolation, limit): (IsolationLevel, usize),
    loop_guard: Option<&crate::engine::loop_guard::LoopGuard>,
) -> Result<Vec<Record>, ReadError> {
    let mut out = Vec::new();
    let mut offset = from;
    let mut read = 0usize;
    while out.len() < want {
        if read > limit {
            return Err(ReadError::Bound);
        }
        let f = k
            .fetch_batched(topic, partition, offset, fetch_size(limit), isolation)
            .await?;
        let end = f.readable_end(isolation);
        read += f.batches.iter().map(|b| b.bytes().len()).sum::<usize>();
        let batches = f.visible(isolation);
        // As the flow copies them: without what kmirror copied here from the target.
        let batches = match loop_guard {
            Some(g) => match g.keep_within(batches, GUARD_ATTEMPTS).await {
                Some(kept) => kept,
                None => return Err(ReadError::Bound),
            },
            None => batches,
        };
        for b in batches {
            let records = decode_batch(b)
                .map_err(|e| corrupt(topic, partition, b.base_offset(), e.to_string()))?;
            out.extend(records.into_iter().filter(|r| r.offset >= from));
        }
        match f.batches.last() {
            Some(last) if last.last_offset() + 1 < end => offset = last.last_offset() + 1,
            _ => break,
        }
    }
    Ok(out)
}
