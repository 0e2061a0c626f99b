//! Wakes idle partitions as soon as their source has new records.
//!
//! Partition tasks fetch without waiting, because partitions share one connection per broker
//! and a broker answers one request per connection at a time: a long poll for one idle
//! partition would hold up every busy one. Instead, a partition that found nothing registers
//! here, and one watcher per source broker long-polls that broker's idle partitions together on
//! connections of its own (`KafkaCluster::wait_for_data`). When any of them gets a record, the
//! broker answers at once and the watcher wakes exactly those partitions.
//!
//! This is what keeps replication latency low at moderate rates (a fixed idle back-off added
//! up to its whole length to every record arriving at a quiet partition), at the cost of one
//! cheap request per broker per poll while everything is idle.

use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::conn::Connection;
use kmirror_kafka::{IsolationLevel, KafkaError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

/// The longest one poll waits (when every connection is busy, partitions that go idle wait
/// for one to come back, so this also bounds how late they start being watched).
const POLL_WAIT: Duration = Duration::from_millis(100);

const POLL_WAIT_MIN: Duration = Duration::from_millis(10);

/// Polls (connections) per broker at once.
const MAX_POLLS: usize = 4;

/// Pause after a failed poll (the waiting partitions are woken and fetch themselves).
const ERROR_PAUSE: Duration = Duration::from_millis(200);

struct Waiter {
    topic: String,
    partition: i32,
    offset: i64,
    wake: oneshot::Sender<()>,
}

/// A broker's watcher task and the way to reach it.
type Watcher = (mpsc::UnboundedSender<Waiter>, JoinHandle<()>);

/// The watchers of one flow's source cluster, one task per broker, started on first use and
/// stopped when this is dropped.
pub(super) struct IdleWatch {
    source: Arc<KafkaCluster>,
    isolation: IsolationLevel,
    poll_wait: Duration,
    brokers: Mutex<HashMap<i32, Watcher>>,
}

impl IdleWatch {
    pub(super) fn new(
        source: Arc<KafkaCluster>,
        isolation: IsolationLevel,
        fetch_max_wait: Duration,
    ) -> IdleWatch {
        IdleWatch {
            source,
            isolation,
            // fetch.max.wait.ms is the consumer's word on how long a poll may wait; the floor
            // keeps a zero from turning the watcher into a busy loop.
            poll_wait: fetch_max_wait.clamp(POLL_WAIT_MIN, POLL_WAIT),
            brokers: Mutex::new(HashMap::new()),
        }
    }

    /// Waits until `topic`-`partition` has records at or past `offset` (or an error to see),
    /// or `timeout` passed, whichever is first. Without a known leader it only pauses for the
    /// poll wait: its own fetch will say what is wrong.
    pub(super) async fn wait(&self, topic: &str, partition: i32, offset: i64, timeout: Duration) {
        let Ok((leader, _)) = self.source.leader_of(topic, partition) else {
            tokio::time::sleep(timeout.min(self.poll_wait)).await;
            return;
        };
        let (wake, woken) = oneshot::channel();
        let waiter = Waiter {
            topic: topic.to_string(),
            partition,
            offset,
            wake,
        };
        if self.sender(leader).send(waiter).is_err() {
            tokio::time::sleep(timeout.min(self.poll_wait)).await;
            return;
        }
        // Dropping `woken` on timeout tells the watcher to forget this waiter.
        let _ = tokio::time::timeout(timeout, woken).await;
    }

    fn sender(&self, broker: i32) -> mpsc::UnboundedSender<Waiter> {
        let mut brokers = self.brokers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tx, task)) = brokers.get(&broker) {
            if !task.is_finished() {
                return tx.clone();
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(watch_broker(
            self.source.clone(),
            broker,
            self.isolation,
            self.poll_wait,
            rx,
        ));
        brokers.insert(broker, (tx.clone(), task));
        tx
    }
}

impl Drop for IdleWatch {
    fn drop(&mut self) {
        let brokers = self.brokers.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, (_, task)) in brokers.drain() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for IdleWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleWatch")
            .field("poll_wait", &self.poll_wait)
            .finish_non_exhaustive()
    }
}

/// What one poll hands back: its connection (None after a failure), its waiters, the result.
type PollDone = (
    Option<Arc<Connection>>,
    Vec<Waiter>,
    Result<Vec<usize>, KafkaError>,
);

/// One broker's watcher: polls while anyone waits, ends when the watch is dropped.
///
/// A broker answers one request per connection at a time, so partitions that go idle while a
/// poll is out cannot join it. Rather than make them wait for it, they get a poll of their own
/// on another connection (up to [`MAX_POLLS`]); when a poll ends, its partitions that are
/// still idle join the next one, so in steady state one or two polls cover everything.
async fn watch_broker(
    source: Arc<KafkaCluster>,
    broker: i32,
    isolation: IsolationLevel,
    poll_wait: Duration,
    mut rx: mpsc::UnboundedReceiver<Waiter>,
) {
    let mut pending: Vec<Waiter> = Vec::new();
    let mut spare: Vec<Arc<Connection>> = Vec::new();
    let mut polls: JoinSet<PollDone> = JoinSet::new();
    let mut paused_until = tokio::time::Instant::now();
    loop {
        // Partitions that stopped waiting (timed out, moved on, stopped) leave.
        pending.retain(|w| !w.wake.is_closed());
        let now = tokio::time::Instant::now();
        if !pending.is_empty() && polls.len() < MAX_POLLS && now >= paused_until {
            let waiters = std::mem::take(&mut pending);
            let (source, conn) = (source.clone(), spare.pop());
            polls.spawn(async move {
                let conn = match conn {
                    Some(c) => c,
                    None => match source.dedicated_connection(broker).await {
                        Ok(c) => c,
                        Err(e) => return (None, waiters, Err(e)),
                    },
                };
                let asked: Vec<(String, i32, i64)> = waiters
                    .iter()
                    .map(|w| (w.topic.clone(), w.partition, w.offset))
                    .collect();
                let result = source
                    .wait_for_data(&conn, &asked, poll_wait, isolation)
                    .await;
                (Some(conn), waiters, result)
            });
            continue;
        }
        tokio::select! {
            w = rx.recv() => match w {
                Some(w) => {
                    pending.push(w);
                    while let Ok(w) = rx.try_recv() {
                        pending.push(w);
                    }
                }
                None => return,
            },
            Some(done) = polls.join_next(), if !polls.is_empty() => {
                let Ok((conn, mut waiters, result)) = done else {
                    continue; // the poll task panicked: dropping its waiters woke them
                };
                match result {
                    Ok(mut ready) => {
                        ready.sort_unstable();
                        ready.dedup();
                        for i in ready.into_iter().rev() {
                            if i < waiters.len() {
                                let _ = waiters.swap_remove(i).wake.send(());
                            }
                        }
                        pending.append(&mut waiters);
                        spare.extend(conn);
                    }
                    Err(e) => {
                        // A moved leader, a deleted topic, a closed connection: the partitions
                        // learn the details from their own fetch.
                        tracing::debug!(broker, error = %e, "idle watch poll failed; waking its partitions");
                        wake_all(&mut waiters);
                        paused_until = tokio::time::Instant::now() + ERROR_PAUSE;
                    }
                }
            },
            _ = tokio::time::sleep_until(paused_until), if !pending.is_empty() && paused_until > now => {}
        }
    }
}

fn wake_all(waiting: &mut Vec<Waiter>) {
    for w in waiting.drain(..) {
        let _ = w.wake.send(());
    }
}
