//! One flow served by several processes (docs/sharing.md): each process joins the flow's group
//! on the target through Kafka's group coordinator, and serves the source partitions the
//! group's leader assigns it ([`assign`]). The leader also does the flow's control work.
//!
//! The membership task here speaks to the group; the flow's control loop owns the partition
//! tasks and applies each assignment it is sent: it drains and stores the partitions it lost
//! before it answers, and only then does the member rejoin, so the partitions' next owner
//! starts from their stored positions (KIP-429's cooperative protocol).
//!
//! Why one file of this size: `Shared`'s private state is the lease and the claims: the
//! membership renews or expires it, `FlowAssignor` reads it to claim partitions at each join,
//! and writers ask `may_write`, so the rules read together (`assign.rs` holds the algorithm).
//! Next to split out: the `Membership::run` loop into `sharing/membership.rs`.

pub mod assign;

use super::Shutdown;
use crate::copy::lease::Lease;
use assign::{Assignment, Key, Member, MemberMetadata, PROTOCOL};
use bytes::Bytes;
use kmirror_kafka::group::{Assignor, GroupConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch, Notify};
mod membership;
pub(crate) use membership::*;

/// The group protocol type: kmirror's own, so a Connect worker or a consumer joining the same
/// group id by mistake is refused by the coordinator (INCONSISTENT_GROUP_PROTOCOL).
const PROTOCOL_TYPE: &str = "kmirror";

/// What the flow's control loop and the membership share.
#[derive(Debug)]
pub(crate) struct Shared {
    settings: BTreeMap<String, String>,
    /// The group protocol offered: partitions (`PROTOCOL`) or exactly-once slots.
    protocol: &'static str,
    host: String,
    inner: Mutex<Inner>,
    /// The leader asks for a rebalance when the flow's partitions change.
    rebalance: Notify,
    /// Any member: what it was given could not all be taken (an exactly-once slot whose id it
    /// could not fence in time); rejoining hands the rest to the group again.
    rejoin: Notify,
}

#[derive(Debug)]
struct Inner {
    /// The partitions this process serves (sent with JoinGroup).
    owned: BTreeSet<Key>,
    /// Every partition of the flow ready to be copied (its remote topic exists), as this
    /// process's last topic refresh found them: what the leader assigns.
    eligible: BTreeSet<Key>,
    leader: bool,
    /// Members of the last assignment this process computed as leader.
    members: usize,
    /// Partitions in the group view of the last assignment (every member's share), if any.
    assigned_total: Option<usize>,
    /// The write lease: renewed by answered heartbeats and joins, held through a rejoin.
    lease: Lease,
}

impl Shared {
    pub(crate) fn new(
        settings: BTreeMap<String, String>,
        session_timeout: Duration,
        rebalance_timeout: Duration,
    ) -> Shared {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Shared {
            settings,
            protocol: PROTOCOL,
            host: format!("{host}:{}", std::process::id()),
            inner: Mutex::new(Inner {
                owned: BTreeSet::new(),
                eligible: BTreeSet::new(),
                leader: false,
                members: 0,
                assigned_total: None,
                lease: Lease::new(session_timeout, rebalance_timeout),
            }),
            rebalance: Notify::new(),
            rejoin: Notify::new(),
        }
    }

    /// Members are given exactly-once slots (`assign::slot_key`) rather than partitions.
    pub(crate) fn with_slots(mut self) -> Shared {
        self.protocol = assign::EOS_PROTOCOL;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This process's name in the group view and in what it publishes: `<host>:<pid>`.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.lock().leader
    }

    pub(crate) fn set_owned(&self, owned: BTreeSet<Key>) {
        self.lock().owned = owned;
    }

    /// Whether this process may still write for its partitions: the coordinator has not given
    /// them away yet as far as this process can tell (a heartbeat answered within the session
    /// timeout, or a rejoin under way within the rebalance timeout). A process paused past its
    /// session (SIGSTOP, a long GC-like stall, a frozen VM) finds this false when it wakes, and
    /// holds its writes until a heartbeat tells it whether it is still a member, instead of
    /// writing a burst of what the partitions' new owner already copied.
    pub(crate) fn may_write(&self) -> bool {
        self.lock().lease.may_write(Instant::now())
    }

    /// Whether a rejoin may claim the partitions this process had (copy/lease.rs).
    fn claims_valid(&self) -> bool {
        self.lock().lease.claims_valid(Instant::now())
    }

    /// Waits until writes are allowed; false if `stop` comes first.
    pub(crate) async fn hold_writes(&self, stop: &Shutdown) -> bool {
        while !self.may_write() {
            if stop.sleep(Duration::from_millis(20)).await {
                return false;
            }
        }
        true
    }

    fn renewed(&self, sent: Instant) {
        self.lock().lease.renewed(sent);
    }

    /// This process is no longer a member for sure (another took its instance id): writes
    /// stop at once rather than at the end of the lease.
    fn expire(&self) {
        self.lock().lease.expire();
    }

    fn joining(&self, since: Option<Instant>) {
        self.lock().lease.joining(since);
    }

    /// The partitions of these topics among the flow's partitions recorded last.
    pub(crate) fn eligible_of(&self, topics: &std::collections::HashSet<String>) -> BTreeSet<Key> {
        self.lock()
            .eligible
            .iter()
            .filter(|(t, _)| topics.contains(t))
            .cloned()
            .collect()
    }

    /// Asks for a rejoin after the current assignment is applied: what it gave and this process
    /// did not take (and so does not claim) is assigned again, here or elsewhere.
    pub(crate) fn ask_rejoin(&self) {
        self.rejoin.notify_one();
    }

    /// Records the flow's partitions; on the leader a change starts a rebalance.
    pub(crate) fn set_eligible(&self, eligible: BTreeSet<Key>) {
        let mut m = self.lock();
        if m.eligible != eligible {
            let first = m.eligible.is_empty();
            m.eligible = eligible;
            // A leader's first look that finds what the group already serves (a static leader
            // back with the assignment the coordinator kept) changes nothing.
            let covered = first && m.assigned_total == Some(m.eligible.len());
            if m.leader && !covered {
                self.rebalance.notify_one();
            }
        }
    }
}

/// The assignor this member offers: its metadata is read at each (re)join.
#[derive(Debug)]
struct FlowAssignor(Arc<Shared>);

impl Assignor for FlowAssignor {
    fn protocol(&self) -> &str {
        self.0.protocol
    }

    fn metadata(&self) -> Bytes {
        let owned = if self.0.claims_valid() {
            assign::by_topic(&self.0.lock().owned)
        } else {
            BTreeMap::new()
        };
        let m = MemberMetadata {
            settings: self.0.settings.clone(),
            owned,
            host: self.0.host.clone(),
        };
        Bytes::from(serde_json::to_vec(&m).unwrap_or_default())
    }

    fn assign(
        &self,
        leader: &str,
        members: &[(String, Bytes)],
    ) -> kmirror_kafka::Result<Vec<(String, Bytes)>> {
        let mut parsed = Vec::with_capacity(members.len());
        for (id, data) in members {
            // Another member's metadata is bytes from the network: a member it cannot read is
            // given nothing, with the reason, rather than failing the whole group.
            match serde_json::from_slice::<MemberMetadata>(data) {
                Ok(metadata) => parsed.push(Member {
                    id: id.clone(),
                    metadata,
                }),
                Err(e) => {
                    tracing::warn!(member = %id, error = %e, "cannot read a member's metadata; it gets no partitions")
                }
            }
        }
        let eligible = self.0.lock().eligible.clone();
        let mut out = assign::assign(&self.0.settings, &parsed, &eligible);
        for (id, _) in members {
            out.entry(id.clone()).or_insert_with(|| Assignment {
                refused: Some(
                    "its group metadata could not be read (another kmirror version?)".into(),
                ),
                ..Assignment::default()
            });
        }
        let hosts: BTreeMap<&str, &str> = parsed
            .iter()
            .map(|m| (m.id.as_str(), m.metadata.host.as_str()))
            .collect();
        assign::add_group_view(&mut out, leader, &hosts);
        self.0.lock().members = out.len();
        for (id, a) in &out {
            let n: usize = a.partitions.values().map(Vec::len).sum();
            tracing::info!(member = %id, host = hosts.get(id.as_str()).copied().unwrap_or("?"), partitions = n, refused = a.refused.is_some(), "assigned");
        }
        Ok(out
            .into_iter()
            .map(|(id, a)| (id, Bytes::from(serde_json::to_vec(&a).unwrap_or_default())))
            .collect())
    }
}

/// What the membership tells the flow's control loop.
#[derive(Debug)]
pub(crate) enum Event {
    /// Serve exactly these partitions (stop the others, storing their positions), then answer.
    Assigned {
        partitions: BTreeSet<Key>,
        done: oneshot::Sender<()>,
    },
    /// This process is no longer a member (its session expired, or it cannot reach the
    /// coordinator for a session timeout): its partitions may be served elsewhere already, so
    /// it stops them all at once, then answers.
    Lost { done: oneshot::Sender<()> },
    /// The group refused this process: the flow stops with this reason.
    Refused(String),
}

/// The group settings of a flow.
pub(crate) fn group_config(flow: &crate::config::model::FlowConfig) -> GroupConfig {
    GroupConfig {
        group_id: flow.sharing.group_id.clone(),
        protocol_type: PROTOCOL_TYPE.into(),
        session_timeout: flow.sharing.session_timeout,
        rebalance_timeout: flow.sharing.rebalance_timeout,
        instance_id: flow.sharing.instance_id.clone(),
    }
}

/// Runs `work` while this process leads the flow's group: started when leadership comes,
/// stopped (its `Shutdown` triggered, then awaited) when it goes or at `stop`.
pub(crate) async fn while_leader<F, Fut>(mut leader: watch::Receiver<bool>, stop: Shutdown, work: F)
where
    F: Fn(Shutdown) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // A closed channel (no membership: a process alone, or the membership ended at shutdown)
    // keeps its last value for good: it neither ends the work nor starts it again. (Taken as a
    // change, it stopped and restarted the work in a tight loop.)
    loop {
        tokio::select! {
            r = leader.wait_for(|l| *l) => if r.is_err() { return },
            _ = stop.wait() => return,
        }
        let own = Shutdown::default();
        let mut task = std::pin::pin!(work(own.clone()));
        let mut closed = false;
        let ended_alone = tokio::select! {
            _ = &mut task => true,
            r = leader.wait_for(|l| !*l) => {
                closed = r.is_err();
                false
            }
            _ = stop.wait() => false,
        };
        let ended_alone = match (ended_alone, closed) {
            (false, true) => tokio::select! {
                _ = &mut task => true,
                _ = stop.wait() => false,
            },
            (e, _) => e,
        };
        if !ended_alone {
            own.trigger();
            task.await;
        }
        if stop.is_triggered() {
            return;
        }
        if ended_alone {
            // Work that ends by itself is not started again within this leadership.
            let closed = tokio::select! {
                r = leader.wait_for(|l| !*l) => r.is_err(),
                _ = stop.wait() => return,
            };
            if closed {
                stop.wait().await;
                return;
            }
        }
    }
}

/// How long a process waits, at most, for the positions of the partitions it gives up to be
/// stored before it lets them go (the next owner then starts from older positions: copies
/// twice, never skips).
pub(crate) const HANDOVER_FLUSH: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn work_runs_while_leader_and_stops_when_leadership_goes() {
        let (tx, rx) = watch::channel(false);
        let stop = Shutdown::default();
        let (started, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let task = {
            let (started, stopped, stop) = (started.clone(), stopped.clone(), stop.clone());
            tokio::spawn(while_leader(rx, stop, move |own: Shutdown| {
                let (started, stopped) = (started.clone(), stopped.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    own.wait().await;
                    stopped.fetch_add(1, Ordering::SeqCst);
                }
            }))
        };
        let settle = || tokio::time::sleep(Duration::from_millis(50));
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 0, "not leader: not started");
        tx.send(true).unwrap();
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        tx.send(false).unwrap();
        settle().await;
        assert_eq!(stopped.load(Ordering::SeqCst), 1, "stopped with leadership");
        tx.send(true).unwrap();
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 2, "started again");
        stop.trigger();
        task.await.unwrap();
        assert_eq!(stopped.load(Ordering::SeqCst), 2, "stopped at shutdown");
    }

    #[tokio::test]
    async fn work_of_a_process_alone_runs_once_until_stop() {
        // Alone, the leadership channel's sender is gone and its value stays true.
        let (tx, rx) = watch::channel(true);
        drop(tx);
        let stop = Shutdown::default();
        let started = Arc::new(AtomicUsize::new(0));
        let task = {
            let (started, stop) = (started.clone(), stop.clone());
            tokio::spawn(while_leader(rx, stop, move |own: Shutdown| {
                let started = started.clone();
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    own.wait().await;
                }
            }))
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "started once, never again"
        );
        stop.trigger();
        task.await.unwrap();
        // Work that ends by itself is not started again either.
        let (tx, rx) = watch::channel(true);
        drop(tx);
        let stop = Shutdown::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let task = {
            let (runs, stop) = (runs.clone(), stop.clone());
            tokio::spawn(while_leader(rx, stop, move |_own: Shutdown| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                }
            }))
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        stop.trigger();
        task.await.unwrap();
    }

    #[test]
    fn writes_are_allowed_within_a_session_of_the_last_answer_or_during_a_join() {
        let shared = Shared::new(
            BTreeMap::new(),
            Duration::from_millis(200),
            Duration::from_millis(400),
        );
        assert!(!shared.may_write(), "never a member yet");
        shared.renewed(Instant::now());
        assert!(shared.may_write());
        // An answer to an older request does not move the lease back.
        shared.renewed(Instant::now() - Duration::from_secs(5));
        assert!(shared.may_write());
        std::thread::sleep(Duration::from_millis(250));
        assert!(!shared.may_write(), "a session without an answer");
        shared.joining(Some(Instant::now()));
        assert!(shared.may_write(), "rejoining");
        std::thread::sleep(Duration::from_millis(450));
        assert!(
            !shared.may_write(),
            "a rejoin longer than the rebalance timeout"
        );
    }

    #[test]
    fn the_assignor_reads_members_and_refuses_what_it_cannot_read() {
        let shared = Arc::new(Shared::new(
            BTreeMap::from([("topics".into(), "1".into())]),
            Duration::from_secs(10),
            Duration::from_secs(60),
        ));
        shared.set_eligible((0..4).map(|p| ("t".to_string(), p)).collect());
        shared.set_owned([("t".to_string(), 3)].into());
        let a = FlowAssignor(shared.clone());
        // Claims count only while a heartbeat was answered within the session timeout.
        let unclaimed: MemberMetadata = serde_json::from_slice(&a.metadata()).unwrap();
        assert!(unclaimed.owned.is_empty(), "never renewed: claims nothing");
        shared.renewed(Instant::now());
        let own = a.metadata();
        let parsed: MemberMetadata = serde_json::from_slice(&own).unwrap();
        assert_eq!(parsed.owned, BTreeMap::from([("t".to_string(), vec![3])]));
        let out = a
            .assign(
                "m1",
                &[
                    ("m1".into(), own.clone()),
                    ("m2".into(), own),
                    ("m3".into(), Bytes::from_static(b"\x00\x01not json")),
                ],
            )
            .unwrap();
        let get = |id: &str| -> Assignment {
            let (_, b) = out.iter().find(|(m, _)| m == id).unwrap();
            parse(b).unwrap()
        };
        let (m1, m2, m3) = (get("m1"), get("m2"), get("m3"));
        assert!(m3.refused.is_some() && m3.partitions.is_empty());
        // Both claim t-3: it stays with the first; all four are served once.
        let all: Vec<Key> = assign::keys(&m1.partitions)
            .into_iter()
            .chain(assign::keys(&m2.partitions))
            .collect();
        assert_eq!(all.len(), 4);
        assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 4);
        // Every member that is served is sent the whole group: m1 leads, m3 is not in it.
        assert_eq!(m1.group, m2.group);
        assert!(m3.group.is_empty());
        let shares: Vec<(&str, usize, bool)> = m1
            .group
            .iter()
            .map(|m| (m.member.as_str(), m.partitions, m.leader))
            .collect();
        assert_eq!(shares, [("m1", 2, true), ("m2", 2, false)]);
        assert_eq!(parse(&Bytes::new()).unwrap(), Assignment::default());
    }

    #[test]
    fn a_refusal_names_what_to_change_and_other_errors_are_retried() {
        use kafka_protocol::error::ResponseError;
        let broker = |error| kmirror_kafka::KafkaError::Broker {
            broker: "b".into(),
            api: kafka_protocol::messages::ApiKey::JoinGroup,
            error,
            message: None,
        };
        let hint = refusal_hint(&broker(ResponseError::GroupAuthorizationFailed), "g").unwrap();
        assert!(hint.contains("grant READ on GROUP g"), "{hint}");
        let hint = refusal_hint(&broker(ResponseError::InconsistentGroupProtocol), "g").unwrap();
        assert!(hint.contains("set kmirror.sharing.group.id"), "{hint}");
        assert!(refusal_hint(&broker(ResponseError::CoordinatorNotAvailable), "g").is_none());
        assert!(refusal_hint(
            &kmirror_kafka::KafkaError::Disconnected { broker: "b".into() },
            "g"
        )
        .is_none());
    }
}
