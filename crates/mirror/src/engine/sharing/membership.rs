//! This process's membership in a shared flow's group (docs/sharing.md): joins under the flow's
//! group id, serves the assignments the leader computes (partitions, or exactly-once slots),
//! heartbeats, renews the write lease, rejoins after rebalances and leaves the group when the
//! flow stops so the others take over at once.

use crate::engine::sharing::*;
use crate::engine::Shutdown;
use assign::{Assignment, PROTOCOL};
use bytes::Bytes;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::group::{GroupConfig, GroupMember};
use kmirror_kafka::Refusal;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) struct Membership {
    pub(crate) target: Arc<KafkaCluster>,
    pub(crate) config: GroupConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) events: mpsc::Sender<Event>,
    /// Whether this process leads the group (does the flow's control work).
    pub(crate) leader: watch::Sender<bool>,
    pub(crate) flow: String,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    pub(crate) labels: crate::metrics::FlowLabels,
}

impl Membership {
    /// Joins, serves assignments and heartbeats until `stop`, then leaves the group so the
    /// others take over at once. Errors are retried: a process that cannot be a member serves
    /// nothing, which is safe.
    pub(crate) async fn run(self, stop: Shutdown) {
        let mut attempt = 0;
        // A member learns of a rebalance at its next heartbeat, and a cooperative one takes two:
        // at most 3 s apart (Java's heartbeat.interval.ms), so a long session timeout (as static
        // members use) does not make every rebalance that slow.
        let heartbeat_every = (self.config.session_timeout / 3).min(Duration::from_secs(3));
        'join: loop {
            let sent = Instant::now();
            let joined = tokio::select! {
                j = GroupMember::join(
                    self.target.clone(),
                    self.config.clone(),
                    Arc::new(FlowAssignor(self.shared.clone())),
                ) => j,
                _ = stop.wait() => return,
            };
            let mut member = match joined {
                Ok(m) => m,
                Err(e) => {
                    let group = &self.config.group_id;
                    if let Some(hint) = refusal_hint(&e, group) {
                        // Serving nothing forever would look like a healthy process that
                        // copies nothing: the flow stops with what to change instead.
                        let reason = format!(
                            "cannot join the flow's group {group} on the target: {e} ({hint}, or set kmirror.sharing.enabled = false to serve the flow from one process alone)"
                        );
                        tracing::error!(flow = %self.flow, reason = %reason, "not allowed to share the flow");
                        let _ = self.events.send(Event::Refused(reason)).await;
                        return;
                    }
                    tracing::warn!(flow = %self.flow, group = %group, error = %e, "cannot join the flow's group; serving nothing until it can");
                    let wait = crate::engine::backoff(attempt);
                    attempt += 1;
                    if stop.sleep(wait).await {
                        return;
                    }
                    continue 'join;
                }
            };
            attempt = 0;
            // From the SyncGroup, not the join's start: a join that waited out a coordinator's
            // restart can take longer than a session.
            self.shared.renewed(member.synced_at());
            let mut last_ok = Instant::now();
            // When the rebalance that produced the assignment at hand began.
            let mut rebalance_began = sent;
            loop {
                self.set_leader(member.is_leader());
                let assignment = match parse(member.assignment()) {
                    Ok(a) => a,
                    Err(e) => Assignment {
                        refused: Some(format!("the leader's assignment could not be read: {e}")),
                        ..Assignment::default()
                    },
                };
                let mut assignment = assignment;
                if assign::differs(&self.shared.settings, &assignment.settings) {
                    // A static member handed its old assignment without a rebalance: no leader
                    // compared its settings. It serves nothing and rejoins, so the leader does.
                    tracing::warn!(flow = %self.flow, "this process's flow settings differ from the group's; rejoining so the group's leader compares them");
                    assignment.partitions.clear();
                    self.shared.ask_rejoin();
                }
                self.show_group(&assignment.group);
                let assigned: usize = assignment.group.iter().map(|s| s.partitions).sum();
                let counted = self.shared.protocol == PROTOCOL && !assignment.group.is_empty();
                let eligible = {
                    let mut m = self.shared.lock();
                    m.assigned_total = counted.then_some(assigned);
                    m.eligible.len()
                };
                // Only then: an assignment this leader computed may leave partitions out on
                // purpose (a cooperative rebalance's first round, its revoked partitions).
                if member.skipped_assignment() && counted && eligible > 0 && assigned != eligible {
                    // A static leader that came back leads the assignment the coordinator kept
                    // (KIP-814): partitions that became eligible meanwhile are in no one's
                    // share, and a change of `eligible` seen before it led asked no one.
                    self.shared.rebalance.notify_one();
                }
                if let Some(reason) = assignment.refused {
                    tracing::error!(flow = %self.flow, group = %self.config.group_id, reason = %reason, "refused by the flow's group");
                    self.show_group(&[]);
                    let _ = self.events.send(Event::Refused(reason)).await;
                    leave(member).await;
                    self.set_leader(false);
                    return;
                }
                let partitions = assign::keys(&assignment.partitions);
                let before = self.shared.lock().owned.clone();
                let revoked = before.difference(&partitions).count();
                let added = partitions.difference(&before).count();
                tracing::info!(flow = %self.flow, generation = member.generation(), leader = member.is_leader(), partitions = partitions.len(), added, revoked, "assignment");
                let m = &self.metrics;
                m.rebalances.get_or_create(&self.labels).inc();
                m.assigned_partitions
                    .get_or_create(&self.labels)
                    .set(partitions.len() as i64);
                m.partitions_added
                    .get_or_create(&self.labels)
                    .inc_by(added as u64);
                m.partitions_revoked
                    .get_or_create(&self.labels)
                    .inc_by(revoked as u64);
                let members = if member.is_leader() {
                    self.shared.lock().members
                } else {
                    0
                };
                m.group_members
                    .get_or_create(&self.labels)
                    .set(members as i64);
                let (done, applied) = oneshot::channel();
                if self
                    .events
                    .send(Event::Assigned { partitions, done })
                    .await
                    .is_err()
                {
                    // The flow is stopping: leave so the others take over at once.
                    self.set_leader(false);
                    leave(member).await;
                    return;
                }
                // Heartbeats go on while the partitions are handed over.
                let mut rejoin = revoked > 0;
                let mut applied = std::pin::pin!(applied);
                loop {
                    tokio::select! {
                        _ = &mut applied => {
                            self.metrics
                                .rebalance_ms
                                .get_or_create(&self.labels)
                                .inc_by(rebalance_began.elapsed().as_millis() as u64);
                            break;
                        }
                        _ = tokio::time::sleep(heartbeat_every) => {
                            let sent = Instant::now();
                            match member.heartbeat().await {
                                Ok(true) => rejoin = true,
                                Ok(false) => self.shared.renewed(sent),
                                Err(e) if is_fenced(&e) => {
                                    // Writes stop at once; its partitions stop once the
                                    // hand-over under way is applied.
                                    self.shared.expire();
                                    let _ = (&mut applied).await;
                                    return self.fenced_out().await;
                                }
                                Err(_) => {}
                            }
                        }
                    }
                }
                // Cooperative: a member that gave partitions up rejoins at once, so that the
                // next generation hands them to their new owner.
                while !rejoin {
                    let (sent, beat) = tokio::select! {
                        _ = stop.wait() => {
                            self.set_leader(false);
                            leave(member).await;
                            return;
                        }
                        _ = self.shared.rebalance.notified(), if member.is_leader() => {
                            rejoin = true;
                            continue;
                        }
                        _ = self.shared.rejoin.notified() => {
                            rejoin = true;
                            continue;
                        }
                        _ = tokio::time::sleep(heartbeat_every) => {
                            let sent = Instant::now();
                            (sent, member.heartbeat().await)
                        }
                    };
                    match beat {
                        Ok(false) => {
                            last_ok = Instant::now();
                            self.shared.renewed(sent);
                        }
                        Ok(true) if member.member_id().is_empty() => {
                            // Removed from the group: what it served may be served elsewhere.
                            tracing::warn!(flow = %self.flow, "no longer a member of the flow's group (session expired); stopping every partition and rejoining");
                            self.lost().await;
                            rejoin = true;
                        }
                        Ok(true) => rejoin = true,
                        Err(e) if is_fenced(&e) => return self.fenced_out().await,
                        Err(e) => {
                            tracing::debug!(flow = %self.flow, error = %e, "heartbeat failed");
                            if last_ok.elapsed() > self.config.session_timeout {
                                tracing::warn!(flow = %self.flow, error = %e, "no heartbeat answered for a session timeout; stopping every partition");
                                self.lost().await;
                                rejoin = true;
                            }
                        }
                    }
                }
                if !self.shared.claims_valid() {
                    // Its session may have expired (a pause, a partition from the coordinator):
                    // its partitions may be served elsewhere, so they stop before it rejoins.
                    tracing::warn!(flow = %self.flow, "no heartbeat answered for a session timeout; stopping every partition before rejoining");
                    self.lost().await;
                }
                let id_before = member.member_id().to_string();
                let sent = Instant::now();
                rebalance_began = sent;
                self.shared.joining(Some(sent));
                let rejoined = tokio::select! {
                    r = member.rejoin() => r,
                    _ = stop.wait() => {
                        self.set_leader(false);
                        leave(member).await;
                        return;
                    }
                };
                self.shared.joining(None);
                if let Err(e) = &rejoined {
                    if is_fenced(e) {
                        return self.fenced_out().await;
                    }
                }
                if let Err(e) = rejoined {
                    tracing::warn!(flow = %self.flow, error = %e, "cannot rejoin the flow's group; stopping every partition");
                    self.lost().await;
                    self.set_leader(false);
                    continue 'join;
                }
                if !id_before.is_empty()
                    && member.member_id() != id_before
                    && !self.shared.lock().owned.is_empty()
                {
                    // Rejoined as a new member: the old one was removed, and what it served
                    // may be served elsewhere.
                    tracing::warn!(flow = %self.flow, "no longer a member of the flow's group (session expired); stopping every partition");
                    self.lost().await;
                }
                self.shared.renewed(member.synced_at());
                last_ok = Instant::now();
            }
        }
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.shared.lock().leader = leader;
        self.metrics
            .group_leader
            .get_or_create(&self.labels)
            .set(i64::from(leader));
        self.leader
            .send_if_modified(|l| std::mem::replace(l, leader) != leader);
    }

    /// The group as the leader's last assignment describes it, for `status`.
    pub(crate) fn show_group(&self, group: &[assign::Share]) {
        self.metrics.process.set_group(&self.flow, group.to_vec());
    }

    /// Another process joined with this one's instance id (`kmirror.sharing.instance.id`) and
    /// took its place: its partitions are that process's now. They stop without storing their
    /// positions, and the flow stops with the reason; rejoining would take the place back, and
    /// the two would take turns for ever.
    pub(crate) async fn fenced_out(&self) {
        let reason = format!(
            "another process joined the flow's group {} with this process's instance id {} and took its partitions over: kmirror.sharing.instance.id must differ in every process (the other process keeps serving; this one stops)",
            self.config.group_id,
            self.config.instance_id.as_deref().unwrap_or("?")
        );
        tracing::error!(flow = %self.flow, reason = %reason, "replaced in the flow's group");
        self.shared.expire();
        self.lost().await;
        let _ = self.events.send(Event::Refused(reason)).await;
    }

    pub(crate) async fn lost(&self) {
        self.set_leader(false);
        self.show_group(&[]);
        let (done, stopped) = oneshot::channel();
        if self.events.send(Event::Lost { done }).await.is_ok() {
            let _ = stopped.await;
        }
        self.shared.set_owned(BTreeSet::new());
        self.metrics
            .assigned_partitions
            .get_or_create(&self.labels)
            .set(0);
    }
}

/// Leaves the group, waiting at most [`LEAVE_WAIT`]: a JoinGroup abandoned at shutdown may
/// still be pending on the coordinator's connection (until the rebalance ends, up to a session
/// timeout), and a broker answers a connection's requests in order, so the LeaveGroup behind
/// it would hold the shutdown past its deadline. Not leaving costs the others a session
/// timeout before they take over, nothing else.
pub(crate) async fn leave(member: GroupMember) {
    if tokio::time::timeout(LEAVE_WAIT, member.leave())
        .await
        .is_err()
    {
        tracing::debug!("leaving the flow's group took too long; the coordinator will notice at the session timeout");
    }
}

pub(crate) const LEAVE_WAIT: Duration = Duration::from_secs(2);

/// What a member refused for good by the group must change (the flow stops with it); `None` for
/// errors a retry may fix.
pub(crate) fn refusal_hint(e: &kmirror_kafka::KafkaError, group: &str) -> Option<String> {
    match e.refusal()? {
        Refusal::GroupNotAuthorized => Some(format!("grant READ on GROUP {group} to kmirror's principal")),
        Refusal::OtherGroupProtocol => Some(format!("another client (a Connect worker, a consumer, or a kmirror version with no group protocol in common) uses the group id {group}: set kmirror.sharing.group.id")),
        Refusal::FencedInstance => Some("another process joined with the same kmirror.sharing.instance.id at the same moment: give every process its own".into()),
        Refusal::NoStaticMembership => Some("leave kmirror.sharing.instance.id unset with this Kafka version".into()),
        _ => None,
    }
}

/// KIP-345: another member took this one's instance id.
pub(crate) fn is_fenced(e: &kmirror_kafka::KafkaError) -> bool {
    e.is(Refusal::FencedInstance)
}

pub(crate) fn parse(data: &Bytes) -> Result<Assignment, serde_json::Error> {
    if data.is_empty() {
        // A generation the leader gave this member nothing in.
        return Ok(Assignment::default());
    }
    serde_json::from_slice(data)
}
