//! The write lease, the copy core's send gate for a process that shares its work through a
//! consumer group (MM2 mode's flow group, MM1 mode's source group). A process may send only
//! while the group cannot have given its partitions away yet as far as it can tell: a heartbeat
//! answered within the session timeout, or a rejoin under way within the rebalance timeout. A
//! process paused past its session (SIGSTOP, a long stall, a frozen VM) finds the lease lapsed
//! when it wakes and holds its sends until a heartbeat tells it whether it is still a member,
//! instead of writing a burst of what the partitions' new owner already copied. Pure: the time
//! is the caller's.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Lease {
    session_timeout: Duration,
    rebalance_timeout: Duration,
    /// When the newest heartbeat (or join) that the coordinator answered was sent.
    last_ok: Option<Instant>,
    /// A rejoin under way, since then.
    joining_since: Option<Instant>,
}

impl Lease {
    /// A lease not held yet: nothing may be sent before the first answered heartbeat or join.
    pub fn new(session_timeout: Duration, rebalance_timeout: Duration) -> Lease {
        Lease {
            session_timeout,
            rebalance_timeout,
            last_ok: None,
            joining_since: None,
        }
    }

    /// The coordinator answered a request sent at `sent`; answers that arrive out of order
    /// never move the lease back.
    pub fn renewed(&mut self, sent: Instant) {
        self.last_ok = Some(self.last_ok.map_or(sent, |t| t.max(sent)));
    }

    /// This process is no longer a member for sure (another took its instance id, or the
    /// coordinator said so): sends stop at once rather than at the end of the lease.
    pub fn expire(&mut self) {
        self.last_ok = None;
        self.joining_since = None;
    }

    /// A rejoin started at `since` (None: it ended).
    pub fn joining(&mut self, since: Option<Instant>) {
        self.joining_since = since;
    }

    /// Whether sending is allowed at `now`.
    pub fn may_write(&self, now: Instant) -> bool {
        self.joining_since
            .is_some_and(|t| now.saturating_duration_since(t) < self.rebalance_timeout)
            || self.claims_valid(now)
    }

    /// Whether the coordinator still counts this member alive as far as it can tell (a
    /// heartbeat answered within the session timeout): only then may a rejoin claim the
    /// partitions it had (KIP-429's lost partitions otherwise).
    pub fn claims_valid(&self, now: Instant) -> bool {
        self.last_ok
            .is_some_and(|t| now.saturating_duration_since(t) < self.session_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(10);
    const R: Duration = Duration::from_secs(60);

    #[test]
    fn a_process_paused_past_its_session_holds_its_sends_until_a_heartbeat_answers() {
        let t0 = Instant::now();
        let mut l = Lease::new(S, R);
        assert!(!l.may_write(t0), "not held before the first answer");
        l.renewed(t0);
        assert!(l.may_write(t0 + Duration::from_secs(9)));
        // Woken 30 s later: the group may have given the partitions away meanwhile.
        let woke = t0 + Duration::from_secs(30);
        assert!(!l.may_write(woke) && !l.claims_valid(woke));
        l.renewed(woke);
        assert!(l.may_write(woke) && l.claims_valid(woke));
    }

    #[test]
    fn a_late_answer_never_moves_the_lease_back_and_expiry_ends_it_at_once() {
        let t0 = Instant::now();
        let mut l = Lease::new(S, R);
        l.renewed(t0 + Duration::from_secs(5));
        l.renewed(t0); // an older request's answer, arriving late
        assert!(l.may_write(t0 + Duration::from_secs(14)));
        l.expire();
        assert!(!l.may_write(t0 + Duration::from_secs(6)));
    }

    #[test]
    fn a_rejoin_keeps_sends_going_within_the_rebalance_timeout_without_claims() {
        let t0 = Instant::now();
        let mut l = Lease::new(S, R);
        l.joining(Some(t0));
        let later = t0 + Duration::from_secs(30);
        assert!(l.may_write(later), "rejoining within the rebalance timeout");
        assert!(!l.claims_valid(later), "but it claims nothing it had");
        assert!(!l.may_write(t0 + R));
        l.joining(None);
        assert!(!l.may_write(later));
    }
}
