//! Consumer groups and transactions through the admin API: find a group's coordinator, list and
//! describe groups, fetch and commit group offsets (as a member too), list transactions.

use crate::admin::*;
use crate::cluster::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use commit_topics;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    ApiKey, DescribeGroupsRequest, GroupId, ListGroupsRequest, ListTransactionsRequest,
    OffsetCommitRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::sync::Arc;

impl KafkaCluster {
    /// The group coordinator's connection (retried while the coordinator loads, e.g. right after
    /// `__consumer_offsets` is created).
    pub async fn coordinator(&self, group: &str) -> Result<Arc<Connection>> {
        self.retrying("", true, || self.coordinator_once(group))
            .await
    }

    pub(crate) async fn coordinator_once(&self, group: &str) -> Result<Arc<Connection>> {
        crate::coordinator::find_coordinator(self, group, 0).await
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

    pub(crate) async fn describe_group_once(&self, group: &str) -> Result<GroupDescription> {
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

    pub(crate) async fn fetch_group_offsets_once(
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

    pub(crate) async fn commit_group_offsets_once(
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
