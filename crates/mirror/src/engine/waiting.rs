//! Partitions assigned and not copying yet are never invisible (docs/engine.md, "Starting many
//! partitions"). Each partition task carries a [`Watch`] from the moment it is assigned: what it
//! waits for now (its start lookup, the resume walk, its target partition, the source's data,
//! the target's acknowledgement, a backoff after an error), until it copies. The flow's
//! [`monitor`] looks at every watch each [`TICK`]:
//! - a partition whose lag is not known yet gets it from one batched lookup of the source's
//!   ends: the source's end minus where it will start (its stored position + 1, or what the
//!   flow's start position names), so lag counts it from the moment it is assigned;
//! - one assigned and not copying for longer than [`BOUND`] is reported once, with what it
//!   waits for ([`PartitionWaiting`]: counted, and logged at DEBUG; one WARN line per flow per
//!   [`QUIET`] names how many, [`PartitionsWaiting`]), and counted in
//!   `kmirror_partitions_waiting{reason}` until it copies; `/status` shows the count and the
//!   most common reason.
//!
//! The verdicts ([`judge`]) are plain code over the watches and a clock; the lookups go through
//! the [`Ends`] seam.

use crate::events::{Emitter, Event};
use crate::metrics::PartitionLabels;
use crate::names::FlowId;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a partition may be assigned without copying before it is reported.
pub(crate) const BOUND: Duration = Duration::from_secs(30);
/// How often the monitor looks.
pub(crate) const TICK: Duration = Duration::from_secs(2);
/// How long one round of lag lookups may take (a busy source answers the rest next round).
const LOOKUP: Duration = Duration::from_secs(5);

/// What a partition not copying yet waits for (the `reason` label of
/// `kmirror_partitions_waiting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Stage {
    /// Assigned, its task not running yet.
    Assigned,
    /// Looking up where to start on the source (`auto.offset.reset`).
    StartLookup,
    /// Reading what the target holds past its position (the resume walk).
    Resume,
    /// Its target partition: a log the target broker has not created yet, or no leader.
    TargetPartition,
    /// Subscribed to the source's fetcher, no data yet.
    Fetch,
    /// Data sent, no acknowledgement from the target yet.
    Send,
    /// Backing off after an error, to try again.
    Retrying,
}

const STAGES: [Stage; 7] = [
    Stage::Assigned,
    Stage::StartLookup,
    Stage::Resume,
    Stage::TargetPartition,
    Stage::Fetch,
    Stage::Send,
    Stage::Retrying,
];

impl Stage {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Stage::Assigned => "assigned",
            Stage::StartLookup => "start_lookup",
            Stage::Resume => "resume",
            Stage::TargetPartition => "target_partition",
            Stage::Fetch => "fetch",
            Stage::Send => "send",
            Stage::Retrying => "retrying",
        }
    }

    /// What the log line says it waits for.
    fn text(self) -> &'static str {
        match self {
            Stage::Assigned => "its task to start",
            Stage::StartLookup => "the source to say where it starts",
            Stage::Resume => "the resume walk over what the target holds",
            Stage::TargetPartition => {
                "its target partition (the target broker has not created its log, or it has no leader)"
            }
            Stage::Fetch => "data from the source's fetcher",
            Stage::Send => "the target to acknowledge what was sent",
            Stage::Retrying => "a retry after an error",
        }
    }

    fn from_u8(v: u8) -> Stage {
        STAGES.get(v as usize).copied().unwrap_or(Stage::Assigned)
    }
}

/// One partition's progress towards copying, shared by its task (which moves it on) and the
/// flow's monitor (which reads it). Cheap to update: once copying, the copy loop pays one
/// relaxed load per batch.
#[derive(Debug)]
pub(crate) struct Watch {
    assigned: Instant,
    stage: AtomicU8,
    copying: AtomicBool,
    lag_known: AtomicBool,
    state: Mutex<WatchState>,
}

#[derive(Debug, Default)]
struct WatchState {
    /// Where it will start: its stored position + 1, or the start lookup's answer.
    start: Option<i64>,
    /// The last error, while retrying.
    error: Option<String>,
    reported: bool,
}

impl Watch {
    /// A partition assigned at `now`; `stored`: its stored position, if any.
    pub(crate) fn new(now: Instant, stored: Option<i64>) -> Watch {
        Watch {
            assigned: now,
            stage: AtomicU8::new(Stage::Assigned as u8),
            copying: AtomicBool::new(false),
            lag_known: AtomicBool::new(false),
            state: Mutex::new(WatchState {
                start: stored.filter(|o| *o >= 0).map(|o| o + 1),
                ..WatchState::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stage(&self, stage: Stage) {
        if !self.is_copying() {
            self.stage.store(stage as u8, Ordering::Relaxed);
        }
    }

    /// Backing off after `error`.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        if self.is_copying() {
            return;
        }
        self.lock().error = Some(error.to_string());
        self.stage(Stage::Retrying);
    }

    /// Where it starts, once looked up.
    pub(crate) fn starts_at(&self, next: i64) {
        self.lock().start = Some(next);
    }

    /// Its lag is shown (by the task's own lookup or the fetcher's answers).
    pub(crate) fn lag_shown(&self) {
        self.lag_known.store(true, Ordering::Relaxed);
    }

    /// It copies: something was acknowledged, or the source had nothing for it.
    pub(crate) fn copying(&self) {
        self.copying.store(true, Ordering::Relaxed);
        self.lag_known.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_copying(&self) -> bool {
        self.copying.load(Ordering::Relaxed)
    }

    fn current(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Relaxed))
    }
}

/// A source partition, as the flow's watches key it.
type Key = (String, i32);
/// A flow's watches, by source partition, with each partition's series labels.
type ByPartition = HashMap<Key, (PartitionLabels, Arc<Watch>)>;

#[derive(Debug, Default)]
pub(crate) struct Watches(Mutex<ByPartition>);

impl Watches {
    /// Watches a partition just assigned; returns its watch.
    pub(crate) fn assigned(
        &self,
        key: (String, i32),
        labels: PartitionLabels,
        stored: Option<i64>,
    ) -> Arc<Watch> {
        let w = Arc::new(Watch::new(Instant::now(), stored));
        self.lock().insert(key, (labels, w.clone()));
        w
    }

    /// A partition's task ended (stopped, revoked): it is not waiting here any more.
    pub(crate) fn ended(&self, key: &(String, i32), watch: &Arc<Watch>) {
        let mut m = self.lock();
        // A task started again for the partition has a watch of its own.
        if m.get(key).is_some_and(|(_, w)| Arc::ptr_eq(w, watch)) {
            m.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByPartition> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot(&self) -> Vec<((String, i32), PartitionLabels, Arc<Watch>)> {
        self.lock()
            .iter()
            .filter(|(_, (_, w))| !w.is_copying())
            .map(|(k, (l, w))| (k.clone(), l.clone(), w.clone()))
            .collect()
    }
}

/// A partition reported as waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) key: (String, i32),
    pub(crate) stage: Stage,
    pub(crate) error: Option<String>,
    pub(crate) waited: Duration,
}

/// What the monitor found in one look.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdicts {
    /// Waiting past the bound and not reported before (each is reported once).
    pub(crate) newly: Vec<Waiting>,
    /// Partitions waiting past the bound, by reason (every reason listed, 0 included).
    pub(crate) counts: BTreeMap<&'static str, i64>,
    /// Partitions not copying whose lag is not known yet, with where they start when known.
    pub(crate) lag_unknown: Vec<((String, i32), Option<i64>)>,
}

/// The verdicts on the watches not copying at `now`. Marks the newly reported ones.
pub(crate) fn judge(watches: &[((String, i32), Arc<Watch>)], now: Instant) -> Verdicts {
    let mut v = Verdicts {
        counts: STAGES.iter().map(|s| (s.label(), 0)).collect(),
        ..Verdicts::default()
    };
    for (key, w) in watches {
        if w.is_copying() {
            continue;
        }
        let mut s = w.lock();
        if !w.lag_known.load(Ordering::Relaxed) {
            v.lag_unknown.push((key.clone(), s.start));
        }
        let waited = now.saturating_duration_since(w.assigned);
        if waited < BOUND {
            continue;
        }
        let stage = w.current();
        *v.counts.entry(stage.label()).or_default() += 1;
        if !s.reported {
            s.reported = true;
            v.newly.push(Waiting {
                key: key.clone(),
                stage,
                error: (stage == Stage::Retrying)
                    .then(|| s.error.clone())
                    .flatten(),
                waited,
            });
        }
    }
    v
}

/// The most common reason among `counts`, and the total.
pub(crate) fn summary(counts: &BTreeMap<&'static str, i64>) -> (i64, Option<&'static str>) {
    let total = counts.values().sum();
    let most = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .max_by_key(|(_, n)| **n)
        .map(|(r, _)| *r);
    (total, most)
}

/// The source's offsets the lag of partitions not started yet is counted from.
pub(crate) trait Ends: Send + Sync {
    /// The source's ends of `keys` (offsets a reader at the flow's isolation level sees).
    fn ends(
        &self,
        keys: &[(String, i32)],
    ) -> impl Future<Output = HashMap<(String, i32), i64>> + Send;
    /// Where each of `keys` starts without a stored position (`auto.offset.reset`).
    fn starts(
        &self,
        keys: &[(String, i32)],
    ) -> impl Future<Output = HashMap<(String, i32), i64>> + Send;
}

/// A partition found waiting past the bound: counted once, and logged once at DEBUG; the WARN
/// line is [`PartitionsWaiting`]'s, one per flow per [`QUIET`] for all of them.
#[derive(Debug)]
pub(crate) struct PartitionWaiting<'a> {
    pub(crate) flow: &'a FlowId,
    pub(crate) waiting: &'a Waiting,
}

impl Event for PartitionWaiting<'_> {
    fn emit(self, to: Emitter<'_>) {
        let w = self.waiting;
        let waited_s = w.waited.as_secs();
        let error = w.error.as_deref().unwrap_or("");
        tracing::debug!(flow = %self.flow, topic = %w.key.0, partition = w.key.1, reason = w.stage.label(), waited_s, error, "partition assigned and not copying yet: waiting for {}", w.stage.text());
        to.metrics
            .partitions_reported_waiting
            .get_or_create(&to.labels.reason(w.stage.label()))
            .inc();
    }
}

/// How long after a WARN line about waiting partitions the next ones are only counted.
pub(crate) const QUIET: Duration = Duration::from_secs(10);

/// Partitions newly found waiting past the bound, in one WARN line per flow per [`QUIET`]: a
/// start of 10,000 partitions against a target that needs a minute to create their logs would
/// otherwise log thousands of lines that say the same thing. It names how many, what most of
/// them wait for, and one of them with its error.
#[derive(Debug)]
pub(crate) struct PartitionsWaiting<'a> {
    pub(crate) flow: &'a FlowId,
    /// Found waiting since the last WARN line.
    pub(crate) newly: usize,
    /// Waiting now, and what most of them wait for.
    pub(crate) waiting: i64,
    pub(crate) most: Option<&'static str>,
    pub(crate) example: &'a Waiting,
}

impl Event for PartitionsWaiting<'_> {
    fn emit(self, _to: Emitter<'_>) {
        let e = self.example;
        let most = self.most.unwrap_or(e.stage.label());
        let error = e.error.as_deref().unwrap_or("");
        tracing::warn!(flow = %self.flow, newly = self.newly, waiting = self.waiting, most, example = %format_args!("{}-{}", e.key.0, e.key.1), example_reason = e.stage.label(), error, "partitions assigned and not copying for over 30 s (kmirror_partitions_waiting counts them by reason; the example waits for {})", e.stage.text());
    }
}

/// The monitor's memory between looks: when it last logged a WARN line, and what it counted
/// since.
#[derive(Debug, Default)]
pub(crate) struct Fold {
    last_warn: Option<Instant>,
    /// Found waiting since the last WARN line, and the first of them.
    newly: usize,
    example: Option<Waiting>,
}

/// One look: lag for the partitions not started, reports past the bound, the gauges.
pub(crate) async fn look<E: Ends>(
    watches: &Watches,
    ends: &E,
    flow: &FlowId,
    to: Emitter<'_>,
    now: Instant,
    fold: &mut Fold,
) -> Verdicts {
    let snapshot = watches.snapshot();
    let pairs: Vec<((String, i32), Arc<Watch>)> = snapshot
        .iter()
        .map(|(k, _, w)| (k.clone(), w.clone()))
        .collect();
    let v = judge(&pairs, now);
    if !v.lag_unknown.is_empty() {
        let keys: Vec<(String, i32)> = v.lag_unknown.iter().map(|(k, _)| k.clone()).collect();
        let unplaced: Vec<(String, i32)> = v
            .lag_unknown
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let (found_ends, found_starts) = tokio::join!(ends.ends(&keys), async {
            match unplaced.is_empty() {
                true => HashMap::new(),
                false => ends.starts(&unplaced).await,
            }
        });
        let by_key: HashMap<&(String, i32), (&PartitionLabels, &Arc<Watch>)> =
            snapshot.iter().map(|(k, l, w)| (k, (l, w))).collect();
        for (key, start) in &v.lag_unknown {
            let (Some((labels, w)), Some(end), Some(start)) = (
                by_key.get(key),
                found_ends.get(key),
                start.or_else(|| found_starts.get(key).copied()),
            ) else {
                continue;
            };
            // The task may have shown it meanwhile, from a newer answer.
            if w.is_copying() || w.lag_known.swap(true, Ordering::Relaxed) {
                continue;
            }
            // No record at or after a start timestamp: it starts at the end.
            let start = if start < 0 { *end } else { start };
            let lag = (end - start).max(0);
            to.metrics.partition_series(labels).lag.set(lag);
            if lag == 0 {
                // Nothing to copy (empty, idle): the fetcher delivers nothing for it until
                // records arrive, and it is not waiting for anything.
                w.copying();
            }
        }
    }
    for w in &v.newly {
        PartitionWaiting { flow, waiting: w }.emit(to);
    }
    let (total, most) = summary(&v.counts);
    fold.newly += v.newly.len();
    if fold.example.is_none() {
        fold.example = v.newly.first().cloned();
    }
    let quiet = fold
        .last_warn
        .is_some_and(|t| now.saturating_duration_since(t) < QUIET);
    if !quiet {
        if let Some(example) = fold.example.take() {
            PartitionsWaiting {
                flow,
                newly: std::mem::take(&mut fold.newly),
                waiting: total,
                most,
                example: &example,
            }
            .emit(to);
            fold.last_warn = Some(now);
        }
    }
    for (reason, n) in &v.counts {
        to.metrics
            .partitions_waiting
            .get_or_create(&to.labels.reason(reason))
            .set(*n);
    }
    to.metrics
        .process
        .set_waiting(&flow.to_string(), total, most);
    v
}

/// The ListOffsets timestamp a partition without a stored position starts at; None for
/// `auto.offset.reset = none`.
pub(crate) fn start_at(start: crate::config::model::StartPosition) -> Option<i64> {
    use crate::config::model::StartPosition;
    match start {
        StartPosition::Earliest => Some(kmirror_kafka::cluster::EARLIEST),
        StartPosition::Latest => Some(kmirror_kafka::cluster::LATEST),
        StartPosition::Timestamp(ms) => Some(ms),
        StartPosition::Fail => None,
    }
}

/// The real source: one ListOffsets request per broker, bounded by [`LOOKUP`].
pub(crate) struct SourceEnds {
    pub(crate) source: Arc<kmirror_kafka::cluster::KafkaCluster>,
    pub(crate) isolation: kmirror_kafka::IsolationLevel,
    /// What `auto.offset.reset` / `kmirror.start.position` names, as a ListOffsets timestamp.
    pub(crate) start_at: Option<i64>,
}

impl SourceEnds {
    async fn lookup(&self, keys: &[(String, i32)], at: i64) -> HashMap<(String, i32), i64> {
        let asked = self.source.list_offsets(keys, at, self.isolation);
        match tokio::time::timeout(LOOKUP, asked).await {
            Ok(Ok(found)) => found,
            _ => HashMap::new(),
        }
    }
}

impl Ends for SourceEnds {
    async fn ends(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        self.lookup(keys, kmirror_kafka::cluster::LATEST).await
    }

    async fn starts(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        match self.start_at {
            Some(at) => self.lookup(keys, at).await,
            // `none`: it will not start without a position; its lag is the whole log.
            None => self.lookup(keys, kmirror_kafka::cluster::EARLIEST).await,
        }
    }
}

/// Looks at the flow's watches every [`TICK`] until `stop`.
pub(crate) async fn monitor<E: Ends>(
    watches: Arc<Watches>,
    ends: E,
    flow: FlowId,
    metrics: Arc<crate::metrics::Metrics>,
    labels: crate::metrics::FlowLabels,
    stop: super::Shutdown,
) {
    let mut fold = Fold::default();
    loop {
        if stop.sleep(TICK).await {
            break;
        }
        let to = Emitter {
            metrics: &metrics,
            labels: &labels,
        };
        // A look waits for the source's answers (up to 5 s): the flow's stop does not.
        tokio::select! {
            _ = look(&watches, &ends, &flow, to, Instant::now(), &mut fold) => {}
            _ = stop.wait() => break,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
