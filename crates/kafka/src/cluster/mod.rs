//! A client for one cluster: the [`KafkaCluster`] handle, bootstrap, and retries after stale
//! metadata. Its parts, one job each: `metadata` (brokers, topics, leaders and epochs, and their
//! refresh), `pool` (the connections to each broker), `offsets` (ListOffsets), `topics`
//! (creating and deleting topics) and `partition_requests` (single-partition Fetch and Produce,
//! for log recovery, the log reader and tests). Data moves through [`crate::fetcher`] and
//! [`crate::producer`], which build on these.
//!
//! Every error says whether it is retriable. Single attempts (`*_once`) leave
//! the policy to callers that have deadlines of their own; the other calls go through
//! [`KafkaCluster::retrying`], which re-learns leaders after NOT_LEADER_OR_FOLLOWER,
//! UNKNOWN_TOPIC_OR_PARTITION or FENCED_LEADER_EPOCH within the request timeout.

mod coalesce;
mod fetch_batch;
mod metadata;
mod offset_lookup;
mod offsets;
mod partition_requests;
mod pool;
mod refresh;
mod topics;

pub use metadata::{
    parse_topic_id, topic_id_text, Metadata, PartitionMetadata, TopicId, TopicMetadata,
};
pub use offsets::{EARLIEST, LATEST};
pub use partition_requests::PartitionFetch;
pub(crate) use partition_requests::{fetch_partition, produce_answer};
use pool::BrokerSlot;
pub use pool::{data_channel, DATA_CHANNELS};
pub use topics::NewTopic;

use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::settings::{ClientSettings, IsolationLevel};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::StrBytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// One cluster.
#[derive(Debug)]
pub struct KafkaCluster {
    settings: ClientSettings,
    metadata: RwLock<Arc<Metadata>>,
    /// Connections by (broker, channel): channel 0 for metadata, admin and the like; data
    /// channels (see [`data_channel`]) for fetches and produces.
    slots: Mutex<HashMap<(i32, usize), BrokerSlot>>,
    /// ListOffsets asked by many callers at once, sent together ([`offset_lookup`]).
    pub(crate) lookups: offset_lookup::Lookups,
    /// The lookups a batched answer left out, asked again together a round later.
    pub(crate) lookup_retries: offset_lookup::Lookups,
    pub(crate) fetches: fetch_batch::Fetches,
    /// Metadata reloads of single topics asked by many callers at once, sent together.
    refreshes: refresh::Refreshes,
    /// Brokers that recently let a request or a connection attempt time out, and when: asked
    /// last for metadata and admin requests (see [`KafkaCluster::any_broker`]).
    silent: Mutex<HashMap<i32, std::time::Instant>>,
    /// Told of each producer id this cluster hands a producer of this process.
    producer_ids: Mutex<Option<Arc<dyn ProducerIdHook>>>,
}

/// Learns every producer id a producer of this process gets from the cluster, before the
/// producer writes with it: kmirror's loop prevention records them, so the flow reading this
/// cluster back knows which batches kmirror itself wrote (docs/topologies.md, "Identity names
/// both ways"). An error fails the producer's initialisation.
pub trait ProducerIdHook: Send + Sync + std::fmt::Debug {
    fn obtained(
        &self,
        producer_id: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + '_>>;
}

pub(crate) fn broker_error(
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
            lookup_retries: Default::default(),
            fetches: Default::default(),
            refreshes: Default::default(),
            silent: Mutex::new(HashMap::new()),
            producer_ids: Mutex::new(None),
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

    /// Sets the hook told of producer ids (see [`ProducerIdHook`]); set it before making
    /// producers.
    pub fn set_producer_id_hook(&self, hook: Arc<dyn ProducerIdHook>) {
        *self.producer_ids.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// Tells the hook, if any, of `producer_id`.
    pub(crate) async fn producer_id_obtained(&self, producer_id: i64) -> Result<()> {
        let hook = self
            .producer_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match hook {
            Some(h) => h.obtained(producer_id).await,
            None => Ok(()),
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
                        // Together with the other callers reloading now (`refresh.rs`).
                        self.refreshes
                            .refresh(topic, |topics| async move {
                                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                                let _ = self.refresh_metadata(Some(&names)).await;
                            })
                            .await;
                    }
                }
                other => return other,
            }
        }
    }
}

pub(crate) fn isolation_byte(i: IsolationLevel) -> i8 {
    match i {
        IsolationLevel::ReadUncommitted => 0,
        IsolationLevel::ReadCommitted => 1,
    }
}
