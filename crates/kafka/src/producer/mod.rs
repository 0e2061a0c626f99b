//! The idempotent producer: one producer id for the process, per-partition sequence numbers, and
//! up to five produce requests in flight per partition with order kept.
//!
//! Recovery relies on idempotence: after any retriable failure (leader change, broker restart,
//! lost connection, timeout) every unacknowledged batch of the partition is sent again, in order,
//! with the same sequence numbers. A batch the broker already wrote is recognised as a duplicate
//! (the broker remembers the last five batches of each producer and partition, hence the limit)
//! and answered with its original offset, so nothing is lost, duplicated or reordered.
//!
//! Lanes do not write their own requests: each hands its batches to the sender of its leader's
//! connection ([`sender`]), which puts the batches of many partitions in one Produce request.
//!
//! Why one file of this size: a `PartitionLane`'s recovery (resend in order, find written
//! batches in the log, renumber sequences under a new producer id) drives the producer's private
//! identity, senders, stats and transaction. Next to split out: the recovery methods
//! (`complete_oldest`, `resolve_from_log`, `resend_all`) into `producer/recovery.rs`.

pub mod sender;
pub mod transaction;

use crate::batch::RawBatch;
use crate::cluster::KafkaCluster;
use crate::error::{KafkaError, Result};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, ProducerId};
use sender::{Answer, Entry, ProduceCounts, ProduceStats};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use transaction::Transaction;

/// Kafka brokers deduplicate only the last five batches per producer and partition.
pub const MAX_IN_FLIGHT: usize = 5;

/// The process-wide producer identity.
#[derive(Debug)]
pub struct IdempotentProducer {
    cluster: Arc<KafkaCluster>,
    identity: tokio::sync::Mutex<(i64, i16)>,
    /// How long a batch may take to be acknowledged, retries included.
    pub delivery_timeout: Duration,
    /// One sender per (broker, data channel), started on first use; shared with the producers
    /// made by [`IdempotentProducer::fresh`].
    senders: Arc<Mutex<HashMap<(i32, usize), SenderHandle>>>,
    stats: Arc<ProduceStats>,
    /// Set for a transactional producer: its lanes write inside its transactions.
    txn: Option<Arc<Transaction>>,
}

#[derive(Debug)]
struct SenderHandle {
    tx: mpsc::UnboundedSender<Entry>,
    task: JoinHandle<()>,
}

impl IdempotentProducer {
    pub async fn new(cluster: Arc<KafkaCluster>) -> Result<Arc<IdempotentProducer>> {
        let p = IdempotentProducer {
            cluster,
            identity: tokio::sync::Mutex::new((-1, -1)),
            delivery_timeout: Duration::from_secs(120),
            senders: Arc::default(),
            stats: Arc::new(ProduceStats::default()),
            txn: None,
        };
        p.init_id().await?;
        Ok(Arc::new(p))
    }

    /// A producer writing in transactions under `transactional_id`, with its own senders (a
    /// Produce request carries one producer's batches). Its lanes keep the idempotent lanes'
    /// order, pipelining and log-checked retries; they never take a fresh identity: a lost or
    /// fenced producer id fails the lane, and the caller aborts and starts over
    /// ([`Transaction::reinit`]).
    pub async fn transactional(
        cluster: Arc<KafkaCluster>,
        transactional_id: &str,
        transaction_timeout: Duration,
    ) -> Result<Arc<IdempotentProducer>> {
        let txn = Transaction::init(cluster.clone(), transactional_id, transaction_timeout).await?;
        Ok(Arc::new(IdempotentProducer {
            cluster,
            identity: tokio::sync::Mutex::new(txn.identity()),
            // Retrying past the transaction's timeout is useless: the coordinator aborts it.
            delivery_timeout: transaction_timeout.min(Duration::from_secs(120)),
            senders: Arc::default(),
            stats: Arc::new(ProduceStats::default()),
            txn: Some(Arc::new(txn)),
        }))
    }

    /// The transaction of a transactional producer.
    pub fn transaction(&self) -> Option<&Arc<Transaction>> {
        self.txn.as_ref()
    }

    /// A producer with a new producer id that shares this one's senders (and counters), so a
    /// partition that starts its sequences afresh still shares requests with the others.
    pub async fn fresh(&self) -> Result<Arc<IdempotentProducer>> {
        if let Some(t) = &self.txn {
            return Err(KafkaError::Config(format!(
                "transactional producer '{}' cannot take a fresh producer id",
                t.id()
            )));
        }
        let p = IdempotentProducer {
            cluster: self.cluster.clone(),
            identity: tokio::sync::Mutex::new((-1, -1)),
            delivery_timeout: self.delivery_timeout,
            senders: self.senders.clone(),
            stats: self.stats.clone(),
            txn: None,
        };
        p.init_id().await?;
        Ok(Arc::new(p))
    }

    /// InitProducerId, retried while the transaction coordinator loads.
    async fn init_id(&self) -> Result<(i64, i16)> {
        let id = self
            .cluster
            .retrying("", true, || self.init_id_once())
            .await?;
        self.cluster.producer_id_obtained(id.0).await?;
        *self.identity.lock().await = id;
        tracing::debug!(
            producer_id = id.0,
            epoch = id.1,
            "idempotent producer initialised"
        );
        Ok(id)
    }

    async fn init_id_once(&self) -> Result<(i64, i16)> {
        let conn = self.cluster.any_broker().await?;
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(i32::MAX)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let resp = conn.send(&req).await?;
        if let Some(error) = resp.error_code.err() {
            return Err(KafkaError::Broker {
                broker: conn.broker().into(),
                api: ApiKey::InitProducerId,
                error,
                message: None,
            });
        }
        Ok((resp.producer_id.0, resp.producer_epoch))
    }

    pub async fn identity(&self) -> (i64, i16) {
        match &self.txn {
            Some(t) => t.identity(),
            None => *self.identity.lock().await,
        }
    }

    /// Requests and batches written so far, over every connection.
    pub fn stats(&self) -> ProduceCounts {
        self.stats.snapshot()
    }

    /// Queues an entry on the sender of `(broker, channel)`, starting it if needed.
    fn enqueue(&self, broker: i32, channel: usize, entry: Entry) -> Result<()> {
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        let handle = senders.entry((broker, channel)).or_insert_with(|| {
            let (tx, task) = sender::spawn(
                self.cluster.clone(),
                broker,
                channel,
                self.stats.clone(),
                self.txn.as_ref().map(|t| Arc::from(t.id())),
            );
            SenderHandle { tx, task }
        });
        match handle.tx.send(entry) {
            Ok(()) => Ok(()),
            // A sender ends only when its producer is dropped, or by a panic: no lane may go
            // on as if its batch were on its way.
            Err(_) => Err(KafkaError::Protocol {
                broker: format!("broker {broker}"),
                api: ApiKey::Produce,
                message: if handle.task.is_finished() {
                    "the produce sender of this connection failed (a bug: see the log)".into()
                } else {
                    "the produce sender of this connection stopped".into()
                },
            }),
        }
    }

    /// A lane for one partition. Use one lane per partition, from one task.
    pub fn lane(self: &Arc<Self>, topic: &str, partition: i32) -> PartitionLane {
        PartitionLane {
            producer: self.clone(),
            topic: topic.into(),
            partition,
            channel: crate::cluster::data_channel(topic, partition),
            next_sequence: 0,
            // A transactional lane belongs to the epoch it was made in: sends of a lane made
            // before an abort must not land in the next transaction.
            identity: self.txn.as_ref().map(|t| t.identity()),
            in_flight: VecDeque::new(),
            max_request_size: 1_048_576,
            max_in_flight_bytes: 16 << 20,
            acked_end: None,
            resolved: VecDeque::new(),
            route: None,
        }
    }
}

/// A batch the target acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// The caller's tag (e.g. the source offset of the batch).
    pub tag: i64,
    /// Where the batch's first record landed on the target.
    pub base_offset: i64,
    pub records: i32,
}

#[derive(Debug)]
struct InFlight {
    tag: i64,
    batch: RawBatch,
    sequence: i32,
    response: Option<Pending>,
    first_sent: Instant,
}

/// This partition's answer, coming from the sender (which applies the request timeout).
#[derive(Debug)]
struct Pending {
    rx: oneshot::Receiver<Answer>,
    arrived: Option<Answer>,
}

impl Pending {
    /// Cancel-safe: polling the receiver by reference loses nothing.
    async fn ready(&mut self) {
        if self.arrived.is_none() {
            let answer = (&mut self.rx).await.unwrap_or_else(|_| Err(sender_gone()));
            self.arrived = Some(answer);
        }
    }

    fn is_ready(&mut self) -> bool {
        if self.arrived.is_none() {
            self.arrived = match self.rx.try_recv() {
                Ok(a) => Some(a),
                Err(oneshot::error::TryRecvError::Closed) => Some(Err(sender_gone())),
                Err(oneshot::error::TryRecvError::Empty) => None,
            };
        }
        self.arrived.is_some()
    }

    async fn wait(mut self) -> Answer {
        self.ready().await;
        self.arrived.unwrap_or_else(|| Err(sender_gone()))
    }
}

/// A sender dropped a batch without answering: only when its task ended (the producer went
/// away, or a panic). Retriable, so the lane's recovery decides.
fn sender_gone() -> KafkaError {
    KafkaError::Disconnected {
        broker: "(produce sender)".into(),
    }
}

/// Ordered, pipelined produce to one partition.
#[derive(Debug)]
pub struct PartitionLane {
    producer: Arc<IdempotentProducer>,
    topic: Arc<str>,
    partition: i32,
    /// The connection to the leader this partition's requests use (keeps them in order).
    channel: usize,
    next_sequence: i32,
    identity: Option<(i64, i16)>,
    in_flight: VecDeque<InFlight>,
    /// `max.request.size`: a larger batch is refused at once.
    max_request_size: usize,
    /// Backpressure: `send` waits while this many bytes are unacknowledged.
    max_in_flight_bytes: usize,
    /// The target log offset after the last batch this lane knows to be written (the log end
    /// when the lane first sent). Recovery reads the log from here.
    acked_end: Option<i64>,
    /// Batches found written during a recovery, not yet returned to the caller.
    resolved: VecDeque<Acked>,
    /// The leader the last batch was handed to.
    route: Option<i32>,
}

fn is_out_of_order(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::Broker {
            error: ResponseError::OutOfOrderSequenceNumber,
            ..
        }
    )
}

enum Outcome {
    Acked(i64),
    /// Resend every unacknowledged batch with the same sequence numbers.
    Retry(KafkaError),
    /// The broker lost or fenced our producer id.
    NewIdentity(KafkaError),
    Fatal(KafkaError),
}

impl PartitionLane {
    /// Sends a batch (its producer fields are rewritten; the records are untouched). Waits for
    /// the oldest request first when five are in flight. Returns the batches acknowledged so far,
    /// in order.
    pub async fn send(&mut self, tag: i64, batch: RawBatch) -> Result<Vec<Acked>> {
        let size = batch.bytes().len();
        if size > self.max_request_size {
            return Err(KafkaError::BatchTooLarge {
                topic: self.topic.to_string(),
                partition: self.partition,
                size,
                limit: self.max_request_size,
            });
        }
        self.prepare().await?;
        let mut acked: Vec<Acked> = self.resolved.drain(..).collect();
        while self.in_flight.len() >= MAX_IN_FLIGHT
            || (!self.in_flight.is_empty()
                && self.in_flight_bytes() + size > self.max_in_flight_bytes)
        {
            acked.push(self.complete_oldest().await?);
        }
        acked.extend(self.resolved.drain(..));
        if let (Some(t), Some(identity)) = (&self.producer.txn, self.identity) {
            // Never a write outside the open transaction (a hanging transaction on brokers
            // without KIP-890's verification).
            t.add(&self.topic, self.partition, identity).await?;
        }
        let sequence = self.next_sequence;
        self.next_sequence = next_seq(sequence, batch.record_count());
        let mut entry = InFlight {
            tag,
            batch,
            sequence,
            response: None,
            first_sent: Instant::now(),
        };
        match self.submit(&mut entry).await {
            Ok(()) => {}
            // A request that could not be written is resent by the recovery of the oldest one.
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                tracing::debug!(error = %e, "produce not written; will retry")
            }
            Err(e) => return Err(e),
        }
        self.in_flight.push_back(entry);
        Ok(acked)
    }

    /// Sends on the broker's control connection (channel 0: metadata, offsets, coordinators)
    /// instead of a data channel, so a small write whose latency matters (a transaction's
    /// positions, just before its commit) does not wait behind other producers' large Produce
    /// requests: a broker answers one request per connection at a time. Call before the first
    /// send: a partition's requests stay on one connection to stay in order.
    pub fn on_control_channel(mut self) -> Self {
        self.channel = 0;
        self
    }

    /// Looks up the target log's end, where recovery reads from (the first `send` does it
    /// otherwise). It waits while the target partition has no leader yet (a topic just created:
    /// a broker creates partition logs one by one, about 40 a second on the benchmark machine),
    /// so a caller that fetches only after it holds no data meanwhile, and the data of partitions
    /// that are ready is not kept waiting behind it.
    pub async fn prepare(&mut self) -> Result<()> {
        if self.acked_end.is_none() {
            // Boxed, as the recovery calls below: a lookup's future is kilobytes, and inline it
            // would size every partition task for its whole life (docs/benchmarks.md, peak RSS
            // at 10,000 partitions).
            self.acked_end = Some(Box::pin(self.log_end()).await?);
        }
        Ok(())
    }

    /// The target partition's log end (every write, committed or not).
    async fn log_end(&self) -> Result<i64> {
        // Asked together with the other lanes starting now (one request per broker).
        self.producer
            .cluster
            .list_offset_batched(
                &self.topic,
                self.partition,
                crate::cluster::LATEST,
                crate::settings::IsolationLevel::ReadUncommitted,
            )
            .await
    }

    /// Waits until every batch sent is acknowledged.
    pub async fn flush(&mut self) -> Result<Vec<Acked>> {
        let mut acked: Vec<Acked> = self.resolved.drain(..).collect();
        while !self.in_flight.is_empty() {
            acked.push(self.complete_oldest().await?);
        }
        acked.extend(self.resolved.drain(..));
        self.release_if_idle();
        Ok(acked)
    }

    /// Gives the queues' memory back once nothing is in flight: with thousands of partitions
    /// mostly idle, a few in-flight slots each (216 bytes per slot) add up to megabytes, while
    /// allocating them again costs a partition one allocation per burst.
    fn release_if_idle(&mut self) {
        if self.in_flight.is_empty() && self.in_flight.capacity() > 0 {
            self.in_flight = VecDeque::new();
        }
        if self.resolved.is_empty() && self.resolved.capacity() > 0 {
            self.resolved = VecDeque::new();
        }
    }

    /// Waits until the oldest batch in flight has its answer (or its request timed out), without
    /// taking it; pending forever while nothing is in flight. Cancel-safe: a partition waits on
    /// this and on its next fetched data at once, so acknowledgements (and stored positions)
    /// follow as they arrive and several produces stay in flight while it waits for data.
    pub async fn answered(&mut self) {
        if !self.resolved.is_empty() {
            return;
        }
        match self.in_flight.front_mut() {
            Some(InFlight {
                response: Some(r), ..
            }) => r.ready().await,
            // Not written: completing it resends it.
            Some(_) => {}
            None => std::future::pending().await,
        }
    }

    /// The batches whose answers are already there, in order, acknowledged (a failed answer runs
    /// the usual recovery, which may wait). Never waits for an answer still on its way.
    pub async fn take_answered(&mut self) -> Result<Vec<Acked>> {
        let mut acked: Vec<Acked> = self.resolved.drain(..).collect();
        while let Some(front) = self.in_flight.front_mut() {
            if front.response.as_mut().is_some_and(|r| !r.is_ready()) {
                break;
            }
            acked.push(self.complete_oldest().await?);
            acked.extend(self.resolved.drain(..));
        }
        self.release_if_idle();
        Ok(acked)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn in_flight_bytes(&self) -> usize {
        self.in_flight.iter().map(|e| e.batch.bytes().len()).sum()
    }

    /// Sets `max.request.size` and the unacknowledged-bytes bound.
    pub fn with_limits(mut self, max_request_size: usize, max_in_flight_bytes: usize) -> Self {
        self.max_request_size = max_request_size;
        self.max_in_flight_bytes = max_in_flight_bytes.max(max_request_size);
        self
    }

    async fn submit(&mut self, entry: &mut InFlight) -> Result<()> {
        let (pid, epoch) = match self.identity {
            Some(id) => id,
            None => {
                let id = self.producer.identity().await;
                self.identity = Some(id);
                id
            }
        };
        let batch = entry.batch.rewrite_for_produce(
            pid,
            epoch,
            entry.sequence,
            self.producer.txn.is_some(),
        );
        let (leader, _) = self
            .producer
            .cluster
            .leader_of(&self.topic, self.partition)?;
        // The leader moved while earlier batches are still with the old leader's sender: this
        // one waits (not written), so it cannot reach the new leader ahead of them; the
        // recovery of the oldest resends everything in order.
        if self.route.is_some_and(|r| r != leader)
            && self.in_flight.iter().any(|e| e.response.is_some())
        {
            return Ok(());
        }
        self.route = Some(leader);
        let (reply, rx) = oneshot::channel();
        self.producer.enqueue(
            leader,
            self.channel,
            Entry {
                topic: self.topic.clone(),
                partition: self.partition,
                batch: batch.into_bytes(),
                request_limit: self.max_request_size,
                reply,
            },
        )?;
        entry.response = Some(Pending { rx, arrived: None });
        Ok(())
    }

    async fn outcome(&mut self) -> Outcome {
        let Some(entry) = self.in_flight.front_mut() else {
            return Outcome::Retry(KafkaError::Config("nothing in flight".into()));
        };
        // Waited for in place first (cancel-safe): a flush cancelled here must not drop the
        // batch from its sender's queue while later ones of the partition go out.
        if let Some(r) = entry.response.as_mut() {
            r.ready().await;
        }
        let Some(fut) = entry.response.take() else {
            return Outcome::Retry(KafkaError::Disconnected {
                broker: "(not sent)".into(),
            });
        };
        let p = match fut.wait().await {
            Ok(p) => p,
            Err(e) if e.is_retriable() || e.is_stale_metadata() => return Outcome::Retry(e),
            Err(e) => return Outcome::Fatal(e),
        };
        match p.error_code.err() {
            None => Outcome::Acked(p.base_offset),
            Some(error) => {
                let e = KafkaError::Broker {
                    broker: "produce".into(),
                    api: ApiKey::Produce,
                    error,
                    message: p.error_message.as_ref().map(|m| m.to_string()),
                };
                match error {
                    ResponseError::UnknownProducerId
                    | ResponseError::InvalidProducerEpoch
                    | ResponseError::ProducerFenced => Outcome::NewIdentity(e),
                    // After a failed earlier batch, later ones arrive out of order: resend all.
                    ResponseError::OutOfOrderSequenceNumber => Outcome::Retry(e),
                    _ if e.is_retriable() || e.is_stale_metadata() => Outcome::Retry(e),
                    _ => Outcome::Fatal(e),
                }
            }
        }
    }

    async fn complete_oldest(&mut self) -> Result<Acked> {
        if let Some(a) = self.resolved.pop_front() {
            return Ok(a);
        }
        let mut delay = Duration::from_millis(50);
        // Answers of OUT_OF_ORDER_SEQUENCE_NUMBER for the oldest batch in a row, each after a
        // resend in order: see below.
        let mut out_of_order = 0;
        loop {
            let outcome = match self.outcome().await {
                Outcome::Retry(e) if is_out_of_order(&e) => {
                    out_of_order += 1;
                    // The oldest unacknowledged batch is out of order even though everything
                    // before it was acknowledged: the broker's idea of our sequence changed (its
                    // log was truncated under us, an unclean election). Resending the same
                    // sequences cannot succeed until the delivery timeout: after one resend in
                    // order, start over under a fresh identity (as Java's producer bumps its
                    // epoch, KIP-360).
                    if out_of_order > 2 {
                        Outcome::NewIdentity(e)
                    } else {
                        Outcome::Retry(e)
                    }
                }
                o => o,
            };
            match outcome {
                Outcome::Acked(base_offset) => {
                    let Some(e) = self.in_flight.pop_front() else {
                        return Err(KafkaError::Protocol {
                            broker: String::new(),
                            api: ApiKey::Produce,
                            message: format!(
                                "{}-{}: an acknowledgement with nothing in flight",
                                self.topic, self.partition
                            ),
                        });
                    };
                    self.acked_end = Some(base_offset + e.batch.last_offset_delta() as i64 + 1);
                    return Ok(Acked {
                        tag: e.tag,
                        base_offset,
                        records: e.batch.record_count(),
                    });
                }
                Outcome::NewIdentity(e) if self.producer.txn.is_some() => {
                    // A transactional lane cannot start over on its own: what it wrote belongs
                    // to the open transaction, which must be aborted as a whole. A lane of an
                    // earlier epoch of this producer is only stale, not fenced by another.
                    if let Some(t) = &self.producer.txn {
                        if self.identity != Some(t.identity()) {
                            return Err(KafkaError::StaleProducer {
                                transactional_id: t.id().to_string(),
                            });
                        }
                    }
                    return Err(match e {
                        KafkaError::Broker {
                            error:
                                ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch,
                            ..
                        } => KafkaError::Fenced {
                            transactional_id: self
                                .producer
                                .txn
                                .as_ref()
                                .map(|t| t.id().to_string())
                                .unwrap_or_default(),
                        },
                        e => e,
                    });
                }
                Outcome::NewIdentity(e) => {
                    // The broker lost our producer state. An earlier attempt of a batch may have
                    // been written before it did (its answer lost with a connection): look in
                    // the log under the old identity first, as a retry does, so that only what
                    // is not there is sent again under the new one.
                    match Box::pin(self.resolve_from_log()).await {
                        Ok(found) => {
                            if let Some(first) = found.into_iter().next() {
                                return Ok(first);
                            }
                        }
                        Err(err) => {
                            tracing::debug!(error = %err, "cannot read the log before taking a new producer id")
                        }
                    }
                    out_of_order = 0;
                    // Start this partition's sequence again under a fresh identity.
                    tracing::warn!(topic = %self.topic, partition = self.partition, error = %e, "producer state lost on the broker; re-initialising (what the log did not show may be written twice)");
                    self.producer
                        .stats
                        .new_identities
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let id = Box::pin(self.producer.init_id()).await?;
                    self.identity = Some(id);
                    let mut seq = 0;
                    for e in self.in_flight.iter_mut() {
                        e.sequence = seq;
                        seq = next_seq(seq, e.batch.record_count());
                    }
                    self.next_sequence = seq;
                    self.resend_all().await;
                }
                Outcome::Fatal(e) => return Err(e),
                Outcome::Retry(e) => {
                    let first_sent = self
                        .in_flight
                        .front()
                        .map(|e| e.first_sent)
                        .unwrap_or_else(Instant::now);
                    if first_sent.elapsed() > self.producer.delivery_timeout {
                        return Err(e);
                    }
                    tracing::debug!(topic = %self.topic, partition = self.partition, error = %e, "produce failed; resending unacknowledged batches");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                    let cluster = &self.producer.cluster;
                    let _ = Box::pin(cluster.refresh_metadata(Some(&[&*self.topic]))).await;
                    // A restarted broker deduplicates only the last batch of a producer, so
                    // first find in the log which unacknowledged batches were written.
                    match Box::pin(self.resolve_from_log()).await {
                        Ok(found) => match found.into_iter().next() {
                            Some(first) => return Ok(first),
                            None => self.resend_all().await,
                        },
                        Err(err) => {
                            tracing::debug!(error = %err, "cannot read the log yet; will retry")
                        }
                    }
                }
            }
        }
    }

    /// Reads the target log after the last acknowledged offset and acknowledges, in order, every
    /// unacknowledged batch found there (same producer id and base sequence). Returns the first
    /// one found (the caller's result); the others stay queued as already-acknowledged entries.
    async fn resolve_from_log(&mut self) -> Result<Vec<Acked>> {
        let Some(mut offset) = self.acked_end else {
            return Ok(Vec::new());
        };
        let Some((pid, epoch)) = self.identity else {
            return Ok(Vec::new());
        };
        let end = self.log_end().await?;
        if end < offset {
            // The log ends before what the target acknowledged: a replica without those records
            // became leader (an unclean leader election), and the records are gone from the
            // target. Nothing of ours after `end` is left to find; recovery goes on from there.
            // They are not copied again (their positions are stored already): reported, so the
            // operator knows to compare the topics (`kmirror verify`): docs/client.md.
            tracing::error!(
                topic = %self.topic,
                partition = self.partition,
                acknowledged_end = offset,
                log_end = end,
                "the target lost records it had acknowledged (its log was truncated, as by an unclean leader election); they are not copied again"
            );
            self.producer
                .stats
                .truncated_offsets
                .fetch_add((offset - end) as u64, std::sync::atomic::Ordering::Relaxed);
            self.acked_end = Some(end);
            return Ok(Vec::new());
        }
        let cluster = &self.producer.cluster;
        let mut written: std::collections::HashMap<i32, i64> = std::collections::HashMap::new();
        while offset < end {
            let f = cluster
                .fetch(
                    &self.topic,
                    self.partition,
                    offset,
                    4 << 20,
                    Duration::from_millis(100),
                    crate::settings::IsolationLevel::ReadUncommitted,
                )
                .await?;
            if f.batches.is_empty() {
                break;
            }
            for b in &f.batches {
                offset = b.last_offset() + 1;
                if b.producer_id() == pid && b.producer_epoch() == epoch {
                    written.insert(b.base_sequence(), b.base_offset());
                }
            }
        }
        let mut found = Vec::new();
        while let Some(front) = self.in_flight.front() {
            let Some(&base_offset) = written.get(&front.sequence) else {
                break;
            };
            let Some(e) = self.in_flight.pop_front() else {
                break;
            };
            self.acked_end = Some(base_offset + e.batch.last_offset_delta() as i64 + 1);
            found.push(Acked {
                tag: e.tag,
                base_offset,
                records: e.batch.record_count(),
            });
        }
        if !found.is_empty() {
            tracing::debug!(topic = %self.topic, partition = self.partition, batches = found.len(), "unacknowledged batches found written in the log");
            // Entries after the resolved ones: keep the extra acks for the next calls.
            self.resolved.extend(found.iter().skip(1).cloned());
        }
        Ok(found)
    }

    /// Drops pending responses and sends every unacknowledged batch again, in order, with the
    /// same sequence numbers.
    async fn resend_all(&mut self) {
        let mut entries: Vec<InFlight> = self.in_flight.drain(..).collect();
        for e in entries.iter_mut() {
            e.response = None;
        }
        for mut e in entries {
            if let Err(err) = self.submit(&mut e).await {
                tracing::debug!(error = %err, "resend not written; will retry");
            }
            self.in_flight.push_back(e);
        }
    }
}

/// Sequence numbers wrap at i32::MAX, as in Kafka.
fn next_seq(seq: i32, records: i32) -> i32 {
    let n = seq as i64 + records.max(1) as i64;
    if n > i32::MAX as i64 {
        (n - i32::MAX as i64 - 1) as i32
    } else {
        n as i32
    }
}

#[cfg(test)]
mod tests {
    use super::next_seq;

    #[test]
    fn sequences_wrap_like_kafka() {
        assert_eq!(next_seq(0, 5), 5);
        assert_eq!(next_seq(i32::MAX - 1, 1), i32::MAX);
        assert_eq!(next_seq(i32::MAX, 1), 0);
        assert_eq!(next_seq(i32::MAX - 1, 3), 1);
    }
}
