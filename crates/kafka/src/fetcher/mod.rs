//! One fetcher per source broker: a single Fetch request carries every partition the
//! broker leads that has room, in an incremental fetch session ([`crate::fetch_session`]), and
//! the broker's own wait (`fetch.min.bytes`, `fetch.max.wait.ms`) makes idle partitions cost
//! nothing. Partitions whose leader moves are handed to the new leader's fetcher with their
//! position; nothing is read twice or skipped.
//!
//! A consumer [`subscribe`](Fetcher::subscribe)s to a partition at an offset and receives
//! [`FetchEvent`]s from its [`Subscription`]. Two bounds keep memory in check: at most two
//! undelivered responses per partition (a partition whose consumer has not taken them is left
//! out of the session, not skipped, so the broker does not keep returning it), and a
//! byte budget shared by every partition of the fetcher: the bytes of each delivered response
//! count until the consumer drops its [`BufferShare`].
//!
//! The fetch uses a connection of its own per broker: a long poll holds its connection for up to
//! `fetch.max.wait.ms`, and metadata, offsets and commits must not queue behind it.
//!
//! Why one file of this size: a partition's `Slot` state is shared by its `Subscription` (a
//! seek bumps the generation) and its `BrokerFetcher` (checks it again under the slot's lock),
//! as are the byte `Buffer` and the broker table that `assign` and `retire` lock. Next to split
//! out: `BrokerFetcher` (request building, `on_partition`) into `fetcher/broker.rs`.

use crate::batch::{keep_until_corrupt, split_until_bad};
use crate::cluster::{fetch_partition, KafkaCluster, PartitionFetch, EARLIEST, LATEST};
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::fetch_session::{
    FetchPosition, FetchSession, SessionOutcome, SessionPartition, SessionStats,
};
use crate::settings::IsolationLevel;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use mailbox::{Mailbox, Sent};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

mod mailbox;

/// The topics of a Fetch request, grouped by (name, id): `FetchTopic` and `ForgottenTopic` are
/// separate generated types that name a topic the same two ways, by id from v13 (KIP-516), else
/// by name.
macro_rules! named_topics {
    ($kind:ident, $groups:expr, $ids:expr) => {
        $groups
            .into_iter()
            .map(|((t, id), parts): ((Arc<str>, uuid::Uuid), _)| {
                let topic = $kind::default().with_partitions(parts);
                if $ids {
                    topic.with_topic_id(id)
                } else {
                    topic.with_topic(TopicName(StrBytes::from_string(t.to_string())))
                }
            })
            .collect()
    };
}

/// The longest a fetcher with nothing to ask for sleeps before looking again.
const IDLE_TICK: Duration = Duration::from_millis(100);
/// The broker-side wait while a partition with data waits for its consumer.
const HELD_BACK_WAIT: Duration = Duration::from_millis(20);

/// How a fetcher asks (the consumer settings of the flow).
#[derive(Debug, Clone, Copy)]
pub struct FetcherConfig {
    pub isolation: IsolationLevel,
    /// `fetch.min.bytes`: the broker answers once this much is ready (or the wait is over).
    pub min_bytes: i32,
    /// `fetch.max.wait.ms`.
    pub max_wait: Duration,
    /// `fetch.max.bytes`: at most this much per request.
    pub max_bytes: i32,
    /// `max.partition.fetch.bytes`.
    pub partition_max_bytes: i32,
    /// Bytes delivered and not yet released, for all partitions together.
    pub buffer_bytes: usize,
    /// `check.crcs`: every fetched batch's CRC-32C is checked before it is delivered.
    pub check_crcs: bool,
}

/// The smallest buffer: one default-sized partition fetch, so a tiny `buffer.memory` cannot
/// stall.
const MIN_BUFFER: usize = 1 << 20;

impl FetcherConfig {
    /// A consumer's settings, with a buffer of `buffer_bytes` (at least 1 MiB). One partition
    /// asks for at most a quarter of the buffer, so at least four partitions can hold data at
    /// once (a partition allowed the whole buffer would hold up every other one).
    pub fn from_tuning(tuning: &crate::settings::ConsumerTuning, buffer_bytes: usize) -> Self {
        let buffer_bytes = buffer_bytes.clamp(MIN_BUFFER, i32::MAX as usize);
        FetcherConfig {
            isolation: tuning.isolation_level,
            min_bytes: tuning.fetch_min_bytes.max(1),
            max_wait: tuning.fetch_max_wait,
            max_bytes: tuning.fetch_max_bytes.max(1),
            partition_max_bytes: tuning
                .max_partition_fetch_bytes
                .clamp(1, (buffer_bytes / 4) as i32),
            buffer_bytes,
            check_crcs: tuning.check_crcs,
        }
    }
}

impl Default for FetcherConfig {
    fn default() -> Self {
        // The Java consumer's defaults; the buffer as the Java producer's buffer.memory.
        FetcherConfig {
            isolation: IsolationLevel::ReadUncommitted,
            min_bytes: 1,
            max_wait: Duration::from_millis(500),
            max_bytes: 50 << 20,
            partition_max_bytes: 1 << 20,
            buffer_bytes: 32 << 20,
            check_crcs: true,
        }
    }
}

/// What a subscription delivers.
#[derive(Debug)]
pub enum FetchEvent {
    /// Batches from the subscription's position on (none of them ends before it); the position
    /// moved past the last one.
    Data {
        data: PartitionFetch,
        /// Counts against the fetcher's buffer until dropped.
        share: BufferShare,
    },
    /// The position is outside the log; the subscription is paused until [`Subscription::seek`].
    OutOfRange {
        requested: i64,
        log_start: i64,
        log_end: i64,
    },
    /// An error that retrying cannot fix (authorization, corrupt data, a topic re-created
    /// under a new id); the subscription ends.
    Failed(KafkaError),
}

/// Totals over a fetcher's brokers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetcherStats {
    pub requests: u64,
    pub session: SessionStats,
    /// The most partitions one request carried.
    pub max_partitions_per_request: usize,
    /// Partitions sent back to routing (their leader moved, or their broker failed twice in a
    /// row), to go to whichever broker leads them after a metadata refresh.
    pub rerouted: u64,
    /// Requests that failed as a whole (connection lost, timeout, a broker-level error); the
    /// fetcher retries them itself.
    pub failed_requests: u64,
    /// Partition errors in answers that the fetcher retries itself (a stale leader sends the
    /// partition back to routing, other retriable errors back off).
    pub partition_errors: u64,
}

/// Bytes of a delivered response; released when dropped.
#[derive(Debug)]
pub struct BufferShare {
    bytes: usize,
    buffer: Arc<Buffer>,
}

impl BufferShare {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A share of a buffer of its own, counted nowhere else: for data that did not come
    /// through a fetcher (scripted feeds in tests).
    pub fn detached(bytes: usize) -> BufferShare {
        BufferShare {
            bytes,
            buffer: Arc::new(Buffer {
                capacity: bytes,
                used: AtomicUsize::new(bytes),
                freed: Notify::new(),
            }),
        }
    }
}

impl Drop for BufferShare {
    fn drop(&mut self) {
        self.buffer.used.fetch_sub(self.bytes, Ordering::SeqCst);
        self.buffer.freed.notify_waiters();
    }
}

#[derive(Debug, Default)]
struct Buffer {
    capacity: usize,
    used: AtomicUsize,
    freed: Notify,
}

impl Buffer {
    fn room(&self) -> usize {
        self.capacity
            .saturating_sub(self.used.load(Ordering::SeqCst))
    }
}

/// A subscribed partition, shared by its subscription and the fetcher that owns it.
#[derive(Debug)]
struct Slot {
    topic: Arc<str>,
    partition: i32,
    topic_id: uuid::Uuid,
    state: Mutex<SlotState>,
    /// Its events, waiting for the consumer.
    mailbox: Mailbox,
    /// The owning fetcher's wake-up: the consumer took an event, sought or left.
    wake: Mutex<Arc<Notify>>,
}

impl Slot {
    /// Fails the partition at a damaged batch at `offset`; the fetcher drops it. (Its mailbox
    /// has room: the partition is asked for only then.)
    fn corrupt(&self, generation: u64, offset: i64, message: String) -> Verdict {
        let _ = self.mailbox.try_send((
            generation,
            FetchEvent::Failed(KafkaError::CorruptBatch {
                topic: self.topic.to_string(),
                partition: self.partition,
                offset,
                message,
            }),
        ));
        Verdict::Drop
    }
}

#[derive(Debug)]
struct SlotState {
    position: i64,
    leader_epoch: i32,
    /// Bumped by a seek: responses and events of an older generation are dropped.
    generation: u64,
    out_of_range: bool,
    /// Since when out-of-range answers have come, not yet believed: a guard against an answer
    /// from a stale view, which costs a second on a log really trimmed (docs/engine.md, "Out of
    /// range"). Believed once they held for [`OUT_OF_RANGE_CONFIRM`], asked again with new
    /// metadata after each back-off.
    out_of_range_since: Option<tokio::time::Instant>,
    /// The partition's end as of the last answer (the last stable offset for read_committed).
    end: i64,
    /// Retriable partition errors back off until this instant.
    backoff_until: Option<tokio::time::Instant>,
    backoff_attempt: u32,
    closed: bool,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        self.wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .notify_one();
    }

    fn key(&self) -> SessionPartition {
        SessionPartition {
            topic: self.topic.clone(),
            topic_id: self.topic_id,
            partition: self.partition,
        }
    }
}

/// Receives a partition's data.
#[derive(Debug)]
pub struct Subscription {
    slot: Arc<Slot>,
    /// The fetcher's stop (set by `shutdown`, or by a fetcher task that panicked).
    stopped: watch::Receiver<bool>,
    buffer: Arc<Buffer>,
}

impl Subscription {
    /// The next event; `None` once the fetcher stopped (shut down, or one of its tasks
    /// panicked) and nothing is left to take. Cancel-safe.
    pub async fn recv(&mut self) -> Option<FetchEvent> {
        loop {
            let (generation, event) = tokio::select! {
                biased;
                e = self.slot.mailbox.recv() => e,
                _ = self.stopped.wait_for(|stopped| *stopped) => return None,
            };
            self.slot.wake();
            if generation == self.slot.lock().generation {
                return Some(event);
            }
        }
    }

    /// Continues from `offset` (after [`FetchEvent::OutOfRange`], or to re-read).
    pub fn seek(&self, offset: i64) {
        {
            let mut s = self.slot.lock();
            s.position = offset;
            s.generation += 1;
            s.out_of_range = false;
            s.out_of_range_since = None;
        }
        self.slot.wake();
    }

    /// Bytes the fetcher has delivered (to every subscription) and not yet seen released.
    pub fn buffered(&self) -> usize {
        self.buffer.used.load(Ordering::SeqCst)
    }

    /// The next offset the fetcher will ask for.
    pub fn position(&self) -> i64 {
        self.slot.lock().position
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.slot.lock().closed = true;
        self.slot.mailbox.close();
        self.slot.wake();
    }
}

#[derive(Debug)]
struct BrokerHandle {
    control: mpsc::UnboundedSender<Arc<Slot>>,
    wake: Arc<Notify>,
}

#[derive(Debug)]
struct Shared {
    cluster: Arc<KafkaCluster>,
    config: FetcherConfig,
    buffer: Arc<Buffer>,
    brokers: Mutex<HashMap<i32, BrokerHandle>>,
    /// Partitions without a usable leader, routed again after one metadata refresh for all.
    homeless: mpsc::UnboundedSender<Arc<Slot>>,
    /// Stops every task of the fetcher (and ends subscriptions' `recv`).
    halt: watch::Sender<bool>,
    /// Sums over every broker fetcher, past and present.
    stats: Mutex<SessionStats>,
    requests: AtomicU64,
    failed_requests: AtomicU64,
    partition_errors: AtomicU64,
    rerouted: AtomicU64,
    max_partitions: AtomicUsize,
    stop: watch::Receiver<bool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The fetchers of one cluster.
#[derive(Debug)]
pub struct Fetcher {
    shared: Arc<Shared>,
}

/// Stops the whole fetcher when a task of it panics: its subscriptions must not wait for data
/// that will never come.
struct StopOnPanic(Arc<Shared>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("a fetcher task panicked; the fetcher stops");
            self.0.halt.send_replace(true);
        }
    }
}

impl Fetcher {
    pub fn start(cluster: Arc<KafkaCluster>, config: FetcherConfig) -> Fetcher {
        let (halt, stop) = watch::channel(false);
        let (homeless, homeless_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            cluster,
            config,
            buffer: Arc::new(Buffer {
                capacity: config.buffer_bytes.max(config.partition_max_bytes as usize),
                ..Buffer::default()
            }),
            brokers: Mutex::new(HashMap::new()),
            homeless,
            halt,
            stats: Mutex::new(SessionStats::default()),
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            partition_errors: AtomicU64::new(0),
            rerouted: AtomicU64::new(0),
            max_partitions: AtomicUsize::new(0),
            stop,
            tasks: Mutex::new(Vec::new()),
        });
        let router = tokio::spawn(route_homeless(shared.clone(), homeless_rx));
        lock(&shared.tasks).push(router);
        Fetcher { shared }
    }

    /// Starts fetching `topic`-`partition` from `offset`. The topic id is taken from the
    /// current metadata: should the topic be re-created, the subscription fails instead of
    /// reading the new log at the old offset.
    pub fn subscribe(&self, topic: &str, partition: i32, offset: i64) -> Result<Subscription> {
        let md = self.shared.cluster.metadata();
        let topic_id = md.topics.get(topic).map(|t| t.id).unwrap_or_default();
        let (leader_epoch, leader) = self
            .shared
            .cluster
            .leader_of(topic, partition)
            .map_or((-1, None), |(l, e)| (e, Some(l)));
        let slot = Arc::new(Slot {
            topic: topic.into(),
            partition,
            topic_id,
            state: Mutex::new(SlotState {
                position: offset,
                leader_epoch,
                generation: 0,
                out_of_range: false,
                out_of_range_since: None,
                end: -1,
                backoff_until: None,
                backoff_attempt: 0,
                closed: false,
            }),
            mailbox: Mailbox::default(),
            wake: Mutex::new(Arc::new(Notify::new())),
        });
        match leader {
            Some(l) => self.shared.assign(l, slot.clone()),
            None => {
                let _ = self.shared.homeless.send(slot.clone());
            }
        }
        Ok(Subscription {
            slot,
            stopped: self.shared.stop.clone(),
            buffer: self.shared.buffer.clone(),
        })
    }

    pub fn stats(&self) -> FetcherStats {
        let session = *lock(&self.shared.stats);
        FetcherStats {
            requests: self.shared.requests.load(Ordering::SeqCst),
            session,
            max_partitions_per_request: self.shared.max_partitions.load(Ordering::SeqCst),
            rerouted: self.shared.rerouted.load(Ordering::SeqCst),
            failed_requests: self.shared.failed_requests.load(Ordering::SeqCst),
            partition_errors: self.shared.partition_errors.load(Ordering::SeqCst),
        }
    }

    /// Bytes delivered and not yet released.
    pub fn buffered(&self) -> usize {
        self.shared.buffer.used.load(Ordering::SeqCst)
    }

    /// Stops every fetcher (closing their sessions) and waits for them.
    pub async fn shutdown(&self) {
        self.shared.halt.send_replace(true);
        let tasks: Vec<_> = std::mem::take(&mut *lock(&self.shared.tasks));
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.shared.halt.send_replace(true);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Hands a partition to `broker`'s fetcher, starting it if needed.
    fn assign(self: &Arc<Self>, broker: i32, slot: Arc<Slot>) {
        let mut brokers = lock(&self.brokers);
        if let Some(h) = brokers.get(&broker) {
            *lock(&slot.wake) = h.wake.clone();
            if h.control.send(slot.clone()).is_ok() {
                h.wake.notify_one();
                return;
            }
        }
        if *self.stop.borrow() {
            return;
        }
        let (control, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        *lock(&slot.wake) = wake.clone();
        let _ = control.send(slot);
        let task = tokio::spawn(
            BrokerFetcher {
                shared: self.clone(),
                broker,
                control: rx,
                wake: wake.clone(),
                assigned: BTreeMap::new(),
                session: FetchSession::new(),
                conn: None,
                failures: 0,
                used_ids: None,
                reported: SessionStats::default(),
            }
            .run(),
        );
        brokers.insert(broker, BrokerHandle { control, wake });
        lock(&self.tasks).push(task);
    }
}

/// Routes partitions that lost their leader: one metadata refresh for all of them, then each
/// goes to its new leader's fetcher; those still without one wait and try again.
async fn route_homeless(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Arc<Slot>>) {
    let _guard = StopOnPanic(shared.clone());
    let mut stop = shared.stop.clone();
    let mut waiting: Vec<Arc<Slot>> = Vec::new();
    let mut delay = Duration::from_millis(50);
    loop {
        if waiting.is_empty() {
            tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => waiting.push(s),
                    None => return,
                },
                _ = stop.changed() => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            waiting.push(s);
        }
        waiting.retain(|s| !s.lock().closed);
        if waiting.is_empty() {
            continue;
        }
        let _ = shared.cluster.refresh_metadata(None).await;
        let md = shared.cluster.metadata();
        let mut still = Vec::new();
        for slot in waiting.drain(..) {
            let now_id = md.topics.get(&*slot.topic).map(|t| t.id);
            if now_id.is_some_and(|id| id != slot.topic_id && !slot.topic_id.is_nil()) {
                let generation = slot.lock().generation;
                let sent = slot.mailbox.try_send((
                    generation,
                    FetchEvent::Failed(KafkaError::Broker {
                        broker: "metadata".into(),
                        api: ApiKey::Fetch,
                        error: ResponseError::InconsistentTopicId,
                        message: Some(format!(
                            "{}-{}: the topic was deleted and re-created",
                            slot.topic, slot.partition
                        )),
                    }),
                ));
                // Its consumer has not taken the data before it yet: tell it next round, or it
                // would wait for events that never come.
                if sent == Sent::Full {
                    still.push(slot);
                }
                continue;
            }
            match shared.cluster.leader_of(&slot.topic, slot.partition) {
                // Dropped during the reload: nobody reads it (see `admit`).
                _ if slot.lock().closed => {}
                Ok((leader, epoch)) if md.brokers.contains_key(&leader) => {
                    slot.lock().leader_epoch = epoch;
                    shared.rerouted.fetch_add(1, Ordering::SeqCst);
                    shared.assign(leader, slot);
                }
                _ => still.push(slot),
            }
        }
        waiting = still;
        if waiting.is_empty() {
            delay = Duration::from_millis(50);
        } else {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return,
            }
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }
}

/// Takes a slot handed to a broker's fetcher. A slot dropped on its way here (it waited for a
/// leader in [`route_homeless`] while its consumer gave it up and subscribed again) is left
/// out: inserted, it would replace the consumer's new slot for the same partition, already
/// here, and the retain that drops closed slots would then drop both, so the partition's
/// consumer waited for data forever with nothing in the log.
fn admit(assigned: &mut BTreeMap<SessionPartition, Arc<Slot>>, slot: Arc<Slot>) {
    if slot.lock().closed {
        return;
    }
    assigned.insert(slot.key(), slot);
}

/// Partitions a broker should no longer serve, and why.
enum Verdict {
    Keep,
    /// Leadership moved (or is unknown): route again after a metadata refresh.
    Reroute,
    /// Delivered an event that ends the subscription.
    Drop,
}

struct BrokerFetcher {
    shared: Arc<Shared>,
    broker: i32,
    control: mpsc::UnboundedReceiver<Arc<Slot>>,
    wake: Arc<Notify>,
    assigned: BTreeMap<SessionPartition, Arc<Slot>>,
    session: FetchSession,
    conn: Option<Arc<Connection>>,
    failures: u32,
    /// Whether the last request named topics by id (a session cannot switch mid-way).
    used_ids: Option<bool>,
    /// The session's counts already added to the shared ones.
    reported: SessionStats,
}

impl BrokerFetcher {
    async fn run(mut self) {
        let _guard = StopOnPanic(self.shared.clone());
        let mut stop = self.shared.stop.clone();
        loop {
            if *stop.borrow() {
                break;
            }
            while let Ok(slot) = self.control.try_recv() {
                admit(&mut self.assigned, slot);
            }
            self.assigned.retain(|_, s| !s.lock().closed);
            let (wanted, held_back) = self.wanted();
            if wanted.is_empty() {
                if self.assigned.is_empty() && self.control.is_empty() && self.retire() {
                    break;
                }
                // Nothing to ask for: wait for a consumer to take data, memory to be freed, a
                // new partition, a back-off to end, or the stop. Freed memory wakes every
                // fetcher without a stored permit, so a short tick covers a wake-up lost
                // between the check and the wait.
                let backoff = self.next_backoff();
                let buffer = self.shared.buffer.clone();
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = buffer.freed.notified() => {}
                    _ = sleep_until(backoff) => {}
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                    _ = stop.changed() => break,
                }
                continue;
            }
            // A partition held back only because its consumer is busy has data waiting: do
            // not let a long poll over idle partitions keep it waiting.
            let max_wait = if held_back {
                HELD_BACK_WAIT.min(self.shared.config.max_wait)
            } else {
                self.shared.config.max_wait
            };
            let result = tokio::select! {
                r = self.fetch(&wanted, max_wait) => r,
                _ = stop.changed() => break,
            };
            match result {
                Ok(()) => self.failures = 0,
                Err(e) => {
                    self.shared.failed_requests.fetch_add(1, Ordering::SeqCst);
                    self.session.on_outcome(SessionOutcome::Failed);
                    if let Some(c) = self.conn.take() {
                        // A timed-out request leaves the connection in an unknown state.
                        c.close().await;
                    }
                    self.failures += 1;
                    tracing::debug!(broker = self.broker, error = %e, failures = self.failures, "fetch failed");
                    if self.failures >= 2 {
                        // The broker may be gone or no longer lead these partitions.
                        let all: Vec<SessionPartition> = self.assigned.keys().cloned().collect();
                        for k in all {
                            self.reroute(&k);
                        }
                    }
                    let delay = Duration::from_millis(50 << self.failures.min(4));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.changed() => break,
                    }
                }
            }
            self.record_stats();
        }
        self.close_session().await;
        self.record_stats();
    }

    /// Leaves the broker table when this fetcher has nothing left; false if a partition arrived
    /// meanwhile. The fetcher ends after it (closing its session).
    fn retire(&mut self) -> bool {
        let mut brokers = lock(&self.shared.brokers);
        if !self.control.is_empty() {
            return false;
        }
        brokers.remove(&self.broker);
        self.control.close();
        // Anything sent between the check and the close goes back to routing.
        while let Ok(slot) = self.control.try_recv() {
            let _ = self.shared.homeless.send(slot);
        }
        true
    }

    fn next_backoff(&self) -> Option<tokio::time::Instant> {
        self.assigned
            .values()
            .filter_map(|s| s.lock().backoff_until)
            .min()
    }

    /// The partitions to ask for now: their consumer has room, they are not paused, and the
    /// shared buffer has room. Also whether a partition with data waiting was held back
    /// because its consumer has not taken what it has.
    fn wanted(&self) -> (BTreeMap<SessionPartition, FetchPosition>, bool) {
        let mut held_back = false;
        if self.shared.buffer.room() == 0 {
            return (BTreeMap::new(), false);
        }
        let now = tokio::time::Instant::now();
        // Collected in key order, so the map is built in one pass rather than by a search per
        // partition.
        let out = self
            .assigned
            .iter()
            .filter_map(|(k, slot)| {
                let s = slot.lock();
                if s.out_of_range || s.closed || s.backoff_until.is_some_and(|t| t > now) {
                    return None;
                }
                if slot.mailbox.is_full() {
                    held_back |= s.end > s.position;
                    return None;
                }
                Some((
                    k.clone(),
                    FetchPosition {
                        fetch_offset: s.position,
                        leader_epoch: s.leader_epoch,
                        max_bytes: self.shared.config.partition_max_bytes,
                    },
                ))
            })
            .collect();
        (out, held_back)
    }

    async fn connection(&mut self) -> Result<Arc<Connection>> {
        if let Some(c) = self.conn.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        // A session belongs to the broker, not to a connection: a new connection continues it
        // (and a restarted broker answers FETCH_SESSION_ID_NOT_FOUND).
        let c = self
            .shared
            .cluster
            .dedicated_connection(self.broker)
            .await?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    async fn fetch(
        &mut self,
        wanted: &BTreeMap<SessionPartition, FetchPosition>,
        max_wait: Duration,
    ) -> Result<()> {
        let conn = self.connection().await?;
        let cfg = self.shared.config;
        let negotiated = conn.version::<FetchRequest>()?;
        // Fetch v13+ names topics by id (KIP-516); a partition without one needs names.
        let ids = negotiated >= 13 && wanted.keys().all(|k| !k.topic_id.is_nil());
        let version = if ids { negotiated } else { negotiated.min(12) };
        if self.used_ids.is_some_and(|u| u != ids) {
            self.session.reset();
        }
        self.used_ids = Some(ids);
        let generations: HashMap<SessionPartition, u64> = wanted
            .keys()
            .filter_map(|k| {
                self.assigned
                    .get(k)
                    .map(|s| (k.clone(), s.lock().generation))
            })
            .collect();
        let plan = self.session.plan(wanted);
        let mut topics: BTreeMap<(Arc<str>, uuid::Uuid), Vec<FetchPartition>> = BTreeMap::new();
        for (k, pos) in &plan.partitions {
            topics
                .entry((k.topic.clone(), k.topic_id))
                .or_default()
                .push(fetch_partition(
                    k.partition,
                    pos.leader_epoch,
                    pos.fetch_offset,
                    pos.max_bytes,
                ));
        }
        let n = plan.partitions.len();
        self.shared.max_partitions.fetch_max(n, Ordering::SeqCst);
        let mut forgotten: BTreeMap<(Arc<str>, uuid::Uuid), Vec<i32>> = BTreeMap::new();
        for k in &plan.forgotten {
            forgotten
                .entry((k.topic.clone(), k.topic_id))
                .or_default()
                .push(k.partition);
        }
        // At most a quarter of the buffer per request: a response is held whole while its
        // partitions' records are copied out of it, so a bigger one would double the memory
        // for a moment; and the next request can go out while the last is being forwarded.
        let room = self
            .shared
            .buffer
            .room()
            .min(self.shared.buffer.capacity / 4)
            .max(cfg.partition_max_bytes as usize);
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait.as_millis() as i32)
            .with_min_bytes(cfg.min_bytes)
            .with_max_bytes(cfg.max_bytes.min(i32::try_from(room).unwrap_or(i32::MAX)))
            .with_isolation_level(match cfg.isolation {
                IsolationLevel::ReadUncommitted => 0,
                IsolationLevel::ReadCommitted => 1,
            })
            .with_session_id(plan.session_id)
            .with_session_epoch(plan.session_epoch)
            .with_topics(named_topics!(FetchTopic, topics, ids))
            .with_forgotten_topics_data(named_topics!(ForgottenTopic, forgotten, ids));
        self.shared.requests.fetch_add(1, Ordering::SeqCst);
        tracing::trace!(
            broker = self.broker,
            partitions = n,
            forgotten = plan.forgotten.len(),
            session = plan.session_id,
            epoch = plan.session_epoch,
            max_wait_ms = max_wait.as_millis() as u64,
            room,
            "fetch"
        );
        let timeout = self.shared.cluster.settings().request_timeout + max_wait;
        let resp = conn
            .submit(&req, version)
            .await?
            .with_timeout(timeout)
            .wait()
            .await?;
        match resp.error_code.err() {
            None => self.session.on_outcome(SessionOutcome::Answered {
                session_id: resp.session_id,
            }),
            Some(ResponseError::FetchSessionIdNotFound) => {
                self.session.on_outcome(SessionOutcome::SessionIdNotFound);
                return Ok(());
            }
            Some(ResponseError::InvalidFetchSessionEpoch) => {
                self.session.on_outcome(SessionOutcome::InvalidEpoch);
                return Ok(());
            }
            Some(error) => {
                // The caller records the failed outcome.
                return Err(KafkaError::Broker {
                    broker: conn.broker().into(),
                    api: ApiKey::Fetch,
                    error,
                    message: None,
                });
            }
        }
        self.deliver(&conn, resp, wanted, &generations, ids).await;
        Ok(())
    }

    /// Hands each partition's part of a fetch response to its subscriber, then reroutes or
    /// drops the partitions that asked for it.
    async fn deliver(
        &mut self,
        conn: &Connection,
        resp: FetchResponse,
        wanted: &BTreeMap<SessionPartition, FetchPosition>,
        generations: &HashMap<SessionPartition, u64>,
        ids: bool,
    ) {
        let by_id: HashMap<uuid::Uuid, &SessionPartition> =
            wanted.keys().map(|k| (k.topic_id, k)).collect();
        let mut verdicts: Vec<(SessionPartition, Verdict)> = Vec::new();
        // Each partition's records are a slice of the whole response: one partition whose
        // consumer holds its data would keep every other partition's bytes of it in memory
        // too, far past what the buffer counts. With several partitions, each gets a copy.
        let with_data = resp
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .filter(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()))
            .count();
        let detach = with_data > 1;
        for t in resp.responses {
            for p in t.partitions {
                // The response names the topic as the request did.
                let key = if ids {
                    by_id.get(&t.topic_id).map(|k| SessionPartition {
                        partition: p.partition_index,
                        ..(*k).clone()
                    })
                } else {
                    wanted
                        .keys()
                        .find(|k| &*k.topic == t.topic.as_str() && k.partition == p.partition_index)
                        .cloned()
                };
                let Some(key) = key else {
                    continue; // a partition forgotten meanwhile, or one we never asked for
                };
                let Some(slot) = self.assigned.get(&key).cloned() else {
                    continue;
                };
                let Some(&generation) = generations.get(&key) else {
                    continue; // in the session from before, not asked for this time
                };
                let verdict = self.on_partition(conn, &slot, generation, p, detach).await;
                verdicts.push((key, verdict));
            }
        }
        for (key, verdict) in verdicts {
            match verdict {
                Verdict::Keep => {}
                Verdict::Reroute => self.reroute(&key),
                Verdict::Drop => {
                    self.assigned.remove(&key);
                }
            }
        }
    }

    async fn on_partition(
        &self,
        conn: &Connection,
        slot: &Slot,
        generation: u64,
        mut p: kafka_protocol::messages::fetch_response::PartitionData,
        detach: bool,
    ) -> Verdict {
        if slot.lock().generation != generation {
            return Verdict::Keep; // sought meanwhile: this answer is for the old position
        }
        let error = p.error_code.err();
        match error {
            None => {}
            Some(ResponseError::OffsetOutOfRange) => {
                return self.out_of_range(slot, generation).await
            }
            Some(
                ResponseError::NotLeaderOrFollower
                | ResponseError::FencedLeaderEpoch
                | ResponseError::UnknownTopicOrPartition
                | ResponseError::LeaderNotAvailable
                | ResponseError::ReplicaNotAvailable
                | ResponseError::KafkaStorageError
                | ResponseError::UnknownTopicId
                | ResponseError::InconsistentTopicId,
            ) => {
                self.shared.partition_errors.fetch_add(1, Ordering::SeqCst);
                return Verdict::Reroute;
            }
            Some(e) if e.is_retriable() && e != ResponseError::CorruptMessage => {
                self.back_off(slot);
                return Verdict::Keep;
            }
            Some(e) => {
                let _ = slot.mailbox.try_send((
                    generation,
                    FetchEvent::Failed(KafkaError::Broker {
                        broker: conn.broker().into(),
                        api: ApiKey::Fetch,
                        error: e,
                        message: Some(format!("{}-{}", slot.topic, slot.partition)),
                    }),
                ));
                return Verdict::Drop;
            }
        }
        let position = slot.lock().position;
        let records = p.records.take().unwrap_or_default();
        let records = if detach {
            bytes::Bytes::copy_from_slice(&records)
        } else {
            records
        };
        let bytes = records.len();
        let (batches, rest) = split_until_bad(records);
        let mut batches: Vec<_> = batches
            .into_iter()
            .filter(|b| b.last_offset() >= position)
            .collect();
        // The batches before one that does not frame are delivered; the next fetch starts at
        // the bad one and fails there.
        if let (Err(bad), true) = (rest, batches.is_empty()) {
            // The claimed offset is hostile data: named only when it is plausible.
            let offset = if bad.claimed_offset >= position {
                bad.claimed_offset
            } else {
                position
            };
            let message = format!("{} (from broker {})", bad.error, conn.broker());
            return slot.corrupt(generation, offset, message);
        }
        if self.shared.config.check_crcs {
            // The batches before a corrupt one are delivered; the next fetch starts at the
            // corrupt one and fails the partition there, naming its offset.
            if let Err((offset, e)) = keep_until_corrupt(&mut batches) {
                let message = format!(
                    "{} (from broker {}; the source log is damaged, check.crcs=false copies it \
                     anyway)",
                    e.message,
                    conn.broker()
                );
                return slot.corrupt(generation, offset, message);
            }
        }
        {
            let mut s = slot.lock();
            s.backoff_attempt = 0;
            s.backoff_until = None;
            s.out_of_range_since = None;
            s.end = match self.shared.config.isolation {
                IsolationLevel::ReadCommitted if p.last_stable_offset >= 0 => p.last_stable_offset,
                _ => p.high_watermark,
            };
        }
        let Some(last) = batches.last().map(|b| b.last_offset()) else {
            return Verdict::Keep;
        };
        self.shared.buffer.used.fetch_add(bytes, Ordering::SeqCst);
        let share = BufferShare {
            bytes,
            buffer: self.shared.buffer.clone(),
        };
        let data = PartitionFetch::new(&p, batches);
        // The generation is checked again under the lock that a seek takes: a seek since the
        // check above must not be overwritten by this answer's end (the records between the
        // sought offset and it would never be delivered).
        let mut s = slot.lock();
        if s.generation != generation {
            return Verdict::Keep;
        }
        // The partition was asked for only with room in its channel, and only this fetcher
        // sends to it, so this cannot be full; a closed one is a dropped subscription.
        if slot
            .mailbox
            .try_send((generation, FetchEvent::Data { data, share }))
            == Sent::Queued
        {
            s.position = last + 1;
        }
        Verdict::Keep
    }

    /// The partition's position is outside the log: asked again after a back-off with new
    /// metadata before it is believed (a broker that just became leader may answer so), then
    /// reported to the subscriber with the log's bounds.
    async fn out_of_range(&self, slot: &Slot, generation: u64) -> Verdict {
        let requested = slot.lock().position;
        let iso = self.shared.config.isolation;
        let cluster = &self.shared.cluster;
        let (log_start, log_end) = match (
            cluster
                .list_offset(&slot.topic, slot.partition, EARLIEST, iso)
                .await,
            cluster
                .list_offset(&slot.topic, slot.partition, LATEST, iso)
                .await,
        ) {
            (Ok(s), Ok(e)) => (s, e),
            _ => {
                self.back_off(slot);
                return Verdict::Keep;
            }
        };
        // A seek during the lookups wins: pausing its new position would stall the
        // partition for good (its consumer drops this generation's event).
        let mut s = slot.lock();
        let now = tokio::time::Instant::now();
        let held = s.out_of_range_since.map(|t| now - t);
        let believed = believe_out_of_range(requested, log_start, log_end, held);
        if s.generation == generation && !believed {
            // Asked again after a back-off, with new metadata.
            let stale = (log_start..=log_end).contains(&requested);
            s.out_of_range_since = (!stale).then(|| s.out_of_range_since.unwrap_or(now));
            drop(s);
            self.back_off(slot);
            tracing::debug!(topic = %slot.topic, partition = slot.partition, requested, log_start, log_end, "offset out of range; asking again before believing it");
            return Verdict::Reroute;
        }
        if s.generation == generation {
            s.out_of_range = true;
            let _ = slot.mailbox.try_send((
                generation,
                FetchEvent::OutOfRange {
                    requested,
                    log_start,
                    log_end,
                },
            ));
        }
        Verdict::Keep
    }

    fn back_off(&self, slot: &Slot) {
        self.shared.partition_errors.fetch_add(1, Ordering::SeqCst);
        let mut s = slot.lock();
        s.backoff_attempt = (s.backoff_attempt + 1).min(5);
        s.backoff_until = Some(
            tokio::time::Instant::now() + Duration::from_millis(50 << (s.backoff_attempt - 1)),
        );
    }

    fn reroute(&mut self, key: &SessionPartition) {
        if let Some(slot) = self.assigned.remove(key) {
            let _ = self.shared.homeless.send(slot);
        }
    }

    fn record_stats(&mut self) {
        let now = self.session.stats();
        let was = std::mem::replace(&mut self.reported, now);
        let mut total = lock(&self.shared.stats);
        total.full_requests += now.full_requests - was.full_requests;
        total.incremental_requests += now.incremental_requests - was.incremental_requests;
        total.fallbacks += now.fallbacks - was.fallbacks;
        total.sessionless += now.sessionless - was.sessionless;
        total.forgotten += now.forgotten - was.forgotten;
        total.max_epoch = total.max_epoch.max(now.max_epoch);
    }

    /// Frees the broker's session slot (best effort, briefly).
    async fn close_session(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if let Some(plan) = self.session.close() {
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_session_id(plan.session_id)
                .with_session_epoch(plan.session_epoch);
            if let Ok(version) = conn.version::<FetchRequest>() {
                if let Ok(f) = conn.submit(&req, version).await {
                    let _ = f.with_timeout(Duration::from_secs(1)).wait().await;
                }
            }
        }
        conn.close().await;
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// How long out-of-range answers must keep coming before one is believed.
const OUT_OF_RANGE_CONFIRM: Duration = Duration::from_secs(1);

/// Whether an OFFSET_OUT_OF_RANGE answer for `requested` is believed, given the log's start
/// and end from ListOffsets and how long such answers have come (docs/engine.md, "Out of
/// range"). A position inside the log is never out of range.
fn believe_out_of_range(
    requested: i64,
    log_start: i64,
    log_end: i64,
    held: Option<Duration>,
) -> bool {
    !(log_start..=log_end).contains(&requested) && held.is_some_and(|h| h >= OUT_OF_RANGE_CONFIRM)
}

#[cfg(test)]
mod tests {
    use super::{admit, believe_out_of_range, Mailbox, Slot, SlotState};
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::sync::Notify;

    fn slot(closed: bool) -> Arc<Slot> {
        Arc::new(Slot {
            topic: "t".into(),
            partition: 3,
            topic_id: Default::default(),
            state: Mutex::new(SlotState {
                position: 0,
                leader_epoch: -1,
                generation: 0,
                out_of_range: false,
                out_of_range_since: None,
                end: -1,
                backoff_until: None,
                backoff_attempt: 0,
                closed,
            }),
            mailbox: Mailbox::default(),
            wake: Mutex::new(Arc::new(Notify::new())),
        })
    }

    /// The cause of partitions that never copied after a leader wait: the old slot of a
    /// partition, dropped while it waited for a leader, reached the broker's fetcher after the
    /// consumer's new slot and replaced it, and both were then dropped as closed.
    #[test]
    fn a_slot_dropped_on_its_way_never_replaces_the_live_one() {
        let mut assigned = BTreeMap::new();
        let live = slot(false);
        admit(&mut assigned, live.clone());
        admit(&mut assigned, slot(true));
        assigned.retain(|_, s: &mut Arc<Slot>| !s.lock().closed);
        assert_eq!(assigned.len(), 1, "the live subscription is still fetched");
        assert!(Arc::ptr_eq(assigned.values().next().unwrap(), &live));
        // A live slot arriving after a closed one that is still listed takes its place.
        let mut assigned = BTreeMap::new();
        let old = slot(false);
        admit(&mut assigned, old.clone());
        old.lock().closed = true;
        let new = slot(false);
        admit(&mut assigned, new.clone());
        assert!(Arc::ptr_eq(assigned.values().next().unwrap(), &new));
    }

    #[test]
    fn an_out_of_range_answer_is_believed_once_it_held_and_never_inside_the_log() {
        let ms = Duration::from_millis;
        // Below the log start: not at the first answer, nor 0.9 s on; after 1 s, believed.
        assert!(!believe_out_of_range(0, 100, 500, None));
        assert!(!believe_out_of_range(0, 100, 500, Some(ms(900))));
        assert!(believe_out_of_range(0, 100, 500, Some(ms(1000))));
        // Past the end (unclean election) alike.
        assert!(believe_out_of_range(900, 100, 500, Some(ms(1500))));
        // ListOffsets puts the position inside the log: a stale answer, never believed.
        for at in [100, 300, 500] {
            assert!(!believe_out_of_range(at, 100, 500, Some(ms(5000))), "{at}");
        }
    }
}
