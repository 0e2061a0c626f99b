//! A client for one cluster: bootstrap, metadata (brokers, topics, partition leaders and epochs),
//! shared connections per broker opened on demand (one for control requests, a few for partition
//! data), and request routing to partition leaders.
//!
//! Retry policy belongs to callers (they know their deadlines); every error says whether it is
//! retriable, and [`KafkaCluster::refresh_metadata`] re-learns leaders after NOT_LEADER_OR_FOLLOWER,
//! UNKNOWN_TOPIC_OR_PARTITION or FENCED_LEADER_EPOCH.

use crate::batch::{split_batches, RawBatch};
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::settings::{BrokerAddress, ClientSettings, IsolationLevel};
use bytes::Bytes;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteTopicsRequest, FetchRequest, ListOffsetsRequest,
    MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// A Kafka topic id (KIP-516).
pub type TopicId = uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    pub partition: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub error: Option<ResponseError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    pub name: String,
    pub id: TopicId,
    pub is_internal: bool,
    pub error: Option<ResponseError>,
    pub partitions: Vec<PartitionMetadata>,
}

/// What the cluster told us last.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    /// When it was loaded (for periodic refresh).
    pub loaded_at: Option<std::time::Instant>,
    pub cluster_id: Option<String>,
    pub controller_id: i32,
    pub brokers: BTreeMap<i32, BrokerAddress>,
    pub topics: BTreeMap<String, TopicMetadata>,
}

/// The earliest offset, for ListOffsets.
pub const EARLIEST: i64 = -2;
/// The next offset to be written (the high watermark, or the LSO for read_committed).
pub const LATEST: i64 = -1;

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

/// The shared connection to one broker, opened on first use.
type BrokerSlot = Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>;

/// Connections per broker for partition data, besides channel 0.
pub const DATA_CHANNELS: usize = 4;

/// The data channel of a partition: fixed, so its requests stay in order on one connection.
pub fn data_channel(topic: &str, partition: i32) -> usize {
    // FNV-1a: stable across runs and processes, unlike the std hasher's random keys.
    let mut h: u32 = 0x811c_9dc5;
    for b in topic.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    1 + (h.wrapping_add(partition as u32) as usize) % DATA_CHANNELS
}

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

/// One cluster.
#[derive(Debug)]
pub struct KafkaCluster {
    settings: ClientSettings,
    metadata: RwLock<Arc<Metadata>>,
    /// Connections by (broker, channel): channel 0 for metadata, admin and the like; data
    /// channels (see [`data_channel`]) for fetches and produces.
    slots: Mutex<HashMap<(i32, usize), BrokerSlot>>,
    /// ListOffsets asked by many callers at once, sent together ([`crate::offset_lookup`]).
    pub(crate) lookups: crate::offset_lookup::Lookups,
}

fn broker_error(
    broker: &str,
    api: ApiKey,
    code: i16,
    message: Option<&StrBytes>,
) -> Option<KafkaError> {
    code.err().map(|error| KafkaError::Broker {
        broker: broker.into(),
        api,
        error,
        message: message.map(|m| m.to_string()),
    })
}

impl KafkaCluster {
    /// Connects to the first reachable bootstrap server and loads the metadata of all topics.
    pub async fn connect(settings: ClientSettings) -> Result<KafkaCluster> {
        if settings.bootstrap.is_empty() {
            return Err(KafkaError::Config("no bootstrap servers".into()));
        }
        let cluster = KafkaCluster {
            settings,
            metadata: RwLock::new(Arc::new(Metadata::default())),
            slots: Mutex::new(HashMap::new()),
            lookups: Default::default(),
        };
        // A broker that just started (or restarted) may refuse connections or answer metadata
        // without its listeners for a moment: go round the bootstrap list with backoff until
        // the request timeout, as Java clients do with reconnect.backoff.ms.
        let deadline = tokio::time::Instant::now() + cluster.settings.request_timeout;
        let mut delay = Duration::from_millis(100);
        loop {
            let mut last = None;
            for b in cluster.settings.bootstrap.clone() {
                match Connection::connect(&b.host, b.port, b.to_string(), &cluster.settings).await {
                    Ok(conn) => match cluster.load_metadata(&conn, None).await {
                        Ok(()) => {
                            conn.close().await;
                            return Ok(cluster);
                        }
                        Err(e) => last = Some(e),
                    },
                    // Credentials and TLS problems do not get better on another broker.
                    Err(e @ (KafkaError::Authentication { .. } | KafkaError::Tls { .. })) => {
                        return Err(e)
                    }
                    Err(e) => last = Some(e),
                }
            }
            let e = last.unwrap_or_else(|| KafkaError::Config("no bootstrap servers".into()));
            let transient = e.is_retriable() || e.is_stale_metadata();
            if !transient || tokio::time::Instant::now() + delay >= deadline {
                return Err(e);
            }
            tracing::debug!(error = %e, "bootstrap failed; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    /// The metadata as last loaded.
    pub fn metadata(&self) -> Arc<Metadata> {
        self.metadata
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn load_metadata(&self, conn: &Connection, topics: Option<&[&str]>) -> Result<()> {
        self.load_metadata_with(conn, topics, false).await
    }

    async fn load_metadata_with(
        &self,
        conn: &Connection,
        topics: Option<&[&str]>,
        auto_create: bool,
    ) -> Result<()> {
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(auto_create)
            .with_topics(topics.map(|t| {
                t.iter()
                    .map(|name| {
                        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
                    })
                    .collect()
            }));
        let resp = conn.send(&req).await?;
        let mut md = if topics.is_some() {
            (*self.metadata()).clone()
        } else {
            Metadata::default()
        };
        md.loaded_at = Some(std::time::Instant::now());
        md.cluster_id = resp.cluster_id.map(|c| c.to_string());
        md.controller_id = resp.controller_id.0;
        // A broker in controlled shutdown may list no live broker at all; keeping the ones known
        // leaves the client someone to ask next time.
        if resp.brokers.is_empty() {
            md.brokers = self.metadata().brokers.clone();
        } else {
            md.brokers = resp
                .brokers
                .iter()
                .map(|b| {
                    (
                        b.node_id.0,
                        BrokerAddress {
                            host: b.host.to_string(),
                            port: b.port as u16,
                        },
                    )
                })
                .collect();
        }
        if topics.is_none() {
            md.topics.clear();
        }
        for t in resp.topics {
            let Some(name) = t.name.map(|n| n.0.to_string()) else {
                continue;
            };
            let error = t.error_code.err();
            if error == Some(ResponseError::UnknownTopicOrPartition) {
                md.topics.remove(&name);
                continue;
            }
            let mut partitions: Vec<PartitionMetadata> = t
                .partitions
                .iter()
                .map(|p| PartitionMetadata {
                    partition: p.partition_index,
                    leader: p.leader_id.0,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replica_nodes.iter().map(|r| r.0).collect(),
                    error: p.error_code.err(),
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            md.topics.insert(
                name.clone(),
                TopicMetadata {
                    name,
                    id: t.topic_id,
                    is_internal: t.is_internal,
                    error,
                    partitions,
                },
            );
        }
        *self.metadata.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(md);
        Ok(())
    }

    /// Reloads metadata (all topics, or only the named ones).
    pub async fn refresh_metadata(&self, topics: Option<&[&str]>) -> Result<Arc<Metadata>> {
        self.refresh_with(topics, false).await
    }

    /// Reloads the named topics' metadata asking the broker to create missing ones with its
    /// defaults, as a Java producer does when `auto.create.topics.enable` is on (MM1's way of
    /// getting its target topics).
    pub async fn refresh_metadata_auto_creating(&self, topics: &[&str]) -> Result<Arc<Metadata>> {
        self.refresh_with(Some(topics), true).await
    }

    /// Asks a known broker; when none answers, the bootstrap servers again (Java clients'
    /// `metadata.recovery.strategy=rebootstrap`, the default since Kafka 4.0): a broker that
    /// restarted under a new address, or metadata loaded while every broker was shutting down,
    /// must not leave the client with nobody to ask.
    async fn refresh_with(
        &self,
        topics: Option<&[&str]>,
        auto_create: bool,
    ) -> Result<Arc<Metadata>> {
        let known = match self.any_broker().await {
            Ok(conn) => match self.load_metadata_with(&conn, topics, auto_create).await {
                Ok(()) => return Ok(self.metadata()),
                Err(e) => e,
            },
            Err(e) => e,
        };
        for b in self.settings.bootstrap.clone() {
            let Ok(conn) =
                Connection::connect(&b.host, b.port, b.to_string(), &self.settings).await
            else {
                continue;
            };
            let loaded = self.load_metadata_with(&conn, topics, auto_create).await;
            conn.close().await;
            if loaded.is_ok() {
                tracing::debug!(bootstrap = %b, error = %known, "metadata reloaded through a bootstrap server");
                return Ok(self.metadata());
            }
        }
        Err(known)
    }

    /// Reloads all metadata when it is older than `max_age` (Kafka's `metadata.max.age.ms`), so
    /// new brokers, topics and leaders are learned even without an error.
    pub async fn refresh_if_older(&self, max_age: Duration) -> Result<Arc<Metadata>> {
        let md = self.metadata();
        if md.loaded_at.is_some_and(|t| t.elapsed() < max_age) {
            return Ok(md);
        }
        self.refresh_metadata(None).await
    }

    /// The connection to broker `id`, opened (or reopened) on demand.
    pub async fn broker(&self, id: i32) -> Result<Arc<Connection>> {
        self.broker_channel(id, 0).await
    }

    /// One of several connections to broker `id` (`channel` 0 is [`broker`](Self::broker)'s).
    /// A broker handles one request per connection at a time, so produces and fetches for
    /// different partitions spread over [`DATA_CHANNELS`] connections are validated and
    /// appended in parallel instead of queueing behind each other. A partition always uses
    /// the same channel ([`data_channel`]), which keeps its requests in order.
    pub async fn broker_channel(&self, id: i32, channel: usize) -> Result<Arc<Connection>> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry((id, channel)).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let addr = self.metadata().brokers.get(&id).cloned().ok_or_else(|| {
            KafkaError::Config(format!("broker {id} is not in the cluster metadata"))
        })?;
        let conn = Arc::new(
            Connection::connect(
                &addr.host,
                addr.port,
                format!("{id}@{addr}"),
                &self.settings,
            )
            .await?,
        );
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// A new connection to broker `id` that nobody else uses: for requests the broker holds (a
    /// JoinGroup waits for the whole rebalance, and a broker answers one request per connection
    /// at a time, so it would stall everything else sharing the connection).
    pub async fn dedicated_connection(&self, id: i32) -> Result<Arc<Connection>> {
        let addr = self.metadata().brokers.get(&id).cloned().ok_or_else(|| {
            KafkaError::Config(format!("broker {id} is not in the cluster metadata"))
        })?;
        Ok(Arc::new(
            Connection::connect(
                &addr.host,
                addr.port,
                format!("{id}@{addr}"),
                &self.settings,
            )
            .await?,
        ))
    }

    /// Some live broker (for metadata and cluster-wide requests).
    pub async fn any_broker(&self) -> Result<Arc<Connection>> {
        let ids: Vec<i32> = self.metadata().brokers.keys().copied().collect();
        let mut last = None;
        for id in ids {
            match self.broker(id).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| KafkaError::Config("no broker known".into())))
    }

    /// The broker that leads a partition, per the current metadata.
    pub fn leader_of(&self, topic: &str, partition: i32) -> Result<(i32, i32)> {
        let md = self.metadata();
        let p = md
            .topics
            .get(topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition == partition))
            .ok_or_else(|| KafkaError::Broker {
                broker: "metadata".into(),
                api: ApiKey::Metadata,
                error: ResponseError::UnknownTopicOrPartition,
                message: Some(format!("{topic}-{partition}")),
            })?;
        if p.leader < 0 {
            return Err(KafkaError::Broker {
                broker: "metadata".into(),
                api: ApiKey::Metadata,
                error: ResponseError::LeaderNotAvailable,
                message: Some(format!("{topic}-{partition}")),
            });
        }
        Ok((p.leader, p.leader_epoch))
    }

    fn topic_id(&self, topic: &str) -> TopicId {
        self.metadata()
            .topics
            .get(topic)
            .map(|t| t.id)
            .unwrap_or_default()
    }

    /// Creates topics (`replication_factor` -1 = the broker's default); existing topics are
    /// reported as TOPIC_ALREADY_EXISTS errors in the result, per topic.
    pub async fn create_topics(
        &self,
        topics: &[NewTopic],
        validate_only: bool,
    ) -> Result<Vec<(String, Option<KafkaError>)>> {
        let conn = self.controller_or_any().await?;
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(self.settings.request_timeout.as_millis() as i32)
            .with_validate_only(validate_only)
            .with_topics(
                topics
                    .iter()
                    .map(|t| {
                        CreatableTopic::default()
                            .with_name(TopicName(StrBytes::from_string(t.name.clone())))
                            .with_num_partitions(t.partitions)
                            .with_replication_factor(t.replication_factor)
                            .with_configs(
                                t.configs
                                    .iter()
                                    .map(|(k, v)| {
                                        CreatableTopicConfig::default()
                                            .with_name(StrBytes::from_string(k.clone()))
                                            .with_value(Some(StrBytes::from_string(v.clone())))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        let resp = conn.send(&req).await?;
        let out = resp
            .topics
            .iter()
            .map(|t| {
                (
                    t.name.0.to_string(),
                    broker_error(
                        conn.broker(),
                        ApiKey::CreateTopics,
                        t.error_code,
                        t.error_message.as_ref(),
                    ),
                )
            })
            .collect();
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        self.refresh_metadata(Some(&names)).await?;
        Ok(out)
    }

    /// Deletes topics by name (for tests and tooling).
    pub async fn delete_topics(&self, names: &[&str]) -> Result<()> {
        let conn = self.controller_or_any().await?;
        let version = conn.version::<DeleteTopicsRequest>()?;
        let mut req = DeleteTopicsRequest::default()
            .with_timeout_ms(self.settings.request_timeout.as_millis() as i32);
        if version >= 6 {
            req = req.with_topics(
                names
                    .iter()
                    .map(|n| {
                        DeleteTopicState::default()
                            .with_name(Some(TopicName(StrBytes::from_string(n.to_string()))))
                    })
                    .collect(),
            );
        } else {
            req = req.with_topic_names(
                names
                    .iter()
                    .map(|n| TopicName(StrBytes::from_string(n.to_string())))
                    .collect(),
            );
        }
        let resp = conn.submit(&req, version).await?.wait().await?;
        for r in resp.responses {
            if let Some(e) = broker_error(
                conn.broker(),
                ApiKey::DeleteTopics,
                r.error_code,
                r.error_message.as_ref(),
            ) {
                return Err(e);
            }
        }
        self.refresh_metadata(None).await?;
        Ok(())
    }

    async fn controller_or_any(&self) -> Result<Arc<Connection>> {
        // KRaft brokers forward admin requests to the controller; any broker will do.
        let controller = self.metadata().controller_id;
        match self.broker(controller).await {
            Ok(c) => Ok(c),
            Err(_) => self.any_broker().await,
        }
    }

    /// Runs `f` again after a metadata refresh while it fails with stale leadership (and, when
    /// `idempotent_read`, with a lost connection), with exponential backoff and jitter, within
    /// the request timeout.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        topic: &str,
        idempotent_read: bool,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.settings.request_timeout;
        let mut delay = Duration::from_millis(25);
        loop {
            match f().await {
                Err(e)
                    if (e.is_stale_metadata() || (idempotent_read && e.is_retriable()))
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(topic, error = %e, "retrying after a metadata refresh");
                    let jitter = Duration::from_millis(
                        rand::random::<u64>() % (delay.as_millis() as u64 / 2 + 1),
                    );
                    tokio::time::sleep(delay + jitter).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    if !topic.is_empty() {
                        let _ = self.refresh_metadata(Some(&[topic])).await;
                    }
                }
                other => return other,
            }
        }
    }

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

    async fn list_offset_once(
        &self,
        topic: &str,
        partition: i32,
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        let (leader, epoch) = self.leader_of(topic, partition)?;
        let conn = self.broker(leader).await?;
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

    /// ListOffsets for many partitions: one request per leader broker, so thousands of
    /// partitions cost a few round trips. A partition whose batched answer is an error is asked
    /// again on its own (with the usual retries); one that still fails is left out.
    pub async fn list_offsets(
        &self,
        partitions: &[(String, i32)],
        at: i64,
        isolation: IsolationLevel,
    ) -> Result<HashMap<(String, i32), i64>> {
        let (mut out, retry) = self.list_offsets_once(partitions, at, isolation).await;
        for (t, p) in retry {
            if let Ok(o) = self.list_offset(&t, p, at, isolation).await {
                out.insert((t, p), o);
            }
        }
        Ok(out)
    }

    /// One ListOffsets request per leader broker, no retries: the offsets answered, and the
    /// partitions that were not (no leader known, an error, a failed request).
    pub(crate) async fn list_offsets_once(
        &self,
        partitions: &[(String, i32)],
        at: i64,
        isolation: IsolationLevel,
    ) -> (HashMap<(String, i32), i64>, Vec<(String, i32)>) {
        let mut by_leader: BTreeMap<i32, BTreeMap<String, Vec<(i32, i32)>>> = BTreeMap::new();
        let mut retry: Vec<(String, i32)> = Vec::new();
        for (t, p) in partitions {
            match self.leader_of(t, *p) {
                Ok((leader, epoch)) => by_leader
                    .entry(leader)
                    .or_default()
                    .entry(t.clone())
                    .or_default()
                    .push((*p, epoch)),
                Err(_) => retry.push((t.clone(), *p)),
            }
        }
        let mut out = HashMap::new();
        for (leader, topics) in by_leader {
            let answered = async {
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
                conn.send(&req).await
            }
            .await;
            match answered {
                Ok(resp) => {
                    for t in &resp.topics {
                        for p in &t.partitions {
                            let key = (t.name.0.to_string(), p.partition_index);
                            if p.error_code == 0 {
                                out.insert(key, p.offset);
                            } else {
                                retry.push(key);
                            }
                        }
                    }
                }
                Err(_) => retry.extend(
                    topics
                        .iter()
                        .flat_map(|(t, ps)| ps.iter().map(move |(p, _)| (t.clone(), *p))),
                ),
            }
        }
        (out, retry)
    }

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
        let mut data =
            TopicProduceData::default().with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch.bytes().clone()))]);
        // Produce v13 names topics by id (KIP-516).
        if version >= 13 {
            data = data.with_topic_id(self.topic_id(topic));
        } else {
            data = data.with_name(TopicName(StrBytes::from_string(topic.to_string())));
        }
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(self.settings.request_timeout.as_millis() as i32)
            .with_topic_data(vec![data]);
        let resp = conn.submit(&req, version).await?.wait().await?;
        let p = resp
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .ok_or_else(|| conn.empty_response(ApiKey::Produce))?;
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
        self.retrying(topic, true, || {
            self.fetch_attempt(topic, partition, offset, max_bytes, max_wait, isolation)
        })
        .await
    }

    /// One topic of a Fetch request: v13+ names topics by id (KIP-516).
    fn fetch_topic(
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

    /// [`fetch`](Self::fetch) without its retries: one attempt, so a caller holding resources
    /// for the response (a memory budget) can let go of them between attempts. After a stale
    /// metadata error the caller should [`refresh_metadata`](Self::refresh_metadata).
    pub async fn fetch_attempt(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        max_wait: Duration,
        isolation: IsolationLevel,
    ) -> Result<PartitionFetch> {
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
        let p = resp
            .responses
            .into_iter()
            .next()
            .and_then(|t| t.partitions.into_iter().next())
            .ok_or_else(|| conn.empty_response(ApiKey::Fetch))?;
        if p.error_code.err() == Some(ResponseError::OffsetOutOfRange) {
            // The caller decides (stop, or resume at the log start): tell it where the log is.
            let log_start = self
                .list_offset_once(topic, partition, EARLIEST, isolation)
                .await?;
            let log_end = self
                .list_offset_once(topic, partition, LATEST, isolation)
                .await?;
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
        let (batches, _truncated) =
            split_batches(p.records.unwrap_or_else(Bytes::new)).map_err(|e| {
                KafkaError::Protocol {
                    broker: conn.broker().into(),
                    api: ApiKey::Fetch,
                    message: e.to_string(),
                }
            })?;
        Ok(PartitionFetch {
            high_watermark: p.high_watermark,
            last_stable_offset: p.last_stable_offset,
            log_start_offset: p.log_start_offset,
            batches: batches
                .into_iter()
                .filter(|b| b.last_offset() >= offset)
                .collect(),
            aborted: p
                .aborted_transactions
                .unwrap_or_default()
                .iter()
                .map(|a| (a.producer_id.0, a.first_offset))
                .collect(),
        })
    }
}

fn fetch_partition(partition: i32, epoch: i32, offset: i64, max_bytes: i32) -> FetchPartition {
    FetchPartition::default()
        .with_partition(partition)
        .with_current_leader_epoch(epoch)
        .with_fetch_offset(offset)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(max_bytes)
}

fn isolation_byte(i: IsolationLevel) -> i8 {
    match i {
        IsolationLevel::ReadUncommitted => 0,
        IsolationLevel::ReadCommitted => 1,
    }
}

#[cfg(test)]
mod channel_tests {
    use super::*;

    #[test]
    fn a_partition_keeps_its_data_channel_and_partitions_spread_over_all() {
        let mut used = std::collections::BTreeSet::new();
        for p in 0..16 {
            let c = data_channel("orders", p);
            assert!((1..=DATA_CHANNELS).contains(&c), "{c}");
            assert_eq!(c, data_channel("orders", p), "stable");
            used.insert(c);
        }
        assert_eq!(
            used.len(),
            DATA_CHANNELS,
            "never channel 0, every data channel used"
        );
        // FNV-1a's offset basis for the empty name: the hash does not depend on the process.
        assert_eq!(data_channel("", 0), 1 + 0x811c_9dc5 % DATA_CHANNELS);
    }
}
