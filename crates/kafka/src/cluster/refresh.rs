//! Metadata refreshes asked by many callers at once, sent as one request.
//!
//! A caller that meets stale metadata (NOT_LEADER_OR_FOLLOWER, an unknown partition) reloads
//! its topic before it asks again. When a flow starts 10,000 partitions against a target still
//! creating their logs, thousands of callers do that at once, each every 25 ms to 1 s: one
//! Metadata request each, queued on the broker's one control connection (it answers one request
//! per connection at a time), and one copy of the whole cached metadata each. That load starved
//! the runtime, so partitions that had not started yet waited minutes for their turn, with
//! nothing in the log (docs/engine.md, "Starting many partitions"). Here the topics asked while
//! a reload is on its way go out together in the next one, and every caller waits for the
//! first reload that began after its ask.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use tokio::sync::watch;

#[derive(Debug)]
pub(crate) struct Refreshes {
    state: Mutex<State>,
    /// The last round completed; every change wakes the waiters.
    completed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    /// Topics asked for and not yet in a round.
    pending: BTreeSet<String>,
    /// A round is on its way.
    flying: bool,
    /// Rounds begun so far (the next round is `started + 1`).
    started: u64,
    completed: u64,
}

impl Default for Refreshes {
    fn default() -> Self {
        Refreshes {
            state: Mutex::default(),
            completed: watch::Sender::new(0),
        }
    }
}

impl Refreshes {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once a reload that includes `topic` and began after this call has ended
    /// (whether it succeeded or not: the caller's next attempt tells). `load` is called with
    /// the topics of a round when this caller runs it.
    pub(crate) async fn refresh<F, Fut>(&self, topic: &str, load: F)
    where
        F: Fn(Vec<String>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let wanted = {
            let mut s = self.lock();
            s.pending.insert(topic.to_string());
            s.started + 1
        };
        loop {
            let mut changed = self.completed.subscribe();
            let round = {
                let mut s = self.lock();
                if s.completed >= wanted {
                    return;
                }
                if s.flying {
                    None
                } else {
                    s.flying = true;
                    s.started += 1;
                    Some((s.started, std::mem::take(&mut s.pending)))
                }
            };
            match round {
                Some((number, topics)) => {
                    let mut flight = Flight {
                        owner: self,
                        number,
                        topics: Some(topics.iter().cloned().collect()),
                    };
                    // Boxed: a reload's future is kilobytes, and inline it would size every
                    // waiting caller's future.
                    Box::pin(load(topics.into_iter().collect())).await;
                    flight.topics = None;
                }
                None => {
                    let _ = changed.changed().await;
                }
            }
        }
    }
}

/// A round on its way. Dropped when it ends, or when its caller is cancelled mid-way: then its
/// topics go back to the pending ones, and a waiter runs the next round.
struct Flight<'a> {
    owner: &'a Refreshes,
    number: u64,
    /// Set while the round has not completed.
    topics: Option<Vec<String>>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let completed = {
            let mut s = self.owner.lock();
            s.flying = false;
            match self.topics.take() {
                None => s.completed = s.completed.max(self.number),
                Some(topics) => s.pending.extend(topics),
            }
            s.completed
        };
        self.owner.completed.send_replace(completed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// The cause of the stall at 10,000 partitions: one reload per waiting caller. Now
    /// thousands of callers asking at once cost a few reloads, and each caller returns only
    /// after a reload that named its topic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_callers_share_a_few_reloads_that_name_their_topics() {
        let r = Arc::new(Refreshes::default());
        let loads: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..5_000 {
            let (r, loads) = (r.clone(), loads.clone());
            tasks.spawn(async move {
                let topic = format!("t-{}", i % 100);
                r.refresh(&topic, |topics| {
                    let loads = loads.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        loads.lock().unwrap().push(topics);
                    }
                })
                .await;
                // Returned only once a completed reload named the topic.
                assert!(
                    loads.lock().unwrap().iter().any(|l| l.contains(&topic)),
                    "{topic} returned before a reload named it"
                );
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
        let n = loads.lock().unwrap().len();
        assert!(n <= 5, "5,000 callers cost {n} reloads");
    }

    /// A caller cancelled while it runs a round: the others still get a reload of their topic.
    #[tokio::test]
    async fn a_cancelled_round_is_run_again_by_a_waiter() {
        let r = Arc::new(Refreshes::default());
        let loads: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let slow = {
            let r = r.clone();
            tokio::spawn(async move {
                r.refresh("a", |_| std::future::pending::<()>()).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waiter = {
            let (r, loads) = (r.clone(), loads.clone());
            tokio::spawn(async move {
                r.refresh("b", |topics| {
                    let loads = loads.clone();
                    async move { loads.lock().unwrap().push(topics) }
                })
                .await;
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "waits for the round on its way");
        slow.abort();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter ran the next round")
            .unwrap();
        // The cancelled round's topic went back and was reloaded with the waiter's.
        assert_eq!(
            loads.lock().unwrap().clone(),
            vec![vec!["a".to_string(), "b".to_string()]]
        );
    }
}
