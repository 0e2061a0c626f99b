//! Exactly-once slots (docs/plans/exactly-once.md §2 and §5–8): a flow's partitions are divided
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

use super::Shutdown;
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::producer::{IdempotentProducer, PartitionLane};
use kmirror_kafka::KafkaError;
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

/// A second fence within this long stops the flow (docs/plans/exactly-once.md §4).
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

/// The open transaction's members and size: pure state, changed under the slot's lock.
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

/// One slot: its transactional producer, the open transaction and the gate.
pub(super) struct Slot {
    pub(super) index: u32,
    pub(super) producer: Arc<IdempotentProducer>,
    open: Mutex<Open>,
    phase: watch::Sender<Phase>,
    /// Wakes the committer: a member flushed, hurried or failed; the transaction grew.
    wake: Notify,
    /// Why the committer ended, when it did with an error.
    stopped: Mutex<Option<String>>,
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
    /// The slot stopped committing: the partition stops with this error.
    Stopped(KafkaError),
}

impl Slot {
    pub(super) fn new(index: u32, producer: Arc<IdempotentProducer>) -> Slot {
        Slot {
            index,
            producer,
            open: Mutex::new(Open::default()),
            phase: watch::Sender::new(Phase::default()),
            wake: Notify::new(),
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
            slot: self.clone(),
            key: (topic.to_string(), partition),
            rx,
            epoch,
            joined: None,
            flushed: false,
        }
    }

    fn doom(&self, reason: AbortReason) {
        let mut o = self.lock();
        o.doomed.get_or_insert(reason);
        // Nobody sends into a transaction that will be aborted.
        self.phase.send_modify(|p| p.closed = true);
        drop(o);
        self.wake.notify_one();
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
        // Partitions waiting at the gate or for an outcome must not wait forever.
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = Some(match &result {
            Ok(()) => "the flow is stopping".to_string(),
            Err(e) => e.to_string(),
        });
        self.phase.send_modify(|p| p.stopped = true);
        result
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

    async fn commit_loop(self: Arc<Self>, c: Committer, stop: Shutdown) -> Result<(), KafkaError> {
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
            // Wait until the open transaction is due.
            loop {
                let now = Instant::now();
                let wait = {
                    let o = self.lock();
                    if o.due(now, c.interval, c.max_bytes) {
                        break;
                    }
                    o.opened
                        .map(|t| (t + c.interval).saturating_duration_since(now))
                        .unwrap_or(Duration::from_secs(1))
                };
                if stop.is_triggered() && self.lock().opened.is_none() {
                    return Ok(());
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait(), if !stop.is_triggered() => {}
                }
            }
            let closed_at = Instant::now();
            let txn = {
                let _o = self.lock();
                self.phase.send_modify(|p| p.closed = true);
                self.phase().txn
            };
            // Wait for every member's flush.
            let reason = loop {
                let flushed = {
                    let mut o = self.lock();
                    if let Some(r) = o.doomed {
                        break Some(r);
                    }
                    if closed_at.elapsed() > c.timeout / 2 {
                        o.doomed = Some(AbortReason::Timeout);
                        break Some(AbortReason::Timeout);
                    }
                    o.all_flushed()
                };
                if flushed {
                    break None;
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            };
            let outcome = match reason {
                Some(r) => Err(r),
                None => {
                    let positions = self.lock().positions();
                    match self.commit(&c, &positions, &mut positions_lanes).await {
                        Ok(()) => Ok(()),
                        Err(e @ KafkaError::Fenced { .. }) => {
                            if last_fence.is_some_and(|t| t.elapsed() < FENCED_AGAIN) {
                                // Another process took this slot's transactional id: what this
                                // one wrote in the transaction is aborted; it stops writing.
                                self.end(txn, Outcome::Aborted, false);
                                return Err(e);
                            }
                            last_fence = Some(Instant::now());
                            tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "transaction fenced; aborting it and taking a new epoch");
                            Err(AbortReason::Fenced)
                        }
                        Err(e) => {
                            tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "transaction commit failed; aborting it");
                            Err(AbortReason::Commit)
                        }
                    }
                }
            };
            match outcome {
                Ok(()) => {
                    c.metrics
                        .transactions_committed
                        .get_or_create(&c.labels)
                        .inc();
                    c.metrics
                        .transaction_commit_ms
                        .get_or_create(&c.labels)
                        .inc_by(closed_at.elapsed().as_millis() as u64);
                    self.end(txn, Outcome::Committed, false);
                }
                Err(reason) => {
                    c.metrics
                        .transactions_aborted
                        .get_or_create(&c.labels.reason(reason.label()))
                        .inc();
                    tracing::warn!(flow = %c.flow, slot = self.index, reason = reason.label(), "transaction aborted; the slot's partitions go back to their last committed positions");
                    // A new epoch aborts the open transaction (whatever its lanes still send
                    // is refused), and sequences start over with new lanes.
                    if let Some(t) = self.producer.transaction() {
                        let mut attempt = 0;
                        loop {
                            match t.reinit().await {
                                Ok(_) => break,
                                Err(e @ KafkaError::Fenced { .. }) => {
                                    self.end(txn, Outcome::Aborted, true);
                                    return Err(e);
                                }
                                Err(e) => {
                                    tracing::warn!(flow = %c.flow, slot = self.index, error = %e, "re-initialising the transactional id failed; retrying");
                                    if stop.retry_after(&mut attempt).await {
                                        self.end(txn, Outcome::Aborted, true);
                                        return Err(e);
                                    }
                                }
                            }
                        }
                    }
                    positions_lanes.clear();
                    self.end(txn, Outcome::Aborted, true);
                }
            }
        }
    }

    /// Ends transaction `txn`: the next one opens, empty, with the gate open.
    fn end(&self, txn: u64, outcome: Outcome, new_epoch: bool) {
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

    /// Writes the members' positions in the open transaction and commits it.
    async fn commit(
        &self,
        c: &Committer,
        positions: &[(String, i32, i64)],
        lanes: &mut BTreeMap<i32, PartitionLane>,
    ) -> Result<(), KafkaError> {
        let Some(txn) = self.producer.transaction() else {
            return Ok(());
        };
        if !positions.is_empty() {
            let partitions = c
                .target
                .metadata()
                .topics
                .get(&c.positions_topic)
                .map_or(1, |t| t.partitions.len() as i32);
            let batches = super::positions::position_batches(
                &c.source_alias,
                positions,
                partitions,
                super::now_ms(),
            )?;
            for (p, batch) in batches {
                let lane = lanes
                    .entry(p)
                    .or_insert_with(|| self.producer.lane(&c.positions_topic, p));
                lane.send(0, batch).await?;
            }
            for lane in lanes.values_mut() {
                lane.flush().await?;
            }
        }
        txn.commit().await
    }
}

/// What a slot's committer needs besides the slot.
#[derive(Clone)]
pub(super) struct Committer {
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

/// A partition's place in its slot, for one run of its forwarder.
pub(super) struct Member {
    slot: Arc<Slot>,
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

    /// Waits at the gate before sending `bytes` (0: only the position moves).
    pub(super) async fn admit(&mut self, bytes: u64) -> Admit {
        loop {
            {
                let p = *self.rx.borrow_and_update();
                if p.stopped {
                    return Admit::Stopped(self.slot.stopped_error());
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
                    let mut o = self.slot.lock();
                    // Checked again under the lock the committer closes the gate under.
                    if !self.slot.phase.borrow().closed {
                        o.members.entry(self.key.clone()).or_insert(None);
                        o.bytes += bytes;
                        o.opened.get_or_insert_with(Instant::now);
                        self.joined = Some(p.txn);
                        return Admit::Go;
                    }
                    continue;
                }
            }
            if self.rx.changed().await.is_err() {
                return Admit::Rewind;
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
                    return Admit::Stopped(self.slot.stopped_error());
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
    pub(super) async fn flush(&mut self, position: Option<i64>, hurry: bool) -> Outcome {
        let Some(txn) = self.joined else {
            return Outcome::Committed;
        };
        {
            let mut o = self.slot.lock();
            if let Some(m) = o.members.get_mut(&self.key) {
                *m = Some(position);
            }
            o.hurry |= hurry;
        }
        self.flushed = true;
        self.slot.wake.notify_one();
        loop {
            let p = *self.rx.borrow_and_update();
            if p.stopped && p.ended.is_none_or(|(t, _)| t < txn) {
                self.joined = None;
                return Outcome::Aborted;
            }
            match p.ended {
                Some((t, outcome)) if t >= txn => {
                    self.joined = None;
                    self.flushed = false;
                    if p.epoch != self.epoch {
                        return Outcome::Aborted;
                    }
                    return outcome;
                }
                _ => {}
            }
            if self.rx.changed().await.is_err() {
                return Outcome::Aborted;
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A partition that leaves with data in the open transaction and without handing in its
        // position: what it sent may be half there, so the transaction cannot be committed.
        if let Some(txn) = self.joined {
            if !self.flushed && self.slot.phase().txn == txn {
                self.slot.doom(AbortReason::Failed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
