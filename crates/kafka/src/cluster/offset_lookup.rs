//! ListOffsets asked by many callers at about the same time, sent as one request per broker.
//!
//! When a flow starts, each of its partitions looks up where to start on the source and where
//! the target log ends. Asked one by one, on the one control connection a broker has (it answers
//! one request per connection at a time), 1,000 partitions cost 2,000 round trips, several
//! seconds before the first record moves. Here the asks that arrive within a short window go
//! out together ([`KafkaCluster::list_offsets_once`]); a partition the batched answer left out
//! (no leader yet, its log not created yet) is asked again in a later batch, after a backoff,
//! so one slow partition never holds up the others, and thousands waiting cost one request per
//! broker per round.

use super::KafkaCluster;
use crate::error::Result;
use crate::settings::IsolationLevel;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long the first ask waits for others to join it.
const WINDOW: Duration = Duration::from_millis(2);

pub(crate) type Lookups = super::coalesce::Coalesce<Ask>;

#[derive(Debug)]
pub(crate) struct Ask {
    topic: String,
    partition: i32,
    at: i64,
    isolation: IsolationLevel,
    reply: oneshot::Sender<Option<i64>>,
}

impl KafkaCluster {
    /// [`KafkaCluster::list_offset`], sent together with the other lookups asked at about the
    /// same time (one request per broker). Same answer and retry budget as `list_offset`: a
    /// partition the batched answer left out (its log not created yet, no leader known) is
    /// asked again in a later batch, after a backoff, until `request.timeout.ms`; then once on
    /// its own, whose error the caller gets.
    ///
    /// Retried in batches, not one by one: a flow starting 10,000 partitions against a target
    /// still creating their logs sent one ListOffsets per waiting partition and retry (thousands
    /// a second), and the broker, busy with those, created the logs slower; now each retry
    /// round is one request per broker.
    pub async fn list_offset_batched(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        let deadline = tokio::time::Instant::now() + self.settings.request_timeout;
        let mut delay = RETRY_FIRST;
        loop {
            let (reply, answer) = oneshot::channel();
            let first = self.lookups.push(Ask {
                topic: topic.into(),
                partition,
                at,
                isolation,
                reply,
            });
            if first {
                tokio::spawn(flush(self.clone()));
            }
            if let Ok(Some(offset)) = answer.await {
                return Ok(offset);
            }
            if tokio::time::Instant::now() + delay >= deadline {
                break;
            }
            tokio::time::sleep(retry_delay(delay)).await;
            delay = (delay * 2).min(RETRY_MAX);
            if self.leader_of(topic, partition).is_err() {
                // Not in the cached metadata (a topic created a moment ago): reloaded together
                // with the other callers reloading now (`refresh.rs`).
                self.refreshes
                    .refresh(topic, |topics| async move {
                        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                        let _ = self.refresh_metadata(Some(&names)).await;
                    })
                    .await;
            }
        }
        // Boxed: the retrying lookup's future is kilobytes, and inline it would size every
        // ask waiting for its batch (thousands when a flow starts).
        Box::pin(self.list_offset(topic, partition, at, isolation)).await
    }
}

/// The first wait before a partition left out of a batched answer is asked again, and the
/// longest (as `retrying`'s).
const RETRY_FIRST: Duration = Duration::from_millis(25);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// `delay` plus up to half of it again, so the retries of partitions left out together spread
/// over a few batches rather than all landing in one.
fn retry_delay(delay: Duration) -> Duration {
    let half = delay.as_millis() as u64 / 2 + 1;
    delay + Duration::from_millis(rand::random::<u64>() % half)
}

/// Sends every queued ask, one request per (broker, kind of lookup), and answers each.
async fn flush(cluster: Arc<KafkaCluster>) {
    let asks = cluster.lookups.take_after(WINDOW).await;
    for ((at, isolation), asks) in group(asks) {
        let partitions: Vec<(String, i32)> = asks
            .iter()
            .map(|a| (a.topic.clone(), a.partition))
            .collect();
        let round = cluster.list_offsets_once(&partitions, at, isolation).await;
        for a in asks {
            let _ = a
                .reply
                .send(round.found.get(&(a.topic, a.partition)).copied());
        }
    }
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
    fn retries_spread_over_up_to_half_their_delay_again() {
        for _ in 0..100 {
            let d = retry_delay(Duration::from_millis(100));
            assert!(
                d >= Duration::from_millis(100) && d <= Duration::from_millis(151),
                "{d:?}"
            );
        }
        assert!(retry_delay(RETRY_MAX) <= RETRY_MAX * 3 / 2 + Duration::from_millis(1));
    }

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
