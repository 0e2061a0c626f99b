//! Creating and deleting topics.

use super::{broker_error, KafkaCluster};
use crate::error::Result;
use crate::KafkaError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, DeleteTopicsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

impl KafkaCluster {
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
}
