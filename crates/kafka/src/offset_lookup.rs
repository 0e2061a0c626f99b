//! ListOffsets asked by many callers at about the same time, sent as one request per broker.
//!
//! When a flow starts, each of its partitions looks up where to start on the source and where
//! the target log ends. Asked one by one, on the one control connection a broker has (it answers
//! one request per connection at a time), 1,000 partitions cost 2,000 round trips, several
//! seconds before the first record moves. Here the asks that arrive within a short window go
//! out together ([`KafkaCluster::list_offsets_once`]).
//!
//! A partition the answer left out (no leader yet, a retriable error) waits for the next retry
//! round, which is shared too: one metadata refresh for the topics still waiting, then one
//! request per broker, at 25 ms doubling to 1 s. At 10,000 partitions on a target still
//! creating its partition logs, asking again one by one meant a metadata refresh per partition
//! (each copying the cluster's metadata) and the caller's reconnect backoff of up to 30 s
//! after each lookup gave up, so the last partitions started tens of seconds after their
//! leaders appeared (docs/benchmarks.md). After the request timeout a waiting caller asks once
//! on its own, for the real error.

use crate::cluster::KafkaCluster;
use crate::error::{KafkaError, Result};
use crate::settings::IsolationLevel;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long the first ask waits for others to join it.
const WINDOW: Duration = Duration::from_millis(2);
/// The first and the longest pause between retry rounds.
const RETRY_FIRST: Duration = Duration::from_millis(25);
const RETRY_MAX: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct Lookups {
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    asks: Vec<Ask>,
    /// A flush is on its way for the asks queued.
    scheduled: bool,
    /// Asks left out of an answer, for the retry rounds.
    waiting: Vec<Ask>,
    /// The retry rounds are running.
    retrying: bool,
}

#[derive(Debug)]
struct Ask {
    topic: String,
    partition: i32,
    at: i64,
    isolation: IsolationLevel,
    reply: oneshot::Sender<Result<i64>>,
}

impl KafkaCluster {
    /// [`KafkaCluster::list_offset`], sent together with the other lookups asked at about the
    /// same time (one request per broker), and retried together while the partition has no
    /// leader. Same answers as `list_offset`, and the same time bound (the request timeout).
    pub async fn list_offset_batched(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        let deadline = tokio::time::Instant::now() + self.settings().request_timeout;
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut q = self.lookups.lock();
            q.asks.push(Ask {
                topic: topic.into(),
                partition,
                at,
                isolation,
                reply,
            });
            !std::mem::replace(&mut q.scheduled, true)
        };
        if first {
            tokio::spawn(flush(self.clone()));
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(answer)) => answer,
            // Still waiting at the deadline (the retry rounds drop the ask), or the rounds' task
            // ended: once on its own, for the real answer or error.
            _ => self.list_offset_once(topic, partition, at, isolation).await,
        }
    }
}

impl Lookups {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends every queued ask, one request per (broker, kind of lookup), and answers each; what
/// was left out goes to the retry rounds.
async fn flush(cluster: Arc<KafkaCluster>) {
    tokio::time::sleep(WINDOW).await;
    let asks = {
        let mut q = cluster.lookups.lock();
        q.scheduled = false;
        std::mem::take(&mut q.asks)
    };
    let left = ask_all(&cluster, asks).await;
    wait_for_retry(&cluster, left);
}

/// Queues asks for the retry rounds, starting them if they are not running.
fn wait_for_retry(cluster: &Arc<KafkaCluster>, left: Vec<Ask>) {
    if left.is_empty() {
        return;
    }
    let start = {
        let mut q = cluster.lookups.lock();
        q.waiting.extend(left);
        !std::mem::replace(&mut q.retrying, true)
    };
    if start {
        tokio::spawn(retry_rounds(cluster.clone()));
    }
}

/// Until nothing waits: pause, refresh the waiting topics' metadata once, ask them all again.
async fn retry_rounds(cluster: Arc<KafkaCluster>) {
    let mut pause = RETRY_FIRST;
    loop {
        tokio::time::sleep(pause + jitter(pause)).await;
        pause = (pause * 2).min(RETRY_MAX);
        let waiting = {
            let mut q = cluster.lookups.lock();
            // A caller past its deadline has asked on its own.
            q.waiting.retain(|a| !a.reply.is_closed());
            if q.waiting.is_empty() {
                q.retrying = false;
                return;
            }
            std::mem::take(&mut q.waiting)
        };
        let topics: BTreeSet<&str> = waiting.iter().map(|a| a.topic.as_str()).collect();
        let topics: Vec<&str> = topics.into_iter().collect();
        if let Err(e) = cluster.refresh_metadata(Some(&topics)).await {
            tracing::debug!(error = %e, "metadata refresh for waiting offset lookups failed");
        }
        let left = ask_all(&cluster, waiting).await;
        cluster.lookups.lock().waiting.extend(left);
    }
}

fn jitter(d: Duration) -> Duration {
    Duration::from_millis(rand::random::<u64>() % (d.as_millis() as u64 / 4 + 1))
}

/// One round: answers what was found or failed for good, returns the asks left out.
async fn ask_all(cluster: &KafkaCluster, asks: Vec<Ask>) -> Vec<Ask> {
    let mut left = Vec::new();
    for ((at, isolation), asks) in group(asks) {
        let partitions: Vec<(String, i32)> = asks
            .iter()
            .map(|a| (a.topic.clone(), a.partition))
            .collect();
        let mut round = cluster.list_offsets_once(&partitions, at, isolation).await;
        let mut failed: HashMap<(String, i32), KafkaError> = round.failed.drain(..).collect();
        for a in asks {
            let key = (a.topic, a.partition);
            if let Some(offset) = round.found.get(&key) {
                let _ = a.reply.send(Ok(*offset));
            } else if let Some(e) = failed.remove(&key) {
                let _ = a.reply.send(Err(e));
            } else {
                left.push(Ask {
                    topic: key.0,
                    partition: key.1,
                    ..a
                });
            }
        }
    }
    left
}

/// Asks grouped by what they look up (one ListOffsets request has one isolation level, and
/// kmirror asks one timestamp kind per request).
fn group(asks: Vec<Ask>) -> HashMap<(i64, IsolationLevel), Vec<Ask>> {
    let mut out: HashMap<(i64, IsolationLevel), Vec<Ask>> = HashMap::new();
    for a in asks {
        out.entry((a.at, a.isolation)).or_default().push(a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_are_grouped_by_timestamp_and_isolation() {
        let ask = |t: &str, at, isolation| Ask {
            topic: t.into(),
            partition: 0,
            at,
            isolation,
            reply: oneshot::channel().0,
        };
        let groups = group(vec![
            ask("a", -1, IsolationLevel::ReadCommitted),
            ask("b", -2, IsolationLevel::ReadCommitted),
            ask("c", -1, IsolationLevel::ReadCommitted),
            ask("d", -1, IsolationLevel::ReadUncommitted),
        ]);
        assert_eq!(groups.len(), 3);
        let latest: Vec<&str> = groups[&(-1, IsolationLevel::ReadCommitted)]
            .iter()
            .map(|a| a.topic.as_str())
            .collect();
        assert_eq!(latest, vec!["a", "c"]);
    }
}
