//! Rate limits (`kmirror.rate.limit.bytes.per.second` per flow,
//! `kmirror.process.rate.limit.bytes.per.second` for all flows of the process together), so a
//! backfill does not saturate the source cluster or the link. A token bucket holding one second
//! of bytes: fetched bytes are paid for before they are sent on, and a fetch larger than the
//! bucket goes into debt, which later fetches wait out, so the average holds over any window of a
//! few seconds.

use super::Shutdown;
use prometheus_client::metrics::counter::Counter;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct RateLimiter {
    bytes_per_second: f64,
    /// (tokens, when last refilled); tokens may be negative (debt).
    bucket: Mutex<(f64, Instant)>,
    /// Milliseconds spent waiting.
    throttled_ms: Counter,
}

impl RateLimiter {
    pub(crate) fn new(bytes_per_second: u64, throttled_ms: Counter) -> RateLimiter {
        let rate = bytes_per_second.max(1) as f64;
        RateLimiter {
            bytes_per_second: rate,
            bucket: Mutex::new((rate, Instant::now())),
            throttled_ms,
        }
    }

    /// How long the caller must wait before sending `bytes` (pure bookkeeping; the caller waits).
    fn charge(&self, bytes: usize, now: Instant) -> Duration {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let refill = now.duration_since(b.1).as_secs_f64() * self.bytes_per_second;
        b.0 = (b.0 + refill).min(self.bytes_per_second);
        b.1 = now;
        b.0 -= bytes as f64;
        if b.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.0 / self.bytes_per_second)
        }
    }

    /// Pays for `bytes`, waiting as long as the limit needs; true if stopped meanwhile.
    pub(crate) async fn acquire(&self, bytes: usize, stop: &Shutdown) -> bool {
        let wait = self.charge(bytes, Instant::now());
        if wait.is_zero() {
            return false;
        }
        self.throttled_ms.inc_by(wait.as_millis() as u64);
        stop.sleep(wait).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_holds_and_bursts_are_paid_back() {
        let l = RateLimiter::new(1_000, Counter::default());
        let t0 = Instant::now();
        // One second of bytes is free (the bucket starts full).
        assert_eq!(l.charge(1_000, t0), Duration::ZERO);
        // 500 more at once: half a second of debt.
        assert_eq!(l.charge(500, t0), Duration::from_millis(500));
        // After the wait, the debt is paid: another 500 costs half a second again.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(l.charge(500, t1), Duration::from_millis(500));
        // Idle time refills at most one second's worth.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(l.charge(1_000, t2), Duration::ZERO);
        assert!(l.charge(1, t2) > Duration::ZERO);
    }

    #[test]
    fn over_a_window_the_rate_is_the_limit() {
        // Charging 100 bytes and waiting what is asked, 200 times: the clock advances by the
        // total bytes / rate, less the first second's burst.
        let l = RateLimiter::new(10_000, Counter::default());
        let mut now = Instant::now();
        let start = now;
        for _ in 0..2_000 {
            now += l.charge(100, now);
        }
        let elapsed = now.duration_since(start).as_secs_f64();
        let expected = (2_000.0 * 100.0 - 10_000.0) / 10_000.0;
        assert!((elapsed - expected).abs() < 0.01, "{elapsed} vs {expected}");
    }
}
