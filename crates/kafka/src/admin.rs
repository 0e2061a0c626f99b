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
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreatePartitionsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeClusterRequest, DescribeConfigsRequest, DescribeGroupsRequest, GroupId,
    IncrementalAlterConfigsRequest, ListGroupsRequest, ListTransactionsRequest,
    OffsetCommitRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::sync::Arc;

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

    /// The group coordinator's connection (retried while the coordinator loads, e.g. right after
    /// `__consumer_offsets` is created).
    pub async fn coordinator(&self, group: &str) -> Result<Arc<Connection>> {
        self.retrying("", true, || self.coordinator_once(group))
            .await
    }

    async fn coordinator_once(&self, group: &str) -> Result<Arc<Connection>> {
        crate::txn::find_coordinator(self, group, 0).await
    }

    /// Every group the cluster knows (all brokers asked).
    pub async fn list_groups(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for id in self.metadata().brokers.keys().copied().collect::<Vec<_>>() {
            let conn = self.broker(id).await?;
            let resp = conn.send(&ListGroupsRequest::default()).await?;
            check(&conn, ApiKey::ListGroups, resp.error_code, None)?;
            out.extend(
                resp.groups
                    .iter()
                    .map(|g| (g.group_id.0.to_string(), g.protocol_type.to_string())),
            );
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The transactions of the given states (`Ongoing`, `PrepareCommit`, ...) every broker
    /// coordinates, as (transactional id, producer id, state); all states if empty. Needs
    /// Kafka 3.0+ (KIP-664) and DESCRIBE on the transactional ids listed.
    pub async fn list_transactions(&self, states: &[&str]) -> Result<Vec<(String, i64, String)>> {
        let mut out = Vec::new();
        for id in self.metadata().brokers.keys().copied().collect::<Vec<_>>() {
            let conn = self.broker(id).await?;
            let req = ListTransactionsRequest::default()
                .with_state_filters(
                    states
                        .iter()
                        .map(|s| StrBytes::from_string(s.to_string()))
                        .collect(),
                )
                .with_duration_filter(-1);
            let resp = conn.send(&req).await?;
            check(&conn, ApiKey::ListTransactions, resp.error_code, None)?;
            out.extend(resp.transaction_states.iter().map(|t| {
                (
                    t.transactional_id.0.to_string(),
                    t.producer_id.0,
                    t.transaction_state.to_string(),
                )
            }));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// A group the coordinator does not know is described as `Dead` with no members, as
    /// brokers before Kafka 4.0 answered (4.x answers GROUP_ID_NOT_FOUND).
    pub async fn describe_group(&self, group: &str) -> Result<GroupDescription> {
        match self
            .retrying("", true, || self.describe_group_once(group))
            .await
        {
            Err(KafkaError::Broker {
                error: ResponseError::GroupIdNotFound,
                ..
            }) => Ok(GroupDescription {
                group: group.into(),
                state: "Dead".into(),
                protocol_type: String::new(),
                members: 0,
            }),
            other => other,
        }
    }

    async fn describe_group_once(&self, group: &str) -> Result<GroupDescription> {
        let conn = self.coordinator(group).await?;
        let resp = conn
            .send(&DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]))
            .await?;
        let g = resp
            .groups
            .first()
            .ok_or_else(|| conn.empty_response(ApiKey::DescribeGroups))?;
        check(
            &conn,
            ApiKey::DescribeGroups,
            g.error_code,
            g.error_message.as_ref(),
        )?;
        Ok(GroupDescription {
            group: group.into(),
            state: g.group_state.to_string(),
            protocol_type: g.protocol_type.to_string(),
            members: g.members.len(),
        })
    }

    /// All committed offsets of a group: topic → partition → offset.
    pub async fn fetch_group_offsets(
        &self,
        group: &str,
    ) -> Result<BTreeMap<String, BTreeMap<i32, CommittedOffset>>> {
        match self
            .retrying("", true, || self.fetch_group_offsets_once(group))
            .await
        {
            // An unknown group has no offsets.
            Err(KafkaError::Broker {
                error: ResponseError::GroupIdNotFound,
                ..
            }) => Ok(BTreeMap::new()),
            other => other,
        }
    }

    async fn fetch_group_offsets_once(
        &self,
        group: &str,
    ) -> Result<BTreeMap<String, BTreeMap<i32, CommittedOffset>>> {
        let conn = self.coordinator(group).await?;
        // v10 names topics by id; the name-based forms are enough here.
        let version = conn.version::<OffsetFetchRequest>()?.min(9);
        let req = if version >= 8 {
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(None)])
        } else {
            OffsetFetchRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(None)
        };
        let resp = conn.submit(&req, version).await?.wait().await?;
        // v8+ answers per group, older versions for the one group; the partitions' fields are
        // the same in both.
        macro_rules! rows {
            ($topics:expr) => {
                $topics.iter().flat_map(|t| {
                    t.partitions.iter().map(move |p| {
                        (
                            &t.name,
                            p.partition_index,
                            p.committed_offset,
                            p.committed_leader_epoch,
                            p.error_code,
                            &p.metadata,
                        )
                    })
                })
            };
        }
        let mut rows = Vec::new();
        if version >= 8 {
            for g in &resp.groups {
                check(&conn, ApiKey::OffsetFetch, g.error_code, None)?;
                rows.extend(rows!(g.topics));
            }
        } else {
            check(&conn, ApiKey::OffsetFetch, resp.error_code, None)?;
            rows.extend(rows!(resp.topics));
        }
        let mut out: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = BTreeMap::new();
        for (topic, partition, offset, leader_epoch, error, metadata) in rows {
            check(&conn, ApiKey::OffsetFetch, error, None)?;
            if offset >= 0 {
                out.entry(topic.0.to_string()).or_default().insert(
                    partition,
                    CommittedOffset {
                        offset,
                        leader_epoch,
                        metadata: metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
                    },
                );
            }
        }
        Ok(out)
    }

    /// Commits offsets for a group with no active members (generation -1, no member id), as
    /// Kafka's admin client does; the coordinator refuses it for an active group.
    /// Committing the same offsets twice is harmless, so retriable errors are retried.
    pub async fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &BTreeMap<String, BTreeMap<i32, CommittedOffset>>,
    ) -> Result<()> {
        self.retrying("", true, || {
            self.commit_group_offsets_once(group, None, offsets)
        })
        .await
    }

    /// Commits offsets as a member of the group in `generation` (a Java consumer's commit): the
    /// coordinator refuses it once the member was removed or the group moved to a new
    /// generation (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS), so a member
    /// that lost its partitions cannot move them.
    pub async fn commit_member_offsets(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        offsets: &BTreeMap<String, BTreeMap<i32, CommittedOffset>>,
    ) -> Result<()> {
        self.retrying("", true, || {
            self.commit_group_offsets_once(group, Some((generation, member_id)), offsets)
        })
        .await
    }

    async fn commit_group_offsets_once(
        &self,
        group: &str,
        member: Option<(i32, &str)>,
        offsets: &BTreeMap<String, BTreeMap<i32, CommittedOffset>>,
    ) -> Result<()> {
        let conn = self.coordinator(group).await?;
        let version = conn.version::<OffsetCommitRequest>()?.min(9);
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(member.map_or(-1, |m| m.0))
            .with_member_id(member.map_or_else(StrBytes::default, |m| s(m.1)))
            .with_retention_time_ms(-1)
            .with_topics(commit_topics!(
                OffsetCommitRequestTopic,
                OffsetCommitRequestPartition,
                offsets
            ));
        let resp = conn.submit(&req, version).await?.wait().await?;
        for t in &resp.topics {
            for p in &t.partitions {
                check(&conn, ApiKey::OffsetCommit, p.error_code, None)?;
            }
        }
        Ok(())
    }
}
