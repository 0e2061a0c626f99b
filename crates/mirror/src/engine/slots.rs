//! Exactly-once slots (docs/engine.md, "Exactly-once"): a flow's partitions are divided
//! over a fixed number of slots, each one transactional id with one open transaction at a time.
//! A slot's partitions write their data through its transactional lanes; every commit interval
//! the slot closes its gate, every partition that wrote in the transaction flushes its lane and
//! hands in the source position it reached, the slot writes those positions to the positions
//! topic in the same transaction, and commits. Only then do the partitions count their data as
//! copied (positions, offset syncs, runs): a read_committed reader of the target sees each
//! source record once, whatever crashes.
//!
//! A failure inside a transaction (a lane's error, a partition stopping half-way) aborts it as a
//! whole: the slot takes a new producer epoch (InitProducerId, which aborts the open
//! transaction) and every partition of the slot goes back to its last committed position with a
//! new lane ([`Admit::Rewind`]).
//!
//! Why one file of this size: the `Gate` is one protocol with two sides, the partitions'
//! `Member`s and the slot's commit loop, which both change its private `Open` and phase under
//! one lock (a member joins only the transaction open under it). Next to split out: the
//! committer side (`Slot::commit_loop`, `commit`, `give_up`) into `slots/committer.rs`.

use super::Shutdown;
use crate::events::{Emitter, Event};
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::{KafkaError, Refusal};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The slot a source partition belongs to: every process computes it alike, nothing is
/// stored, and a new partition never moves an existing one. A topic's partitions go round-robin
/// over consecutive slots.
pub(super) fn slot_of(topic: &str, partition: i32, slots: u32) -> u32 {
    // FNV-1a (32 bit): stable across versions and platforms, unlike std's hasher.
    let mut h: u32 = 0x811c_9dc5;
    for b in topic.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.wrapping_add(partition as u32) % slots.max(1)
}

/// The slots this process owns now, by index: a partition writes through its slot's producer
/// and gate, and is started only while its slot is here (docs/sharing.md, "Exactly-once").
pub(super) struct SlotTable {
    count: u32,
    owned: Mutex<BTreeMap<u32, Arc<Slot>>>,
}

impl SlotTable {
    pub(super) fn new(count: u32) -> SlotTable {
        SlotTable {
            count: count.max(1),
            owned: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<Slot>>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn count(&self) -> u32 {
        self.count
    }

    pub(super) fn index_of(&self, topic: &str, partition: i32) -> u32 {
        slot_of(topic, partition, self.count)
    }

    /// The slot of a partition, if this process owns it.
    pub(super) fn get(&self, topic: &str, partition: i32) -> Option<Arc<Slot>> {
        self.lock().get(&self.index_of(topic, partition)).cloned()
    }

    pub(super) fn owns(&self, topic: &str, partition: i32) -> bool {
        self.lock().contains_key(&self.index_of(topic, partition))
    }

    pub(super) fn insert(&self, slot: Arc<Slot>) {
        self.lock().insert(slot.index, slot);
    }

    pub(super) fn remove(&self, index: u32) -> Option<Arc<Slot>> {
        self.lock().remove(&index)
    }
}

/// A second fence within this long stops the flow (docs/engine.md, "Exactly-once").
const FENCED_AGAIN: Duration = Duration::from_secs(60);

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Committed,
    Aborted,
}

/// What partitions see of their slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Phase {
    /// The transaction partitions join now.
    pub(super) txn: u64,
    /// The gate: no partition sends while the transaction is ending.
    pub(super) closed: bool,
    /// The last transaction that ended, and how.
    pub(super) ended: Option<(u64, Outcome)>,
    /// Bumped with every new producer epoch: lanes made before must be made again.
    pub(super) epoch: u64,
    /// The committer ended (the flow stops, or the slot was fenced): nothing more is written.
    pub(super) stopped: bool,
}

/// Why a transaction is aborted instead of committed (the metric's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AbortReason {
    /// A partition stopped or failed with data in the transaction.
    Failed,
    /// Partitions did not flush within half the transaction timeout.
    Timeout,
    /// Writing the positions or ending the transaction failed.
    Commit,
    /// The producer epoch was bumped under the slot (the coordinator aborts a transaction older
    /// than its timeout this way).
    Fenced,
}

impl AbortReason {
    pub(super) fn label(self) -> &'static str {
        match self {
            AbortReason::Failed => "failed",
            AbortReason::Timeout => "timeout",
            AbortReason::Commit => "commit_failed",
            AbortReason::Fenced => "fenced",
        }
    }
}

/// The open transaction's members and size: pure state, changed under the gate's lock.
#[derive(Debug, Default)]
struct Open {
    /// Partitions that wrote (or moved their position) in the open transaction: `None` until
    /// they flushed, then the source position to store (`None` inside: nothing to store).
    members: BTreeMap<(String, i32), Option<Option<i64>>>,
    bytes: u64,
    opened: Option<Instant>,
    doomed: Option<AbortReason>,
    /// A member wants the transaction ended now (it stops, or hands its data in early).
    hurry: bool,
}

impl Open {
    fn due(&self, now: Instant, interval: Duration, max_bytes: u64) -> bool {
        self.doomed.is_some()
            || self.opened.is_some_and(|o| {
                self.hurry || self.bytes >= max_bytes || now.duration_since(o) >= interval
            })
    }

    fn all_flushed(&self) -> bool {
        self.members.values().all(|m| m.is_some())
    }

    /// The positions to write with the commit.
    fn positions(&self) -> Vec<(String, i32, i64)> {
        self.members
            .iter()
            .filter_map(|((t, p), m)| m.flatten().map(|o| (t.clone(), *p, o)))
            .collect()
    }
}

/// A source position handed in: topic, partition, offset.
type Position = (String, i32, i64);

/// How many ended transactions' outcomes are kept for members that have not read theirs yet.
const OUTCOMES_KEPT: usize = 1024;

/// The coordination between a slot's partitions and its committer, without I/O: the open
/// transaction, the gate, and the outcomes. (Unit-tested below by playing the committer.)
pub(super) struct Gate {
    index: u32,
    open: Mutex<Open>,
    phase: watch::Sender<Phase>,
    /// Wakes the committer: a member joined, flushed, hurried or failed; the transaction grew.
    wake: Notify,
    /// Outcomes of the last transactions that ended, by number: a member reads its own, even
    /// when later transactions ended before it looked.
    outcomes: Mutex<BTreeMap<u64, Outcome>>,
    /// Why the committer ended, when it did.
    stopped: Mutex<Option<String>>,
}

impl Gate {
    pub(super) fn new(index: u32) -> Gate {
        Gate {
            index,
            open: Mutex::new(Open::default()),
            phase: watch::Sender::new(Phase::default()),
            wake: Notify::new(),
            outcomes: Mutex::default(),
            stopped: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// A partition's handle for one run of its forwarder.
    pub(super) fn member(self: &Arc<Self>, topic: &str, partition: i32) -> Member {
        let rx = self.phase.subscribe();
        let epoch = rx.borrow().epoch;
        Member {
            gate: self.clone(),
            key: (topic.to_string(), partition),
            rx,
            epoch,
            joined: None,
            flushed: false,
        }
    }

    /// Marks transaction `txn` for abort (if it is still the open one) and closes the gate:
    /// nobody sends into a transaction that will be aborted.
    fn doom(&self, txn: u64, reason: AbortReason) {
        let mut o = self.lock();
        if self.phase().txn != txn {
            return;
        }
        o.doomed.get_or_insert(reason);
        self.phase.send_modify(|p| p.closed = true);
        drop(o);
        self.wake.notify_one();
    }

    /// Whether the open transaction is due for its end.
    fn due(&self, interval: Duration, max_bytes: u64) -> Result<(), Duration> {
        let now = Instant::now();
        let o = self.lock();
        if o.due(now, interval, max_bytes) {
            return Ok(());
        }
        Err(o
            .opened
            .map(|t| (t + interval).saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(1)))
    }

    fn is_open(&self) -> bool {
        self.lock().opened.is_some()
    }

    /// Closes the gate; returns the transaction that is ending.
    fn close(&self) -> u64 {
        let _o = self.lock();
        self.phase.send_modify(|p| p.closed = true);
        self.phase().txn
    }

    /// `Ok(Some(positions))` once every member flushed, `Err(reason)` if the transaction is
    /// doomed (or `deadline` passed: then it is doomed now), `Ok(None)` to wait more.
    fn flushed(&self, deadline_passed: bool) -> Result<Option<Vec<Position>>, AbortReason> {
        let mut o = self.lock();
        if let Some(r) = o.doomed {
            return Err(r);
        }
        if o.all_flushed() {
            return Ok(Some(o.positions()));
        }
        if deadline_passed {
            o.doomed = Some(AbortReason::Timeout);
            return Err(AbortReason::Timeout);
        }
        Ok(None)
    }

    /// Ends transaction `txn`: the next one opens, empty, with the gate open.
    fn end(&self, txn: u64, outcome: Outcome, new_epoch: bool) {
        {
            let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
            outcomes.insert(txn, outcome);
            while outcomes.len() > OUTCOMES_KEPT {
                outcomes.pop_first();
            }
        }
        let mut o = self.lock();
        *o = Open::default();
        self.phase.send_modify(|p| {
            p.txn = txn + 1;
            p.closed = false;
            p.ended = Some((txn, outcome));
            if new_epoch {
                p.epoch += 1;
            }
        });
        drop(o);
    }

    fn outcome(&self, txn: u64) -> Option<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&txn)
            .copied()
    }

    /// The committer ended: partitions waiting at the gate or for an outcome stop waiting.
    fn stop(&self, why: String) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.phase.send_modify(|p| p.stopped = true);
    }

    fn stopped_error(&self) -> KafkaError {
        let why = self
            .stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        KafkaError::Config(format!(
            "exactly-once slot {} stopped committing: {why}",
            self.index
        ))
    }
}

/// One slot: its transactional producer and its gate.
pub(super) struct Slot {
    pub(super) index: u32,
    pub(super) producer: Arc<IdempotentProducer>,
    pub(super) gate: Arc<Gate>,
}

/// What a partition may do before sending.
#[derive(Debug)]
pub(super) enum Admit {
    /// Send: the partition is a member of the open transaction.
    Go,
    /// The transaction is ending: flush, hand in the position, wait for the outcome.
    Flush,
    /// The slot's producer epoch changed (a transaction was aborted): go back to the last
    /// committed position with a new lane.
    Rewind,
    /// The partition is stopping and has nothing in the open transaction.
    Leave,
    /// The slot stopped committing: the partition stops with this error.
    Stopped(KafkaError),
}

/// Errors of EndTxn after which the commit's outcome is unknown (it may have reached the
/// coordinator): asked again until the coordinator says.
fn outcome_unknown(e: &KafkaError) -> bool {
    e.is_retriable() || e.is_stale_metadata() || e.is(Refusal::CoordinatorMoved)
}

impl Slot {
    pub(super) fn new(index: u32, producer: Arc<IdempotentProducer>) -> Slot {
        Slot {
            index,
            producer,
            gate: Arc::new(Gate::new(index)),
        }
    }

    /// Commits the slot's transactions until `stop` (then once more, for what the stopping
    /// partitions handed in). A fence or an error that retrying cannot fix ends it with the
    /// error: the flow stops.
    pub(super) async fn run(
        self: Arc<Self>,
        c: Committer,
        stop: Shutdown,
    ) -> Result<(), KafkaError> {
        let result = self.clone().commit_loop(c, stop).await;
        self.gate.stop(match &result {
            Ok(()) => "the flow is stopping".to_string(),
            Err(e) => e.to_string(),
        });
        result
    }

    async fn commit_loop(self: Arc<Self>, c: Committer, stop: Shutdown) -> Result<(), KafkaError> {
        let gate = &self.gate;
        let mut positions_lanes: BTreeMap<i32, PartitionLane> = BTreeMap::new();
        // A fence is survived once (the coordinator's own abort at the transaction timeout
        // looks the same); a second one soon after means another process holds the id.
        let mut last_fence: Option<Instant> = None;
        // Staggered, so the slots' commit pauses do not coincide.
        let stagger = c.interval * self.index / c.slots.max(1);
        if stop.sleep(stagger).await {
            return Ok(());
        }
        loop {
            self.report_hanging(&c);
            if !self.until_due(&c, &stop).await {
                return Ok(());
            }
            let closed_at = Instant::now();
            let txn = gate.close();
            // Wait for every member's flush.
            let flushed = loop {
                match gate.flushed(closed_at.elapsed() > c.timeout / 2) {
                    Ok(Some(positions)) => break Ok(positions),
                    Ok(None) => {}
                    Err(r) => break Err(r),
                }
                tokio::select! {
                    _ = gate.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            };
            let flushed_in = closed_at.elapsed();
            let outcome = match flushed {
                Err(r) => Err(r),
                Ok(positions) => match self
                    .commit(&c, &positions, &mut positions_lanes, &stop)
                    .await
                {
                    Ok(()) => Ok(()),
                    Err(KafkaError::Fenced { .. }) => Err(AbortReason::Fenced),
                    Err(e) if outcome_unknown(&e) => {
                        // Stopping (the flow, or handing the slot over) with a commit whose
                        // outcome is unknown: the next owner fences the id and reads what was
                        // committed, so nothing is lost or doubled either way.
                        tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "stopping with the last commit's outcome unknown; the next owner reads what was committed");
                        gate.end(txn, Outcome::Aborted, false);
                        return Ok(());
                    }
                    Err(e) => {
                        tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "transaction commit failed; aborting it");
                        Err(AbortReason::Commit)
                    }
                },
            };
            match outcome {
                Ok(()) => {
                    tracing::debug!(flow = %c.flow, slot = self.index, flush_ms = flushed_in.as_millis() as u64, commit_ms = closed_at.elapsed().as_millis() as u64, "committed");
                    c.metrics
                        .transactions_committed
                        .get_or_create(&c.labels)
                        .inc();
                    c.metrics
                        .transaction_commit_ms
                        .get_or_create(&c.labels)
                        .inc_by(closed_at.elapsed().as_millis() as u64);
                    gate.end(txn, Outcome::Committed, false);
                }
                Err(reason) => {
                    c.metrics
                        .transactions_aborted
                        .get_or_create(&c.labels.reason(reason.label()))
                        .inc();
                    if stop.is_triggered() {
                        // Handing the slot over, losing it or stopping. A new epoch ends what
                        // a lane may still have on its way (an abort of the same epoch does
                        // not, on brokers before KIP-890's verification), but it is taken only
                        // while this process surely still holds the slot: never after a
                        // fence, never once the membership lapsed, as it would fence the
                        // slot's next holder (docs/sharing.md, "Exactly-once").
                        let holds = reason != AbortReason::Fenced
                            && c.lease.as_ref().is_none_or(|l| l.may_write());
                        self.give_up(&c, txn, holds).await;
                        return Ok(());
                    }
                    if let Some(lease) = &c.lease {
                        // A process that slept past its session (a zombie) may have lost the
                        // slot already: it takes a new epoch only once the group confirms it
                        // is still a member; if not, the slot is taken from it (stop).
                        if !lease.hold_writes(&stop).await {
                            self.give_up(&c, txn, false).await;
                            return Ok(());
                        }
                    }
                    if reason == AbortReason::Fenced {
                        if last_fence.is_some_and(|t| t.elapsed() < FENCED_AGAIN) {
                            // Another process took this slot's transactional id: what this
                            // one wrote in the transaction is aborted; it stops writing.
                            gate.end(txn, Outcome::Aborted, true);
                            return Err(KafkaError::Fenced {
                                transactional_id: self
                                    .producer
                                    .transaction()
                                    .map(|t| t.id().to_string())
                                    .unwrap_or_default(),
                            });
                        }
                        last_fence = Some(Instant::now());
                    }
                    tracing::warn!(flow = %c.flow, slot = self.index, reason = reason.label(), "transaction aborted; the slot's partitions go back to their last committed positions");
                    // A new epoch aborts the open transaction (whatever its lanes still send
                    // is refused), and sequences start over with new lanes.
                    if !self.new_epoch(&c, &stop).await {
                        // Given up or stopping: not a failure of the flow.
                        self.give_up(&c, txn, false).await;
                        return Ok(());
                    }
                    positions_lanes.clear();
                    gate.end(txn, Outcome::Aborted, true);
                }
            }
        }
    }

    /// Waits until the open transaction is due; false when stopping with nothing open.
    async fn until_due(&self, c: &Committer, stop: &Shutdown) -> bool {
        let gate = &self.gate;
        loop {
            let wait = match gate.due(c.interval, c.max_bytes) {
                Ok(()) => return true,
                Err(wait) => wait,
            };
            if stop.is_triggered() && !gate.is_open() {
                return false;
            }
            tokio::select! {
                _ = gate.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait(), if !stop.is_triggered() => {}
            }
        }
    }

    /// Takes a new producer epoch after an abort, retrying; false when the slot must be given
    /// up instead (stopping, or the membership lapsed).
    async fn new_epoch(&self, c: &Committer, stop: &Shutdown) -> bool {
        let Some(t) = self.producer.transaction() else {
            return true;
        };
        let mut attempt = 0;
        loop {
            // Asked before every attempt: a membership that lapsed while retrying (a network
            // partition that heals late) must not fence the slot's next holder.
            if let Some(lease) = &c.lease {
                if !lease.hold_writes(stop).await {
                    return false;
                }
            }
            match t.reinit().await {
                Ok(_) => return true,
                Err(e) => {
                    tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "re-initialising the transactional id failed; retrying");
                    if stop.retry_after(&mut attempt).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Logs and counts what the transaction found and settled since the last look.
    fn report_hanging(&self, c: &Committer) {
        let Some(t) = self.producer.transaction() else {
            return;
        };
        for found in t.take_reports() {
            crate::events::copy::HangingTransaction {
                flow: &c.flow,
                transactional_id: t.id(),
                found: &found,
            }
            .emit(Emitter {
                metrics: &c.metrics,
                labels: &c.labels,
            });
        }
    }

    /// Ends a transaction that cannot be committed, the slot being given up: with a new epoch
    /// when this process surely still holds it (`bump`), else with an abort of the slot's
    /// current epoch, which fails harmlessly if another holder fenced it already.
    async fn give_up(&self, c: &Committer, txn: u64, bump: bool) {
        if let Some(t) = self.producer.transaction() {
            let ended = if bump {
                tokio::time::timeout(GIVE_UP_WAIT, async { t.reinit().await.map(|_| ()) }).await
            } else {
                tokio::time::timeout(GIVE_UP_WAIT, t.abort()).await
            };
            match ended {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(flow = %c.flow, slot = self.index, error = %e, "abort while giving the slot up failed; its next owner's fence aborts the transaction")
                }
                Err(_) => {
                    tracing::debug!(flow = %c.flow, slot = self.index, "abort while giving the slot up took too long; its next owner's fence aborts the transaction")
                }
            }
        }
        self.gate.end(txn, Outcome::Aborted, true);
    }

    /// Writes the members' positions in the open transaction and commits it. EndTxn is asked
    /// again while its outcome is unknown (its answer lost, the coordinator moving): treating
    /// it as aborted could rewind partitions behind a commit that happened (duplicates).
    async fn commit(
        &self,
        c: &Committer,
        positions: &[(String, i32, i64)],
        lanes: &mut BTreeMap<i32, PartitionLane>,
        stop: &Shutdown,
    ) -> Result<(), KafkaError> {
        let Some(txn) = self.producer.transaction() else {
            return Ok(());
        };
        if !positions.is_empty() {
            let partitions = c
                .target
                .metadata()
                .partition_count(&c.positions_topic)
                .unwrap_or(1);
            let batches = super::positions::position_batches(
                &c.source_alias,
                positions,
                partitions,
                super::now_ms(),
            )?;
            let topic: Arc<str> = Arc::from(c.positions_topic.as_str());
            txn.add_all(
                batches.keys().map(|p| (topic.clone(), *p)).collect(),
                txn.identity(),
            )
            .await
            .map_err(not_committed)?;
            for (p, batch) in batches {
                let lane = lanes
                    .entry(p)
                    // Other slots' data would hold it up for hundreds of ms on a data
                    // connection, this slot's partitions waiting meanwhile (docs/benchmarks.md).
                    .or_insert_with(|| {
                        self.producer
                            .lane(&c.positions_topic, p)
                            .on_control_channel()
                    });
                lane.send(0, batch).await.map_err(not_committed)?;
            }
            for lane in lanes.values_mut() {
                lane.flush().await.map_err(not_committed)?;
            }
        }
        let mut attempt = 0;
        loop {
            match txn.commit().await {
                Err(e) if outcome_unknown(&e) && !stop.is_triggered() => {
                    tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "the commit's outcome is unknown; asking again");
                    let _ = stop.retry_after(&mut attempt).await;
                }
                other => return other,
            }
        }
    }
}

/// An error before EndTxn was sent: the transaction is certainly not committed.
fn not_committed(e: KafkaError) -> KafkaError {
    match e {
        e @ KafkaError::Fenced { .. } => e,
        e => KafkaError::Config(format!("writing positions in the transaction failed: {e}")),
    }
}

/// How long a slot being given up tries to abort its open transaction itself.
const GIVE_UP_WAIT: Duration = Duration::from_secs(5);

/// What a slot's committer needs besides the slot.
#[derive(Clone)]
pub(super) struct Committer {
    /// With sharing: the membership's lease (a slot takes a new epoch only while it holds).
    pub(super) lease: Option<Arc<super::sharing::Shared>>,
    pub(super) flow: String,
    pub(super) interval: Duration,
    pub(super) max_bytes: u64,
    pub(super) timeout: Duration,
    pub(super) slots: u32,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) positions_topic: String,
    pub(super) source_alias: String,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
}

/// How long a stopping partition waits for the outcome of the transaction it handed its
/// position to, before it leaves (the next process reads what was committed).
const LEAVE_AFTER: Duration = Duration::from_secs(10);

/// A partition's place in its slot, for one run of its forwarder.
pub(super) struct Member {
    gate: Arc<Gate>,
    key: (String, i32),
    rx: watch::Receiver<Phase>,
    /// The producer epoch this run's lane belongs to.
    epoch: u64,
    /// The transaction this partition wrote in, until it learns the outcome.
    joined: Option<u64>,
    flushed: bool,
}

impl Member {
    pub(super) fn joined(&self) -> bool {
        self.joined.is_some()
    }

    /// Waits at the gate before sending `bytes` (0: only the position moves). `stop`: the
    /// partition is stopping (waiting then ends with `Leave`, or `Flush` for a member).
    pub(super) async fn admit(&mut self, bytes: u64, stop: &Shutdown) -> Admit {
        loop {
            {
                let mut o = self.gate.lock();
                // Read under the lock the committer closes and ends transactions under, so
                // the transaction joined is the one open now.
                let p = *self.rx.borrow_and_update();
                if p.stopped {
                    return Admit::Stopped(self.gate.stopped_error());
                }
                if p.epoch != self.epoch {
                    return Admit::Rewind;
                }
                if p.closed {
                    if self.joined.is_some() && !self.flushed {
                        return Admit::Flush;
                    }
                } else if self.joined.is_some_and(|t| t != p.txn) {
                    // Its transaction ended without it (only by an abort, which changes the
                    // epoch): nothing it sent counts.
                    return Admit::Rewind;
                } else if !self.flushed {
                    o.members.entry(self.key.clone()).or_insert(None);
                    let first = o.opened.is_none();
                    o.bytes = o.bytes.saturating_add(bytes);
                    o.opened.get_or_insert_with(Instant::now);
                    self.joined = Some(p.txn);
                    drop(o);
                    if first {
                        // The committer sleeps while nothing is open: its interval starts now.
                        self.gate.wake.notify_one();
                    }
                    return Admit::Go;
                }
            }
            if stop.is_triggered() && self.joined.is_none() {
                return Admit::Leave;
            }
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return Admit::Rewind;
                    }
                }
                _ = stop.wait(), if !stop.is_triggered() => {}
            }
        }
    }

    /// Ready when the transaction this partition wrote in is ending (flush now), or the epoch
    /// changed (rewind). Pending otherwise. Cancel-safe.
    pub(super) async fn ending(&mut self) -> Admit {
        loop {
            {
                let p = *self.rx.borrow_and_update();
                if p.stopped {
                    return Admit::Stopped(self.gate.stopped_error());
                }
                if p.epoch != self.epoch {
                    return Admit::Rewind;
                }
                if p.closed && self.joined.is_some() && !self.flushed {
                    return Admit::Flush;
                }
            }
            if self.rx.changed().await.is_err() {
                return Admit::Rewind;
            }
        }
    }

    /// Hands in the partition's position (everything it sent is acknowledged) and waits for
    /// the transaction's outcome. `hurry`: ask for the commit now rather than at the interval.
    /// A stopping partition waits at most [`LEAVE_AFTER`] for it.
    pub(super) async fn flush(
        &mut self,
        position: Option<i64>,
        hurry: bool,
        stop: &Shutdown,
    ) -> Outcome {
        let Some(txn) = self.joined else {
            return Outcome::Committed;
        };
        {
            let mut o = self.gate.lock();
            if self.gate.phase().txn == txn {
                if let Some(m) = o.members.get_mut(&self.key) {
                    *m = Some(position);
                }
                o.hurry |= hurry;
            }
        }
        self.flushed = true;
        self.gate.wake.notify_one();
        let mut leave_at: Option<Instant> = None;
        loop {
            if let Some(outcome) = self.gate.outcome(txn) {
                self.joined = None;
                self.flushed = false;
                return outcome;
            }
            let p = *self.rx.borrow_and_update();
            if p.stopped || p.txn > txn {
                // Ended, its outcome no longer kept (or the committer is gone): not known
                // to be committed.
                if self.gate.outcome(txn).is_none() {
                    self.joined = None;
                    self.flushed = false;
                    return Outcome::Aborted;
                }
                continue;
            }
            if stop.is_triggered() && leave_at.is_none() {
                leave_at = Some(Instant::now() + LEAVE_AFTER);
            }
            let wait = leave_at.map_or(Duration::from_secs(3600), |t| {
                t.saturating_duration_since(Instant::now())
            });
            if leave_at.is_some() && wait.is_zero() {
                self.joined = None;
                return Outcome::Aborted;
            }
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        self.joined = None;
                        return Outcome::Aborted;
                    }
                }
                _ = stop.wait(), if !stop.is_triggered() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Leaves the open transaction without dooming it: nothing this partition did reached it
    /// (its lane belonged to an earlier epoch). Its place among the members goes too, or the
    /// commit would wait for its flush until the deadline and abort.
    pub(super) fn forget(&mut self) {
        if let Some(txn) = self.joined.take() {
            let mut o = self.gate.lock();
            if self.gate.phase().txn == txn && !self.flushed {
                if let Some(None) = o.members.get(&self.key) {
                    o.members.remove(&self.key);
                }
            }
            drop(o);
            self.gate.wake.notify_one();
        }
    }

    /// This partition's lane was fenced by a newer epoch of the slot's id, not the slot's own:
    /// the open transaction is dead (the committer counts the fence).
    pub(super) fn fenced(&mut self) {
        if let Some(txn) = self.joined.take() {
            self.gate.doom(txn, AbortReason::Fenced);
        } else {
            self.gate.doom(self.gate.phase().txn, AbortReason::Fenced);
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A partition that leaves with data in the open transaction and without handing in its
        // position: what it sent may be half there, so the transaction cannot be committed.
        if let Some(txn) = self.joined {
            if !self.flushed {
                self.gate.doom(txn, AbortReason::Failed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/status` adds the aborts up over `metrics::ABORT_REASONS`: a reason missing there would
    /// be counted in `/metrics` and not in `/status`.
    #[test]
    fn every_abort_reason_is_one_status_adds_up() {
        // A new reason fails to compile here until it is added to the list below.
        let _every = |r: AbortReason| match r {
            AbortReason::Failed
            | AbortReason::Timeout
            | AbortReason::Commit
            | AbortReason::Fenced => {}
        };
        let all = [
            AbortReason::Failed,
            AbortReason::Timeout,
            AbortReason::Commit,
            AbortReason::Fenced,
        ];
        let labels: Vec<&str> = all.iter().map(|r| r.label()).collect();
        assert_eq!(labels, crate::metrics::ABORT_REASONS);
    }

    #[test]
    fn slots_are_stable_and_spread_a_topics_partitions() {
        // Fixed values: a change would move partitions between slots across versions, and a
        // mixed deployment would fence itself.
        assert_eq!(slot_of("orders", 0, 12), slot_of("orders", 0, 12));
        let first = slot_of("orders", 0, 12);
        for p in 0..24 {
            assert_eq!(slot_of("orders", p, 12), (first + p as u32) % 12);
        }
        assert_eq!(slot_of("", 0, 12), 0x811c_9dc5 % 12);
        assert_eq!(slot_of("a", 0, 1), 0);
        assert_eq!(slot_of("a", 5, 0), 0, "no slots: everything in one");
    }

    #[test]
    fn a_transaction_is_due_by_time_size_hurry_or_doom_and_only_once_opened() {
        let now = Instant::now();
        let i = Duration::from_millis(500);
        let mut o = Open::default();
        assert!(!o.due(now, i, 100), "nothing open");
        o.hurry = true;
        assert!(!o.due(now, i, 100), "nothing open, even in a hurry");
        o.hurry = false;
        o.opened = Some(now);
        assert!(!o.due(now, i, 100));
        assert!(o.due(now + i, i, 100), "interval");
        o.bytes = 100;
        assert!(o.due(now, i, 100), "size");
        o.bytes = 0;
        o.hurry = true;
        assert!(o.due(now, i, 100), "hurry");
        let doomed = Open {
            doomed: Some(AbortReason::Failed),
            ..Open::default()
        };
        assert!(doomed.due(now, i, 100), "doomed, even with nothing open");
    }

    #[test]
    fn positions_come_from_flushed_members_that_moved() {
        let mut o = Open::default();
        o.members.insert(("t".into(), 0), Some(Some(41)));
        o.members.insert(("t".into(), 1), Some(None));
        o.members.insert(("u".into(), 0), None);
        assert!(!o.all_flushed());
        assert_eq!(o.positions(), vec![("t".to_string(), 0, 41)]);
        o.members.insert(("u".into(), 0), Some(Some(7)));
        assert!(o.all_flushed());
        assert_eq!(o.positions().len(), 2);
    }

    fn key(topic: &str, partition: i32) -> (String, i32) {
        (topic.to_string(), partition)
    }

    /// Plays the committer: closes the gate, waits until every member flushed, ends the
    /// transaction with `outcome`; returns the positions handed in.
    async fn commit(gate: &Gate, outcome: Outcome) -> Vec<(String, i32, i64)> {
        let txn = gate.close();
        loop {
            match gate.flushed(false) {
                Ok(Some(p)) => {
                    gate.end(txn, outcome, outcome == Outcome::Aborted);
                    return p;
                }
                Ok(None) => tokio::task::yield_now().await,
                Err(r) => panic!("doomed: {r:?}"),
            }
        }
    }

    async fn pending<F: std::future::Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_member_hands_in_its_position_and_learns_the_commit() {
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        let mut m = gate.member("t", 0);
        assert!(matches!(m.admit(100, &stop).await, Admit::Go));
        assert!(
            gate.due(Duration::from_secs(60), 100).is_ok(),
            "size reached"
        );
        assert!(
            pending(m.ending()).await,
            "nothing ends while the gate is open"
        );
        let committer = {
            let gate = gate.clone();
            tokio::spawn(async move { commit(&gate, Outcome::Committed).await })
        };
        assert!(matches!(m.ending().await, Admit::Flush));
        assert_eq!(m.flush(Some(41), false, &stop).await, Outcome::Committed);
        assert_eq!(committer.await.unwrap(), vec![("t".to_string(), 0, 41)]);
        assert!(!m.joined());
        // The next send joins the next transaction.
        assert!(matches!(m.admit(1, &stop).await, Admit::Go));
        assert_eq!(m.joined, Some(1));
    }

    #[tokio::test]
    async fn a_member_whose_lane_was_stale_leaves_without_holding_the_commit_up() {
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        let mut a = gate.member("t", 0);
        let mut b = gate.member("t", 1);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        assert!(matches!(b.admit(1, &stop).await, Admit::Go));
        // b's lane was refused before sending (an earlier epoch's lane): it forgets.
        b.forget();
        let txn = gate.close();
        let flushing = tokio::spawn(async move {
            let stop = Shutdown::default();
            a.flush(Some(3), false, &stop).await
        });
        while gate.flushed(false) == Ok(None) {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            gate.flushed(false),
            Ok(Some(vec![("t".to_string(), 0, 3)])),
            "the commit waits for a only"
        );
        gate.end(txn, Outcome::Committed, false);
        assert_eq!(flushing.await.unwrap(), Outcome::Committed);
        drop(b);
        assert!(!gate.phase().closed, "b's drop doomed nothing");
    }

    #[tokio::test]
    async fn a_closed_gate_holds_newcomers_until_the_transaction_ends() {
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        let mut a = gate.member("t", 0);
        let mut b = gate.member("t", 1);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        let txn = gate.close();
        assert!(
            pending(b.admit(1, &stop)).await,
            "b sent into a closing transaction"
        );
        assert_eq!(gate.flushed(false), Ok(None), "a has not flushed");
        let flushing = tokio::spawn(async move {
            let stop = Shutdown::default();
            a.flush(None, false, &stop).await
        });
        while gate.flushed(false) == Ok(None) {
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.flushed(false), Ok(Some(vec![])), "a moved nothing");
        gate.end(txn, Outcome::Committed, false);
        assert_eq!(flushing.await.unwrap(), Outcome::Committed);
        assert!(matches!(b.admit(1, &stop).await, Admit::Go));
        assert_eq!(b.joined, Some(txn + 1), "b is in the next transaction");
        assert!(gate.lock().members.contains_key(&key("t", 1)));
    }

    #[tokio::test]
    async fn a_member_dropped_with_data_dooms_the_transaction_and_the_abort_rewinds_the_slot() {
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        let mut a = gate.member("t", 0);
        let mut b = gate.member("t", 1);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        assert!(matches!(b.admit(1, &stop).await, Admit::Go));
        drop(a);
        assert_eq!(gate.flushed(false), Err(AbortReason::Failed));
        assert!(
            gate.phase().closed,
            "nobody sends into a doomed transaction"
        );
        // b, waiting for the outcome of its flush, learns the abort.
        let txn = gate.phase().txn;
        let waiting = tokio::spawn(async move {
            let stop = Shutdown::default();
            let outcome = b.flush(Some(7), false, &stop).await;
            (outcome, b)
        });
        tokio::task::yield_now().await;
        gate.end(txn, Outcome::Aborted, true);
        let (outcome, mut b) = waiting.await.unwrap();
        assert_eq!(outcome, Outcome::Aborted);
        assert!(
            matches!(b.admit(1, &stop).await, Admit::Rewind),
            "a new epoch: new lanes"
        );
        let mut c = gate.member("t", 2);
        assert!(
            matches!(c.admit(1, &stop).await, Admit::Go),
            "a member of the new epoch sends"
        );
    }

    #[tokio::test]
    async fn a_commit_is_known_as_such_even_after_a_later_abort() {
        // The member reads its own transaction's outcome, not the latest one's.
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        let mut a = gate.member("t", 0);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        let txn = gate.close();
        {
            let mut o = gate.lock();
            *o.members.get_mut(&key("t", 0)).unwrap() = Some(Some(3));
        }
        a.flushed = true;
        gate.end(txn, Outcome::Committed, false);
        let mut other = gate.member("t", 1);
        assert!(matches!(other.admit(1, &stop).await, Admit::Go));
        drop(other);
        gate.end(txn + 1, Outcome::Aborted, true);
        assert_eq!(a.flush(Some(3), false, &stop).await, Outcome::Committed);
    }

    #[tokio::test]
    async fn leaving_late_or_after_flushing_dooms_nothing() {
        let gate = Arc::new(Gate::new(0));
        let stop = Shutdown::default();
        // A member of an ended transaction that drops does not doom the next one.
        let mut a = gate.member("t", 0);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        let txn = gate.close();
        gate.end(txn, Outcome::Aborted, false);
        drop(a);
        assert_eq!(gate.lock().doomed, None);
        // A stale member leaves the transaction it never wrote in.
        let mut b = gate.member("t", 1);
        assert!(matches!(b.admit(1, &stop).await, Admit::Go));
        b.forget();
        drop(b);
        assert_eq!(gate.lock().doomed, None);
        // A stopping partition that is not in the closing transaction leaves the gate.
        let mut c = gate.member("t", 2);
        assert!(matches!(c.admit(1, &stop).await, Admit::Go));
        gate.close();
        let mut d = gate.member("t", 3);
        stop.trigger();
        assert!(matches!(d.admit(1, &stop).await, Admit::Leave));
        // A lane fenced from outside dooms the open transaction as fenced.
        c.fenced();
        assert_eq!(gate.flushed(false), Err(AbortReason::Fenced));
    }

    #[tokio::test]
    async fn a_stopped_committer_releases_every_waiting_member() {
        let gate = Arc::new(Gate::new(3));
        let stop = Shutdown::default();
        let mut a = gate.member("t", 0);
        assert!(matches!(a.admit(1, &stop).await, Admit::Go));
        gate.close();
        let mut b = gate.member("t", 1);
        let waiting = tokio::spawn(async move {
            let stop = Shutdown::default();
            b.admit(1, &stop).await
        });
        tokio::task::yield_now().await;
        gate.stop("fenced".into());
        match waiting.await.unwrap() {
            Admit::Stopped(e) => assert!(
                e.to_string().contains("slot 3 stopped committing: fenced"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.flush(None, false, &stop).await, Outcome::Aborted);
    }
}
