//! The exactly-once slots this process holds, and their committers (docs/sharing.md,
//! "Exactly-once"). A flow's group assigns slots, not partitions, when its flow is exactly-once:
//! the transactional id is the unit of fencing, and one slot's partitions split over two
//! processes would fence each other.
//!
//! Taking a slot initialises its transactional id before anything else: InitProducerId bumps
//! the id's epoch, so the previous holder (a process that gave the slot up, died, or slept past
//! its session) can no longer write or commit, and its open transaction is aborted before the
//! call returns. The positions read after that are final. Giving a slot up stops its committer
//! once its partitions have stopped: what they handed in is committed once more, and a
//! transaction that cannot be committed is aborted with the slot's own epoch, never with a new
//! one (that would fence the next holder).

use super::slots::{Committer, Slot, SlotTable};
use super::{Shutdown, Supervisor};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::KafkaError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

pub(super) struct SlotKeeper {
    pub(super) table: Arc<SlotTable>,
    committer: Committer,
    id_prefix: String,
    timeout: Duration,
    running: BTreeMap<u32, (Shutdown, JoinHandle<()>)>,
    /// Triggered when a slot cannot be taken or its committer fails: the flow stops with
    /// `failure`.
    pub(super) failed: Shutdown,
    pub(super) failure: Arc<Mutex<Option<String>>>,
    helpers: Supervisor,
}

impl SlotKeeper {
    pub(super) fn new(
        t: &crate::config::model::Transactions,
        committer: Committer,
        helpers: Supervisor,
    ) -> SlotKeeper {
        SlotKeeper {
            table: Arc::new(SlotTable::new(t.slots)),
            committer,
            id_prefix: t.transactional_id_prefix.clone(),
            timeout: t.timeout,
            running: BTreeMap::new(),
            failed: Shutdown::default(),
            failure: Arc::default(),
            helpers,
        }
    }

    fn fail(&self, reason: String) {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        self.failed.trigger();
    }

    /// Takes slot `index` (fences its id, then starts its committer). False if `stop` came
    /// first or the id cannot be used (then `failed` is triggered with the reason).
    pub(super) async fn acquire(&mut self, index: u32, stop: &Shutdown) -> bool {
        if self.running.contains_key(&index) {
            return true;
        }
        let id = format!("{}{index}", self.id_prefix);
        let c = &self.committer;
        let mut attempt = 0;
        let producer = loop {
            if c.lease.as_ref().is_some_and(|l| !l.may_write()) {
                // The membership lapsed while taking it: fencing the id now could fence the
                // slot's next holder. Not claimed, it is given out again (the flow asks the
                // group to rejoin: `apply_slots`).
                tracing::warn!(flow = %c.flow, transactional_id = %id, "not taking the slot: no heartbeat answered for a session timeout");
                return false;
            }
            match IdempotentProducer::transactional(c.target.clone(), &id, self.timeout).await {
                Ok(p) => break p,
                Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                    tracing::warn!(flow = %c.flow, transactional_id = %id, error = %e, "initialising the transactional id failed; retrying");
                    if stop.retry_after(&mut attempt).await {
                        return false;
                    }
                }
                Err(e) => {
                    self.fail(format!(
                        "cannot use the transactional id '{id}' of this exactly-once flow: {e}"
                    ));
                    return false;
                }
            }
        };
        let slot = Arc::new(Slot::new(index, producer));
        self.table.insert(slot.clone());
        let own = Shutdown::default();
        let (c, until) = (self.committer.clone(), own.clone());
        let (failed, failure) = (self.failed.clone(), self.failure.clone());
        let flow = c.flow.clone();
        let task = self.helpers.spawn("transactions", &flow, async move {
            if let Err(e) = slot.run(c, until).await {
                let reason = match e {
                    KafkaError::Fenced { transactional_id } => format!("another kmirror or MirrorMaker 2 process writes with the transactional id '{transactional_id}' of this exactly-once flow while this process holds it (two deployments with one group.id, or MirrorMaker 2 still running?)"),
                    e => format!("exactly-once transactions failed: {e}"),
                };
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(reason);
                failed.trigger();
            }
        });
        self.running.insert(index, (own, task));
        self.show();
        true
    }

    /// Gives slot `index` up once its partitions have stopped: its committer commits what they
    /// handed in, then ends.
    pub(super) async fn release(&mut self, index: u32) {
        if let Some((stop, task)) = self.running.remove(&index) {
            stop.trigger();
            let _ = task.await;
        }
        self.table.remove(index);
        self.show();
    }

    fn show(&self) {
        let c = &self.committer;
        c.metrics
            .exactly_once_slots
            .get_or_create(&c.labels)
            .set(self.running.len() as i64);
    }

    /// Tells every committer to end (without waiting): used when the membership is lost, so
    /// that a committer waiting for the group's answer before a new epoch gives up at once
    /// and the partitions waiting for its outcome stop without delay.
    pub(super) fn stop_committing(&self) {
        for (stop, _) in self.running.values() {
            stop.trigger();
        }
    }

    /// Gives every slot up: all committers are told at once, then each is waited for.
    pub(super) async fn release_all(&mut self) {
        let held: Vec<u32> = self.running.keys().copied().collect();
        self.stop_committing();
        for index in held {
            self.release(index).await;
        }
    }
}
