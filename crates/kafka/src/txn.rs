//! Transactions: a transactional producer (InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn + TxnOffsetCommit, EndTxn), and the read_committed view of
//! a fetch (aborted transactions and control batches removed).
//!
//! The client speaks the pre-KIP-890 protocol (explicit AddPartitionsToTxn, Produce up to v11,
//! EndTxn up to v4), which Kafka 2.x to 4.x brokers all accept.

use crate::admin::{commit_topics, CommittedOffset};
use crate::batch::RawBatch;
use crate::cluster::{produce_answer, KafkaCluster, PartitionFetch};
use crate::committed::{marker, Marker};
use crate::conn::Connection;
use crate::coordinator::find_coordinator;
pub use crate::coordinator::find_coordinator_node;
use crate::error::{KafkaError, Result};
use crate::settings::IsolationLevel;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, GroupId,
    InitProducerIdRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
    TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A producer that writes in transactions. One transaction at a time; sends are sequential.
#[derive(Debug)]
pub struct TransactionalProducer {
    cluster: Arc<KafkaCluster>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    coordinator: Arc<Connection>,
    sequences: HashMap<(String, i32), i32>,
    added: HashSet<(String, i32)>,
    offsets_added: BTreeSet<String>,
}

impl TransactionalProducer {
    /// Registers the transactional id; a previous producer with the same id is fenced.
    pub async fn init(
        cluster: Arc<KafkaCluster>,
        transactional_id: &str,
        timeout: Duration,
    ) -> Result<TransactionalProducer> {
        let coordinator = cluster
            .retrying("", true, || find_coordinator(&cluster, transactional_id, 1))
            .await?;
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(transactional_id))))
            .with_transaction_timeout_ms(timeout.as_millis() as i32)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let resp = cluster
            .retrying("", true, || async {
                let r = coordinator.send(&req).await?;
                match r.error_code.err() {
                    None => Ok(r),
                    Some(error) => Err(KafkaError::Broker {
                        broker: coordinator.broker().into(),
                        api: ApiKey::InitProducerId,
                        error,
                        message: None,
                    }),
                }
            })
            .await?;
        Ok(TransactionalProducer {
            cluster,
            transactional_id: transactional_id.into(),
            producer_id: resp.producer_id.0,
            epoch: resp.producer_epoch,
            coordinator,
            sequences: HashMap::new(),
            added: HashSet::new(),
            offsets_added: BTreeSet::new(),
        })
    }

    pub fn identity(&self) -> (i64, i16) {
        (self.producer_id, self.epoch)
    }

    fn fenced_or(&self, conn: &Connection, api: ApiKey, code: i16) -> Result<()> {
        match code.err() {
            None => Ok(()),
            Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch) => {
                Err(KafkaError::Fenced {
                    transactional_id: self.transactional_id.clone(),
                })
            }
            Some(error) => Err(KafkaError::Broker {
                broker: conn.broker().into(),
                api,
                error,
                message: None,
            }),
        }
    }

    /// Produces one batch in the open transaction and returns its base offset.
    pub async fn send(&mut self, topic: &str, partition: i32, batch: &RawBatch) -> Result<i64> {
        let key = (topic.to_string(), partition);
        if !self.added.contains(&key) {
            // CONCURRENT_TRANSACTIONS while the previous transaction completes is retried.
            self.cluster
                .retrying("", true, || self.add_partition_once(topic, partition))
                .await?;
            self.added.insert(key.clone());
        }
        let seq = *self.sequences.get(&key).unwrap_or(&0);
        let out = batch.rewrite_for_produce(self.producer_id, self.epoch, seq, true);
        let (leader, _) = self.cluster.leader_of(topic, partition)?;
        let conn = self.cluster.broker(leader).await?;
        // Up to v11: v12+ implies the KIP-890 protocol, where partitions are added implicitly.
        let version = conn.version::<ProduceRequest>()?.min(11);
        let req = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(s(&self.transactional_id))))
            .with_acks(-1)
            .with_timeout_ms(self.cluster.settings().request_timeout.as_millis() as i32)
            .with_topic_data(vec![self.cluster.produce_topic(
                version,
                topic,
                partition,
                out.into_bytes(),
            )]);
        let resp = conn.submit(&req, version).await?.wait().await?;
        let p = produce_answer(&conn, &resp)?;
        self.fenced_or(&conn, ApiKey::Produce, p.error_code)?;
        self.sequences
            .insert(key, seq.wrapping_add(batch.record_count()).max(0));
        Ok(p.base_offset)
    }

    async fn add_partition_once(&self, topic: &str, partition: i32) -> Result<()> {
        let version = self
            .coordinator
            .version::<AddPartitionsToTxnRequest>()?
            .min(3);
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_v3_and_below_producer_id(ProducerId(self.producer_id))
            .with_v3_and_below_producer_epoch(self.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![partition])]);
        let resp = self.coordinator.submit(&req, version).await?.wait().await?;
        for t in &resp.results_by_topic_v3_and_below {
            for p in &t.results_by_partition {
                self.fenced_or(
                    &self.coordinator,
                    ApiKey::AddPartitionsToTxn,
                    p.partition_error_code,
                )?;
            }
        }
        Ok(())
    }

    async fn add_offsets_once(&self, group: &str) -> Result<()> {
        let req = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.epoch)
            .with_group_id(GroupId(s(group)));
        let resp = self.coordinator.send(&req).await?;
        self.fenced_or(&self.coordinator, ApiKey::AddOffsetsToTxn, resp.error_code)
    }

    /// Adds consumer-group offsets to the open transaction (committed with it).
    pub async fn send_offsets(
        &mut self,
        group: &str,
        offsets: &BTreeMap<String, BTreeMap<i32, CommittedOffset>>,
    ) -> Result<()> {
        if !self.offsets_added.contains(group) {
            self.cluster
                .retrying("", true, || self.add_offsets_once(group))
                .await?;
            self.offsets_added.insert(group.into());
        }
        // Retried while the group coordinator loads; a fenced producer is not retried.
        self.cluster
            .retrying("", true, || self.txn_offset_commit_once(group, offsets))
            .await
    }

    async fn txn_offset_commit_once(
        &self,
        group: &str,
        offsets: &BTreeMap<String, BTreeMap<i32, CommittedOffset>>,
    ) -> Result<()> {
        let conn = self.cluster.coordinator(group).await?;
        let req = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_group_id(GroupId(s(group)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.epoch)
            .with_generation_id(-1)
            .with_member_id(StrBytes::default())
            .with_topics(commit_topics!(
                TxnOffsetCommitRequestTopic,
                TxnOffsetCommitRequestPartition,
                offsets
            ));
        let resp = conn.send(&req).await?;
        for t in &resp.topics {
            for p in &t.partitions {
                self.fenced_or(&conn, ApiKey::TxnOffsetCommit, p.error_code)?;
            }
        }
        Ok(())
    }

    /// Commits the open transaction.
    pub async fn commit(&mut self) -> Result<()> {
        self.end(true).await
    }

    /// Aborts the open transaction: nothing written in it becomes visible to read_committed.
    pub async fn abort(&mut self) -> Result<()> {
        self.end(false).await
    }

    async fn end(&mut self, committed: bool) -> Result<()> {
        let version = self.coordinator.version::<EndTxnRequest>()?.min(4);
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.epoch)
            .with_committed(committed);
        let resp = self.coordinator.submit(&req, version).await?.wait().await?;
        self.fenced_or(&self.coordinator, ApiKey::EndTxn, resp.error_code)?;
        self.added.clear();
        self.offsets_added.clear();
        Ok(())
    }
}

impl PartitionFetch {
    /// The batches a reader at `isolation` sees: never control batches, and with read_committed
    /// not the batches of aborted transactions either. The one filter every reader of data uses
    /// (both copy loops, resume, verify).
    pub fn visible(&self, isolation: IsolationLevel) -> Vec<&RawBatch> {
        match isolation {
            IsolationLevel::ReadCommitted => self.committed_batches(),
            IsolationLevel::ReadUncommitted => {
                self.batches.iter().filter(|b| !b.is_control()).collect()
            }
        }
    }

    /// How far a reader at `isolation` may read: the last stable offset or the high watermark.
    pub fn readable_end(&self, isolation: IsolationLevel) -> i64 {
        match isolation {
            IsolationLevel::ReadCommitted => self.last_stable_offset,
            IsolationLevel::ReadUncommitted => self.high_watermark,
        }
    }

    /// The batches a read_committed consumer sees: control batches and the batches of aborted
    /// transactions (per the fetch response's aborted-transaction list) are removed.
    pub fn committed_batches(&self) -> Vec<&RawBatch> {
        let mut aborted: Vec<(i64, i64)> = self.aborted.clone();
        aborted.sort_by_key(|a| a.1);
        let mut next = 0;
        let mut ongoing: HashSet<i64> = HashSet::new();
        let mut out = Vec::new();
        for b in &self.batches {
            while next < aborted.len() && aborted[next].1 <= b.last_offset() {
                ongoing.insert(aborted[next].0);
                next += 1;
            }
            if b.is_control() {
                // An ABORT marker (control record type 0) ends that producer's aborted transaction.
                if ongoing.contains(&b.producer_id())
                    && matches!(marker(b), Ok(Some(Marker::Abort)))
                {
                    ongoing.remove(&b.producer_id());
                }
                continue;
            }
            if b.is_transactional() && ongoing.contains(&b.producer_id()) {
                continue;
            }
            out.push(b);
        }
        out
    }
}
