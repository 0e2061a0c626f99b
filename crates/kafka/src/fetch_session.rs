//! The client side of an incremental fetch session (KIP-227), as a pure state machine: which
//! partitions the next Fetch request to one broker must carry, under which session id and epoch,
//! and what the broker's answer does to the session. No I/O: the per-broker fetcher turns a
//! [`FetchPlan`] into a `FetchRequest` and feeds the top-level outcome back.
//!
//! Rules (KIP-227, and the Java client's `FetchSessionHandler`):
//! - Session id 0 with epoch 0 is a full request asking for a new session; the broker answers
//!   with the new id, or with id 0 when it keeps no session for us (its cache is full, or the
//!   request carried no partitions), and then every request stays full.
//! - In a session, epoch N > 0 is an incremental request: it carries only the partitions that
//!   were added or whose fetch offset, leader epoch or maximum changed since the last request,
//!   and lists in `ForgottenTopicsData` the ones to drop. A partition left out without being
//!   forgotten stays in the broker's session at its cached offset, and the broker keeps
//!   returning it: a partition the memory budget pauses must be forgotten, not just skipped.
//! - The epoch goes 1, 2, ... `i32::MAX`, then 1 again.
//! - `FETCH_SESSION_ID_NOT_FOUND`: the broker lost the session; start over with (0, 0).
//!   `INVALID_FETCH_SESSION_EPOCH`, any other top-level error or a failed request: close the
//!   session and create a new one with a full request, (id, 0).
//! - Epoch -1 with the id closes the session for good (a fetcher that stops frees the broker's
//!   slot; `max.incremental.fetch.session.cache.slots` is 1000 by default).

use std::collections::BTreeMap;
use std::sync::Arc;

/// Session id meaning "no session".
pub const NO_SESSION: i32 = 0;
/// Epoch of a full request that creates a session (with id 0, or closing the given id first).
pub const INITIAL_EPOCH: i32 = 0;
/// Epoch that closes a session without creating another.
pub const FINAL_EPOCH: i32 = -1;

/// A partition as a fetch session names it. The topic id is part of the key (Fetch v13+
/// addresses topics by id): a topic deleted and re-created under the same name is another
/// partition, forgotten under the old id and added under the new one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionPartition {
    pub topic: Arc<str>,
    pub topic_id: uuid::Uuid,
    pub partition: i32,
}

/// What the broker is asked for one partition; a change of any field is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPosition {
    pub fetch_offset: i64,
    /// The leader epoch the client knows (`current_leader_epoch`, KIP-320), -1 if unknown.
    pub leader_epoch: i32,
    pub max_bytes: i32,
}

/// The next request: its session fields, and the partitions it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPlan {
    pub session_id: i32,
    pub session_epoch: i32,
    /// A full request carries every wanted partition; an incremental one only the changes.
    pub full: bool,
    pub partitions: Vec<(SessionPartition, FetchPosition)>,
    /// Partitions the broker's session must drop (incremental requests only).
    pub forgotten: Vec<SessionPartition>,
}

/// The top-level result of a fetch request, as far as the session is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOutcome {
    /// No top-level error; the response's `session_id`.
    Answered { session_id: i32 },
    /// `FETCH_SESSION_ID_NOT_FOUND` (70).
    SessionIdNotFound,
    /// `INVALID_FETCH_SESSION_EPOCH` (71).
    InvalidEpoch,
    /// Any other top-level error, a response naming partitions the session does not hold, a
    /// timeout or a lost connection: the broker's view of the session is unknown.
    Failed,
}

/// Counts of what the session did, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub full_requests: u64,
    pub incremental_requests: u64,
    /// Sessions the broker lost or refused mid-way (a full request had to follow).
    pub fallbacks: u64,
    /// Full requests the broker answered without a session (id 0).
    pub sessionless: u64,
    /// Partitions sent in `ForgottenTopicsData`.
    pub forgotten: u64,
    /// The highest epoch sent.
    pub max_epoch: i32,
}

/// One fetch session with one broker.
#[derive(Debug, Default)]
pub struct FetchSession {
    id: i32,
    /// The epoch of the next request.
    next_epoch: i32,
    /// What the broker holds for us once the request in flight succeeds.
    sent: BTreeMap<SessionPartition, FetchPosition>,
    /// The request in flight, if any: whether it was full (its answer may create a session).
    in_flight: Option<bool>,
    stats: SessionStats,
}

impl FetchSession {
    pub fn new() -> FetchSession {
        FetchSession::default()
    }

    pub fn id(&self) -> i32 {
        self.id
    }

    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// The next request for `wanted`: every partition this fetcher should fetch now, at its
    /// position. Call [`FetchSession::on_outcome`] with the result before planning again.
    pub fn plan(&mut self, wanted: &BTreeMap<SessionPartition, FetchPosition>) -> FetchPlan {
        let full = self.next_epoch == INITIAL_EPOCH;
        let plan = if full {
            FetchPlan {
                session_id: self.id,
                session_epoch: INITIAL_EPOCH,
                full: true,
                partitions: wanted.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                forgotten: Vec::new(),
            }
        } else {
            // One walk over both sorted maps: with 10,000 idle partitions a lookup per partition
            // in each direction, twice a second, was most of an idle fetcher's CPU.
            let mut partitions = Vec::new();
            let mut forgotten = Vec::new();
            let mut sent = self.sent.iter().peekable();
            for (k, v) in wanted {
                while let Some((old, _)) = sent.next_if(|(old, _)| *old < k) {
                    forgotten.push(old.clone());
                }
                match sent.next_if(|(old, _)| *old == k) {
                    Some((_, was)) if was == v => {}
                    _ => partitions.push((k.clone(), *v)),
                }
            }
            forgotten.extend(sent.map(|(old, _)| old.clone()));
            FetchPlan {
                session_id: self.id,
                session_epoch: self.next_epoch,
                full: false,
                partitions,
                forgotten,
            }
        };
        if full {
            self.stats.full_requests += 1;
        } else {
            self.stats.incremental_requests += 1;
            self.stats.forgotten += plan.forgotten.len() as u64;
            self.stats.max_epoch = self.stats.max_epoch.max(plan.session_epoch);
        }
        // As the Java client does, the session is assumed to hold the new set once sent; a
        // failure makes the next request full, which sends the whole set again anyway.
        self.sent = wanted.clone();
        self.in_flight = Some(full);
        plan
    }

    /// What the broker answered to the last planned request ([`SessionOutcome::Failed`] also
    /// when no request could be sent: the session is then used again only through a full one).
    pub fn on_outcome(&mut self, outcome: SessionOutcome) {
        let Some(full) = self.in_flight.take() else {
            // Nothing in flight (e.g. a connection that could not be opened).
            self.next_epoch = INITIAL_EPOCH;
            return;
        };
        match outcome {
            SessionOutcome::Answered { session_id } if session_id == NO_SESSION => {
                if full {
                    self.stats.sessionless += 1;
                } else {
                    // The broker ended the session (KIP-227: an incremental answer with id 0).
                    self.stats.fallbacks += 1;
                }
                self.id = NO_SESSION;
                self.next_epoch = INITIAL_EPOCH;
            }
            SessionOutcome::Answered { session_id } => {
                if full || session_id != self.id {
                    self.id = session_id;
                    self.next_epoch = 1;
                } else {
                    self.next_epoch = next_epoch(self.next_epoch);
                }
            }
            SessionOutcome::SessionIdNotFound => {
                self.stats.fallbacks += 1;
                self.id = NO_SESSION;
                self.next_epoch = INITIAL_EPOCH;
            }
            SessionOutcome::InvalidEpoch | SessionOutcome::Failed => {
                if self.id != NO_SESSION && !full {
                    self.stats.fallbacks += 1;
                }
                // (id, 0): the broker closes the old session and creates a new one.
                self.next_epoch = INITIAL_EPOCH;
            }
        }
    }

    /// Forces the next request to be full (e.g. the request version changed from naming
    /// topics to topic ids, which a session cannot switch mid-way).
    pub fn reset(&mut self) {
        self.next_epoch = INITIAL_EPOCH;
    }

    /// The request that closes the session for good, if there is one to close.
    pub fn close(&mut self) -> Option<FetchPlan> {
        if self.id == NO_SESSION {
            return None;
        }
        let plan = FetchPlan {
            session_id: self.id,
            session_epoch: FINAL_EPOCH,
            full: false,
            partitions: Vec::new(),
            forgotten: Vec::new(),
        };
        self.id = NO_SESSION;
        self.next_epoch = INITIAL_EPOCH;
        self.sent.clear();
        self.in_flight = None;
        Some(plan)
    }
}

/// KIP-227: epochs run 1 to `i32::MAX` and wrap to 1 (0 is reserved for full requests).
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, partition: i32) -> SessionPartition {
        SessionPartition {
            topic: topic.into(),
            topic_id: uuid::Uuid::from_u128(topic.len() as u128 + 1),
            partition,
        }
    }

    fn at(offset: i64) -> FetchPosition {
        FetchPosition {
            fetch_offset: offset,
            leader_epoch: 0,
            max_bytes: 1 << 20,
        }
    }

    fn wanted(items: &[(&SessionPartition, i64)]) -> BTreeMap<SessionPartition, FetchPosition> {
        items.iter().map(|(k, o)| ((*k).clone(), at(*o))).collect()
    }

    fn names(plan: &FetchPlan) -> Vec<(i32, i64)> {
        plan.partitions
            .iter()
            .map(|(k, v)| (k.partition, v.fetch_offset))
            .collect()
    }

    #[test]
    fn a_full_request_creates_the_session_then_only_changes_are_sent() {
        let (a, b, c) = (part("t", 0), part("t", 1), part("t", 2));
        let mut s = FetchSession::new();
        let p = s.plan(&wanted(&[(&a, 0), (&b, 0), (&c, 0)]));
        assert_eq!((p.session_id, p.session_epoch, p.full), (0, 0, true));
        assert_eq!(names(&p), vec![(0, 0), (1, 0), (2, 0)]);
        s.on_outcome(SessionOutcome::Answered { session_id: 77 });

        // Only partition 1 got data: only it moves; the others cost nothing.
        let p = s.plan(&wanted(&[(&a, 0), (&b, 5), (&c, 0)]));
        assert_eq!((p.session_id, p.session_epoch, p.full), (77, 1, false));
        assert_eq!(names(&p), vec![(1, 5)]);
        assert!(p.forgotten.is_empty());
        s.on_outcome(SessionOutcome::Answered { session_id: 77 });

        // Nothing changed: an empty incremental request (the broker's wait does the rest).
        let p = s.plan(&wanted(&[(&a, 0), (&b, 5), (&c, 0)]));
        assert_eq!((p.session_epoch, p.partitions.len()), (2, 0));
        s.on_outcome(SessionOutcome::Answered { session_id: 77 });
        assert_eq!(s.stats().max_epoch, 2);
        assert_eq!(s.stats().full_requests, 1);
        assert_eq!(s.stats().incremental_requests, 2);
    }

    #[test]
    fn a_paused_partition_is_forgotten_and_added_back_at_its_position() {
        let (a, b) = (part("t", 0), part("t", 1));
        let mut s = FetchSession::new();
        s.plan(&wanted(&[(&a, 0), (&b, 0)]));
        s.on_outcome(SessionOutcome::Answered { session_id: 9 });
        // b's memory budget is used up: it leaves the session.
        let p = s.plan(&wanted(&[(&a, 0)]));
        assert_eq!(p.forgotten, vec![b.clone()]);
        assert!(p.partitions.is_empty());
        s.on_outcome(SessionOutcome::Answered { session_id: 9 });
        let p = s.plan(&wanted(&[(&a, 0)]));
        assert!(p.forgotten.is_empty(), "forgotten once");
        s.on_outcome(SessionOutcome::Answered { session_id: 9 });
        // Room again: b is added where it stopped.
        let p = s.plan(&wanted(&[(&a, 0), (&b, 40)]));
        assert_eq!(names(&p), vec![(1, 40)]);
        assert_eq!(s.stats().forgotten, 1);
    }

    #[test]
    fn leader_epoch_and_max_bytes_changes_are_sent_again() {
        let a = part("t", 0);
        let mut s = FetchSession::new();
        s.plan(&wanted(&[(&a, 3)]));
        s.on_outcome(SessionOutcome::Answered { session_id: 1 });
        let mut w = wanted(&[(&a, 3)]);
        w.get_mut(&a).unwrap().leader_epoch = 4;
        assert_eq!(s.plan(&w).partitions.len(), 1, "a new leader epoch");
        s.on_outcome(SessionOutcome::Answered { session_id: 1 });
        w.get_mut(&a).unwrap().max_bytes = 1024;
        assert_eq!(s.plan(&w).partitions.len(), 1, "a new maximum");
    }

    #[test]
    fn a_re_created_topic_is_another_partition() {
        let old = part("t", 0);
        let new = SessionPartition {
            topic_id: uuid::Uuid::from_u128(999),
            ..old.clone()
        };
        let mut s = FetchSession::new();
        s.plan(&wanted(&[(&old, 100)]));
        s.on_outcome(SessionOutcome::Answered { session_id: 3 });
        let p = s.plan(&wanted(&[(&new, 0)]));
        assert_eq!(p.forgotten, vec![old]);
        assert_eq!(p.partitions, vec![(new, at(0))]);
    }

    #[test]
    fn session_errors_fall_back_to_full_requests() {
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 5 });
        s.plan(&w);

        // The broker lost the session (restart, eviction): a new one from scratch.
        s.on_outcome(SessionOutcome::SessionIdNotFound);
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (0, 0, true));
        assert_eq!(names(&p), vec![(0, 0)], "a full request carries everything");
        s.on_outcome(SessionOutcome::Answered { session_id: 6 });
        assert_eq!(s.plan(&w).session_epoch, 1);

        // An epoch the broker did not expect: close this session and open another, (id, 0).
        s.on_outcome(SessionOutcome::InvalidEpoch);
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (6, 0, true));
        s.on_outcome(SessionOutcome::Answered { session_id: 8 });
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch), (8, 1));

        // A lost connection or another error: the same.
        s.on_outcome(SessionOutcome::Failed);
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (8, 0, true));
        assert_eq!(s.stats().fallbacks, 3);
    }

    #[test]
    fn a_broker_that_keeps_no_session_gets_full_requests() {
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        for _ in 0..3 {
            let p = s.plan(&w);
            assert_eq!((p.session_id, p.session_epoch, p.full), (0, 0, true));
            s.on_outcome(SessionOutcome::Answered { session_id: 0 });
        }
        assert_eq!(s.stats().sessionless, 3);
        assert_eq!(s.stats().fallbacks, 0);
    }

    #[test]
    fn an_incremental_answer_without_a_session_ends_it() {
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 4 });
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 0 });
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (0, 0, true));
        assert_eq!(s.stats().fallbacks, 1);
    }

    #[test]
    fn epochs_wrap_to_one_and_close_ends_the_session() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(i32::MAX), 1);
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        assert_eq!(s.close(), None, "nothing to close");
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 12 });
        let c = s.close().unwrap();
        assert_eq!((c.session_id, c.session_epoch), (12, FINAL_EPOCH));
        assert!(c.partitions.is_empty() && c.forgotten.is_empty());
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch), (0, 0));
    }

    #[test]
    fn failures_without_a_request_in_flight_are_not_fallbacks() {
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 3 });
        s.plan(&w);
        s.on_outcome(SessionOutcome::Failed);
        // The broker stays down: each reconnect fails before a request is sent.
        s.on_outcome(SessionOutcome::Failed);
        s.on_outcome(SessionOutcome::Failed);
        assert_eq!(s.stats().fallbacks, 1);
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (3, 0, true));
    }

    #[test]
    fn reset_makes_the_next_request_full_in_the_same_session() {
        let a = part("t", 0);
        let w = wanted(&[(&a, 0)]);
        let mut s = FetchSession::new();
        s.plan(&w);
        s.on_outcome(SessionOutcome::Answered { session_id: 2 });
        s.reset();
        let p = s.plan(&w);
        assert_eq!((p.session_id, p.session_epoch, p.full), (2, 0, true));
    }
}
