//! What the cluster told us last: brokers, topics, partition leaders and epochs, and how it is
//! reloaded.

use super::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use crate::settings::BrokerAddress;
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::{ApiKey, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A Kafka topic id (KIP-516).
pub type TopicId = uuid::Uuid;

/// A topic id as Kafka's tools print it (`kafka-topics.sh --describe`: URL-safe base64 of the
/// 16 bytes, no padding), so an operator can match kmirror's logs with what they see there.
pub fn topic_id_text(id: &TopicId) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// Reads [`topic_id_text`]'s form back; `None` for anything else.
pub fn parse_topic_id(text: &str) -> Option<TopicId> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    uuid::Uuid::from_slice(&bytes).ok()
}

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

impl Metadata {
    /// The number of partitions `topic` has, if it is known.
    pub fn partition_count(&self, topic: &str) -> Option<i32> {
        self.topics.get(topic).map(|t| t.partitions.len() as i32)
    }
}

impl KafkaCluster {
    /// The metadata as last loaded.
    pub fn metadata(&self) -> Arc<Metadata> {
        self.metadata
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) async fn load_metadata(
        &self,
        conn: &Connection,
        topics: Option<&[&str]>,
    ) -> Result<()> {
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
        // Merged under the write lock: two reloads of different topics answered at about the
        // same time must both land (copying before the lock let the second drop the first's
        // topics, and their partitions' leaders were unknown until the next reload).
        let mut cached = self.metadata.write().unwrap_or_else(|p| p.into_inner());
        let mut md = if topics.is_some() {
            (**cached).clone()
        } else {
            Metadata::default()
        };
        md.loaded_at = Some(std::time::Instant::now());
        md.cluster_id = resp.cluster_id.map(|c| c.to_string());
        md.controller_id = resp.controller_id.0;
        // A broker in controlled shutdown may list no live broker at all; keeping the ones known
        // leaves the client someone to ask next time.
        let listed: BTreeMap<i32, BrokerAddress> = resp
            .brokers
            .iter()
            .filter_map(|b| match u16::try_from(b.port) {
                Ok(port) => Some((
                    b.node_id.0,
                    BrokerAddress {
                        host: b.host.to_string(),
                        port,
                    },
                )),
                // From the network: a port out of range is not truncated into another one.
                Err(_) => {
                    tracing::warn!(
                        broker = b.node_id.0,
                        port = b.port,
                        "metadata lists a broker with a port out of range; ignoring it"
                    );
                    None
                }
            })
            .collect();
        md.brokers = if listed.is_empty() {
            cached.brokers.clone()
        } else {
            listed
        };
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
        *cached = Arc::new(md);
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
        // Known brokers first, those that went silent last; a broker that does not answer in
        // time is remembered and the next one asked at once (a frozen lowest-id
        // broker used to cost every refresh a request timeout, and one more on the bootstrap
        // list). At most three, each bounded by the request timeout.
        let mut known = KafkaError::Config("no broker known".into());
        for id in self.brokers_to_ask().into_iter().take(3) {
            let conn = match self.broker(id).await {
                Ok(c) => c,
                Err(e) => {
                    known = e;
                    continue;
                }
            };
            match self.load_metadata_with(&conn, topics, auto_create).await {
                Ok(()) => return Ok(self.metadata()),
                Err(e) => {
                    if matches!(e, KafkaError::Timeout { .. }) {
                        self.mark_silent(id);
                    }
                    known = e;
                }
            }
        }
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

    pub(crate) fn topic_id(&self, topic: &str) -> TopicId {
        self.metadata()
            .topics
            .get(topic)
            .map(|t| t.id)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_print_as_kafka_tools_do_and_read_back() {
        let one = uuid::Uuid::from_u128(1);
        // Kafka's `new Uuid(0, 1).toString()`.
        assert_eq!(topic_id_text(&one), "AAAAAAAAAAAAAAAAAAAAAQ");
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(parse_topic_id(&topic_id_text(&id)), Some(id));
        assert_eq!(parse_topic_id("not an id"), None);
        assert_eq!(parse_topic_id("AAAA"), None);
    }
}
