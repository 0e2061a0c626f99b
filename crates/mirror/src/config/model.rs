//! The validated configuration: what every later stage (plan, engine) works from.

use super::diagnostics::{Diagnostics, Origin};
use crate::filter::{NameFilter, PatternList};
use crate::names::{ClusterAlias, FlowId};
use crate::policy::ReplicationPolicy;
use kmirror_kafka::{BrokerAddress, ClientSettings, ConsumerTuning, ProducerTuning};
use serde::Serialize;
use std::time::Duration;

/// Which kind of input the configuration came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// `connect-mirror-maker.properties` (MM2 dedicated mode).
    Mm2 { file: String },
    /// MM2 connector files as run by connect-standalone.
    Connectors {
        files: Vec<String>,
        worker: Option<String>,
    },
}

/// A task that repeats: `enabled` and its interval (MM2's `*.enabled` / `*.interval.seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Periodic {
    pub enabled: bool,
    #[serde(serialize_with = "secs")]
    pub interval: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

/// `offset-syncs.topic.location` and `use.defaults.from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Source,
    Target,
}

/// Exactly-once: the target worker's `exactly.once.source.support` and the connector's
/// `exactly.once.support` (mm2-compatibility §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExactlyOnce {
    Disabled,
    Requested,
    Required,
}

/// Where a partition with no stored position starts copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartPosition {
    Earliest,
    Latest,
    /// The first record whose timestamp is at or after this time (epoch milliseconds), as
    /// ListOffsets by timestamp finds it; the log end when there is none.
    Timestamp(i64),
    /// `auto.offset.reset = none`: the partition stops with an error instead of guessing.
    Fail,
}

/// Exactly-once's units of work and commit cadence: a fixed number of slots, each with a
/// stable transactional id named as Kafka Connect names a source task's (`<worker
/// group.id>-<connector>-<task>`), so MM2's ACLs fit and a takeover fences MM2's tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transactions {
    /// The target worker's `exactly.once.source.support`: disabled, preparing or enabled.
    pub support: &'static str,
    /// `tasks.max` if set, else [`Transactions::DEFAULT_SLOTS`].
    pub slots: u32,
    pub slots_from_tasks_max: bool,
    /// Slot `i`'s transactional id is this prefix followed by `i`.
    pub transactional_id_prefix: String,
    /// `transaction.boundary`: poll (kmirror commits every [`Transactions::POLL_INTERVAL`]) or
    /// interval (`transaction.boundary.interval.ms`).
    pub boundary: TransactionBoundary,
    #[serde(serialize_with = "millis")]
    pub interval: Duration,
    /// The producer's `transaction.timeout.ms` (Java's default 60 s).
    #[serde(serialize_with = "millis")]
    pub timeout: Duration,
    /// `kmirror.exactly.once.transaction.max.bytes`: a transaction is committed early at this
    /// size (bounds what an abort copies again and what readers wait behind).
    pub max_bytes: u64,
}

impl Transactions {
    /// Splits evenly over 1, 2, 3, 4 and 6 processes.
    pub const DEFAULT_SLOTS: u32 = 12;
    /// The commit interval with `transaction.boundary = poll`: Connect commits every poll,
    /// which in kmirror is a fetch of a few milliseconds; half a second bounds the commit
    /// overhead and what a read_committed reader waits.
    pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
    pub const DEFAULT_MAX_BYTES: u64 = 32 * 1024 * 1024;

    /// The transactional ids of all slots, as `plan` shows them.
    pub fn id_range(&self) -> String {
        match self.slots {
            1 => format!("{}0", self.transactional_id_prefix),
            n => format!("{p}0 .. {p}{}", n - 1, p = self.transactional_id_prefix),
        }
    }
}

/// Connect's `transaction.boundary` values kmirror accepts (`connector` needs a connector that
/// defines its own boundaries, which MirrorSourceConnector does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransactionBoundary {
    Poll,
    Interval,
}

/// What a partition does when the source deleted records it had not copied yet (retention
/// outran replication): never skipped silently; the loss is logged and counted either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTruncation {
    /// Stop the partition until an operator decides (the default).
    Stop,
    /// Continue from the source's log start.
    Continue,
}

/// Internal topics of one flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InternalTopics {
    pub emit_offset_syncs: bool,
    pub offset_syncs_location: Side,
    pub offset_syncs_replication_factor: i16,
    pub checkpoints_replication_factor: i16,
    pub heartbeats_replication_factor: i16,
    /// Where source positions are stored on the target, in MM2's Connect offset format
    /// (`offset.storage.topic`, default `mm2-offsets.<source>.internal`; mm2-compatibility §2).
    pub positions_topic: String,
    pub positions_partitions: i32,
    pub positions_replication_factor: i16,
}

/// One client of a flow: how to connect, and for consumers and producers, the tuning.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowClients {
    pub source_consumer: ClientSettings,
    pub consumer_tuning: ConsumerTuning,
    pub source_admin: ClientSettings,
    pub target_producer: ClientSettings,
    pub producer_tuning: ProducerTuning,
    pub target_admin: ClientSettings,
    /// Writes offset syncs where `offset-syncs.topic.location` says (the source by default).
    pub offset_syncs_producer: ClientSettings,
}

/// One replication flow `source->target`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowConfig {
    pub id: FlowId,
    /// `A->B.enabled`: topics, data, configs, ACLs and checkpoints. A flow that is not enabled
    /// exists only to emit heartbeats into its target, as MM2's extra herders do.
    pub replication: bool,
    /// Whether this process serves the flow (its target is in `--clusters`).
    pub served: bool,
    pub topics: NameFilter,
    pub groups: NameFilter,
    pub policy: ReplicationPolicy,
    pub replication_factor: i16,
    pub internal: InternalTopics,
    pub offset_lag_max: i64,
    pub config_properties_exclude: PatternList,
    pub use_defaults_from: Side,
    pub heartbeats_replication: bool,
    pub refresh_topics: Periodic,
    pub refresh_groups: Periodic,
    pub sync_topic_configs: Periodic,
    pub sync_topic_acls: Periodic,
    pub emit_heartbeats: Periodic,
    pub emit_checkpoints: Periodic,
    pub sync_group_offsets: Periodic,
    pub exactly_once: ExactlyOnce,
    /// How exactly-once divides and commits the flow's work (docs/engine.md, "Exactly-once"):
    /// worked out whatever the mode, so `plan` shows what enabling it would do.
    pub transactions: Transactions,
    #[serde(serialize_with = "millis")]
    pub admin_timeout: Duration,
    /// Every connector key the configuration sets for this flow (its own or the file's
    /// top-level one), with the value in effect: `plan` names each, so no setting that
    /// changes behaviour goes unseen.
    pub keys_set: Vec<(String, String)>,
    /// `kmirror.source.truncation`: a stored position below the source's log start.
    pub on_truncation: OnTruncation,
    /// Where a partition without a stored position starts: `kmirror.start.position`, else the
    /// source consumer's `auto.offset.reset`.
    pub start: StartPosition,
    /// `kmirror.sync.group.acls.enabled`: with ACL sync, also copy consumer-group READ ACLs of
    /// groups matching `groups` (default off).
    pub sync_group_acls: bool,
    /// `kmirror.topics.rename` (kmirror's own, default none): source topic -> remote name for
    /// the topics listed, instead of the replication policy's (docs/topologies.md). Left out of
    /// what is serialised when empty, so members of an older version compare equal.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub renames: std::collections::BTreeMap<String, String>,
    /// `transforms` / `predicates` (Connect's SMT syntax; no renaming in MM2 mode): any
    /// transform makes the flow copy in record mode.
    pub transforms: crate::transform::Chain,
    /// `kmirror.rate.limit.bytes.per.second`: this flow's fetched bytes per second (None: off).
    pub rate_limit: Option<u64>,
    /// `kmirror.process.rate.limit.bytes.per.second`: all flows of the process together (the
    /// lowest value among the served flows applies).
    pub process_rate_limit: Option<u64>,
    /// `kmirror.batch.mode.enabled` (default true): forward fetched batches as they are when
    /// possible. false decodes and re-encodes every batch with the producer's
    /// `compression.type` (record mode), e.g. to compress on the way to a distant target.
    pub batch_mode: bool,
    /// `kmirror.batch.merge.enabled` (default true): merge small consecutive batches of a
    /// partition into one target batch (re-encoding their records with their codec); false
    /// forwards each as it is, which costs no CPU but more batches on the target.
    pub merge_small_batches: bool,
    /// `kmirror.positions.interval.ms` (default 250): how often acknowledged positions are
    /// stored (MM2: `offset.flush.interval.ms`, 60 s).
    #[serde(serialize_with = "millis")]
    pub positions_interval: Duration,
    /// `kmirror.resume.from.target.enabled` (default true): an at-least-once partition that
    /// starts with a stored position first looks on the target for what was copied after it
    /// (docs/engine.md, "Resuming from what the target holds").
    pub resume_from_target: bool,
    /// `kmirror.loop.prevention.enabled` (default false): register the producer ids written
    /// into the target, and leave out the source's batches kmirror copied from the target, so
    /// IdentityReplicationPolicy may run both ways (docs/topologies.md, "Identity names both
    /// ways"). Left out of what is serialised when off, so members of an older version compare
    /// equal.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub loop_prevention: bool,
    /// `kmirror.batch.max.decompressed.bytes`: the most one source batch may decompress to when
    /// its records are decoded (record mode; merging forwards a larger run as it is). Default: the
    /// source consumer's `fetch.max.bytes` (or `max.partition.fetch.bytes` if larger), so a
    /// decompression bomb costs at most what one fetch may.
    pub max_decompressed_bytes: usize,
    /// `kmirror.sharing.*`: processes serving this flow share its partitions through a group
    /// on the target (docs/sharing.md).
    pub sharing: Sharing,
    /// Schema sync, when both clusters name a registry (docs/schemas.md). Left out of what is
    /// serialised when off, so members of an older version compare equal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemas: Option<SchemaSync>,
    pub clients: FlowClients,
}

/// A flow's schema sync (docs/schemas.md, "Configuration").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchemaSync {
    pub source: RegistryAt,
    pub target: RegistryAt,
    /// `kmirror.schemas.ids`.
    pub ids: IdsMode,
    /// `kmirror.schemas.subjects`: subjects copied besides those of replicated topics.
    pub subjects: PatternList,
    /// `kmirror.schemas.refresh.interval.seconds` (default 30).
    #[serde(serialize_with = "secs")]
    pub refresh: Duration,
}

impl SchemaSync {
    /// The registry's own topic (Confluent's `kafkastore.topic` default): left out of
    /// replication while schemas are synced through the API.
    pub const REGISTRY_TOPIC: &'static str = "_schemas";
}

/// `kmirror.schemas.ids`: whether the target registers schemas under the source's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdsMode {
    Keep,
    Translate,
}

/// One registry, shown with its URL's credentials masked and the kind of credentials only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAt(pub kmirror_registry::RegistrySettings);

impl Serialize for RegistryAt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let r = &self.0;
        let auth = match r.auth {
            kmirror_registry::Auth::None => "none",
            kmirror_registry::Auth::Basic { .. } => "basic",
            kmirror_registry::Auth::Bearer(_) => "bearer",
        };
        let mut out = s.serialize_struct("RegistryAt", 3)?;
        out.serialize_field("url", &kmirror_kafka::secret::redact_url(&r.url))?;
        out.serialize_field("auth", auth)?;
        out.serialize_field("tls", &r.tls)?;
        out.end()
    }
}

/// Names worked out from a flow's settings. Defined here, once, so that `plan` prints what the
/// engine uses (docs/mm2-compatibility.md §2 for MM2's names and sides).
impl FlowConfig {
    /// The flow's offset-syncs topic and the side it lives on. It is named after the *other*
    /// cluster of the flow: on the source it carries the target's alias, and the other way round.
    pub fn offset_syncs_topic(&self) -> (String, Side) {
        let side = self.internal.offset_syncs_location;
        let alias = match side {
            Side::Source => &self.id.target,
            Side::Target => &self.id.source,
        };
        (self.policy.offset_syncs_topic(alias), side)
    }

    /// The offset-syncs topic of the opposite flow (target->source) when it keeps them where
    /// this flow keeps its own (`offset-syncs.topic.location`), and the side of *this* flow it
    /// lives on: the opposite flow's source is this flow's target.
    pub fn opposite_offset_syncs_topic(&self) -> (String, Side) {
        match self.internal.offset_syncs_location {
            Side::Source => (
                self.policy.offset_syncs_topic(&self.id.source),
                Side::Target,
            ),
            Side::Target => (
                self.policy.offset_syncs_topic(&self.id.target),
                Side::Source,
            ),
        }
    }

    /// The checkpoints topic, on the target, named after the source.
    pub fn checkpoints_topic(&self) -> String {
        self.policy.checkpoints_topic(&self.id.source)
    }
}

/// How the processes serving one flow share it (docs/sharing.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sharing {
    /// `kmirror.sharing.enabled` (default true): join the flow's group and serve only the
    /// partitions it assigns; false serves every partition (one process per flow).
    pub enabled: bool,
    /// The group on the target: `kmirror-<source>-><target>`, or `kmirror.sharing.group.id`.
    pub group_id: String,
    /// `kmirror.sharing.session.timeout.ms` (default 10 s, as Connect's workers): how long a
    /// silent process keeps its partitions, and how soon a paused one stops writing.
    #[serde(serialize_with = "millis")]
    pub session_timeout: Duration,
    /// `kmirror.sharing.rebalance.timeout.ms` (default 60 s, as Connect's): how long a
    /// rebalance waits for every process to rejoin.
    #[serde(serialize_with = "millis")]
    pub rebalance_timeout: Duration,
    /// `kmirror.sharing.instance.id` (default none): this process's static identity in the
    /// group (KIP-345). Restarted under the same id within the session timeout, it is given its
    /// partitions back at once, without a rebalance. Different in every process (usually
    /// `${env:HOSTNAME}`), so it is left out of the settings members compare.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// A cluster named in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterInfo {
    pub alias: ClusterAlias,
    pub bootstrap: Vec<BrokerAddress>,
}

/// A key that was read and not used, with why, and a hint when it looks like a typo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IgnoredKey {
    pub origin: Origin,
    pub reason: String,
    pub did_you_mean: Option<String>,
}

/// A configuration that passed validation (it may still carry warnings).
#[derive(Debug, Clone, Serialize)]
pub struct MirrorConfig {
    pub source: Source,
    pub clusters: Vec<ClusterInfo>,
    pub flows: Vec<FlowConfig>,
    /// `--clusters`, when given: only flows into these targets are served.
    pub served_targets: Option<Vec<ClusterAlias>>,
    pub ignored: Vec<IgnoredKey>,
    pub diagnostics: Diagnostics,
}

impl MirrorConfig {
    /// Flows this process replicates or emits heartbeats for.
    pub fn served_flows(&self) -> impl Iterator<Item = &FlowConfig> {
        self.flows.iter().filter(|f| f.served)
    }
}
