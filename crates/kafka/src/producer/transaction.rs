//! The transactional side of a producer (KIP-98): the transactional id's coordinator, the
//! partitions added to the open transaction, and its end.
//!
//! Lanes of a transactional producer write as idempotent lanes do (pipelined, many partitions
//! per request); before a lane's first batch of a transaction goes out, its partition must be
//! added to the transaction. A write outside the transaction would leave the partition's stable
//! offset hanging on brokers without KIP-890's verification, so [`Transaction::add`] is awaited
//! before every send. Adds are batched: while one AddPartitionsToTxn is on its way, the partitions
//! that ask meanwhile wait and go together in the next one.
//!
//! The protocol is the pre-KIP-890 one (explicit adds, EndTxn up to v4, Produce up to v11), which
//! Kafka 2.x to 4.x brokers all accept.

use crate::cluster::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, InitProducerIdRequest, ProducerId, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Key = (Arc<str>, i32);

/// How long a coordinator call is retried (coordinator moves, loads, a previous transaction still
/// writing its markers): as Java's `max.block.ms` default.
const COORDINATOR_DEADLINE: Duration = Duration::from_secs(60);

/// The state of one transactional id in this process.
#[derive(Debug)]
pub struct Transaction {
    cluster: Arc<KafkaCluster>,
    id: Arc<str>,
    timeout: Duration,
    identity: Mutex<(i64, i16)>,
    coordinator: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// Partitions in the open transaction.
    added: Mutex<HashSet<Key>>,
    /// Partitions waiting for the next AddPartitionsToTxn.
    wanted: Mutex<HashSet<Key>>,
    /// One AddPartitionsToTxn at a time; whoever holds it adds everything wanted.
    adding: tokio::sync::Mutex<()>,
    /// AddPartitionsToTxn requests answered without error (batching shows as fewer of them than
    /// partitions added).
    pub add_requests: AtomicU64,
    pub commits: AtomicU64,
    pub aborts: AtomicU64,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Fencing errors are reported as [`KafkaError::Fenced`]; the rest as broker errors.
fn check(id: &str, conn: &Connection, api: ApiKey, code: i16) -> Result<()> {
    match code.err() {
        None => Ok(()),
        Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch) => {
            Err(KafkaError::Fenced {
                transactional_id: id.into(),
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

/// Errors after which the call is made again to the (perhaps new) coordinator.
fn coordinator_moved(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::Broker {
            error: ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable,
            ..
        }
    ) || matches!(
        e,
        KafkaError::Io { .. } | KafkaError::Disconnected { .. } | KafkaError::Timeout { .. }
    )
}

fn worth_retrying(e: &KafkaError) -> bool {
    coordinator_moved(e)
        || matches!(
            e,
            KafkaError::Broker {
                error: ResponseError::ConcurrentTransactions
                    | ResponseError::CoordinatorLoadInProgress,
                ..
            }
        )
}

impl Transaction {
    /// Registers `id` with its coordinator (InitProducerId): the previous holder of the id is
    /// fenced, and a transaction it left open is aborted before this returns.
    pub(crate) async fn init(
        cluster: Arc<KafkaCluster>,
        id: &str,
        timeout: Duration,
    ) -> Result<Transaction> {
        let t = Transaction {
            cluster,
            id: id.into(),
            timeout,
            identity: Mutex::new((-1, -1)),
            coordinator: tokio::sync::Mutex::new(None),
            added: Mutex::default(),
            wanted: Mutex::default(),
            adding: tokio::sync::Mutex::new(()),
            add_requests: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
        };
        t.reinit().await?;
        Ok(t)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn identity(&self) -> (i64, i16) {
        *self.identity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new epoch for the id: the open transaction (this instance's or a previous one's) is
    /// aborted, and lanes made before must be dropped (their epoch is fenced; sequences restart).
    pub async fn reinit(&self) -> Result<(i64, i16)> {
        // No add in flight under the old epoch may land after this (it would mark a partition
        // added to the new transaction).
        let _turn = self.adding.lock().await;
        // Before KIP-360 brokers a known producer id with a bumped epoch would be refused; the
        // fresh call (-1, -1) works on every version and fences just the same.
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(&self.id))))
            .with_transaction_timeout_ms(self.timeout.as_millis().min(i32::MAX as u128) as i32)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let resp = self
            .coordinated(ApiKey::InitProducerId, |conn| {
                let req = req.clone();
                async move {
                    let r = conn.send(&req).await?;
                    check(&self.id, &conn, ApiKey::InitProducerId, r.error_code)?;
                    Ok(r)
                }
            })
            .await?;
        let id = (resp.producer_id.0, resp.producer_epoch);
        self.cluster.producer_id_obtained(id.0).await?;
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = id;
        self.added.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        tracing::debug!(transactional_id = %self.id, producer_id = id.0, epoch = id.1, "transactional producer initialised");
        Ok(id)
    }

    /// Whether anything was added since the last commit or abort.
    pub fn is_open(&self) -> bool {
        !self
            .added
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Partitions in the open transaction.
    pub fn partitions(&self) -> usize {
        self.added.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Adds the partitions not in the open transaction yet in one AddPartitionsToTxn. Lanes
    /// sent to one after the other would each wait for an add of their own (a slot's positions:
    /// 25 round trips at every commit, 150-600 ms under load).
    pub async fn add_all(&self, keys: Vec<(Arc<str>, i32)>, identity: (i64, i16)) -> Result<()> {
        let missing: Vec<Key> = {
            let added = self.added.lock().unwrap_or_else(|p| p.into_inner());
            keys.into_iter().filter(|k| !added.contains(k)).collect()
        };
        let Some((topic, partition)) = missing.first().cloned() else {
            return Ok(());
        };
        if self.identity() != identity {
            // A caller of an earlier epoch: its partitions must not join the next transaction.
            return Err(KafkaError::StaleProducer {
                transactional_id: self.id.to_string(),
            });
        }
        self.wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(missing);
        // Whoever adds next adds everything wanted.
        self.add(&topic, partition, identity).await
    }

    /// Makes sure the partition is in the open transaction before anything is written to it
    /// by a lane of producer identity `identity` (an earlier epoch's lane is refused).
    pub async fn add(&self, topic: &Arc<str>, partition: i32, identity: (i64, i16)) -> Result<()> {
        let key: Key = (topic.clone(), partition);
        loop {
            if self.identity() != identity {
                return Err(KafkaError::StaleProducer {
                    transactional_id: self.id.to_string(),
                });
            }
            if self
                .added
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&key)
            {
                return Ok(());
            }
            self.wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone());
            let _turn = self.adding.lock().await;
            let batch: Vec<Key> = {
                let added = self.added.lock().unwrap_or_else(|p| p.into_inner());
                let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
                wanted.drain().filter(|k| !added.contains(k)).collect()
            };
            if batch.is_empty() || self.identity() != identity {
                continue;
            }
            self.add_now(&batch).await?;
            self.added
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(batch);
        }
    }

    async fn add_now(&self, batch: &[Key]) -> Result<()> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in batch {
            topics.entry(t).or_default().push(*p);
        }
        let (pid, epoch) = self.identity();
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&self.id)))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(
                topics
                    .iter()
                    .map(|(t, ps)| {
                        AddPartitionsToTxnTopic::default()
                            .with_name(TopicName(s(t)))
                            .with_partitions(ps.clone())
                    })
                    .collect(),
            );
        self.coordinated(ApiKey::AddPartitionsToTxn, |conn| {
            let req = req.clone();
            async move {
                let version = conn.version::<AddPartitionsToTxnRequest>()?.min(3);
                let resp = conn.submit(&req, version).await?.wait().await?;
                // One partition's real error makes the others OPERATION_NOT_ATTEMPTED: report
                // the real one.
                let mut first = None;
                for t in &resp.results_by_topic_v3_and_below {
                    for p in &t.results_by_partition {
                        if let Err(e) = check(
                            &self.id,
                            &conn,
                            ApiKey::AddPartitionsToTxn,
                            p.partition_error_code,
                        ) {
                            let not_attempted = matches!(
                                e,
                                KafkaError::Broker {
                                    error: ResponseError::OperationNotAttempted,
                                    ..
                                }
                            );
                            if first.is_none() || !not_attempted {
                                first = Some(e);
                            }
                        }
                    }
                }
                match first {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .await?;
        self.add_requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits the open transaction. Every lane's batches must be acknowledged first (EndTxn
    /// does not wait for produces in flight). Nothing added: nothing to commit.
    pub async fn commit(&self) -> Result<()> {
        self.end(true).await
    }

    /// Aborts the open transaction: what was written in it stays invisible to read_committed.
    pub async fn abort(&self) -> Result<()> {
        self.end(false).await
    }

    async fn end(&self, committed: bool) -> Result<()> {
        // Adds waiting for their turn would otherwise land in the next transaction unnoticed by
        // the caller, who is responsible for sending nothing while a transaction ends.
        let _turn = self.adding.lock().await;
        if !self.is_open() {
            return Ok(());
        }
        let (pid, epoch) = self.identity();
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&self.id)))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(committed);
        // A retried EndTxn whose first attempt went through is answered OK by the coordinator
        // (the transaction is complete with the same result), so retrying is safe.
        self.coordinated(ApiKey::EndTxn, |conn| {
            let req = req.clone();
            async move {
                let version = conn.version::<EndTxnRequest>()?.min(4);
                let resp = conn.submit(&req, version).await?.wait().await?;
                check(&self.id, &conn, ApiKey::EndTxn, resp.error_code)
            }
        })
        .await?;
        self.added.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let n = if committed {
            &self.commits
        } else {
            &self.aborts
        };
        n.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `call` on the id's coordinator, finding it again after it moved, and retrying while
    /// the coordinator loads or the previous transaction completes.
    async fn coordinated<T, F, Fut>(&self, api: ApiKey, mut call: F) -> Result<T>
    where
        F: FnMut(Arc<Connection>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = tokio::time::Instant::now()
            + COORDINATOR_DEADLINE.max(self.cluster.settings().request_timeout);
        let mut delay = Duration::from_millis(5);
        loop {
            let conn = {
                let mut c = self.coordinator.lock().await;
                match c.as_ref() {
                    Some(conn) => conn.clone(),
                    None => {
                        let found = crate::txn::find_coordinator(&self.cluster, &self.id, 1).await;
                        match found {
                            Ok(conn) => {
                                *c = Some(conn.clone());
                                conn
                            }
                            Err(e) if tokio::time::Instant::now() < deadline => {
                                drop(c);
                                tracing::debug!(transactional_id = %self.id, error = %e, "finding the transaction coordinator; will retry");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
            };
            match call(conn).await {
                Err(e) if worth_retrying(&e) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(transactional_id = %self.id, ?api, error = %e, "transaction coordinator call; will retry");
                    if coordinator_moved(&e) {
                        *self.coordinator.lock().await = None;
                        let _ = self.cluster.refresh_metadata(None).await;
                    }
                    tokio::time::sleep(delay).await;
                    // CONCURRENT_TRANSACTIONS: the last transaction's markers are being
                    // written, which takes milliseconds to seconds; asked every 20 ms at most
                    // (as Java's producer does), the next transaction starts within 20 ms of
                    // their end rather than up to 200.
                    let cap = if matches!(
                        e,
                        KafkaError::Broker {
                            error: ResponseError::ConcurrentTransactions,
                            ..
                        }
                    ) {
                        Duration::from_millis(20)
                    } else {
                        Duration::from_millis(200)
                    };
                    delay = (delay * 2).min(cap);
                }
                other => return other,
            }
        }
    }
}
