//! ListOffsets asked by many callers at about the same time, sent as one request per broker.
//!
//! When a flow starts, each of its partitions looks up where to start on the source and where
//! the target log ends. Asked one by one, on the one control connection a broker has (it answers
//! one request per connection at a time), 1,000 partitions cost 2,000 round trips, several
//! seconds before the first record moves. Here the asks that arrive within a short window go
//! out together ([`KafkaCluster::list_offsets_once`]); a partition the batched answer left out
//! (no leader yet, an error) is asked again on its own, with the usual retries, so one slow
//! partition never holds up the others.

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
    /// same time (one request per broker). Same answer and retries as `list_offset`.
    pub async fn list_offset_batched(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
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
        match answer.await {
            Ok(Some(offset)) => Ok(offset),
            // Left out of the batched answer (or the flush failed): on its own, with retries.
            // Boxed: the retrying lookup's future is kilobytes, and inline it would size every
            // ask waiting for its batch (thousands when a flow starts).
            _ => Box::pin(self.list_offset(topic, partition, at, isolation)).await,
        }
    }
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
