//! Fetch and Produce for one partition at a time, with no session and no pipelining: what log
//! recovery, the log reader, tools and tests need. Copying goes through [`crate::fetcher`] and
//! [`crate::producer`].

use super::offsets::list_offset_on;
use super::{broker_error, data_channel, isolation_byte, KafkaCluster, EARLIEST, LATEST};
use crate::batch::{keep_until_corrupt, split_batches, RawBatch};
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::settings::IsolationLevel;
use bytes::Bytes;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::time::Duration;

/// Result of fetching one partition.
#[derive(Debug, Clone)]
pub struct PartitionFetch {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Whole batches, in offset order; batches ending before the fetch offset are dropped.
    pub batches: Vec<RawBatch>,
    /// (producer id, first offset) of transactions aborted in the fetched range.
    pub aborted: Vec<(i64, i64)>,
}

impl PartitionFetch {
    /// One partition's answer: its positions and aborted transactions, with `batches` split
    /// from its records (taken out of it before).
    pub(crate) fn new(p: &PartitionData, batches: Vec<RawBatch>) -> Self {
        PartitionFetch {
            high_watermark: p.high_watermark,
            last_stable_offset: p.last_stable_offset,
            log_start_offset: p.log_start_offset,
            batches,
            aborted: p
                .aborted_transactions
                .iter()
                .flatten()
                .map(|a| (a.producer_id.0, a.first_offset))
                .collect(),
        }
    }
}

impl KafkaCluster {
    /// Produces one batch to one partition with acks=all and returns its base offset on the
    /// target. (The pipelined idempotent producer builds on this request shape.)
    /// Retried only on stale leadership (nothing was written then); a timeout is returned, since
    /// without idempotence a retry could duplicate the batch.
    pub async fn produce(&self, topic: &str, partition: i32, batch: &RawBatch) -> Result<i64> {
        self.retrying(topic, false, || self.produce_once(topic, partition, batch))
            .await
    }

    async fn produce_once(&self, topic: &str, partition: i32, batch: &RawBatch) -> Result<i64> {
        let (leader, _) = self.leader_of(topic, partition)?;
        let conn = self.broker(leader).await?;
        let version = conn.version::<ProduceRequest>()?;
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(self.settings.request_timeout.as_millis() as i32)
            .with_topic_data(vec![self.produce_topic(
                version,
                topic,
                partition,
                batch.bytes().clone(),
            )]);
        let resp = conn.submit(&req, version).await?.wait().await?;
        let p = produce_answer(&conn, &resp)?;
        if let Some(e) = broker_error(
            conn.broker(),
            ApiKey::Produce,
            p.error_code,
            p.error_message.as_ref(),
        ) {
            return Err(e);
        }
        Ok(p.base_offset)
    }

    /// Fetches raw batches of one partition from `offset`.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        max_wait: Duration,
        isolation: IsolationLevel,
    ) -> Result<PartitionFetch> {
        self.retrying(topic, true, || async move {
            let (leader, epoch) = self.leader_of(topic, partition)?;
            let conn = self
                .broker_channel(leader, data_channel(topic, partition))
                .await?;
            let version = conn.version::<FetchRequest>()?;
            let ft = self.fetch_topic(
                version,
                topic,
                vec![fetch_partition(partition, epoch, offset, max_bytes)],
            );
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(max_wait.as_millis() as i32)
                .with_min_bytes(1)
                .with_max_bytes(max_bytes)
                .with_isolation_level(isolation_byte(isolation))
                .with_session_epoch(-1)
                .with_topics(vec![ft]);
            let resp = conn.submit(&req, version).await?.wait().await?;
            if let Some(e) = broker_error(conn.broker(), ApiKey::Fetch, resp.error_code, None) {
                return Err(e);
            }
            let mut p = resp
                .responses
                .into_iter()
                .next()
                .and_then(|t| t.partitions.into_iter().next())
                .ok_or_else(|| conn.empty_response(ApiKey::Fetch))?;
            if p.error_code.err() == Some(ResponseError::OffsetOutOfRange) {
                // The caller decides (stop, or resume at the log start): tell it where the log is,
                // as the same leader says (one attempt each: an error here is this attempt's).
                let bounds = |at| list_offset_on(&conn, topic, partition, epoch, at, isolation);
                let log_start = bounds(EARLIEST).await?;
                let log_end = bounds(LATEST).await?;
                return Err(KafkaError::OffsetOutOfRange {
                    topic: topic.into(),
                    partition,
                    requested: offset,
                    log_start,
                    log_end,
                });
            }
            if let Some(e) = broker_error(conn.broker(), ApiKey::Fetch, p.error_code, None) {
                return Err(e);
            }
            partition_answer(conn.broker(), topic, &mut p, offset)
        })
        .await
    }

    /// Reads the offsets `range` of a partition, fetch by fetch, handing each answer on;
    /// returns the offset after the last batch read. It stops early at an empty answer (the
    /// log ends before `end`, or a transaction marker's offset is the last one).
    pub async fn read_until(
        &self,
        topic: &str,
        partition: i32,
        range: std::ops::Range<i64>,
        isolation: IsolationLevel,
        mut each: impl FnMut(&PartitionFetch) -> Result<()>,
    ) -> Result<i64> {
        let mut offset = range.start;
        while offset < range.end {
            let f = self
                .fetch(topic, partition, offset, 1 << 20, Duration::ZERO, isolation)
                .await?;
            let Some(last) = f.batches.last() else { break };
            offset = last.last_offset() + 1;
            each(&f)?;
        }
        Ok(offset)
    }

    /// One topic of a Fetch request: v13+ names topics by id (KIP-516).
    pub(super) fn fetch_topic(
        &self,
        version: i16,
        topic: &str,
        partitions: Vec<FetchPartition>,
    ) -> FetchTopic {
        let ft = FetchTopic::default().with_partitions(partitions);
        if version >= 13 {
            ft.with_topic_id(self.topic_id(topic))
        } else {
            ft.with_topic(TopicName(StrBytes::from_string(topic.to_string())))
        }
    }

    /// One topic of a Produce request, with one partition's records: v13+ names topics by id
    /// (KIP-516).
    pub(crate) fn produce_topic(
        &self,
        version: i16,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> TopicProduceData {
        let data =
            TopicProduceData::default().with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))]);
        if version >= 13 {
            data.with_topic_id(self.topic_id(topic))
        } else {
            data.with_name(TopicName(StrBytes::from_string(topic.to_string())))
        }
    }
}

/// One partition's answer to a Fetch from `offset`: its batches from `offset` on, checked.
/// Always checked here: these reads serve internal topics, resuming and verification, where a
/// damaged batch must be an error rather than a misread position or a false verdict. The
/// batches before a damaged one are returned; the next read fails at it.
pub(crate) fn partition_answer(
    broker: &str,
    topic: &str,
    p: &mut PartitionData,
    offset: i64,
) -> Result<PartitionFetch> {
    let corrupt = |at: i64, message: String| KafkaError::CorruptBatch {
        topic: topic.into(),
        partition: p.partition_index,
        offset: at,
        message: format!("{message} (from broker {broker})"),
    };
    let (batches, _truncated) = split_batches(p.records.take().unwrap_or_default())
        .map_err(|e| corrupt(offset, e.to_string()))?;
    let mut batches: Vec<RawBatch> = batches
        .into_iter()
        .filter(|b| b.last_offset() >= offset)
        .collect();
    keep_until_corrupt(&mut batches).map_err(|(at, e)| corrupt(at, e.message))?;
    Ok(PartitionFetch::new(p, batches))
}

pub(crate) fn fetch_partition(
    partition: i32,
    epoch: i32,
    offset: i64,
    max_bytes: i32,
) -> FetchPartition {
    FetchPartition::default()
        .with_partition(partition)
        .with_current_leader_epoch(epoch)
        .with_fetch_offset(offset)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(max_bytes)
}

/// The one partition's answer to a Produce request for one partition.
pub(crate) fn produce_answer<'a>(
    conn: &Connection,
    resp: &'a ProduceResponse,
) -> Result<&'a PartitionProduceResponse> {
    resp.responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .ok_or_else(|| conn.empty_response(ApiKey::Produce))
}
