//! One flow's connector settings (a flat map, as MM2 hands its connectors) → a typed
//! [`FlowConfig`], with MM2's defaults (mm2-compatibility §1.2–§1.5) and the cross-key checks.
//!
//! Why one file of this size: `build` reads all of one flow's keys in one pass through one
//! `Reader`, so its cross-key checks (exactly-once against isolation and timeouts, checkpoints
//! without offset syncs) see every value; the helpers below it each parse one key. Next to split
//! out: the checks across flows (`refuse_loops`, `warn_identity_*`) into their own file.

use super::client;
use super::diagnostics::Diagnostics;
use super::keys::is_client_key;
use super::model::{
    ExactlyOnce, FlowClients, FlowConfig, InternalTopics, OnTruncation, Periodic, Sharing, Side,
    StartPosition, TransactionBoundary, Transactions,
};
use super::values::{Reader, Setting, SettingMap};
use crate::filter::NameFilter;
use crate::names::FlowId;
use crate::policy::{PolicyKind, ReplicationPolicy};
use kmirror_kafka::IsolationLevel;
use std::time::Duration;

pub const DEFAULT_TOPICS_EXCLUDE: &str = r".*[\-\.]internal, .*\.replica, __.*";
pub const DEFAULT_GROUPS_EXCLUDE: &str = "console-consumer-.*, connect-.*, __.*";
pub const DEFAULT_CONFIG_PROPERTIES_EXCLUDE: &str = r"follower\.replication\.throttled\.replicas, leader\.replication\.throttled\.replicas, message\.timestamp\.difference\.max\.ms, message\.timestamp\.type, unclean\.leader\.election\.enable, min\.insync\.replicas";

/// Client settings of one role, layered as MM2's MirrorConnectorConfig does: the cluster's client
/// keys (`source.cluster.*` / `target.cluster.*`, only bootstrap/security/SSL/SASL), then the
/// connector-wide prefix (`consumer.`), then the side-specific prefix (`source.consumer.`), then
/// an optional override prefix (`producer.override.`, as Connect applies it).
pub fn role_map(p: &SettingMap, cluster_prefix: &str, layers: &[&str]) -> SettingMap {
    let mut out = SettingMap::new();
    for (k, v) in p {
        if let Some(rest) = k.strip_prefix(cluster_prefix) {
            if is_client_key(rest) || rest == "client.id" {
                out.insert(rest.to_string(), v.clone());
            }
        }
    }
    for prefix in layers {
        for (k, v) in p {
            // `admin.timeout.ms` is a connector key, not an admin client key.
            if k == "admin.timeout.ms" {
                continue;
            }
            if let Some(rest) = k.strip_prefix(prefix) {
                out.insert(rest.to_string(), v.clone());
            }
        }
    }
    out
}

/// Builds a flow; `None` when an error was recorded for it.
/// The connector keys `p` sets, as `plan` lists them: the flow's identity (its clusters, its
/// switch, the connector's class and name) is shown in its heading and left out.
fn keys_set(p: &SettingMap) -> Vec<(String, String)> {
    const IDENTITY: &[&str] = &[
        "enabled",
        "name",
        "connector.class",
        "source.cluster.alias",
        "target.cluster.alias",
    ];
    super::keys::CONNECTOR_KEYS
        .iter()
        .filter(|k| !IDENTITY.contains(k))
        .filter_map(|k| Some((k.to_string(), p.get(*k)?.value.trim().to_string())))
        .collect()
}

pub fn build(
    id: FlowId,
    p: &SettingMap,
    extra_producer: Option<&SettingMap>,
    diags: &mut Diagnostics,
) -> Option<FlowConfig> {
    let errors_before = diags.errors().count();
    let mut r = Reader::new(p, diags);
    let replication = r.bool("enabled", false);

    let topics = NameFilter {
        include: r.patterns("topics", ".*"),
        exclude: deprecated_alias(
            &mut r,
            "topics.exclude",
            "topics.blacklist",
            DEFAULT_TOPICS_EXCLUDE,
        ),
    };
    let groups = NameFilter {
        include: r.patterns("groups", ".*"),
        exclude: deprecated_alias(
            &mut r,
            "groups.exclude",
            "groups.blacklist",
            DEFAULT_GROUPS_EXCLUDE,
        ),
    };
    let config_properties_exclude = deprecated_alias(
        &mut r,
        "config.properties.exclude",
        "config.properties.blacklist",
        DEFAULT_CONFIG_PROPERTIES_EXCLUDE,
    );
    let policy = policy(&mut r, &id);
    for (key, default_simple) in [
        ("topic.filter.class", "DefaultTopicFilter"),
        ("group.filter.class", "DefaultGroupFilter"),
        (
            "config.property.filter.class",
            "DefaultConfigPropertyFilter",
        ),
        ("forwarding.admin.class", "ForwardingAdmin"),
    ] {
        if let Some(s) = r.get(key) {
            if s.value.trim().rsplit('.').next() != Some(default_simple) {
                r.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("custom Java classes cannot be loaded by kmirror; only the built-in {default_simple} is available (configure it with its own keys)"),
                );
            }
        }
    }
    let transforms = super::transforms::parse(r.map, r.diags);
    if transforms.renames() {
        if let Some(s) = r.get("transforms") {
            r.diags.error(
                Some(&s.origin),
                Some(&s.value),
                format!(
                    "RegexRouter ({}) cannot rename topics in MM2 mode: checkpoints, offset translation and cycle detection need remote names the replication policy can read back; name topics with replication.policy.class / replication.policy.separator, or use kmirror legacy",
                    transforms.renaming_aliases().join(", ")
                ),
            );
        }
    }

    let replication_factor = r.replication_factor("replication.factor", 2);
    let internal = InternalTopics {
        emit_offset_syncs: r.bool("emit.offset-syncs.enabled", true),
        offset_syncs_location: side(r.choice(
            "offset-syncs.topic.location",
            "source",
            &["source", "target"],
        )),
        offset_syncs_replication_factor: r
            .replication_factor("offset-syncs.topic.replication.factor", 3),
        checkpoints_replication_factor: r
            .replication_factor("checkpoints.topic.replication.factor", 3),
        heartbeats_replication_factor: r
            .replication_factor("heartbeats.topic.replication.factor", 3),
        positions_topic: r.string(
            "target.cluster.offset.storage.topic",
            &format!("mm2-offsets.{}.internal", id.source),
        ),
        positions_partitions: r.int(
            "target.cluster.offset.storage.partitions",
            25,
            1,
            i32::MAX as i64,
        ) as i32,
        positions_replication_factor: r
            .replication_factor("target.cluster.offset.storage.replication.factor", 3),
    };
    let offset_lag_max = r.int("offset.lag.max", 100, 0, i64::MAX);
    let use_defaults_from = side(r.choice("use.defaults.from", "target", &["source", "target"]));
    let heartbeats_replication = r.bool("heartbeats.replication.enabled", true);
    let refresh_topics = periodic(&mut r, "refresh.topics", true, 600);
    let refresh_groups = periodic(&mut r, "refresh.groups", true, 600);
    let sync_topic_configs = periodic(&mut r, "sync.topic.configs", true, 600);
    let sync_topic_acls = periodic(&mut r, "sync.topic.acls", true, 600);
    let emit_heartbeats = periodic(&mut r, "emit.heartbeats", true, 1);
    let emit_checkpoints = periodic(&mut r, "emit.checkpoints", true, 60);
    let sync_group_offsets = periodic(&mut r, "sync.group.offsets", false, 60);
    let admin_timeout = r.millis("admin.timeout.ms", 60_000);
    let sync_group_acls = r.bool("kmirror.sync.group.acls.enabled", false);
    let renames = renames(&mut r);
    let limit = |r: &mut Reader<'_>, key: &str| {
        let v = r.int(key, 0, 0, i64::MAX);
        (v > 0).then_some(v as u64)
    };
    let rate_limit = limit(&mut r, "kmirror.rate.limit.bytes.per.second");
    let process_rate_limit = limit(&mut r, "kmirror.process.rate.limit.bytes.per.second");
    let batch_mode = r.bool("kmirror.batch.mode.enabled", true);
    let merge_small_batches = r.bool("kmirror.batch.merge.enabled", true);
    let positions_interval = r.millis("kmirror.positions.interval.ms", 250);
    let resume_from_target = r.bool("kmirror.resume.from.target.enabled", true);
    let loop_prevention = r.bool("kmirror.loop.prevention.enabled", false);
    let sharing = Sharing {
        enabled: r.bool("kmirror.sharing.enabled", true),
        group_id: Some(r.string("kmirror.sharing.group.id", ""))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("kmirror-{id}")),
        session_timeout: r.millis("kmirror.sharing.session.timeout.ms", 10_000),
        rebalance_timeout: r.millis("kmirror.sharing.rebalance.timeout.ms", 60_000),
        instance_id: instance_id(&mut r),
    };
    // Read before the consumer settings its default comes from; 64 KiB at least, so a typo
    // cannot stop every compressed partition.
    let max_decompressed = r
        .get("kmirror.batch.max.decompressed.bytes")
        .is_some()
        .then(|| {
            r.int(
                "kmirror.batch.max.decompressed.bytes",
                0,
                64 << 10,
                i64::MAX,
            ) as usize
        });
    let on_truncation = match r.choice("kmirror.source.truncation", "stop", &["stop", "continue"]) {
        "continue" => OnTruncation::Continue,
        _ => OnTruncation::Stop,
    };

    // Exactly-once needs the target "worker" to support it (MM2: <target>.exactly.once.source.support).
    let worker_eos = r.choice(
        "target.cluster.exactly.once.source.support",
        "disabled",
        &["disabled", "preparing", "enabled"],
    );
    let requested = r.choice(
        "exactly.once.support",
        "requested",
        &["requested", "required"],
    );
    let exactly_once = match (worker_eos, requested) {
        ("enabled", "required") => ExactlyOnce::Required,
        ("enabled", _) => ExactlyOnce::Requested,
        (_, "required") => {
            let origin = r.get("exactly.once.support").map(|s| s.origin.clone());
            r.diags.error(
                origin.as_ref(),
                Some("required"),
                format!("exactly-once is required but the target does not enable it: set {}.exactly.once.source.support = enabled", id.target),
            );
            ExactlyOnce::Disabled
        }
        _ => ExactlyOnce::Disabled,
    };

    // Clients.
    let src_hint = format!("{}.bootstrap.servers", id.source);
    let tgt_hint = format!("{}.bootstrap.servers", id.target);
    let consumer_map = role_map(p, "source.cluster.", &["consumer.", "source.consumer."]);
    let admin_src_map = role_map(p, "source.cluster.", &["admin.", "source.admin."]);
    let admin_tgt_map = role_map(p, "target.cluster.", &["admin.", "target.admin."]);
    // The data producer is Connect's: the target's producer settings (`B.producer.*`) and
    // `A->B.producer.override.*`. A flow's `producer.*` configures only MM2's offset-syncs
    // producer, as in MM2.
    let mut producer_map = role_map(p, "target.cluster.", &["target.producer."]);
    if let Some(extra) = extra_producer {
        producer_map.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    for (k, v) in p {
        if let Some(rest) = k.strip_prefix("producer.override.") {
            producer_map.insert(rest.to_string(), v.clone());
        }
    }
    let what_src = format!("cluster {}", id.source);
    let what_tgt = format!("cluster {}", id.target);
    // MM2's offset-syncs producer writes to the source by default (offset-syncs.topic.location).
    let syncs_producer_map = match internal.offset_syncs_location {
        Side::Source => role_map(p, "source.cluster.", &["producer.", "source.producer."]),
        Side::Target => role_map(p, "target.cluster.", &["producer.", "target.producer."]),
    };
    let offset_syncs_producer = client::connection(
        &syncs_producer_map,
        if internal.offset_syncs_location == Side::Source {
            &what_src
        } else {
            &what_tgt
        },
        if internal.offset_syncs_location == Side::Source {
            &src_hint
        } else {
            &tgt_hint
        },
        diags,
    );
    let source_consumer = client::connection(&consumer_map, &what_src, &src_hint, diags);
    let source_admin = client::connection(&admin_src_map, &what_src, &src_hint, diags);
    let target_producer = client::connection(&producer_map, &what_tgt, &tgt_hint, diags);
    let target_admin = client::connection(&admin_tgt_map, &what_tgt, &tgt_hint, diags);
    let consumer_tuning = client::consumer_tuning(&consumer_map, diags);
    let producer_tuning = client::producer_tuning(&producer_map, diags);
    let max_decompressed_bytes =
        max_decompressed.unwrap_or_else(|| consumer_tuning.default_max_decompressed());
    // A flow that only emits heartbeats copies no records, so no schemas either.
    let schemas = if replication {
        super::schemas::build(&id, p, diags)
    } else {
        None
    };
    let start = match p.get("kmirror.start.position") {
        Some(s) => start_position(s, diags),
        None => match consumer_tuning.auto_offset_reset {
            kmirror_kafka::AutoOffsetReset::Earliest => StartPosition::Earliest,
            kmirror_kafka::AutoOffsetReset::Latest => StartPosition::Latest,
            kmirror_kafka::AutoOffsetReset::None => StartPosition::Fail,
        },
    };

    // Contradictions.
    let transactions = transactions(
        &mut Reader::new(p, diags),
        worker_eos,
        &id,
        producer_tuning.transaction_timeout,
    );
    if exactly_once != ExactlyOnce::Disabled && transactions.interval > transactions.timeout / 3 {
        // A slot's transaction stays open for the interval plus a commit: near the timeout,
        // the coordinator would abort transactions in the steady state.
        let origin = p
            .get("transaction.boundary.interval.ms")
            .or_else(|| producer_map.get("transaction.timeout.ms"))
            .map(|s| s.origin.clone());
        diags.error(
            origin.as_ref(),
            None,
            format!(
                "the exactly-once commit interval ({} ms) must be at most a third of the producer's transaction.timeout.ms ({} ms): lower transaction.boundary.interval.ms or raise {}.producer.transaction.timeout.ms",
                transactions.interval.as_millis(),
                transactions.timeout.as_millis(),
                id.target
            ),
        );
    }
    if exactly_once != ExactlyOnce::Disabled
        && consumer_tuning.isolation_level == IsolationLevel::ReadUncommitted
    {
        let origin = consumer_map
            .get("isolation.level")
            .map(|s| s.origin.clone());
        diags.error(
            origin.as_ref(),
            Some("read_uncommitted"),
            "exactly-once replication cannot read uncommitted data: remove isolation.level or set read_committed",
        );
    }
    if replication && emit_checkpoints.enabled && !internal.emit_offset_syncs {
        diags.error(
            p.get("emit.offset-syncs.enabled").map(|s| &s.origin),
            Some("false"),
            "checkpoints need offset syncs: set emit.checkpoints.enabled = false too, or keep emit.offset-syncs.enabled = true",
        );
    }
    if replication && sync_group_offsets.enabled && !emit_checkpoints.enabled {
        diags.error(
            p.get("sync.group.offsets.enabled").map(|s| &s.origin),
            Some("true"),
            "group offset sync translates offsets through checkpoints: it needs emit.checkpoints.enabled = true",
        );
    }

    if diags.errors().count() > errors_before {
        return None;
    }
    Some(FlowConfig {
        id,
        replication,
        served: true,
        topics,
        groups,
        policy,
        replication_factor,
        internal,
        offset_lag_max,
        config_properties_exclude,
        use_defaults_from,
        heartbeats_replication,
        refresh_topics,
        refresh_groups,
        sync_topic_configs,
        sync_topic_acls,
        emit_heartbeats,
        emit_checkpoints,
        sync_group_offsets,
        exactly_once,
        transactions,
        admin_timeout,
        keys_set: keys_set(p),
        on_truncation,
        start,
        sync_group_acls,
        renames,
        transforms,
        rate_limit,
        process_rate_limit,
        batch_mode,
        merge_small_batches,
        positions_interval,
        resume_from_target,
        loop_prevention,
        max_decompressed_bytes,
        sharing,
        schemas,
        clients: FlowClients {
            source_consumer: source_consumer?,
            consumer_tuning,
            source_admin: source_admin?,
            target_producer: target_producer?,
            producer_tuning,
            target_admin: target_admin?,
            offset_syncs_producer: offset_syncs_producer?,
        },
    })
}

/// Exactly-once's slots, transactional ids and commit cadence (docs/engine.md, "Exactly-once").
/// `timeout` is the data producer's `transaction.timeout.ms`.
fn transactions(
    r: &mut Reader<'_>,
    support: &'static str,
    id: &FlowId,
    timeout: Duration,
) -> Transactions {
    let tasks_max = r.get("tasks.max").is_some();
    let slots = r.int("tasks.max", Transactions::DEFAULT_SLOTS as i64, 1, 1000) as u32;
    // Connect names a source task's transactional id `<worker group.id>-<connector>-<task>`;
    // MM2's dedicated mode runs its worker with group.id `<source>-mm2` unless the target's
    // `group.id` is set (`B.group.id`; in connector mode, the worker file's).
    let group = r
        .get("target.cluster.group.id")
        .map(|s| s.value.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{}-mm2", id.source));
    let connector = r.string(SOURCE_CONNECTOR_NAME, "MirrorSourceConnector");
    let boundary = match r.choice(
        "transaction.boundary",
        "poll",
        &["poll", "interval", "connector"],
    ) {
        "connector" => {
            let origin = r.get("transaction.boundary").map(|s| s.origin.clone());
            r.diags.error(
                origin.as_ref(),
                Some("connector"),
                "transaction.boundary = connector needs a connector that defines its own transaction boundaries, which MirrorSourceConnector does not (Connect refuses it too): use poll or interval",
            );
            TransactionBoundary::Poll
        }
        "interval" => TransactionBoundary::Interval,
        _ => TransactionBoundary::Poll,
    };
    let interval = match boundary {
        TransactionBoundary::Poll => Transactions::POLL_INTERVAL,
        // Connect's default is the worker's offset.flush.interval.ms, 60 s.
        TransactionBoundary::Interval => r.millis("transaction.boundary.interval.ms", 60_000),
    };
    let max_bytes = r.int(
        "kmirror.exactly.once.transaction.max.bytes",
        Transactions::DEFAULT_MAX_BYTES as i64,
        1 << 20,
        i64::from(i32::MAX),
    ) as u64;
    Transactions {
        support,
        slots,
        slots_from_tasks_max: tasks_max,
        transactional_id_prefix: format!("{group}-{connector}-"),
        boundary,
        interval,
        timeout,
        max_bytes,
    }
}

/// The source connector's `name` in connector mode (its files are merged into one map, where
/// `name` is whichever file's came first).
pub const SOURCE_CONNECTOR_NAME: &str = "kmirror.internal.source.connector.name";

/// `kmirror.start.position`: earliest, latest, epoch milliseconds, or an RFC 3339 (ISO 8601)
/// time with its offset (`2026-12-05T10:00:00Z`).
fn start_position(s: &Setting, diags: &mut Diagnostics) -> StartPosition {
    let v = s.value.trim();
    if v.eq_ignore_ascii_case("earliest") {
        return StartPosition::Earliest;
    }
    if v.eq_ignore_ascii_case("latest") {
        return StartPosition::Latest;
    }
    if let Ok(ms) = v.parse::<i64>() {
        if ms >= 0 {
            return StartPosition::Timestamp(ms);
        }
    }
    match time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339) {
        Ok(t) if t.unix_timestamp() >= 0 => {
            StartPosition::Timestamp((t.unix_timestamp_nanos() / 1_000_000) as i64)
        }
        _ => {
            diags.error(
                Some(&s.origin),
                Some(&s.value),
                "expected earliest, latest, a time with its offset (2026-12-05T10:00:00Z, RFC 3339) or epoch milliseconds",
            );
            StartPosition::Earliest
        }
    }
}

fn side(s: &str) -> Side {
    if s == "target" {
        Side::Target
    } else {
        Side::Source
    }
}

/// `<name>.enabled` and `<name>.interval.seconds`; a negative interval disables, as in MM2.
fn periodic(r: &mut Reader<'_>, name: &str, default_enabled: bool, default_secs: i64) -> Periodic {
    let enabled = r.bool(&format!("{name}.enabled"), default_enabled);
    let key = format!("{name}.interval.seconds");
    let secs = r.int(&key, default_secs, i64::MIN, i32::MAX as i64);
    if secs == 0 {
        // MM2's scheduler refuses a zero period.
        if let Some(s) = r.get(&key) {
            r.diags.error(
                Some(&s.origin),
                Some(&s.value),
                "expected at least 1 second (or a negative value to disable)",
            );
        }
    }
    Periodic {
        enabled: enabled && secs >= 0,
        interval: Duration::from_secs(secs.max(0) as u64),
    }
}

/// MM2 4.0 removed the `*.blacklist` names; users migrating off old clusters still have them, so
/// they are accepted with a warning (the new name wins when both are set, as in 3.x).
fn deprecated_alias(
    r: &mut Reader<'_>,
    key: &str,
    old: &str,
    default: &str,
) -> crate::filter::PatternList {
    match (r.get(key), r.get(old)) {
        (None, Some(s)) => {
            r.diags.warning(
                Some(&s.origin),
                None,
                format!("'{old}' is deprecated (removed in Kafka 4.0); it is honoured, but rename it to '{key}'"),
            );
            r.patterns(old, default)
        }
        (Some(_), Some(s)) => {
            r.diags.warning(
                Some(&s.origin),
                None,
                format!("'{old}' is ignored because '{key}' is also set"),
            );
            r.patterns(key, default)
        }
        _ => r.patterns(key, default),
    }
}

fn policy(r: &mut Reader<'_>, id: &FlowId) -> ReplicationPolicy {
    let mut policy = ReplicationPolicy {
        source_alias: Some(id.source.clone()),
        ..ReplicationPolicy::default()
    };
    if let Some(s) = r.get("replication.policy.class") {
        match PolicyKind::from_class(&s.value) {
            Some(kind) => policy.kind = kind,
            None => r.diags.error(
                Some(&s.origin),
                Some(&s.value),
                "custom replication policies cannot be loaded by kmirror; use DefaultReplicationPolicy \
                 (remote topics are named <source><separator><topic>, e.g. A.orders) or IdentityReplicationPolicy \
                 (topic names are kept: use it for migrations, never for active-active)",
            ),
        }
    }
    if let Some(s) = r.get("replication.policy.separator") {
        // MM2 takes the separator verbatim (no trimming).
        if s.value.is_empty() {
            r.diags.error(Some(&s.origin), Some(&s.value), "the separator must not be empty (remote topic names could not be traced back to their source)");
        } else {
            policy.separator = s.value.clone();
        }
    }
    policy.internal_separator_enabled =
        r.bool("replication.policy.internal.topic.separator.enabled", true);
    policy
}

/// A setting inserted by kmirror itself (defaults MM2 adds, such as `source.cluster.alias`).
pub fn synthetic(value: &str, origin: &super::diagnostics::Origin) -> Setting {
    Setting {
        value: value.to_string(),
        origin: origin.clone(),
    }
}

/// Refuses flows that would copy a cluster into itself: the same alias on both ends, or a
/// bootstrap address shared by source and target (data would loop forever).
pub fn refuse_loops(flows: &[FlowConfig], diags: &mut Diagnostics) {
    for f in flows.iter().filter(|f| f.replication) {
        if f.id.source == f.id.target {
            diags.error(None, None, format!("flow {}: source and target are the same cluster: its data would be copied forever", f.id));
            continue;
        }
        let shared = shared_addresses(
            &f.clients.source_consumer.bootstrap,
            &f.clients.target_producer.bootstrap,
        );
        if !shared.is_empty() {
            diags.error(
                None,
                None,
                format!("flow {}: source and target share the address {}: replicating a cluster into itself would copy its data forever", f.id, shared.join(", ")),
            );
        }
    }
}

/// Identity flows that form a ring of three or more clusters (A->B->C->A): a topic all of them
/// copy would go round for ever, and loop prevention only knows the cluster a batch was copied
/// from, so it cannot stop that (docs/topologies.md). Warned, not refused: rings whose topic
/// filters do not overlap are fine. Pairs are handled in `config/mm2.rs`.
pub fn warn_identity_rings(flows: &[FlowConfig], diags: &mut Diagnostics) {
    let edges: Vec<(&str, &str)> = flows
        .iter()
        .filter(|f| f.replication && f.policy.kind == crate::policy::PolicyKind::Identity)
        .map(|f| (f.id.source.as_str(), f.id.target.as_str()))
        .collect();
    if let Some(ring) = crate::policy::ring_of_three_or_more(&edges) {
        diags.warning(
            None,
            None,
            format!(
                "flows {} replicate with IdentityReplicationPolicy in a ring: a topic every flow of the ring copies would go round it forever (loop prevention covers pairs A->B, B->A only); keep the flows' topic filters from overlapping round the ring, break the ring, or use DefaultReplicationPolicy (docs/topologies.md)",
                ring.join("->")
            ),
        );
    }
}

/// Flows into one target that name remote topics as their source does
/// (`IdentityReplicationPolicy`): a topic name both sources have would be one remote topic.
/// Warned, not refused (disjoint topic filters are fine); a process serving both refuses the
/// second flow's copy of such a topic at run time (`engine/remote_claims.rs`).
pub fn warn_identity_fan_in(flows: &[FlowConfig], diags: &mut Diagnostics) {
    let identity: Vec<&FlowConfig> = flows
        .iter()
        .filter(|f| f.replication && f.policy.kind == crate::policy::PolicyKind::Identity)
        .collect();
    for (i, f) in identity.iter().enumerate() {
        for g in &identity[i + 1..] {
            if f.id.target == g.id.target && f.id.source != g.id.source {
                diags.warning(
                    None,
                    None,
                    format!(
                        "flows {} and {} both copy into {} with IdentityReplicationPolicy: a topic name both sources have would be one topic on {}; kmirror refuses the second flow's copy of such a topic when one process serves both, and cannot tell when separate processes do: keep their topics filters disjoint, rename one side's copies (kmirror.topics.rename), or use DefaultReplicationPolicy (docs/topologies.md)",
                        f.id, g.id, f.id.target, f.id.target
                    ),
                );
            }
        }
    }
}

/// Addresses present in both lists.
pub fn shared_addresses(
    a: &[kmirror_kafka::BrokerAddress],
    b: &[kmirror_kafka::BrokerAddress],
) -> Vec<String> {
    let a: std::collections::BTreeSet<String> = a.iter().map(|x| x.to_string()).collect();
    b.iter()
        .map(|x| x.to_string())
        .filter(|x| a.contains(x))
        .collect()
}

/// `kmirror.sharing.instance.id`: this process's static identity in the flow's group (KIP-345).
/// Kafka accepts 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`; checked here so a bad
/// value names its key instead of failing at the first JoinGroup.
fn instance_id(r: &mut Reader<'_>) -> Option<String> {
    const KEY: &str = "kmirror.sharing.instance.id";
    let s = r.get(KEY)?;
    let v = s.value.trim();
    if v.is_empty() {
        return None;
    }
    let legal = v.len() <= 249
        && v != "."
        && v != ".."
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !legal {
        r.error(
            KEY,
            "expected 1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-' (Kafka's rule for group.instance.id), different in every process",
        );
        return None;
    }
    Some(v.to_string())
}

/// `kmirror.topics.rename`: `source:remote` pairs, comma-separated. Each side a legal topic name
/// (Kafka: 1 to 249 characters of `[a-zA-Z0-9._-]`, so `:` cannot occur in one), no source and
/// no remote name twice.
fn renames(r: &mut Reader<'_>) -> std::collections::BTreeMap<String, String> {
    const KEY: &str = "kmirror.topics.rename";
    let mut out = std::collections::BTreeMap::new();
    let Some(s) = r.get(KEY) else {
        return out;
    };
    let legal = |t: &str| {
        !t.is_empty()
            && t.len() <= 249
            && t != "."
            && t != ".."
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    let mut remotes = std::collections::BTreeSet::new();
    for item in crate::filter::split_list(&s.value) {
        let problem = match item.split_once(':') {
            Some((from, to)) if legal(from.trim()) && legal(to.trim()) => {
                let (from, to) = (from.trim().to_string(), to.trim().to_string());
                match out.entry(from) {
                    std::collections::btree_map::Entry::Occupied(e) => {
                        Some(format!("'{item}': {} is renamed twice", e.key()))
                    }
                    std::collections::btree_map::Entry::Vacant(_) if remotes.contains(&to) => {
                        Some(format!("'{item}': two topics would be renamed to {to}"))
                    }
                    std::collections::btree_map::Entry::Vacant(e) => {
                        remotes.insert(to.clone());
                        e.insert(to);
                        None
                    }
                }
            }
            _ => Some(format!(
                "'{item}': expected source:remote, two topic names (a-z, A-Z, 0-9, '.', '_', '-'), e.g. orders:orders-from-a"
            )),
        };
        if let Some(p) = problem {
            r.error(KEY, &p);
            return std::collections::BTreeMap::new();
        }
    }
    out
}
