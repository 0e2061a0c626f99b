//! State read from a cluster on demand, fresh enough for every caller, with one read at a time
//! and every caller waiting on it woken at once.
//!
//! Every partition of a flow that starts asks the offset-syncs index for its anchor
//! (`engine/partition/resume.rs`). Behind one async lock, 10,000 partitions starting together took the
//! lock one after another, each waiting for the runtime to schedule it, and under load the
//! partitions started last waited minutes before they looked at their target, with nothing
//! in the log (docs/engine.md, "Starting many partitions"). Here a caller that finds the state
//! fresh enough reads it under a plain mutex and goes on; one caller reads when it is not, and
//! the others wait for that read's end together.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug)]
pub(super) struct FreshReads<S> {
    /// How old a read may be for a caller asking now.
    fresh: Duration,
    inner: Mutex<Inner<S>>,
    /// Bumped whenever a read ends (or its caller is cancelled): waiters look again.
    ended: watch::Sender<u64>,
}

#[derive(Debug)]
struct Inner<S> {
    data: S,
    /// When the last successful read began: what was written before then is in `data`.
    read_at: Option<Instant>,
    reading: bool,
}

impl<S> FreshReads<S> {
    pub(super) fn new(fresh: Duration, data: S) -> FreshReads<S> {
        FreshReads {
            fresh,
            inner: Mutex::new(Inner {
                data,
                read_at: None,
                reading: false,
            }),
            ended: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at the state (no await inside).
    pub(super) fn with<R>(&self, look: impl FnOnce(&S) -> R) -> R {
        look(&self.lock().data)
    }

    /// Returns once the state holds a read that began at most `fresh` before `asked`. When none
    /// does and no read is on its way, this caller reads: `read` gets what `cursor` takes from
    /// the state (where to continue), and `merge` folds its result in. A failed read is this
    /// caller's error; a waiter then reads again.
    pub(super) async fn ensure<C, T, E, Fut>(
        &self,
        asked: Instant,
        cursor: impl Fn(&S) -> C,
        read: impl Fn(C) -> Fut,
        merge: impl Fn(&mut S, T),
    ) -> Result<(), E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        loop {
            let mut ended = self.ended.subscribe();
            let from = {
                let mut s = self.lock();
                if s.read_at
                    .is_some_and(|t| asked.saturating_duration_since(t) <= self.fresh)
                {
                    return Ok(());
                }
                if s.reading {
                    None
                } else {
                    s.reading = true;
                    Some(cursor(&s.data))
                }
            };
            let Some(from) = from else {
                let _ = ended.changed().await;
                continue;
            };
            let _reading = Reading(self);
            let began = Instant::now();
            // Boxed: a read's future is kilobytes, and inline it would size every caller's
            // future while it only waits (10,000 of them when a flow starts).
            let got = Box::pin(read(from)).await?;
            let mut s = self.lock();
            merge(&mut s.data, got);
            s.read_at = Some(began);
            return Ok(());
        }
    }
}

/// Ends a read, also when its caller fails or is cancelled mid-way.
struct Reading<'a, S>(&'a FreshReads<S>);

impl<S> Drop for Reading<'_, S> {
    fn drop(&mut self) {
        self.0.lock().reading = false;
        self.0.ended.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// 10,000 partitions starting together: one or two reads, not one per partition, and
    /// none of them waits for the others one by one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_asking_together_share_one_read() {
        let reads = Arc::new(FreshReads::new(Duration::from_secs(1), 0u64));
        let count = Arc::new(AtomicU32::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..10_000 {
            let (reads, count) = (reads.clone(), count.clone());
            tasks.spawn(async move {
                let asked = Instant::now();
                reads
                    .ensure(
                        asked,
                        |n| *n,
                        |n| {
                            count.fetch_add(1, Ordering::SeqCst);
                            async move {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                Ok::<_, ()>(n + 1)
                            }
                        },
                        |n, got| *n = got,
                    )
                    .await
                    .unwrap();
                assert!(reads.with(|n| *n) >= 1, "returned before a read ended");
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
        let n = count.load(Ordering::SeqCst);
        assert!((1..=3).contains(&n), "{n} reads for 10,000 callers");
    }

    async fn ok(reads: &FreshReads<u64>) -> Result<(), &'static str> {
        reads
            .ensure(
                Instant::now(),
                |n| *n,
                |n| async move { Ok(n + 1) },
                |n, got| *n = got,
            )
            .await
    }

    #[tokio::test]
    async fn a_stale_state_is_read_again_and_a_failed_or_cancelled_read_is_retried() {
        let stale = || tokio::time::sleep(Duration::from_millis(80));
        let reads = Arc::new(FreshReads::new(Duration::from_millis(50), 0u64));
        ok(&reads).await.unwrap();
        ok(&reads).await.unwrap();
        assert_eq!(reads.with(|n| *n), 1, "fresh: not read again");
        stale().await;
        ok(&reads).await.unwrap();
        assert_eq!(reads.with(|n| *n), 2, "stale: read again");
        stale().await;
        let failed = reads
            .ensure(
                Instant::now(),
                |n| *n,
                |_| async { Err::<u64, _>("broker away") },
                |n, got| *n = got,
            )
            .await;
        assert_eq!(failed, Err("broker away"));
        ok(&reads).await.unwrap();
        assert_eq!(reads.with(|n| *n), 3, "read again after a failure");
        // A reader cancelled mid-way does not leave the others waiting forever.
        stale().await;
        let stuck = {
            let reads = reads.clone();
            tokio::spawn(async move {
                let _ = reads
                    .ensure(
                        Instant::now(),
                        |n| *n,
                        |_| std::future::pending::<Result<u64, &str>>(),
                        |n, got| *n = got,
                    )
                    .await;
            })
        };
        tokio::task::yield_now().await;
        let waiter = {
            let reads = reads.clone();
            tokio::spawn(async move { ok(&reads).await })
        };
        tokio::task::yield_now().await;
        stuck.abort();
        waiter.await.unwrap().unwrap();
        assert_eq!(reads.with(|n| *n), 4);
    }
}
