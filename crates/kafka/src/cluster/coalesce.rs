//! Asks that arrive within a short window, taken together: the queue behind the batched
//! ListOffsets (`offset_lookup`) and the batched Fetch (`fetch_batch`). The first ask of a
//! window schedules the one flush that takes them all.

use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Coalesce<A> {
    pending: Mutex<Pending<A>>,
}

#[derive(Debug)]
struct Pending<A> {
    asks: Vec<A>,
    /// A flush is on its way for the asks queued.
    scheduled: bool,
}

impl<A> Default for Coalesce<A> {
    fn default() -> Self {
        Coalesce {
            pending: Mutex::new(Pending {
                asks: Vec::new(),
                scheduled: false,
            }),
        }
    }
}

impl<A> Coalesce<A> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending<A>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `ask`; true when this caller must start the flush (the first ask of a window).
    pub(crate) fn push(&self, ask: A) -> bool {
        let mut q = self.lock();
        q.asks.push(ask);
        !std::mem::replace(&mut q.scheduled, true)
    }

    /// Waits `window` and takes every ask queued. Dropped before it took them (a runtime
    /// shutting down), it clears `scheduled`, so later asks start a new flush instead of
    /// waiting for nobody.
    pub(crate) async fn take_after(&self, window: Duration) -> Vec<A> {
        let mut guard = Unschedule(Some(self));
        tokio::time::sleep(window).await;
        guard.0 = None;
        let mut q = self.lock();
        q.scheduled = false;
        std::mem::take(&mut q.asks)
    }
}

struct Unschedule<'a, A>(Option<&'a Coalesce<A>>);

impl<A> Drop for Unschedule<'_, A> {
    fn drop(&mut self) {
        if let Some(q) = self.0.take() {
            q.lock().scheduled = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_ask_of_a_window_schedules_and_a_flush_takes_them_all() {
        let q = Coalesce::default();
        assert!(q.push(1));
        assert!(!q.push(2));
        assert_eq!(q.take_after(Duration::ZERO).await, vec![1, 2]);
        assert!(q.push(3), "a new window after the flush");
        // A flush dropped before it took the asks lets the next ask schedule again.
        let window = q.take_after(Duration::from_secs(60));
        assert!(tokio::time::timeout(Duration::from_millis(10), window)
            .await
            .is_err());
        assert!(q.push(4));
    }
}
