//! Single-partition fetches asked by many callers at about the same time, sent as one Fetch
//! request per broker, as [`super::offset_lookup`] does for ListOffsets.
//!
//! When 1,000 partitions start after a restart, each reads the short tail of its target and
//! source logs to learn what the target holds already (docs/engine.md, "Resuming from what the
//! target holds"). A broker answers one request per connection at a time: asked one by one,
//! those reads cost thousands of round trips, a second or more before the last partition
//! copies. Here the asks of a short window go out together; a partition the batched answer
//! leaves out (an error, no leader, a damaged batch) is fetched again on its own through
//! [`KafkaCluster::fetch`], with its retries and its errors, so the batch never changes what
//! a caller sees.

use super::partition_requests::{fetch_partition, partition_answer, PartitionFetch};
use super::{data_channel, isolation_byte, KafkaCluster};
use crate::error::Result;
use crate::settings::IsolationLevel;
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::{BrokerId, FetchRequest};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long the first ask waits for others to join it.
const WINDOW: Duration = Duration::from_millis(2);

pub(crate) type Fetches = super::coalesce::Coalesce<Ask>;

#[derive(Debug)]
pub(crate) struct Ask {
    topic: String,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    isolation: IsolationLevel,
    reply: oneshot::Sender<Option<PartitionFetch>>,
}

impl KafkaCluster {
    /// [`KafkaCluster::fetch`] without waiting for data (`max_wait` zero), sent together with
    /// the other fetches asked at about the same time (one request per broker). Same answer,
    /// retries and errors as `fetch`.
    pub async fn fetch_batched(
        self: &Arc<Self>,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        isolation: IsolationLevel,
    ) -> Result<PartitionFetch> {
        let (reply, answer) = oneshot::channel();
        let first = self.fetches.push(Ask {
            topic: topic.into(),
            partition,
            offset,
            max_bytes,
            isolation,
            reply,
        });
        if first {
            tokio::spawn(flush(self.clone()));
        }
        match answer.await {
            Ok(Some(fetched)) => Ok(fetched),
            // Left out of the batched answer: on its own, with retries and the exact error.
            // Boxed: the retrying fetch's future is kilobytes (see `list_offset_batched`).
            _ => {
                Box::pin(self.fetch(
                    topic,
                    partition,
                    offset,
                    max_bytes,
                    Duration::ZERO,
                    isolation,
                ))
                .await
            }
        }
    }
}

/// Sends every queued ask, one request per (leader, isolation level), and answers each.
async fn flush(cluster: Arc<KafkaCluster>) {
    let asks = cluster.fetches.take_after(WINDOW).await;
    // Asks left out (no leader known, a partition asked twice) are dropped unanswered: their
    // callers fetch on their own.
    let (groups, _alone) = group(asks, |t, p| cluster.leader_of(t, p).ok());
    // Every broker's request is written before any answer is awaited, so the brokers work on
    // them at the same time.
    let mut asked = Vec::with_capacity(groups.len());
    for ((leader, _), asks) in groups {
        let isolation = asks[0].0.isolation;
        let submitted = async {
            let (topic, partition) = (&asks[0].0.topic, asks[0].0.partition);
            let conn = cluster
                .broker_channel(leader, data_channel(topic, partition))
                .await?;
            let version = conn.version::<FetchRequest>()?;
            let mut topics: BTreeMap<&str, Vec<_>> = BTreeMap::new();
            let mut total: i64 = 0;
            for (a, epoch) in &asks {
                total += i64::from(a.max_bytes.max(0));
                topics.entry(&a.topic).or_default().push(fetch_partition(
                    a.partition,
                    *epoch,
                    a.offset,
                    a.max_bytes,
                ));
            }
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_min_bytes(1)
                .with_max_bytes(total.min(i64::from(i32::MAX)) as i32)
                .with_isolation_level(isolation_byte(isolation))
                .with_session_epoch(-1)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, ps)| cluster.fetch_topic(version, t, ps))
                        .collect(),
                );
            // v13+ answers by topic id (KIP-516), older versions by name.
            let names: HashMap<_, String> = asks
                .iter()
                .map(|(a, _)| (cluster.topic_id(&a.topic), a.topic.clone()))
                .collect();
            let answer = conn.submit(&req, version).await?;
            Ok::<_, crate::KafkaError>((conn, names, answer))
        }
        .await;
        asked.push((asks, submitted));
    }
    for (asks, submitted) in asked {
        let Ok((conn, names, answer)) = submitted else {
            continue;
        };
        let Ok(resp) = answer.wait().await else {
            continue;
        };
        if resp.error_code.err().is_some() {
            continue;
        }
        let mut by_partition: HashMap<(String, i32), Ask> = asks
            .into_iter()
            .map(|(a, _)| ((a.topic.clone(), a.partition), a))
            .collect();
        for t in resp.responses {
            let name = if t.topic.0.is_empty() {
                names.get(&t.topic_id).cloned()
            } else {
                Some(t.topic.0.to_string())
            };
            let Some(name) = name else { continue };
            for mut p in t.partitions {
                let Some(a) = by_partition.remove(&(name.clone(), p.partition_index)) else {
                    continue;
                };
                if p.error_code.err().is_some() {
                    continue;
                }
                if let Ok(fetched) = partition_answer(conn.broker(), &name, &mut p, a.offset) {
                    let _ = a.reply.send(Some(fetched));
                }
            }
        }
    }
}

/// Asks grouped by (leader, isolation level), each with its leader epoch; `leader` gives a
/// partition's (leader, epoch). Left out: asks whose leader is not known, and a second ask of
/// a partition already in its group (a Fetch request names each partition once).
#[allow(clippy::type_complexity)]
fn group(
    asks: Vec<Ask>,
    leader: impl Fn(&str, i32) -> Option<(i32, i32)>,
) -> (BTreeMap<(i32, u8), Vec<(Ask, i32)>>, Vec<Ask>) {
    let mut groups: BTreeMap<(i32, u8), Vec<(Ask, i32)>> = BTreeMap::new();
    let mut alone = Vec::new();
    for a in asks {
        let Some((id, epoch)) = leader(&a.topic, a.partition) else {
            alone.push(a);
            continue;
        };
        let g = groups
            .entry((id, isolation_byte(a.isolation) as u8))
            .or_default();
        if g.iter()
            .any(|(b, _)| b.topic == a.topic && b.partition == a.partition)
        {
            alone.push(a);
        } else {
            g.push((a, epoch));
        }
    }
    (groups, alone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(topic: &str, partition: i32, isolation: IsolationLevel) -> Ask {
        Ask {
            topic: topic.into(),
            partition,
            offset: 0,
            max_bytes: 1024,
            isolation,
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn asks_are_grouped_by_leader_and_isolation_and_a_partition_goes_once_per_request() {
        let leader = |t: &str, p: i32| match (t, p) {
            ("gone", _) => None,
            (_, p) => Some((p % 2, 7)),
        };
        let (groups, alone) = group(
            vec![
                ask("a", 0, IsolationLevel::ReadCommitted),
                ask("a", 1, IsolationLevel::ReadCommitted),
                ask("a", 2, IsolationLevel::ReadCommitted),
                ask("a", 0, IsolationLevel::ReadUncommitted),
                ask("a", 0, IsolationLevel::ReadCommitted),
                ask("gone", 0, IsolationLevel::ReadCommitted),
            ],
            leader,
        );
        let names = |k: (i32, u8)| -> Vec<(String, i32, i32)> {
            groups[&k]
                .iter()
                .map(|(a, e)| (a.topic.clone(), a.partition, *e))
                .collect()
        };
        let rc = isolation_byte(IsolationLevel::ReadCommitted) as u8;
        let ru = isolation_byte(IsolationLevel::ReadUncommitted) as u8;
        assert_eq!(groups.len(), 3);
        assert_eq!(names((0, rc)), vec![("a".into(), 0, 7), ("a".into(), 2, 7)]);
        assert_eq!(names((1, rc)), vec![("a".into(), 1, 7)]);
        assert_eq!(names((0, ru)), vec![("a".into(), 0, 7)]);
        let left: Vec<(&str, i32)> = alone
            .iter()
            .map(|a| (a.topic.as_str(), a.partition))
            .collect();
        assert_eq!(left, vec![("a", 0), ("gone", 0)]);
    }
}
