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
use crate::txn_state::{cannot_check, open_since, TxnPhase};
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
    /// Partitions whose last transaction's marker may not have arrived, with that
    /// transaction's result (true: commit). See [`Transaction::settle_suspects`].
    suspects: Mutex<BTreeMap<Key, bool>>,
    /// The id's last result and producer id before this instance took it over: partitions this
    /// instance had not written yet are checked against it on their first add.
    before: Mutex<Option<(bool, i64)>>,
    checked: Mutex<HashSet<Key>>,
    /// Partitions an add left out (see [`Transaction::check_before_add`]), until their own
    /// caller takes the reason.
    refused: Mutex<BTreeMap<Key, Refusal>>,
    /// The last transaction's partitions are still to be checked: by whoever takes the add turn
    /// next, before anything of the next transaction is added.
    check_due: std::sync::atomic::AtomicBool,
    /// Set once the target cannot be asked (see [`cannot_check`]): the check is off.
    unchecked: std::sync::atomic::AtomicBool,
    /// Suspects found hanging and not settled yet: (producer id, first offset of the range).
    open: Mutex<BTreeMap<Key, (i64, i64)>>,
    /// What was found and done about hanging transactions, until the owner takes it.
    reports: Mutex<Vec<Hanging>>,
}

/// A partition on which a transaction of this id stayed open after its coordinator completed
/// it: its marker was dropped (docs/engine.md, "Transactions whose marker was dropped").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hanging {
    pub topic: Arc<str>,
    pub partition: i32,
    pub producer_id: i64,
    /// First offset of the open range.
    pub open_since: i64,
    /// The result it was settled with, or is to be settled with.
    pub committed: bool,
    /// False when found, true once a marker closed it.
    pub settled: bool,
}

/// Why a partition was left out of an add.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// A range of this id is open there: (producer id, first offset).
    Hanging(i64, i64),
    /// Its leader could not say yet.
    Unknown,
}

impl Refusal {
    fn error(self, k: &Key) -> KafkaError {
        match self {
            Refusal::Hanging(producer_id, offset) => KafkaError::HangingTransaction {
                topic: k.0.to_string(),
                partition: k.1,
                producer_id,
                offset,
            },
            // Written now, a batch could join a range left open. Retried as any leaderless
            // partition is.
            Refusal::Unknown => KafkaError::Broker {
                broker: "metadata".into(),
                api: ApiKey::DescribeProducers,
                error: ResponseError::LeaderNotAvailable,
                message: Some(format!(
                    "{}-{}: cannot tell yet whether a transaction of this id is left open there",
                    k.0, k.1
                )),
            },
        }
    }
}

/// How long the check after a transaction waits for its markers to be written before it leaves
/// the partitions to be checked at their next add.
const CHECK_WAIT: Duration = Duration::from_secs(10);
/// Settling rounds before the partitions are left for their next add.
const SETTLE_ROUNDS: usize = 3;

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
            suspects: Mutex::default(),
            before: Mutex::new(None),
            checked: Mutex::default(),
            refused: Mutex::default(),
            check_due: std::sync::atomic::AtomicBool::new(false),
            unchecked: std::sync::atomic::AtomicBool::new(false),
            open: Mutex::default(),
            reports: Mutex::default(),
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
        self.remember_last_transaction().await;
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
        // The open transaction was aborted by InitProducerId: its markers are checked too.
        let aborted: Vec<Key> = self
            .added
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        self.suspect(aborted, false);
        self.check_due.store(false, Ordering::Relaxed);
        self.settle_suspects().await;
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
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
        if self.identity() == identity
            && self
                .added
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(topic.clone(), partition))
        {
            return Ok(());
        }
        // Boxed: the add turn and its requests are kilobytes, and a lane's `send` awaits this
        // inline in every partition task of an exactly-once flow.
        Box::pin(self.add_waiting(topic, partition, identity)).await
    }

    async fn add_waiting(
        &self,
        topic: &Arc<str>,
        partition: i32,
        identity: (i64, i16),
    ) -> Result<()> {
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
            let refused = self
                .refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            if let Some(r) = refused {
                return Err(r.error(&key));
            }
            self.wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone());
            let _turn = self.adding.lock().await;
            self.check_if_due().await;
            let batch: Vec<Key> = {
                let added = self.added.lock().unwrap_or_else(|p| p.into_inner());
                let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
                wanted.drain().filter(|k| !added.contains(k)).collect()
            };
            if batch.is_empty() || self.identity() != identity {
                continue;
            }
            // Partitions that cannot join now are left out; the others are not held up.
            let refused = self.check_before_add(&batch).await;
            let batch: Vec<Key> = batch
                .into_iter()
                .filter(|k| !refused.contains_key(k))
                .collect();
            self.refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(refused);
            if !batch.is_empty() {
                self.add_now(&batch).await?;
                self.added
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(batch);
            }
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
        self.check_if_due().await;
        self.send_end(committed).await?;
        let ended: Vec<Key> = self
            .added
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        let n = if committed {
            &self.commits
        } else {
            &self.aborts
        };
        n.fetch_add(1, Ordering::Relaxed);
        // Checked before any add of the next transaction, by the first caller to take the add
        // turn: a batch written to a partition whose marker was dropped would join the open
        // range. Not here: the partitions learn the outcome and prepare their next batches while
        // the markers are written, as the next add would wait for them anyway.
        self.suspect(ended, committed);
        self.check_due.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Runs the check of the last transaction if it is due. Called with the add turn held.
    async fn check_if_due(&self) {
        if self.check_due.swap(false, Ordering::Relaxed) {
            self.settle_suspects().await;
        }
    }

    async fn send_end(&self, committed: bool) -> Result<()> {
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
        .await
    }

    /// What was found and settled since the last call.
    pub fn take_reports(&self) -> Vec<Hanging> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn suspect(&self, keys: Vec<Key>, committed: bool) {
        if self.unchecked.load(Ordering::Relaxed) {
            return;
        }
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            suspects.insert(k, committed);
        }
    }

    /// Before InitProducerId forgets it: the result of the id's last transaction, and the
    /// partitions of one still open (InitProducerId ends it, and its markers can be dropped
    /// too). Nothing is known when the coordinator cannot say; the check is best effort there.
    async fn remember_last_transaction(&self) {
        let described = match self.cluster.describe_transaction(&self.id).await {
            Ok(Some(d)) => d,
            Ok(None) => return,
            Err(e) if cannot_check(&e) => {
                self.stop_checking(&e);
                return;
            }
            Err(e) => {
                tracing::debug!(transactional_id = %self.id, error = %e, "cannot describe the transactional id before initialising it");
                return;
            }
        };
        let Some(result) = described.phase.result() else {
            return;
        };
        if described.phase != TxnPhase::CompleteCommit && described.phase != TxnPhase::CompleteAbort
        {
            let open: Vec<Key> = described
                .partitions
                .iter()
                .map(|(t, p)| (Arc::from(t.as_str()), *p))
                .collect();
            self.suspect(open, result);
        }
        let mut before = self.before.lock().unwrap_or_else(|p| p.into_inner());
        if self.identity().0 < 0 {
            *before = Some((result, described.producer_id));
        }
    }

    fn producer_ids(&self) -> Vec<i64> {
        let mut ids = vec![self.identity().0];
        if let Some((_, before)) = *self.before.lock().unwrap_or_else(|p| p.into_inner()) {
            if !ids.contains(&before) {
                ids.push(before);
            }
        }
        ids
    }

    /// Partitions about to join the transaction that may hold a range of this id left open:
    /// suspects, and partitions this instance writes for the first time. Settled first when
    /// the transaction is empty; otherwise the partition is refused with
    /// [`KafkaError::HangingTransaction`] (its caller aborts, and the next transaction settles
    /// it before its first add). Returns the partitions refused.
    async fn check_before_add(&self, batch: &[Key]) -> BTreeMap<Key, Refusal> {
        if self.unchecked.load(Ordering::Relaxed) {
            return BTreeMap::new();
        }
        let before = *self.before.lock().unwrap_or_else(|p| p.into_inner());
        let need: Vec<Key> = {
            let suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
            let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
            batch
                .iter()
                .filter(|k| {
                    suspects.contains_key(*k) || (before.is_some() && checked.insert((*k).clone()))
                })
                .cloned()
                .collect()
        };
        if need.is_empty() {
            return BTreeMap::new();
        }
        if let Some((result, _)) = before {
            let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
            for k in &need {
                suspects.entry(k.clone()).or_insert(result);
            }
        }
        if !self.is_open() {
            self.settle(true).await;
        } else {
            self.confirmed_open(&need, tokio::time::Instant::now() + CHECK_WAIT)
                .await;
        }
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        need.into_iter()
            .filter_map(|k| {
                let why = match open.get(&k) {
                    Some(&(producer_id, offset)) => Refusal::Hanging(producer_id, offset),
                    None if suspects.contains_key(&k) => Refusal::Unknown,
                    None => return None,
                };
                Some((k, why))
            })
            .collect()
    }

    /// One look at `keys`: those with nothing open of this id stop being suspects; those with
    /// a range open are reported found. Partitions whose leader cannot answer stay suspects.
    /// Returns the hanging ones with their first offset.
    async fn sort_out(&self, keys: &[Key], record: bool) -> Vec<(Key, i64)> {
        let ids = self.producer_ids();
        let answers = self.cluster.describe_producers(keys).await;
        if let Some(e) = answers
            .values()
            .find_map(|a| a.as_ref().err().filter(|e| cannot_check(e)))
        {
            self.stop_checking(e);
            return Vec::new();
        }
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        look(
            answers,
            &ids,
            record,
            &mut suspects,
            &mut open,
            &mut reports,
        )
    }

    /// The suspects among `keys` on which a range of this id is open once the coordinator has
    /// written (or dropped) the last markers. Usually they are written by the time this is
    /// asked, and one DescribeProducers per leader is all it costs; a range that looks open is
    /// asked about again after DescribeTransactions says the markers are done.
    async fn confirmed_open(
        &self,
        keys: &[Key],
        deadline: tokio::time::Instant,
    ) -> Vec<(Key, i64)> {
        let seen: Vec<Key> = self
            .sort_out(keys, false)
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if seen.is_empty() || !self.markers_written(deadline).await {
            return Vec::new();
        }
        self.sort_out(&seen, true).await
    }

    /// The target cannot be asked: the check is turned off for this id, once, with a warning.
    fn stop_checking(&self, e: &KafkaError) {
        if !self.unchecked.swap(true, Ordering::Relaxed) {
            tracing::warn!(transactional_id = %self.id, error = %e, "cannot check for transactions whose marker the coordinator dropped (needs Kafka 3.0 or later, Describe on the transactional id and Read on the topics); not checking");
        }
        self.suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Waits until the coordinator has written (or dropped) the last transaction's markers.
    async fn markers_written(&self, deadline: tokio::time::Instant) -> bool {
        let mut delay = Duration::from_millis(2);
        loop {
            let cached = self.coordinator.lock().await.clone();
            let described = match cached {
                Some(conn) => crate::txn_state::describe_transaction_on(&conn, &self.id).await,
                None => self.cluster.describe_transaction(&self.id).await,
            };
            match described {
                Ok(Some(d)) if d.phase.completing() => {}
                Ok(_) => return true,
                Err(e) if cannot_check(&e) => {
                    self.stop_checking(&e);
                    return false;
                }
                Err(e) => {
                    tracing::debug!(transactional_id = %self.id, error = %e, "describing the transaction failed; will retry");
                }
            }
            if tokio::time::Instant::now() + delay > deadline {
                return false;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(20));
        }
    }

    /// Finds the suspects on which a transaction of this id is still open though its
    /// coordinator completed it, and closes each with the result it should have had: an empty
    /// transaction on the same producer id that adds only those partitions (explicitly, so the
    /// coordinator sends them a marker though nothing was written) and ends with that result.
    /// The marker closes the open range from its first offset (docs/engine.md). Called with
    /// the add turn held and no transaction open. Best effort: what cannot be checked now
    /// (no leader, no coordinator) stays suspect until its next add.
    async fn settle_suspects(&self) {
        self.settle(false).await
    }

    /// [`Transaction::settle_suspects`]; with `insist`, partitions whose leader could not
    /// answer are asked again (after the metadata reload) a few times.
    async fn settle(&self, insist: bool) {
        let deadline = tokio::time::Instant::now() + CHECK_WAIT;
        for round in 0..=SETTLE_ROUNDS {
            let keys: Vec<Key> = self
                .suspects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect();
            if keys.is_empty() {
                return;
            }
            let hanging = self.confirmed_open(&keys, deadline).await;
            if hanging.is_empty() {
                if !insist || round == SETTLE_ROUNDS {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let mut by_result: BTreeMap<bool, Vec<Key>> = BTreeMap::new();
            {
                let suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
                for (k, _) in hanging {
                    if let Some(&committed) = suspects.get(&k) {
                        by_result.entry(committed).or_default().push(k);
                    }
                }
            }
            for (committed, keys) in by_result {
                let settled = async {
                    self.add_now(&keys).await?;
                    self.send_end(committed).await
                }
                .await;
                if let Err(e) = settled {
                    tracing::warn!(transactional_id = %self.id, error = %e, "settling a hanging transaction failed; trying again at the partitions' next add");
                    return;
                }
            }
        }
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
                        let found =
                            crate::coordinator::find_coordinator(&self.cluster, &self.id, 1).await;
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

/// One look at the leaders' answers (pure, so it is tested without brokers): a suspect on which
/// none of `ids` holds a transaction open is clean (and reported settled if it was found
/// before); one with a range open is hanging (with `record`, reported found the first time;
/// without, its marker may still be on its way). Suspects whose
/// leader could not answer, and partitions that are not suspects, are left as they are.
/// Returns the hanging ones with the first offset of their range.
fn look(
    answers: BTreeMap<Key, crate::txn_state::ProducersAnswer>,
    ids: &[i64],
    record: bool,
    suspects: &mut BTreeMap<Key, bool>,
    open: &mut BTreeMap<Key, (i64, i64)>,
    reports: &mut Vec<Hanging>,
) -> Vec<(Key, i64)> {
    let mut hanging = Vec::new();
    for (k, answer) in answers {
        let Ok(producers) = answer else { continue };
        let Some(&committed) = suspects.get(&k) else {
            continue;
        };
        let report = |producer_id, open_since, settled| Hanging {
            topic: k.0.clone(),
            partition: k.1,
            producer_id,
            open_since,
            committed,
            settled,
        };
        match open_since(&producers, ids) {
            None => {
                suspects.remove(&k);
                if let Some((producer_id, offset)) = open.remove(&k) {
                    reports.push(report(producer_id, offset, true));
                }
            }
            Some(offset) => {
                if record && !open.contains_key(&k) {
                    let producer_id = producers
                        .iter()
                        .find(|p| ids.contains(&p.producer_id) && p.open_since == offset)
                        .map_or(ids[0], |p| p.producer_id);
                    open.insert(k.clone(), (producer_id, offset));
                    reports.push(report(producer_id, offset, false));
                }
                hanging.push((k, offset));
            }
        }
    }
    hanging
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn_state::ProducerOnPartition;

    fn key(p: i32) -> Key {
        (Arc::from("t"), p)
    }

    fn producer(id: i64, open_since: i64) -> ProducerOnPartition {
        ProducerOnPartition {
            producer_id: id,
            epoch: 3,
            last_timestamp: 0,
            open_since,
        }
    }

    #[test]
    fn a_look_finds_our_open_ranges_and_later_sees_them_settled() {
        let mut suspects: BTreeMap<Key, bool> = [
            (key(0), true),
            (key(1), true),
            (key(2), false),
            (key(3), true),
        ]
        .into();
        let (mut open, mut reports) = (BTreeMap::new(), Vec::new());
        // A first look, markers perhaps still on their way: open ranges are not reported yet.
        let mut first = suspects.clone();
        let early = [(key(1), Ok(vec![producer(8, 40)]))].into();
        let seen = look(early, &[7, 8], false, &mut first, &mut open, &mut reports);
        assert_eq!(seen, vec![(key(1), 40)]);
        assert!(open.is_empty() && reports.is_empty());
        let answers: BTreeMap<Key, crate::txn_state::ProducersAnswer> = [
            // Clean: our producer has nothing open.
            (key(0), Ok(vec![producer(7, -1)])),
            // Hanging: our producer id of before the new epoch holds a range open from 40.
            (key(1), Ok(vec![producer(9, 5), producer(8, 40)])),
            // Another producer's open transaction is none of ours.
            (key(2), Ok(vec![producer(9, 12)])),
            // No leader now: still a suspect.
            (key(3), Err(KafkaError::Config("no leader".into()))),
            // Not a suspect: not looked at.
            (key(4), Ok(vec![producer(7, 1)])),
        ]
        .into();
        let hanging = look(
            answers,
            &[7, 8],
            true,
            &mut suspects,
            &mut open,
            &mut reports,
        );
        assert_eq!(hanging, vec![(key(1), 40)]);
        assert_eq!(
            suspects.keys().cloned().collect::<Vec<_>>(),
            vec![key(1), key(3)]
        );
        assert_eq!(reports.len(), 1);
        assert_eq!(
            (
                reports[0].partition,
                reports[0].producer_id,
                reports[0].open_since
            ),
            (1, 8, 40)
        );
        assert!(reports[0].committed && !reports[0].settled);

        // Still open at the next look: not reported twice.
        let again = [(key(1), Ok(vec![producer(8, 40)]))].into();
        assert_eq!(
            look(again, &[7, 8], true, &mut suspects, &mut open, &mut reports).len(),
            1
        );
        assert_eq!(reports.len(), 1);

        // Closed by the settling transaction's marker: reported settled, no longer a suspect.
        let settled = [(key(1), Ok(vec![producer(8, -1)]))].into();
        assert!(look(
            settled,
            &[7, 8],
            true,
            &mut suspects,
            &mut open,
            &mut reports
        )
        .is_empty());
        assert_eq!(reports.len(), 2);
        assert!(reports[1].settled && reports[1].open_since == 40);
        assert!(!suspects.contains_key(&key(1)) && open.is_empty());
    }
}
