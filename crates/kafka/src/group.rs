//! Group membership through Kafka's group coordinator (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup), with a pluggable protocol type and assignor: kmirror processes share work this
//! way, and MM1 mode joins ordinary consumer groups with the standard `consumer` protocol.

use crate::cluster::KafkaCluster;
use crate::conn::Connection;
use crate::error::{KafkaError, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// Computes assignments (on the member the coordinator elects leader) and describes this
/// member's subscription.
pub trait Assignor: Send + Sync + Debug {
    /// The protocol name (e.g. `range`).
    fn protocol(&self) -> &str;
    /// This member's metadata (for the consumer protocol: its subscription).
    fn metadata(&self) -> Bytes;
    /// Given every member's id and metadata (`leader` is this member's id), each member's
    /// assignment.
    fn assign(&self, leader: &str, members: &[(String, Bytes)]) -> Result<Vec<(String, Bytes)>>;
}

/// Settings of one membership.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub group_id: String,
    /// `consumer` for consumer groups; kmirror uses its own type for its workers.
    pub protocol_type: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    /// KIP-345 static membership (`group.instance.id`): a member that comes back under the same
    /// id within its session timeout is given its previous assignment without a rebalance. Two
    /// live members with one id fence each other: the older one gets `FENCED_INSTANCE_ID`.
    pub instance_id: Option<String>,
}

/// A member of a group, in a generation, with its assignment.
#[derive(Debug)]
pub struct GroupMember {
    cluster: Arc<KafkaCluster>,
    config: GroupConfig,
    assignor: Arc<dyn Assignor>,
    coordinator: Arc<Connection>,
    member_id: String,
    generation: i32,
    leader: bool,
    /// KIP-814: this leader was told to keep the coordinator's assignment (a static leader back
    /// in a stable group) rather than compute one.
    skipped_assignment: bool,
    assignment: Bytes,
    /// When the SyncGroup that gave the current assignment was sent: the coordinator counts the
    /// member alive for a session timeout from its arrival, however long the join took before.
    synced_at: std::time::Instant,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

impl GroupMember {
    /// Joins the group and waits for an assignment.
    pub async fn join(
        cluster: Arc<KafkaCluster>,
        config: GroupConfig,
        assignor: Arc<dyn Assignor>,
    ) -> Result<GroupMember> {
        let coordinator = Self::connect_coordinator(&cluster, &config.group_id).await?;
        let mut m = GroupMember {
            cluster,
            config,
            assignor,
            coordinator,
            member_id: String::new(),
            generation: -1,
            leader: false,
            skipped_assignment: false,
            assignment: Bytes::new(),
            synced_at: std::time::Instant::now(),
        };
        m.rejoin().await?;
        Ok(m)
    }

    /// Its own connection to the coordinator (see [`KafkaCluster::dedicated_connection`]).
    async fn connect_coordinator(
        cluster: &Arc<KafkaCluster>,
        group: &str,
    ) -> Result<Arc<Connection>> {
        let node = cluster
            .retrying("", true, || {
                crate::coordinator::find_coordinator_node(cluster, group, 0)
            })
            .await?;
        cluster.dedicated_connection(node).await
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }
    pub fn generation(&self) -> i32 {
        self.generation
    }
    pub fn is_leader(&self) -> bool {
        self.leader
    }
    /// Whether this leader kept the coordinator's assignment instead of computing one (KIP-814).
    pub fn skipped_assignment(&self) -> bool {
        self.skipped_assignment
    }
    pub fn assignment(&self) -> &Bytes {
        &self.assignment
    }
    /// When the SyncGroup of the current assignment was sent (the last (re)join's end).
    pub fn synced_at(&self) -> std::time::Instant {
        self.synced_at
    }

    fn instance(&self) -> Option<StrBytes> {
        self.config.instance_id.as_deref().map(s)
    }

    fn err(&self, api: ApiKey, error: ResponseError) -> KafkaError {
        KafkaError::Broker {
            broker: self.coordinator.broker().into(),
            api,
            error,
            message: None,
        }
    }

    /// JoinGroup + SyncGroup until this member has an assignment in a stable generation.
    pub async fn rejoin(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.config.rebalance_timeout * 3;
        loop {
            match self.join_once().await {
                Ok(()) => return Ok(()),
                Err(e)
                    if tokio::time::Instant::now() < deadline
                        && (e.is_retriable() || is_rejoin(&e)) =>
                {
                    tracing::debug!(group = %self.config.group_id, error = %e, "rejoining");
                    if matches!(
                        e,
                        KafkaError::Broker {
                            error: ResponseError::NotCoordinator
                                | ResponseError::CoordinatorNotAvailable,
                            ..
                        } | KafkaError::Disconnected { .. }
                            | KafkaError::Io { .. }
                    ) {
                        self.coordinator =
                            Self::connect_coordinator(&self.cluster, &self.config.group_id).await?;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn join_once(&mut self) -> Result<()> {
        let join = JoinGroupRequest::default()
            .with_group_id(GroupId(s(&self.config.group_id)))
            .with_session_timeout_ms(self.config.session_timeout.as_millis() as i32)
            .with_rebalance_timeout_ms(self.config.rebalance_timeout.as_millis() as i32)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance())
            .with_protocol_type(s(&self.config.protocol_type))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s(self.assignor.protocol()))
                .with_metadata(self.assignor.metadata())]);
        let version = self.coordinator.version::<JoinGroupRequest>()?;
        if self.config.instance_id.is_some() && version < 9 {
            // Silently joining as a dynamic member would lose what the user asked for. v5
            // (Kafka 2.3) carries the instance id, but before v9 (Kafka 3.2, KIP-814) a static
            // leader that comes back is told the old leader's id, and no member leads.
            return Err(KafkaError::UnsupportedVersion {
                broker: self.coordinator.broker().into(),
                api: ApiKey::JoinGroup,
                ours: format!(
                    "v9+ for static membership (an instance id for group {}), Kafka 3.2+; this coordinator speaks v{version}",
                    self.config.group_id
                ),
            });
        }
        // The coordinator holds JoinGroup until every member rejoined (up to the rebalance timeout).
        let wait = self.config.rebalance_timeout + Duration::from_secs(5);
        let resp = self
            .coordinator
            .submit(&join, version)
            .await?
            .with_timeout(wait)
            .wait()
            .await?;
        match resp.error_code.err() {
            None => {}
            // KIP-394: the first JoinGroup only hands out a member id.
            Some(ResponseError::MemberIdRequired) => {
                self.member_id = resp.member_id.to_string();
                return Err(self.err(ApiKey::JoinGroup, ResponseError::MemberIdRequired));
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                return Err(self.err(ApiKey::JoinGroup, ResponseError::UnknownMemberId));
            }
            Some(e) => return Err(self.err(ApiKey::JoinGroup, e)),
        }
        self.member_id = resp.member_id.to_string();
        self.generation = resp.generation_id;
        self.leader = resp.leader == resp.member_id;
        // KIP-814: a static leader that came back to a stable group is told it leads, but the
        // coordinator keeps the assignment it has; one sent now would not reach the others.
        self.skipped_assignment = self.leader && resp.skip_assignment;
        let assignments = if self.leader && !resp.skip_assignment {
            let members: Vec<(String, Bytes)> = resp
                .members
                .iter()
                .map(|m| (m.member_id.to_string(), m.metadata.clone()))
                .collect();
            self.assignor
                .assign(&self.member_id, &members)?
                .into_iter()
                .map(|(id, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(&id))
                        .with_assignment(a)
                })
                .collect()
        } else {
            Vec::new()
        };
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(s(&self.config.group_id)))
            .with_generation_id(self.generation)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance())
            .with_protocol_type(Some(s(&self.config.protocol_type)))
            .with_protocol_name(resp.protocol_name.clone())
            .with_assignments(assignments);
        let version = self.coordinator.version::<SyncGroupRequest>()?;
        let sync_sent = std::time::Instant::now();
        let resp = self
            .coordinator
            .submit(&sync, version)
            .await?
            .with_timeout(wait)
            .wait()
            .await?;
        if let Some(e) = resp.error_code.err() {
            return Err(self.err(ApiKey::SyncGroup, e));
        }
        self.assignment = resp.assignment;
        self.synced_at = sync_sent;
        Ok(())
    }

    /// Replaces what this member offers at its next (re)join: a changed subscription makes the
    /// coordinator rebalance the group.
    pub fn set_assignor(&mut self, assignor: Arc<dyn Assignor>) {
        self.assignor = assignor;
    }

    /// Sends a heartbeat; when the group rebalances, rejoins and returns the new assignment.
    /// Call it more often than the session timeout (a third of it is usual).
    pub async fn poll(&mut self) -> Result<Option<Bytes>> {
        if self.heartbeat().await? {
            self.rejoin().await?;
            return Ok(Some(self.assignment.clone()));
        }
        Ok(None)
    }

    /// Sends a heartbeat; true when the member must rejoin (the group is rebalancing, or this
    /// member was removed). It does not rejoin, so that the caller can first stop its work and
    /// commit offsets with the generation it still holds (as a Java consumer's revocation).
    pub async fn heartbeat(&mut self) -> Result<bool> {
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(s(&self.config.group_id)))
            .with_generation_id(self.generation)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance());
        let result = match self.coordinator.send(&req).await {
            Ok(r) => r.error_code.err(),
            Err(
                KafkaError::Disconnected { .. }
                | KafkaError::Io { .. }
                | KafkaError::Timeout { .. },
            ) => {
                self.coordinator =
                    Self::connect_coordinator(&self.cluster, &self.config.group_id).await?;
                Some(ResponseError::NotCoordinator)
            }
            Err(e) => return Err(e),
        };
        match result {
            None => Ok(false),
            Some(
                ResponseError::RebalanceInProgress
                | ResponseError::IllegalGeneration
                | ResponseError::UnknownMemberId
                | ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable,
            ) => {
                if result == Some(ResponseError::UnknownMemberId) {
                    self.member_id.clear();
                }
                Ok(true)
            }
            Some(e) => Err(self.err(ApiKey::Heartbeat, e)),
        }
    }

    /// Leaves the group so the others rebalance at once (instead of after the session timeout).
    pub async fn leave(self) -> Result<()> {
        let version = self.coordinator.version::<LeaveGroupRequest>()?;
        let mut req = LeaveGroupRequest::default().with_group_id(GroupId(s(&self.config.group_id)));
        req = if version >= 3 {
            req.with_members(vec![MemberIdentity::default()
                .with_member_id(s(&self.member_id))
                .with_group_instance_id(self.instance())])
        } else {
            req.with_member_id(s(&self.member_id))
        };
        let resp = self.coordinator.submit(&req, version).await?.wait().await?;
        self.coordinator.close().await;
        match resp.error_code.err() {
            None | Some(ResponseError::UnknownMemberId) => Ok(()),
            Some(e) => Err(self.err(ApiKey::LeaveGroup, e)),
        }
    }
}

fn is_rejoin(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::Broker {
            error: ResponseError::MemberIdRequired
                | ResponseError::RebalanceInProgress
                | ResponseError::UnknownMemberId
                | ResponseError::IllegalGeneration
                | ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::CoordinatorLoadInProgress,
            ..
        }
    )
}

/// The standard `consumer` protocol: subscriptions and assignments as Java consumers encode them
/// (a version prefix, then the ConsumerProtocolSubscription / Assignment struct).
pub mod consumer_protocol {
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
    use kafka_protocol::messages::{
        ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, Encodable};
    use std::collections::BTreeMap;

    /// Newest version of both structs this client writes.
    const VERSION: i16 = 3;

    fn bad(what: &str, e: impl std::fmt::Display) -> KafkaError {
        KafkaError::Protocol {
            broker: "group".into(),
            api: ApiKey::JoinGroup,
            message: format!("{what}: {e}"),
        }
    }

    pub fn subscription(topics: &[String]) -> Bytes {
        let sub = ConsumerProtocolSubscription::default()
            .with_topics(topics.iter().map(|t| s(t)).collect())
            .with_generation_id(-1);
        let mut b = BytesMut::new();
        b.put_i16(VERSION);
        sub.encode(&mut b, VERSION).expect("subscription encodes");
        b.freeze()
    }

    pub fn parse_subscription(data: &Bytes) -> Result<Vec<String>> {
        let mut b = data.clone();
        if b.remaining() < 2 {
            return Err(bad("subscription", "too short"));
        }
        // Newer versions only append fields: read them as the newest version we know.
        let version = b.get_i16().min(VERSION);
        let sub = ConsumerProtocolSubscription::decode(&mut b, version)
            .map_err(|e| bad("subscription", e))?;
        Ok(sub.topics.iter().map(|t| t.to_string()).collect())
    }

    pub fn assignment(parts: &BTreeMap<String, Vec<i32>>) -> Bytes {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
            parts
                .iter()
                .map(|(t, p)| {
                    AssignedPartitions::default()
                        .with_topic(TopicName(s(t)))
                        .with_partitions(p.clone())
                })
                .collect(),
        );
        let mut b = BytesMut::new();
        b.put_i16(VERSION);
        a.encode(&mut b, VERSION).expect("assignment encodes");
        b.freeze()
    }

    pub fn parse_assignment(data: &Bytes) -> Result<BTreeMap<String, Vec<i32>>> {
        let mut b = data.clone();
        if b.remaining() < 2 {
            // An empty assignment (no partitions for this member).
            return Ok(BTreeMap::new());
        }
        let version = b.get_i16().min(VERSION);
        let a = ConsumerProtocolAssignment::decode(&mut b, version)
            .map_err(|e| bad("assignment", e))?;
        Ok(a.assigned_partitions
            .iter()
            .map(|t| (t.topic.0.to_string(), t.partitions.clone()))
            .collect())
    }

    /// Kafka's RangeAssignor: per topic, partitions split into contiguous ranges among the
    /// subscribed members sorted by member id; the first members get one extra.
    #[derive(Debug, Clone)]
    pub struct RangeAssignor {
        pub topics: Vec<String>,
        pub partition_counts: BTreeMap<String, i32>,
    }

    impl Assignor for RangeAssignor {
        fn protocol(&self) -> &str {
            "range"
        }

        fn metadata(&self) -> Bytes {
            subscription(&self.topics)
        }

        fn assign(&self, _: &str, members: &[(String, Bytes)]) -> Result<Vec<(String, Bytes)>> {
            Ok(range(members, &self.partition_counts)?
                .into_iter()
                .map(|(m, a)| (m, assignment(&a)))
                .collect())
        }
    }

    /// The range assignment itself (pure; unit-tested).
    pub fn range(
        members: &[(String, Bytes)],
        counts: &BTreeMap<String, i32>,
    ) -> Result<BTreeMap<String, BTreeMap<String, Vec<i32>>>> {
        let mut out: BTreeMap<String, BTreeMap<String, Vec<i32>>> = members
            .iter()
            .map(|(m, _)| (m.clone(), BTreeMap::new()))
            .collect();
        let mut by_topic: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (m, meta) in members {
            for t in parse_subscription(meta)? {
                by_topic.entry(t).or_default().push(m.clone());
            }
        }
        for (topic, mut subs) in by_topic {
            subs.sort();
            let n = *counts.get(&topic).unwrap_or(&0);
            let per = n / subs.len() as i32;
            let extra = n % subs.len() as i32;
            let mut next = 0;
            for (i, m) in subs.iter().enumerate() {
                let take = per + if (i as i32) < extra { 1 } else { 0 };
                if take > 0 {
                    out.entry(m.clone())
                        .or_default()
                        .insert(topic.clone(), (next..next + take).collect());
                }
                next += take;
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn subscription_and_assignment_round_trip() {
            let s = subscription(&["a".into(), "b".into()]);
            assert_eq!(parse_subscription(&s).unwrap(), ["a", "b"]);
            let a: BTreeMap<String, Vec<i32>> = [("a".to_string(), vec![0, 2])].into();
            assert_eq!(parse_assignment(&assignment(&a)).unwrap(), a);
            assert!(parse_assignment(&Bytes::new()).unwrap().is_empty());
        }

        #[test]
        fn range_matches_kafkas_range_assignor() {
            let members: Vec<(String, Bytes)> = ["m2", "m1", "m3"]
                .iter()
                .map(|m| (m.to_string(), subscription(&["t".into()])))
                .collect();
            let counts: BTreeMap<String, i32> = [("t".to_string(), 7)].into();
            let r = range(&members, &counts).unwrap();
            assert_eq!(r["m1"]["t"], [0, 1, 2]);
            assert_eq!(r["m2"]["t"], [3, 4]);
            assert_eq!(r["m3"]["t"], [5, 6]);
        }
    }
}
