//! Partition interruptions logged per flow, not per partition. A flow starting against a target
//! still creating thousands of partition logs sees every partition's first lookup time out at
//! about the same moment; a WARN line each (thousands at 10,000 partitions) costs a user's log
//! pipeline and says nothing the first line does not. So one interruption in a quiet period
//! gets a WARN line that also counts the ones folded since the last; the others log at DEBUG.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a WARN line further interruptions of the flow are only counted.
pub(super) const QUIET: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct Interruptions {
    quiet: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_warn: Option<Instant>,
    folded: u64,
}

impl Interruptions {
    pub(super) fn new(quiet: Duration) -> Interruptions {
        Interruptions {
            quiet,
            state: Mutex::default(),
        }
    }

    /// One interruption at `now`: `Some(n)` when it gets a WARN line, `n` being the
    /// interruptions folded (logged at DEBUG only) since the previous WARN line; `None` when
    /// it is folded.
    pub(super) fn note(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last_warn {
            Some(t) if now.saturating_duration_since(t) < self.quiet => {
                s.folded += 1;
                None
            }
            _ => {
                s.last_warn = Some(now);
                Some(std::mem::take(&mut s.folded))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warn_line_per_quiet_period_counting_the_rest() {
        let i = Interruptions::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(i.note(t0), Some(0));
        // 10,000 partitions interrupted within the period: folded.
        for k in 0..10_000u64 {
            assert_eq!(i.note(t0 + Duration::from_micros(k)), None);
        }
        assert_eq!(i.note(t0 + Duration::from_secs(9)), None);
        // The next line after the period names how many were folded.
        assert_eq!(i.note(t0 + Duration::from_secs(10)), Some(10_001));
        assert_eq!(i.note(t0 + Duration::from_secs(11)), None);
        assert_eq!(i.note(t0 + Duration::from_secs(25)), Some(1));
    }
}
