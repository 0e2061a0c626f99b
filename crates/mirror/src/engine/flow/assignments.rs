//! What the flow's group hands a process and takes away: assigned partitions (with sharing),
//! exactly-once slots, a lost membership (everything stops, positions remembered), and loading
//! the stored positions of what was assigned.

use super::control::Control;
use super::Running;
use crate::engine::positions;
use crate::engine::sharing::{self, assign};
use crate::events::{Event as _, PositionsUnreadable};
use std::collections::BTreeSet;

impl Control {
    /// Serves exactly `partitions` from now on (sharing): the partitions given up are drained,
    /// their positions stored and released before this returns (so that the membership only
    /// then rejoins and their next owner starts where this process stopped); the new ones are
    /// started from the positions stored now (their previous owner stored them last).
    pub(super) async fn apply(&mut self, partitions: BTreeSet<(String, i32)>) {
        if self.slots.is_some() {
            return self.apply_slots(partitions).await;
        }
        let Some(a) = &mut self.sharing else {
            return;
        };
        let shared = a.shared.clone();
        let before = std::mem::replace(&mut a.partitions, partitions.clone());
        let revoked: BTreeSet<(String, i32)> = before.difference(&partitions).cloned().collect();
        let added: BTreeSet<(String, i32)> = partitions.difference(&before).cloned().collect();
        shared.set_owned(partitions);
        if !revoked.is_empty() {
            self.stop_keys(&revoked).await;
            if !self.ctx.board.flushed(sharing::HANDOVER_FLUSH).await {
                tracing::warn!(flow = %self.ctx.flow.id, partitions = revoked.len(), "positions of the partitions handed over not stored in time; their next owner may copy some records again");
            }
            self.ctx.board.release(&revoked);
            self.release_runs(&revoked);
            self.stored.retain(|k, _| !revoked.contains(k));
        }
        if !added.is_empty() {
            self.load_positions(|k| added.contains(k)).await;
            // The leader may know topics or partitions this process's last refresh did not.
            let (source, target) = (&self.ctx.source, &self.ctx.target);
            let md = source.metadata();
            let unknown = added
                .iter()
                .any(|(t, p)| md.partition_count(t).is_none_or(|n| n <= *p));
            if unknown {
                let _ = source.refresh_metadata(None).await;
                let _ = target.refresh_metadata(None).await;
            }
        }
        self.reconcile().await;
    }

    /// Exactly-once: serves exactly the slots `keys` name from now on. A slot given up: its
    /// partitions stop (handing in their positions), then its committer commits them and ends,
    /// before the membership answers. A slot taken: its id is fenced first, then its
    /// partitions' positions are read (final now: the last holder can no longer commit) and its
    /// partitions start (docs/sharing.md, "Exactly-once").
    pub(super) async fn apply_slots(&mut self, keys: BTreeSet<(String, i32)>) {
        let (Some(a), Some(k)) = (&mut self.sharing, &self.slots) else {
            return;
        };
        let table = k.table.clone();
        let shared = a.shared.clone();
        let before = std::mem::replace(&mut a.partitions, keys.clone());
        let revoked: BTreeSet<u32> = before
            .difference(&keys)
            .filter_map(assign::slot_index)
            .collect();
        let added: BTreeSet<u32> = keys
            .difference(&before)
            .filter_map(assign::slot_index)
            .collect();
        shared.set_owned(keys);
        let of = |revoked: &BTreeSet<u32>, (t, p): &(String, i32)| {
            revoked.contains(&table.index_of(t, *p))
        };
        if !revoked.is_empty() {
            let moving: BTreeSet<(String, i32)> = self
                .running
                .keys()
                .filter(|k| of(&revoked, k))
                .cloned()
                .collect();
            self.stop_keys(&moving).await;
            if let Some(k) = &mut self.slots {
                for i in &revoked {
                    k.release(*i).await;
                }
            }
            self.ctx.board.release(&moving);
            self.release_runs(&moving);
            self.stored.retain(|k, _| !of(&revoked, k));
            tracing::info!(flow = %self.ctx.flow.id, slots = ?revoked, partitions = moving.len(), "exactly-once slots handed over");
        }
        if !added.is_empty() {
            let shutdown = self.shutdown.clone();
            let mut taken = BTreeSet::new();
            if let Some(k) = &mut self.slots {
                for i in &added {
                    if !k.acquire(*i, &shutdown).await {
                        break;
                    }
                    taken.insert(*i);
                }
            }
            let missed: Vec<u32> = added.difference(&taken).copied().collect();
            if let (false, Some(a)) = (missed.is_empty(), &mut self.sharing) {
                // Not held (stopping, or the membership lapsed meanwhile): not claimed, and
                // the group is asked at once to give them again (a quiet group would leave
                // them unserved).
                for i in missed {
                    a.partitions.remove(&assign::slot_key(i));
                }
                a.shared.set_owned(a.partitions.clone());
                if !shutdown.is_triggered() {
                    a.shared.ask_rejoin();
                }
            }
            // Always after the fence, also when not every slot could be taken: the positions
            // read at setup (or by an earlier holder's time) may be older than its last commit.
            if !taken.is_empty() {
                self.load_positions(|k| of(&taken, k)).await;
                tracing::info!(flow = %self.ctx.flow.id, slots = ?taken, "exactly-once slots taken");
            }
        }
        self.reconcile().await;
    }

    /// This process lost its membership: its partitions may be served elsewhere already, so
    /// they stop now, and their positions are not stored any more (the new owner's are newer).
    /// Exactly-once slots are given up as well: their ids may be fenced by their next holders
    /// already, and nothing of theirs was committed after that.
    pub(super) async fn lose(&mut self) {
        let exactly_once = self.slots.is_some();
        let Some(a) = &mut self.sharing else {
            return;
        };
        let shared = a.shared.clone();
        let mut all = std::mem::take(&mut a.partitions);
        if exactly_once {
            all = self.running.keys().cloned().collect();
        }
        shared.set_owned(BTreeSet::new());
        // Exactly-once: the partitions are told first (a partition not stopping would take its
        // slot's end for a failure), then the committers, which may be waiting for the group's
        // answer before a new epoch and must give up at once.
        for k in &all {
            if let Some(r) = self.running.get(k) {
                r.stop.trigger();
            }
        }
        if let Some(k) = &self.slots {
            k.stop_committing();
        }
        self.stop_keys(&all).await;
        if let Some(k) = &mut self.slots {
            k.release_all().await;
        }
        // Not stored (another owner's may be newer), but remembered: if a partition comes back
        // here, everything up to what this process had acknowledged is on the target, so it
        // resumes from the later of that and the stored position. Starting from the stored one
        // alone would copy again all that was acknowledged since (a coordinator that went
        // silent makes a lone process lose its membership with nobody else taking over).
        for (k, o) in self.ctx.board.take(&all) {
            let e = self.remembered.entry(k).or_insert(o);
            *e = (*e).max(o);
        }
        self.release_runs(&all);
        self.stored.retain(|k, _| !all.contains(k));
    }

    /// Partitions served elsewhere from now on: their next owner's runs describe them.
    pub(super) fn release_runs(&self, keys: &BTreeSet<(String, i32)>) {
        self.ctx
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(keys);
    }

    pub(super) async fn stop_keys(&mut self, keys: &BTreeSet<(String, i32)>) {
        let stopping: Vec<Running> = keys.iter().filter_map(|k| self.running.remove(k)).collect();
        for r in &stopping {
            r.stop.trigger();
        }
        for r in stopping {
            let _ = r.task.await;
        }
    }

    /// Reads the stored positions of partitions just assigned (those `assigned` accepts),
    /// retrying until it can (starting without them would copy them again from the start).
    pub(super) async fn load_positions(&mut self, assigned: impl Fn(&(String, i32)) -> bool) {
        let flow = &self.ctx.flow;
        let mut attempt = 0;
        let stored = loop {
            match positions::load(
                &self.ctx.target,
                &flow.internal.positions_topic,
                flow.id.source.as_str(),
            )
            .await
            {
                Ok(s) => break s,
                Err(e) => {
                    let wait = crate::engine::backoff(attempt);
                    attempt += 1;
                    PositionsUnreadable {
                        flow: &flow.id,
                        error: &e,
                        retry_in: wait,
                    }
                    .emit(self.ctx.emitter());
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let keys: BTreeSet<(String, i32)> = stored
            .positions
            .keys()
            .chain(self.stored.keys())
            .chain(self.remembered.keys())
            .filter(|k| assigned(k))
            .cloned()
            .collect();
        for k in &keys {
            // A position stored for another log of the topic (it was re-created, and the
            // tombstones of its old positions are not stored yet) means nothing on this one.
            let same_log = match (stored.logs.get(&k.0), self.topic_ids.get(&k.0)) {
                (Some(recorded), Some(known)) => recorded == known,
                _ => true,
            };
            let stored = stored.positions.get(k).filter(|_| same_log).copied();
            match stored.max(self.remembered.remove(k)) {
                Some(o) => {
                    self.stored.insert(k.clone(), o);
                }
                None => {
                    self.stored.remove(k);
                }
            }
        }
    }

    /// Stops every partition task; each drains its in-flight produces and reports its last
    /// acknowledged offset before it ends.
    pub(super) async fn stop_all(&mut self) {
        for r in self.running.values() {
            r.stop.trigger();
        }
        for (_, r) in std::mem::take(&mut self.running) {
            let _ = r.task.await;
        }
    }
}
