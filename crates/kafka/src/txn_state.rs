//! What brokers say about transactions: the coordinator's view of a transactional id
//! (DescribeTransactions, KIP-664) and a partition leader's view of the producers writing to it
//! (DescribeProducers, KIP-664). Both need only Describe on the transactional id and Read on the
//! topic, no cluster rights. Used to find transactions whose marker a partition never got
//! (docs/engine.md, "Transactions whose marker was dropped") and by `verify`.

use crate::cluster::KafkaCluster;
use crate::error::{KafkaError, Result};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::{
    ApiKey, DescribeProducersRequest, DescribeTransactionsRequest, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A transactional id's state at its coordinator (the coordinator's `TransactionState` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnPhase {
    /// No transaction since the last InitProducerId.
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    /// Expired, or a state this client does not know.
    Other,
}

impl TxnPhase {
    pub fn parse(state: &str) -> TxnPhase {
        match state {
            "Empty" => TxnPhase::Empty,
            "Ongoing" => TxnPhase::Ongoing,
            "PrepareCommit" => TxnPhase::PrepareCommit,
            "PrepareAbort" => TxnPhase::PrepareAbort,
            "CompleteCommit" => TxnPhase::CompleteCommit,
            "CompleteAbort" => TxnPhase::CompleteAbort,
            _ => TxnPhase::Other,
        }
    }

    /// Markers are still being written: a partition's producer state is not final yet.
    pub fn completing(self) -> bool {
        matches!(self, TxnPhase::PrepareCommit | TxnPhase::PrepareAbort)
    }

    /// The result the last (or current) transaction has or will have: true for commit. An
    /// ongoing transaction is aborted by the next InitProducerId; Empty says nothing.
    pub fn result(self) -> Option<bool> {
        match self {
            TxnPhase::PrepareCommit | TxnPhase::CompleteCommit => Some(true),
            TxnPhase::Ongoing | TxnPhase::PrepareAbort | TxnPhase::CompleteAbort => Some(false),
            TxnPhase::Empty | TxnPhase::Other => None,
        }
    }
}

/// The coordinator's answer for one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnDescription {
    pub phase: TxnPhase,
    pub producer_id: i64,
    pub epoch: i16,
    /// Partitions of the open transaction (empty once it completed).
    pub partitions: Vec<(String, i32)>,
}

/// One producer's state on a partition leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerOnPartition {
    pub producer_id: i64,
    pub epoch: i32,
    pub last_timestamp: i64,
    /// First offset of the producer's open transaction on this partition; -1 when none.
    pub open_since: i64,
}

/// A partition leader's answer: its producers, or why it could not say (no leader now, not
/// the leader any more).
pub type ProducersAnswer = std::result::Result<Vec<ProducerOnPartition>, KafkaError>;

impl KafkaCluster {
    /// The coordinator's view of `id`; None when the coordinator does not know it.
    pub async fn describe_transaction(&self, id: &str) -> Result<Option<TxnDescription>> {
        let conn = crate::coordinator::find_coordinator(self, id, 1).await?;
        describe_transaction_on(&conn, id).await
    }
}

/// DescribeTransactions for `id`, asked of `conn` (its coordinator).
pub async fn describe_transaction_on(
    conn: &crate::conn::Connection,
    id: &str,
) -> Result<Option<TxnDescription>> {
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(StrBytes::from_string(id.to_string()))]);
    let resp = conn.send(&req).await?;
    let Some(s) = resp.transaction_states.first() else {
        return Err(KafkaError::Protocol {
            broker: conn.broker().into(),
            api: ApiKey::DescribeTransactions,
            message: "no state in the answer".into(),
        });
    };
    match s.error_code.err() {
        None => {}
        Some(kafka_protocol::error::ResponseError::TransactionalIdNotFound) => return Ok(None),
        Some(error) => {
            return Err(KafkaError::Broker {
                broker: conn.broker().into(),
                api: ApiKey::DescribeTransactions,
                error,
                message: None,
            })
        }
    }
    Ok(Some(TxnDescription {
        phase: TxnPhase::parse(&s.transaction_state),
        producer_id: s.producer_id.0,
        epoch: s.producer_epoch,
        partitions: s
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic.0.to_string(), *p))
            })
            .collect(),
    }))
}

impl KafkaCluster {
    /// Each partition's producers, asked of its leader (one request per leader). A partition
    /// without a leader, or whose leader said it is not, answers with the error; the metadata
    /// is reloaded for the next call.
    pub async fn describe_producers(
        &self,
        partitions: &[(Arc<str>, i32)],
    ) -> BTreeMap<(Arc<str>, i32), ProducersAnswer> {
        let mut out = BTreeMap::new();
        let mut by_leader: BTreeMap<i32, BTreeMap<Arc<str>, Vec<i32>>> = BTreeMap::new();
        for (t, p) in partitions {
            match self.leader_of(t, *p) {
                Ok((leader, _)) => by_leader
                    .entry(leader)
                    .or_default()
                    .entry(t.clone())
                    .or_default()
                    .push(*p),
                Err(e) => {
                    out.insert((t.clone(), *p), Err(e));
                }
            }
        }
        let asks = by_leader.into_iter().map(|(leader, topics)| async move {
            let answer = self.describe_producers_on(leader, &topics).await;
            (topics, answer)
        });
        let mut stale = false;
        for (topics, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(mut found) => {
                    for (t, ps) in topics {
                        for p in ps {
                            let a = found.remove(&(t.clone(), p)).unwrap_or_else(|| {
                                Err(KafkaError::Config(format!(
                                    "{t}-{p}: no answer in DescribeProducers"
                                )))
                            });
                            stale |= a.as_ref().is_err_and(|e| e.is_stale_metadata());
                            out.insert((t.clone(), p), a);
                        }
                    }
                }
                Err(e) => {
                    stale = true;
                    for (t, ps) in topics {
                        for p in ps {
                            out.insert((t.clone(), p), Err(e.duplicate()));
                        }
                    }
                }
            }
        }
        if stale || out.values().any(|a| a.is_err()) {
            let _ = self.refresh_metadata(None).await;
        }
        out
    }

    async fn describe_producers_on(
        &self,
        leader: i32,
        topics: &BTreeMap<Arc<str>, Vec<i32>>,
    ) -> Result<BTreeMap<(Arc<str>, i32), ProducersAnswer>> {
        let conn = self.broker(leader).await?;
        let req = DescribeProducersRequest::default().with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    TopicRequest::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(ps.clone())
                })
                .collect(),
        );
        let resp = conn.send(&req).await?;
        let mut out = BTreeMap::new();
        for t in &resp.topics {
            let Some((topic, _)) = topics.get_key_value(t.name.0.as_str()) else {
                continue;
            };
            for p in &t.partitions {
                let answer = match p.error_code.err() {
                    Some(error) => Err(KafkaError::Broker {
                        broker: conn.broker().into(),
                        api: ApiKey::DescribeProducers,
                        error,
                        message: p.error_message.as_ref().map(|m| m.to_string()),
                    }),
                    None => Ok(p
                        .active_producers
                        .iter()
                        .map(|s| ProducerOnPartition {
                            producer_id: s.producer_id.0,
                            epoch: s.producer_epoch,
                            last_timestamp: s.last_timestamp,
                            open_since: s.current_txn_start_offset,
                        })
                        .collect()),
                };
                out.insert((topic.clone(), p.partition_index), answer);
            }
        }
        Ok(out)
    }
}

/// Errors after which a check cannot be made at all (a broker before KIP-664, Kafka 2.8 or 3.0;
/// a principal without Describe on the id or Read on the topic): retrying would not help.
pub fn cannot_check(e: &KafkaError) -> bool {
    use kafka_protocol::error::ResponseError as R;
    matches!(e, KafkaError::UnsupportedVersion { .. })
        || matches!(
            e,
            KafkaError::Broker {
                error: R::TopicAuthorizationFailed
                    | R::TransactionalIdAuthorizationFailed
                    | R::ClusterAuthorizationFailed
                    | R::UnsupportedVersion,
                ..
            }
        )
}

/// Where one of `producer_ids` holds a transaction open on a partition: the first offset of it.
pub fn open_since(producers: &[ProducerOnPartition], producer_ids: &[i64]) -> Option<i64> {
    producers
        .iter()
        .filter(|p| producer_ids.contains(&p.producer_id) && p.open_since >= 0)
        .map(|p| p.open_since)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_say_what_result_a_transaction_has() {
        assert_eq!(TxnPhase::parse("CompleteCommit").result(), Some(true));
        assert_eq!(TxnPhase::parse("PrepareCommit").result(), Some(true));
        assert_eq!(TxnPhase::parse("CompleteAbort").result(), Some(false));
        assert_eq!(TxnPhase::parse("Ongoing").result(), Some(false));
        assert_eq!(TxnPhase::parse("Empty").result(), None);
        assert_eq!(TxnPhase::parse("Dead"), TxnPhase::Other);
        assert!(TxnPhase::PrepareAbort.completing());
        assert!(!TxnPhase::CompleteAbort.completing());
    }

    #[test]
    fn only_our_producers_open_transactions_count() {
        let p = |id, open| ProducerOnPartition {
            producer_id: id,
            epoch: 0,
            last_timestamp: 0,
            open_since: open,
        };
        let answer = [p(7, -1), p(8, 40), p(9, 12)];
        assert_eq!(open_since(&answer, &[7]), None);
        assert_eq!(open_since(&answer, &[8]), Some(40));
        assert_eq!(open_since(&answer, &[7, 8, 9]), Some(12));
        assert_eq!(open_since(&answer, &[10]), None);
    }
}
