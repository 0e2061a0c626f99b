//! ListOffsets: for one partition, and for many in one request per leader broker
//! ([`super::offset_lookup`] gathers the asks of many callers into the latter).

use super::{broker_error, isolation_byte, KafkaCluster};
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::settings::IsolationLevel;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The earliest offset, for ListOffsets.
pub const EARLIEST: i64 = -2;
/// The next offset to be written (the high watermark, or the LSO for read_committed).
pub const LATEST: i64 = -1;

/// One ListOffsets for one partition on `conn`, its leader at leader epoch `epoch`; no retry
/// (callers that retry ask again with new metadata).
pub(super) async fn list_offset_on(
    conn: &Connection,
    topic: &str,
    partition: i32,
    epoch: i32,
    at: i64,
    isolation: IsolationLevel,
) -> Result<i64> {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_byte(isolation))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(epoch)
                .with_timestamp(at)])]);
    let resp = conn.send(&req).await?;
    let p = resp
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| conn.empty_response(ApiKey::ListOffsets))?;
    if let Some(e) = broker_error(conn.broker(), ApiKey::ListOffsets, p.error_code, None) {
        return Err(e);
    }
    Ok(p.offset)
}

impl KafkaCluster {
    /// ListOffsets for one partition: [`EARLIEST`], [`LATEST`] or a timestamp.
    pub async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        self.retrying(topic, true, || {
            self.list_offset_once(topic, partition, at, isolation)
        })
        .await
    }

    /// One ListOffsets for one partition to its leader as the metadata names it, no retry.
    pub(super) async fn list_offset_once(
        &self,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        let (leader, epoch) = self.leader_of(topic, partition)?;
        let conn = self.broker(leader).await?;
        list_offset_on(&conn, topic, partition, epoch, at, isolation).await
    }

    /// ListOffsets for many partitions: one request per leader broker, so thousands of
    /// partitions cost a few round trips. A partition whose batched answer is an error is asked
    /// again on its own (with the usual retries); one that still fails is left out.
    pub async fn list_offsets(
        &self,
        partitions: &[(String, i32)],
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<HashMap<(String, i32), i64>> {
        let round = self.list_offsets_once(partitions, at, isolation).await;
        let mut out = round.found;
        for (t, p) in round.retry {
            if let Ok(o) = self.list_offset(&t, p, at, isolation).await {
                out.insert((t, p), o);
            }
        }
        Ok(out)
    }

    /// One ListOffsets request per leader broker, no retries: the offsets answered and the
    /// partitions a retry may answer. A partition asked twice is asked once (a broker refuses a request naming a
    /// partition twice with INVALID_REQUEST for it).
    pub(crate) async fn list_offsets_once(
        &self,
        partitions: &[(String, i32)],
        at: i64,
        isolation: IsolationLevel,
    ) -> OffsetsRound {
        let mut by_leader: BTreeMap<i32, BTreeMap<String, BTreeMap<i32, i32>>> = BTreeMap::new();
        for (t, p) in partitions {
            // No leader known: left for a retry (below, as everything not answered).
            if let Ok((leader, epoch)) = self.leader_of(t, *p) {
                by_leader
                    .entry(leader)
                    .or_default()
                    .entry(t.clone())
                    .or_default()
                    .insert(*p, epoch);
            }
        }
        // Every broker's request is written before any answer is awaited, so the brokers work
        // on them at the same time (connections are opened one after another, once).
        let mut asked = Vec::with_capacity(by_leader.len());
        for (leader, topics) in by_leader {
            let submitted = async {
                let conn = self.broker(leader).await?;
                let req = ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_isolation_level(isolation_byte(isolation))
                    .with_topics(
                        topics
                            .iter()
                            .map(|(t, ps)| {
                                ListOffsetsTopic::default()
                                    .with_name(TopicName(StrBytes::from_string(t.clone())))
                                    .with_partitions(
                                        ps.iter()
                                            .map(|(p, epoch)| {
                                                ListOffsetsPartition::default()
                                                    .with_partition_index(*p)
                                                    .with_current_leader_epoch(*epoch)
                                                    .with_timestamp(at)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    );
                let version = conn.version::<ListOffsetsRequest>()?;
                Ok::<_, KafkaError>((conn.broker().to_string(), conn.submit(&req, version).await?))
            }
            .await;
            asked.push((topics, submitted));
        }
        let mut round = OffsetsRound::default();
        let mut gave_up: HashSet<(String, i32)> = HashSet::new();
        for (topics, submitted) in asked {
            let answered = match submitted {
                Ok((broker, answer)) => answer.wait().await.map(|resp| (broker, resp)),
                Err(e) => Err(e),
            };
            let (broker, resp) = match answered {
                Ok(answered) => answered,
                Err(e) => {
                    // Authentication, TLS, an unsupported version: asking again will not help.
                    if !(e.is_retriable() || e.is_stale_metadata()) {
                        gave_up.extend(
                            topics
                                .iter()
                                .flat_map(|(t, ps)| ps.keys().map(move |p| (t.clone(), *p))),
                        );
                    }
                    continue;
                }
            };
            for t in &resp.topics {
                for p in &t.partitions {
                    let key = (t.name.0.to_string(), p.partition_index);
                    match broker_error(&broker, ApiKey::ListOffsets, p.error_code, None) {
                        None => {
                            round.found.insert(key, p.offset);
                        }
                        Some(e) if e.is_retriable() || e.is_stale_metadata() => {}
                        Some(_) => {
                            gave_up.insert(key);
                        }
                    }
                }
            }
        }
        // Whatever is neither answered nor given up is retried: no leader known, a retriable
        // error, a request that failed, or a partition the broker's answer left out.
        let mut retry: BTreeSet<(String, i32)> = BTreeSet::new();
        for k in partitions {
            if !round.found.contains_key(k) && !gave_up.contains(k) {
                retry.insert(k.clone());
            }
        }
        round.retry = retry.into_iter().collect();
        round
    }
}

/// What one round of batched ListOffsets requests found.
#[derive(Debug, Default)]
pub(crate) struct OffsetsRound {
    pub(crate) found: HashMap<(String, i32), i64>,
    /// Not answered for a reason a retry can fix (each partition once); partitions answered
    /// with an error no retry fixes are in neither list.
    pub(crate) retry: Vec<(String, i32)>,
}
