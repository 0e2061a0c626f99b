//! ListOffsets asked by many callers at about the same time, sent as one request per broker.
//!
//! When a flow starts, each of its partitions looks up where to start on the source and where
//! the target log ends. Asked one by one, on the one control connection a broker has (it answers
//! one request per connection at a time), 1,000 partitions cost 2,000 round trips, several
//! seconds before the first record moves. Here the asks that arrive within a short window go
//! out together ([`KafkaCluster::list_offsets_once`]); a partition the batched answer left out
//! (no leader yet, its log not created yet) is asked again in the next retry round, a quarter
//! of a second later, so one slow partition never holds up the others, and thousands waiting
//! cost one request per broker a round.

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
    /// asked again in the next retry round ([`RETRY_WINDOW`]), with every other partition left
    /// out meanwhile, until `request.timeout.ms`; then once on its own, whose answer (or error)
    /// the caller gets.
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
        let mut retry = false;
        loop {
            let (reply, answer) = oneshot::channel();
            let ask = Ask {
                topic: topic.into(),
                partition,
                at,
                isolation,
                reply,
            };
            // A retry waits for the next retry round, with every other partition left out
            // since the last one: thousands waiting for their logs cost one request per
            // broker a round, not one each.
            let (queue, window) = match retry {
                false => (&self.lookups, WINDOW),
                true => (&self.lookup_retries, RETRY_WINDOW),
            };
            if queue.push(ask) {
                tokio::spawn(flush(self.clone(), retry, window));
            }
            if let Ok(Some(offset)) = answer.await {
                return Ok(offset);
            }
            if tokio::time::Instant::now() + RETRY_WINDOW >= deadline {
                break;
            }
            retry = true;
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
        // Once on its own, for the broker's own answer: retried one by one, thousands of
        // partitions still waiting would each send requests as fast as the retries allow. The
        // caller backs off and asks again. Boxed: the lookup's future is kilobytes, and inline
        // it would size every ask waiting for its batch (thousands when a flow starts).
        Box::pin(self.list_offset_once(topic, partition, at, isolation)).await
    }
}

/// How long a retry round gathers the partitions left out of earlier answers.
const RETRY_WINDOW: Duration = Duration::from_millis(250);

/// Sends every queued ask, one request per (broker, kind of lookup), and answers each.
async fn flush(cluster: Arc<KafkaCluster>, retries: bool, window: Duration) {
    let queue = match retries {
        false => &cluster.lookups,
        true => &cluster.lookup_retries,
    };
    let asks = queue.take_after(window).await;
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
