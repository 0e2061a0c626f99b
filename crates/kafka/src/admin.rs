//! Admin operations a replicator needs: topic configs, partitions, ACLs, consumer groups and
//! their committed offsets, and the cluster description.
//!
//! Why one file of this size: a catalogue of admin wire APIs, one section per API (configs,
//! partitions, ACLs, cluster, groups and offsets) sharing only `check` and `s`; each section is
//! read alone. Next to split out: the groups section (coordinator, groups, committed offsets)
//! into its own `impl KafkaCluster` file, as `cluster/` already splits its methods.

use crate::cluster::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreatePartitionsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeClusterRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
mod groups;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn check(conn: &Connection, api: ApiKey, code: i16, message: Option<&StrBytes>) -> Result<()> {
    match code.err() {
        None => Ok(()),
        Some(error) => Err(KafkaError::Broker {
            broker: conn.broker().into(),
            api,
            error,
            message: message.map(|m| m.to_string()),
        }),
    }
}

/// One topic or broker config entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: String,
    /// `None` for sensitive values (the broker does not return them).
    pub value: Option<String>,
    /// Kafka's ConfigSource (1 topic, 2 dynamic broker, 3 dynamic default broker, 4 static broker,
    /// 5 default, ...).
    pub source: i8,
    pub read_only: bool,
    pub sensitive: bool,
}

/// The topics of an offset commit from `offsets` (topic → partition → offset): OffsetCommit's
/// and TxnOffsetCommit's are separate generated types with the same fields.
macro_rules! commit_topics {
    ($topic:ident, $partition:ident, $offsets:expr) => {
        $offsets
            .iter()
            .map(|(t, parts)| {
                $topic::default()
                    .with_name(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partitions(
                        parts
                            .iter()
                            .map(|(p, o)| {
                                $partition::default()
                                    .with_partition_index(*p)
                                    .with_committed_offset(o.offset)
                                    .with_committed_leader_epoch(o.leader_epoch)
                                    .with_committed_metadata(Some(StrBytes::from_string(
                                        o.metadata.clone(),
                                    )))
                            })
                            .collect(),
                    )
            })
            .collect()
    };
}
pub(crate) use commit_topics;

impl ConfigEntry {
    /// Whether the value is Kafka's built-in default (nothing overrides it).
    pub fn is_default(&self) -> bool {
        self.source == 5
    }
}

/// What to do with one config key (IncrementalAlterConfigs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOp {
    Set(String, String),
    /// Back to the default.
    Delete(String),
}

/// Resource types, pattern types, operations and permissions of ACLs, as Kafka numbers them.
pub mod acl {
    pub const RESOURCE_ANY: i8 = 1;
    pub const RESOURCE_TOPIC: i8 = 2;
    pub const RESOURCE_GROUP: i8 = 3;
    pub const RESOURCE_CLUSTER: i8 = 4;
    pub const PATTERN_ANY: i8 = 1;
    pub const PATTERN_LITERAL: i8 = 3;
    pub const PATTERN_PREFIXED: i8 = 4;
    pub const OP_ANY: i8 = 1;
    pub const OP_ALL: i8 = 2;
    pub const OP_READ: i8 = 3;
    pub const OP_WRITE: i8 = 4;
    pub const OP_CREATE: i8 = 5;
    pub const OP_DESCRIBE: i8 = 8;
    pub const PERMISSION_ANY: i8 = 1;
    pub const PERMISSION_DENY: i8 = 2;
    pub const PERMISSION_ALLOW: i8 = 3;
}

/// One ACL binding (or, with the ANY values, a filter).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AclBinding {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

impl AclBinding {
    /// A filter matching every binding.
    pub fn any() -> Self {
        AclBinding {
            resource_type: acl::RESOURCE_ANY,
            resource_name: None,
            pattern_type: acl::PATTERN_ANY,
            principal: None,
            host: None,
            operation: acl::OP_ANY,
            permission: acl::PERMISSION_ANY,
        }
    }
}

/// A consumer group as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group: String,
    pub state: String,
    pub protocol_type: String,
    pub members: usize,
}

/// A committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

impl KafkaCluster {
    /// DescribeConfigs of one topic (all keys, with their source).
    pub async fn describe_topic_configs(&self, topic: &str) -> Result<Vec<ConfigEntry>> {
        let mut all = self.describe_topics_configs(&[topic.to_string()]).await?;
        all.remove(topic)
            .ok_or_else(|| KafkaError::Config(format!("no configs returned for {topic}")))?
    }

    /// DescribeConfigs of many topics, a few hundred per request; each topic's own result (an
    /// error for one topic does not hide the others).
    pub async fn describe_topics_configs(
        &self,
        topics: &[String],
    ) -> Result<BTreeMap<String, Result<Vec<ConfigEntry>>>> {
        let conn = self.any_broker().await?;
        let mut out = BTreeMap::new();
        for chunk in topics.chunks(500) {
            let req = DescribeConfigsRequest::default().with_resources(
                chunk
                    .iter()
                    .map(|t| {
                        DescribeConfigsResource::default()
                            .with_resource_type(2)
                            .with_resource_name(s(t))
                            .with_configuration_keys(None)
                    })
                    .collect(),
            );
            let resp = conn.send(&req).await?;
            for r in &resp.results {
                let entries = check(
                    &conn,
                    ApiKey::DescribeConfigs,
                    r.error_code,
                    r.error_message.as_ref(),
                )
                .map(|_| {
                    r.configs
                        .iter()
                        .map(|c| ConfigEntry {
                            name: c.name.to_string(),
                            value: c.value.as_ref().map(|v| v.to_string()),
                            source: c.config_source,
                            read_only: c.read_only,
                            sensitive: c.is_sensitive,
                        })
                        .collect()
                });
                out.insert(r.resource_name.to_string(), entries);
            }
        }
        Ok(out)
    }

    /// One broker config as a broker reports it (its static value, or the default), asked of
    /// the first broker in the metadata; None when the broker does not list it.
    pub async fn describe_broker_config(&self, key: &str) -> Result<Option<String>> {
        let id = self
            .metadata()
            .brokers
            .keys()
            .next()
            .copied()
            .ok_or_else(|| KafkaError::Config("no broker in the metadata".into()))?;
        let conn = self.broker(id).await?;
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(s(&id.to_string()))
                .with_configuration_keys(Some(vec![s(key)])),
        ]);
        let resp = conn.send(&req).await?;
        for r in &resp.results {
            check(
                &conn,
                ApiKey::DescribeConfigs,
                r.error_code,
                r.error_message.as_ref(),
            )?;
            if let Some(c) = r.configs.iter().find(|c| c.name.as_str() == key) {
                return Ok(c.value.as_ref().map(|v| v.to_string()));
            }
        }
        Ok(None)
    }

    /// IncrementalAlterConfigs of one topic.
    pub async fn alter_topic_configs(
        &self,
        topic: &str,
        ops: &[ConfigOp],
        validate_only: bool,
    ) -> Result<()> {
        let conn = self.any_broker().await?;
        let configs = ops
            .iter()
            .map(|op| match op {
                ConfigOp::Set(k, v) => AlterableConfig::default()
                    .with_name(s(k))
                    .with_config_operation(0)
                    .with_value(Some(s(v))),
                ConfigOp::Delete(k) => AlterableConfig::default()
                    .with_name(s(k))
                    .with_config_operation(1)
                    .with_value(None),
            })
            .collect();
        let req = IncrementalAlterConfigsRequest::default()
            .with_validate_only(validate_only)
            .with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s(topic))
                .with_configs(configs)]);
        let resp = conn.send(&req).await?;
        for r in &resp.responses {
            check(
                &conn,
                ApiKey::IncrementalAlterConfigs,
                r.error_code,
                r.error_message.as_ref(),
            )?;
        }
        Ok(())
    }

    /// Grows a topic to `total` partitions.
    pub async fn create_partitions(
        &self,
        topic: &str,
        total: i32,
        validate_only: bool,
    ) -> Result<()> {
        let conn = self.any_broker().await?;
        let req = CreatePartitionsRequest::default()
            .with_timeout_ms(self.settings().request_timeout.as_millis() as i32)
            .with_validate_only(validate_only)
            .with_topics(vec![CreatePartitionsTopic::default()
                .with_name(TopicName(s(topic)))
                .with_count(total)
                .with_assignments(None)]);
        let resp = conn.send(&req).await?;
        for r in &resp.results {
            check(
                &conn,
                ApiKey::CreatePartitions,
                r.error_code,
                r.error_message.as_ref(),
            )?;
        }
        self.refresh_metadata(Some(&[topic])).await?;
        Ok(())
    }

    /// DescribeAcls with a filter. A cluster without an authorizer answers SECURITY_DISABLED.
    pub async fn describe_acls(&self, filter: &AclBinding) -> Result<Vec<AclBinding>> {
        let conn = self.any_broker().await?;
        let req = DescribeAclsRequest::default()
            .with_resource_type_filter(filter.resource_type)
            .with_resource_name_filter(filter.resource_name.as_deref().map(s))
            .with_pattern_type_filter(filter.pattern_type)
            .with_principal_filter(filter.principal.as_deref().map(s))
            .with_host_filter(filter.host.as_deref().map(s))
            .with_operation(filter.operation)
            .with_permission_type(filter.permission);
        let resp = conn.send(&req).await?;
        check(
            &conn,
            ApiKey::DescribeAcls,
            resp.error_code,
            resp.error_message.as_ref(),
        )?;
        let mut out = Vec::new();
        for r in &resp.resources {
            for a in &r.acls {
                out.push(AclBinding {
                    resource_type: r.resource_type,
                    resource_name: Some(r.resource_name.to_string()),
                    pattern_type: r.pattern_type,
                    principal: Some(a.principal.to_string()),
                    host: Some(a.host.to_string()),
                    operation: a.operation,
                    permission: a.permission_type,
                });
            }
        }
        out.sort();
        Ok(out)
    }

    /// CreateAcls; every binding must be fully specified.
    pub async fn create_acls(&self, bindings: &[AclBinding]) -> Result<()> {
        let conn = self.any_broker().await?;
        let creations = bindings
            .iter()
            .map(|b| {
                AclCreation::default()
                    .with_resource_type(b.resource_type)
                    .with_resource_name(s(b.resource_name.as_deref().unwrap_or_default()))
                    .with_resource_pattern_type(b.pattern_type)
                    .with_principal(s(b.principal.as_deref().unwrap_or_default()))
                    .with_host(s(b.host.as_deref().unwrap_or("*")))
                    .with_operation(b.operation)
                    .with_permission_type(b.permission)
            })
            .collect();
        let resp = conn
            .send(&CreateAclsRequest::default().with_creations(creations))
            .await?;
        for r in &resp.results {
            check(
                &conn,
                ApiKey::CreateAcls,
                r.error_code,
                r.error_message.as_ref(),
            )?;
        }
        Ok(())
    }

    /// DeleteAcls by filters; returns the bindings deleted.
    pub async fn delete_acls(&self, filters: &[AclBinding]) -> Result<Vec<AclBinding>> {
        let conn = self.any_broker().await?;
        let req = DeleteAclsRequest::default().with_filters(
            filters
                .iter()
                .map(|f| {
                    DeleteAclsFilter::default()
                        .with_resource_type_filter(f.resource_type)
                        .with_resource_name_filter(f.resource_name.as_deref().map(s))
                        .with_pattern_type_filter(f.pattern_type)
                        .with_principal_filter(f.principal.as_deref().map(s))
                        .with_host_filter(f.host.as_deref().map(s))
                        .with_operation(f.operation)
                        .with_permission_type(f.permission)
                })
                .collect(),
        );
        let resp = conn.send(&req).await?;
        let mut out = Vec::new();
        for r in &resp.filter_results {
            check(
                &conn,
                ApiKey::DeleteAcls,
                r.error_code,
                r.error_message.as_ref(),
            )?;
            for m in &r.matching_acls {
                out.push(AclBinding {
                    resource_type: m.resource_type,
                    resource_name: Some(m.resource_name.to_string()),
                    pattern_type: m.pattern_type,
                    principal: Some(m.principal.to_string()),
                    host: Some(m.host.to_string()),
                    operation: m.operation,
                    permission: m.permission_type,
                });
            }
        }
        Ok(out)
    }

    /// DescribeCluster: the cluster id and controller as the brokers report them.
    pub async fn describe_cluster(&self) -> Result<(Option<String>, i32, usize)> {
        let conn = self.any_broker().await?;
        let resp = conn.send(&DescribeClusterRequest::default()).await?;
        check(
            &conn,
            ApiKey::DescribeCluster,
            resp.error_code,
            resp.error_message.as_ref(),
        )?;
        Ok((
            Some(resp.cluster_id.to_string()),
            resp.controller_id.0,
            resp.brokers.len(),
        ))
    }
}
