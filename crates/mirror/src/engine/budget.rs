//! The flow's memory budget: bytes fetched from the source and not yet acknowledged by the
//! target, bounded by the target producer's `buffer.memory` (the Java producer's own bound on
//! records waiting to be sent, 32 MiB by default).
//!
//! A partition takes its largest possible response (`max.partition.fetch.bytes`, at most a
//! quarter of the budget) before it fetches, gives back what the response did not use, and holds the rest until the target
//! acknowledged the response's last batch. Without it, each partition could hold a full fetch
//! plus a full in-flight window, and resident memory grew with the partition count.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The smallest budget: one default-sized fetch, so a tiny `buffer.memory` cannot stall.
const MIN_BYTES: u32 = 1 << 20;

#[derive(Debug)]
pub(super) struct Budget {
    sem: Arc<Semaphore>,
    capacity: u32,
}

impl Budget {
    pub(super) fn new(buffer_memory: i64) -> Budget {
        let capacity = buffer_memory.clamp(MIN_BYTES as i64, i32::MAX as i64) as u32;
        Budget {
            sem: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
        }
    }

    /// How many bytes one fetch may ask for: the partition maximum, within a quarter of the
    /// budget, so at least four partitions can fetch at once (a fetch asking for the whole
    /// budget would wait until every other partition's data was acknowledged).
    pub(super) fn fetch_size(&self, max_partition_fetch_bytes: i32) -> u32 {
        (max_partition_fetch_bytes.max(1) as u32).min(self.capacity / 4)
    }

    /// `bytes` of the budget if they are free now.
    pub(super) fn try_take(&self, bytes: u32) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_many_owned(bytes).ok()
    }

    /// `bytes` of the budget, waiting until other partitions' data is acknowledged. The
    /// caller must hold none while it waits (its own in-flight data would never be released).
    pub(super) async fn take(&self, bytes: u32) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed, so this only waits.
        self.sem.clone().acquire_many_owned(bytes).await.ok()
    }

    /// Bytes taken now (for the metric).
    pub(super) fn used(&self) -> u64 {
        u64::from(self.capacity) - self.sem.available_permits() as u64
    }
}

/// Gives back what a response did not use, keeping `used` bytes.
pub(super) fn keep(permit: &mut Option<OwnedSemaphorePermit>, used: usize) {
    if let Some(p) = permit {
        let spare = p.num_permits().saturating_sub(used);
        if spare > 0 {
            drop(p.split(spare));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unused_bytes_return_at_once_and_the_rest_on_drop() {
        let b = Budget::new(4 << 20);
        assert_eq!(
            b.fetch_size(10 << 20),
            1 << 20,
            "a fetch takes at most a quarter of the budget"
        );
        assert_eq!(b.fetch_size(512 << 10), 512 << 10);
        let mut p = b.try_take(4 << 20);
        assert!(p.is_some());
        assert!(b.try_take(1).is_none(), "the whole budget is taken");
        keep(&mut p, 1000);
        assert_eq!(b.used(), 1000);
        assert!(b.try_take((4 << 20) - 1000).is_some());
        drop(p);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_waiting_partition_gets_its_bytes_once_another_releases_them() {
        let b = Arc::new(Budget::new(2 << 20));
        let held = b.try_take(2 << 20);
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take(1 << 20).await.map(|p| p.num_permits()) })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.ok().flatten(), Some(1 << 20));
    }

    #[test]
    fn a_tiny_buffer_memory_still_allows_one_fetch() {
        assert_eq!(Budget::new(10).fetch_size(1 << 20), MIN_BYTES / 4);
    }
}
