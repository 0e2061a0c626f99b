//! Target topics of MM1 mode: the partition count of each (looked up once, again after every
//! metadata refresh), and missing ones created with the source topic's partition count and
//! configs (MM2's default config exclusions, the target's default replication factor), or,
//! with `--create.topics false`, requested through metadata as MM1's producer did so that the
//! target's `auto.create.topics.enable` decides.

use crate::config::flow::DEFAULT_CONFIG_PROPERTIES_EXCLUDE;
use crate::engine::remote_topics::{copied_configs, create};
use crate::filter::PatternList;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::KafkaError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Targets {
    source: Arc<KafkaCluster>,
    target: Arc<KafkaCluster>,
    create: bool,
    exclude: PatternList,
    counts: Mutex<HashMap<String, i32>>,
}

/// A target topic that cannot be written yet.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("target topic {topic} does not exist and was not auto-created (--create.topics false relies on the target's auto.create.topics.enable)")]
    Missing { topic: String },
    #[error("target topic {topic}: {source}")]
    Kafka {
        topic: String,
        #[source]
        source: KafkaError,
    },
}

impl Targets {
    pub(crate) fn new(source: Arc<KafkaCluster>, target: Arc<KafkaCluster>, create: bool) -> Self {
        Targets {
            source,
            target,
            create,
            exclude: PatternList::parse(DEFAULT_CONFIG_PROPERTIES_EXCLUDE).unwrap_or_default(),
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets the counts so they are read again (the target may have gained partitions).
    pub(crate) fn refresh(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i32>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The partition count of `topic` on the target, creating it from `source_topic` if needed.
    pub(crate) async fn partitions(
        &self,
        topic: &str,
        source_topic: &str,
    ) -> Result<i32, TargetError> {
        if let Some(n) = self.lock().get(topic) {
            return Ok(*n);
        }
        let kafka = |source| TargetError::Kafka {
            topic: topic.to_string(),
            source,
        };
        let mut n = self.ready_count(topic).await.map_err(kafka)?;
        if n.is_none() {
            if self.create {
                self.create_from(topic, source_topic).await.map_err(kafka)?;
            } else {
                self.target
                    .refresh_metadata_auto_creating(&[topic])
                    .await
                    .map_err(kafka)?;
            }
            // A new topic has no leaders for a moment.
            for _ in 0..50 {
                n = self.ready_count(topic).await.map_err(kafka)?;
                if n.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let n = n.ok_or_else(|| TargetError::Missing {
            topic: topic.to_string(),
        })?;
        self.lock().insert(topic.to_string(), n);
        Ok(n)
    }

    /// The partition count once every partition has a leader.
    async fn ready_count(&self, topic: &str) -> Result<Option<i32>, KafkaError> {
        let md = self.target.refresh_metadata(Some(&[topic])).await?;
        Ok(md
            .topics
            .get(topic)
            .filter(|t| !t.partitions.is_empty() && t.partitions.iter().all(|p| p.leader >= 0))
            .map(|t| t.partitions.len() as i32))
    }

    async fn create_from(&self, topic: &str, source_topic: &str) -> Result<(), KafkaError> {
        let partitions = match self.source.metadata().partition_count(source_topic) {
            Some(n) => n,
            None => self
                .source
                .refresh_metadata(Some(&[source_topic]))
                .await?
                .partition_count(source_topic)
                .unwrap_or(1),
        };
        let configs = copied_configs(
            false,
            &self.exclude,
            &self.source.describe_topic_configs(source_topic).await?,
        );
        let n = configs.len();
        let created = create(
            &self.target,
            NewTopic {
                name: topic.to_string(),
                partitions: partitions.max(1),
                replication_factor: -1,
                configs,
            },
        )
        .await?;
        if created {
            tracing::info!(
                topic,
                partitions,
                configs = n,
                from = source_topic,
                "created target topic"
            );
        }
        Ok(())
    }
}
