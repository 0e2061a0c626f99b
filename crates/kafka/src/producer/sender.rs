//! Produce requests per broker connection: the batches of many partitions in one request.
//!
//! A lane ([`super::PartitionLane`]) keeps its partition's order, sequences and recovery; it
//! hands each batch to the sender of its leader's connection and waits for that partition's
//! answer. The sender writes as soon as the connection has room for another request (at most
//! [`MAX_REQUESTS`] in flight), and everything that queued meanwhile goes out together, one batch
//! per partition per request, as the Java producer's accumulator does. A busy broker therefore
//! gets fewer, larger requests instead of one per partition, and an idle one gets each batch at
//! once (no linger).

use crate::cluster::KafkaCluster;
use crate::conn::ResponseFuture;
use crate::error::{KafkaError, Result};
use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{ApiKey, ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Requests in flight per connection, as Java's `max.in.flight.requests.per.connection`: a
/// partition with five batches in flight (the broker's deduplication window) can have them all
/// in flight at once, one per request.
pub const MAX_REQUESTS: usize = 5;

/// One partition's answer from a shared request.
pub(crate) type Answer = Result<PartitionProduceResponse>;

/// One batch to write, ready for the wire (producer fields already set).
#[derive(Debug)]
pub(crate) struct Entry {
    pub topic: Arc<str>,
    pub partition: i32,
    pub batch: Bytes,
    /// Bytes a request may carry when this entry is the first in it (`max.request.size`).
    pub request_limit: usize,
    pub reply: oneshot::Sender<Answer>,
}

/// Totals over every sender of a producer.
#[derive(Debug, Default)]
pub struct ProduceStats {
    pub requests: AtomicU64,
    /// Partition batches written (a request carries one per partition).
    pub batches: AtomicU64,
    pub max_batches_per_request: AtomicU64,
    /// The most requests seen in flight at once on one connection.
    pub max_in_flight: AtomicU64,
    /// Requests that failed as a whole (connection, timeout); their lanes recover.
    pub failed_requests: AtomicU64,
    /// Times a partition started its sequences over under a new producer id (the broker lost or
    /// fenced its producer state, or answered out of order with nothing to resend).
    pub new_identities: AtomicU64,
    /// Offsets the target acknowledged and later lost: its log end was found below what it had
    /// acknowledged (an unclean leader election truncates a log this way).
    pub truncated_offsets: AtomicU64,
}

/// A snapshot of [`ProduceStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProduceCounts {
    pub requests: u64,
    pub batches: u64,
    pub max_batches_per_request: u64,
    pub max_in_flight: u64,
    pub failed_requests: u64,
    pub new_identities: u64,
    pub truncated_offsets: u64,
}

impl ProduceStats {
    pub fn snapshot(&self) -> ProduceCounts {
        ProduceCounts {
            requests: self.requests.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            max_batches_per_request: self.max_batches_per_request.load(Ordering::Relaxed),
            max_in_flight: self.max_in_flight.load(Ordering::Relaxed),
            failed_requests: self.failed_requests.load(Ordering::Relaxed),
            new_identities: self.new_identities.load(Ordering::Relaxed),
            truncated_offsets: self.truncated_offsets.load(Ordering::Relaxed),
        }
    }
}

/// Takes the next request's entries from the queue, in queue order: at most one per partition
/// (a Produce v3+ entry holds one batch per partition, and a partition's later batches must
/// follow its earlier ones), within the first entry's request limit (the first is always
/// taken). Entries whose lane stopped waiting (it resends, or it is gone) are dropped unsent.
pub(crate) fn take_request(queue: &mut VecDeque<Entry>) -> Vec<Entry> {
    let mut taken: Vec<Entry> = Vec::new();
    let mut partitions: HashSet<(Arc<str>, i32)> = HashSet::new();
    // A partition skipped for its order also blocks its later entries in this round.
    let mut blocked: HashSet<(Arc<str>, i32)> = HashSet::new();
    let mut size = 0usize;
    let mut limit = usize::MAX;
    let mut kept = VecDeque::with_capacity(queue.len());
    for e in queue.drain(..) {
        if e.reply.is_closed() {
            continue;
        }
        let key = (e.topic.clone(), e.partition);
        let fits = taken.is_empty() || size + e.batch.len() <= limit;
        if fits && !partitions.contains(&key) && !blocked.contains(&key) {
            if taken.is_empty() {
                limit = e.request_limit;
            }
            size += e.batch.len();
            partitions.insert(key);
            taken.push(e);
        } else {
            blocked.insert(key);
            kept.push_back(e);
        }
    }
    *queue = kept;
    taken
}

/// Builds the Produce request for `entries` (grouped by topic; by topic id from v13, KIP-516).
fn build(
    entries: &[Entry],
    version: i16,
    timeout_ms: i32,
    topic_ids: &HashMap<String, uuid::Uuid>,
    transactional_id: Option<&str>,
) -> ProduceRequest {
    let mut topics: Vec<TopicProduceData> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for e in entries {
        let i = *index.entry(&e.topic).or_insert_with(|| {
            let data = if version >= 13 {
                TopicProduceData::default()
                    .with_topic_id(topic_ids.get(&*e.topic).copied().unwrap_or_default())
            } else {
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(e.topic.to_string())))
            };
            topics.push(data);
            topics.len() - 1
        });
        topics[i].partition_data.push(
            PartitionProduceData::default()
                .with_index(e.partition)
                .with_records(Some(e.batch.clone())),
        );
    }
    ProduceRequest::default()
        .with_transactional_id(
            transactional_id.map(|id| TransactionalId(StrBytes::from_string(id.to_string()))),
        )
        .with_acks(-1)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(topics)
}

/// A request on the wire and the lanes waiting for it.
struct Sent {
    waiting: Vec<(Arc<str>, i32, oneshot::Sender<Answer>)>,
    response: ResponseFuture<ProduceRequest>,
    /// The topics this request named by id (v13+), to read the answer by.
    names: HashMap<uuid::Uuid, String>,
}

/// The lanes waiting for `entries`.
fn waiting(entries: Vec<Entry>) -> Vec<(Arc<str>, i32, oneshot::Sender<Answer>)> {
    entries
        .into_iter()
        .map(|e| (e.topic, e.partition, e.reply))
        .collect()
}

/// Ready once the oldest request has its answer; pending while none is in flight.
async fn oldest_answered(in_flight: &mut VecDeque<Sent>) {
    match in_flight.front_mut() {
        Some(sent) => sent.response.ready().await,
        None => std::future::pending().await,
    }
}

/// A partition of a request.
type Key = (Arc<str>, i32);

/// Hands each partition its part of the answer; a partition the broker left out gets an error
/// (its lane recovers). Returns the partitions that did not get a plain acknowledgement.
fn dispatch(
    broker: &str,
    waiting: Vec<(Arc<str>, i32, oneshot::Sender<Answer>)>,
    answer: Result<kafka_protocol::messages::ProduceResponse>,
    topic_names: &HashMap<uuid::Uuid, String>,
) -> Vec<Key> {
    let mut failed = Vec::new();
    match answer {
        Ok(resp) => {
            let mut by_key: HashMap<(String, i32), PartitionProduceResponse> = HashMap::new();
            for t in resp.responses {
                // v13 answers name the topic by id.
                let name = if t.name.0.is_empty() {
                    topic_names.get(&t.topic_id).cloned().unwrap_or_default()
                } else {
                    t.name.0.to_string()
                };
                for p in t.partition_responses {
                    by_key.insert((name.clone(), p.index), p);
                }
            }
            for (topic, partition, reply) in waiting {
                // Left out of the answer: as if the broker did not know the partition (stale
                // metadata), so the lane refreshes and recovers.
                let answer = by_key
                    .remove(&(topic.to_string(), partition))
                    .ok_or_else(|| KafkaError::Broker {
                        broker: broker.into(),
                        api: ApiKey::Produce,
                        error: kafka_protocol::error::ResponseError::UnknownTopicOrPartition,
                        message: Some(format!("no answer for {topic}-{partition}")),
                    });
                if !matches!(&answer, Ok(p) if p.error_code == 0) {
                    failed.push((topic.clone(), partition));
                }
                let _ = reply.send(answer);
            }
        }
        Err(e) => {
            tracing::debug!(broker, error = %e, partitions = waiting.len(), "produce request failed; its partitions recover");
            for (topic, partition, reply) in waiting {
                failed.push((topic, partition));
                let _ = reply.send(Err(e.duplicate()));
            }
        }
    }
    failed
}

/// After a batch of these partitions failed, their batches still queued must not go: a broker
/// with no state for the producer id accepts any first sequence number (Kafka's
/// `ProducerAppendInfo`), so a later batch written ahead of the failed one would be out of
/// order in the log. They fail too, without being sent; the lane resends them in order once it
/// recovered.
fn fail_queued(queue: &mut VecDeque<Entry>, failed: &[Key], broker: &str) {
    if failed.is_empty() {
        return;
    }
    let failed: HashSet<&Key> = failed.iter().collect();
    let mut kept = VecDeque::with_capacity(queue.len());
    for e in queue.drain(..) {
        if failed.contains(&(e.topic.clone(), e.partition)) {
            let _ = e.reply.send(Err(KafkaError::Disconnected {
                broker: format!("{broker} (not sent: an earlier batch of the partition failed)"),
            }));
        } else {
            kept.push_back(e);
        }
    }
    *queue = kept;
}

/// Starts the sender of one connection (`channel` of `broker`); it ends once every handle is
/// dropped and its requests are answered. A transactional producer's sender names its id in
/// every request (a request carries the batches of one producer only).
pub(crate) fn spawn(
    cluster: Arc<KafkaCluster>,
    broker: i32,
    channel: usize,
    stats: Arc<ProduceStats>,
    transactional_id: Option<Arc<str>>,
) -> (mpsc::UnboundedSender<Entry>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(cluster, broker, channel, rx, stats, transactional_id));
    (tx, task)
}

async fn run(
    cluster: Arc<KafkaCluster>,
    broker: i32,
    channel: usize,
    mut rx: mpsc::UnboundedReceiver<Entry>,
    stats: Arc<ProduceStats>,
    transactional_id: Option<Arc<str>>,
) {
    let mut queue: VecDeque<Entry> = VecDeque::new();
    let mut in_flight: VecDeque<Sent> = VecDeque::new();
    let mut open = true;
    let name = format!("broker {broker}");
    loop {
        while in_flight.len() < MAX_REQUESTS && !queue.is_empty() {
            let entries = take_request(&mut queue);
            if entries.is_empty() {
                break;
            }
            match write(
                &cluster,
                broker,
                channel,
                &entries,
                transactional_id.as_deref(),
            )
            .await
            {
                Ok((response, names)) => {
                    stats.requests.fetch_add(1, Ordering::Relaxed);
                    stats
                        .batches
                        .fetch_add(entries.len() as u64, Ordering::Relaxed);
                    stats
                        .max_batches_per_request
                        .fetch_max(entries.len() as u64, Ordering::Relaxed);
                    in_flight.push_back(Sent {
                        waiting: waiting(entries),
                        response,
                        names,
                    });
                    stats
                        .max_in_flight
                        .fetch_max(in_flight.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    let failed = dispatch(&name, waiting(entries), Err(e), &HashMap::new());
                    fail_queued(&mut queue, &failed, &name);
                }
            }
        }
        if !open && queue.is_empty() && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            _ = oldest_answered(&mut in_flight), if !in_flight.is_empty() => {
                let Some(sent) = in_flight.pop_front() else { continue };
                let answer = sent.response.wait().await;
                let lost = matches!(
                    answer,
                    Err(KafkaError::Timeout { .. } | KafkaError::Disconnected { .. } | KafkaError::Io { .. })
                );
                if answer.is_err() {
                    stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                }
                let mut failed = dispatch(&name, sent.waiting, answer, &sent.names);
                // The connection is gone or stalled: the later requests on it will not be
                // answered either; fail them now rather than one request timeout after another.
                if lost {
                    for later in in_flight.drain(..) {
                        stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                        let e = KafkaError::Disconnected { broker: name.clone() };
                        failed.extend(dispatch(&name, later.waiting, Err(e), &later.names));
                    }
                }
                fail_queued(&mut queue, &failed, &name);
            }
            entry = rx.recv(), if open => match entry {
                Some(e) => {
                    queue.push_back(e);
                    while let Ok(e) = rx.try_recv() {
                        queue.push_back(e);
                    }
                }
                None => open = false,
            },
        }
    }
}

/// Writes one request on the connection (in order after the earlier ones); with the topics it
/// named by id.
async fn write(
    cluster: &KafkaCluster,
    broker: i32,
    channel: usize,
    entries: &[Entry],
    transactional_id: Option<&str>,
) -> Result<(ResponseFuture<ProduceRequest>, HashMap<uuid::Uuid, String>)> {
    let conn = cluster.broker_channel(broker, channel).await?;
    let mut version = conn.version::<ProduceRequest>()?;
    if transactional_id.is_some() {
        // v12+ implies KIP-890's protocol (partitions added by the produce itself), which
        // transaction.rs does not speak.
        version = version.min(11);
    }
    let ids: HashMap<String, uuid::Uuid> = if version >= 13 {
        let md = cluster.metadata();
        entries
            .iter()
            .filter_map(|e| {
                md.topics
                    .get(&*e.topic)
                    .map(|t| (e.topic.to_string(), t.id))
            })
            .collect()
    } else {
        HashMap::new()
    };
    let req = build(
        entries,
        version,
        cluster.settings().request_timeout.as_millis() as i32,
        &ids,
        transactional_id,
    );
    let names = ids.into_iter().map(|(name, id)| (id, name)).collect();
    Ok((conn.submit(&req, version).await?, names))
}

#[cfg(test)]
mod tests;
