//! MM2 dedicated mode: `connect-mirror-maker.properties` → flows, with MM2's precedence
//! (top-level < cluster < flow) and its client-key copying (mm2-compatibility §1.1).

use super::diagnostics::{ConfigError, Diagnostics, Origin};
use super::flow;
use super::keys::{self, is_client_key, CONNECTOR_KEYS};
use super::model::{
    ClusterInfo, FlowConfig, IgnoredKey, MirrorConfig, Source, TransactionBoundary,
};
use super::properties::Properties;
use super::providers::Environment;
use super::values::{Setting, SettingMap};
use crate::filter::split_list;
use crate::names::{ClusterAlias, FlowId};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Reads a dedicated-mode file. `served` is `--clusters` (empty: all targets).
pub fn load(
    props: &Properties,
    served: &[String],
    env: &dyn Environment,
) -> Result<MirrorConfig, ConfigError> {
    let mut diags = Diagnostics::default();
    let file: Arc<str> = Arc::from(props.source.as_str());
    // Providers are declared at top level and resolve every other value.
    let all = super::front::read(props, None, env, &mut diags).settings;

    let aliases = cluster_aliases(&all, &props.source, &mut diags);

    for s in served {
        if !aliases.iter().any(|a| a.as_str() == s) {
            diags.error(
                None,
                Some(s),
                format!(
                    "--clusters names '{s}', which is not in 'clusters' ({})",
                    join(&aliases)
                ),
            );
        }
    }

    let mut ignored = classify_keys(&all, &aliases, &mut diags);

    // Per-cluster properties and flows.
    let mut flows = Vec::new();
    let mut clusters = Vec::new();
    for a in &aliases {
        let cp = cluster_props(&all, a);
        let bootstrap = cp
            .get("bootstrap.servers")
            .map(|s| super::client::parse_bootstrap(&s.value).0)
            .unwrap_or_default();
        clusters.push(ClusterInfo {
            alias: a.clone(),
            bootstrap,
        });
    }
    // The keys that decide which flows exist are checked here, before any flow is skipped.
    for (k, v) in &all {
        let decides = k == "emit.heartbeats.enabled"
            || (k.contains("->")
                && (k.ends_with(".enabled") && !k.ends_with("offset-syncs.enabled")));
        if decides
            && !matches!(
                v.value.trim().to_ascii_lowercase().as_str(),
                "true" | "false"
            )
        {
            diags.error(Some(&v.origin), Some(&v.value), "expected true or false");
        }
    }
    let top_heartbeats = all.get("emit.heartbeats.enabled");
    for s in &aliases {
        for t in &aliases {
            if s == t {
                continue;
            }
            let id = FlowId::new(s.clone(), t.clone());
            let flow_key = |k: &str| format!("{id}.{k}");
            let enabled = all.get(&flow_key("enabled"));
            let heartbeats = all
                .get(&flow_key("emit.heartbeats.enabled"))
                .or(top_heartbeats);
            let on = |s: Option<&Setting>, default: bool| {
                s.map_or(default, |s| s.value.trim().eq_ignore_ascii_case("true"))
            };
            if !on(enabled, false) && !on(heartbeats, true) {
                continue;
            }
            let p = connector_props(&all, &aliases, &id, &file);
            if let Some(mut f) = flow::build(id, &p, None, &mut diags) {
                unused_here(&f, &p, &mut ignored);
                f.served = served.is_empty() || served.iter().any(|x| x == f.id.target.as_str());
                flows.push(f);
            }
        }
    }
    if !aliases.is_empty() && !diags.has_errors() {
        if flows.is_empty() {
            diags.error(None, None, format!("{}: No source->target replication flows: enable one, e.g. {}->{}.enabled = true", props.source, aliases[0], aliases.get(1).unwrap_or(&aliases[0])));
        } else if flows.iter().all(|f| !f.replication) {
            diags.warning(
                None,
                None,
                format!(
                    "{}: no flow has replication enabled: set e.g. {}->{}.enabled = true",
                    props.source,
                    aliases[0],
                    aliases.get(1).unwrap_or(&aliases[0])
                ),
            );
        }
        if !served.is_empty() && !flows.iter().any(|f| f.served) {
            diags.error(
                None,
                None,
                "No source->target replication flows: --clusters selects no flow target",
            );
        }
    }

    unused_schema_keys(&all, &flows, &mut ignored);
    refuse_identity_both_ways(&flows, &all, &mut diags);
    flow::warn_identity_rings(&flows, &mut diags);
    flow::refuse_loops(&flows, &mut diags);
    flow::warn_identity_fan_in(&flows, &mut diags);
    if diags.has_errors() {
        return Err(ConfigError(diags));
    }
    Ok(MirrorConfig {
        source: Source::Mm2 {
            file: props.source.clone(),
        },
        clusters,
        flows,
        served_targets: (!served.is_empty())
            .then(|| served.iter().map(ClusterAlias::new).collect()),
        ignored,
        diagnostics: diags,
    })
}

/// The `clusters` list: each alias valid and listed once.
fn cluster_aliases(all: &SettingMap, file: &str, diags: &mut Diagnostics) -> Vec<ClusterAlias> {
    match all.get("clusters") {
        None => {
            diags.error(
                None,
                None,
                format!(
                    "{}: 'clusters' is not set: list the cluster aliases, e.g. clusters = A, B",
                    file
                ),
            );
            Vec::new()
        }
        Some(s) => {
            let list = split_list(&s.value);
            let mut seen = BTreeSet::new();
            let mut out = Vec::new();
            for a in list {
                if a.is_empty() || a.contains("->") || a.chars().any(char::is_whitespace) {
                    diags.error(
                        Some(&s.origin),
                        Some(&s.value),
                        format!(
                            "'{a}' is not a valid cluster alias (no spaces, no '->', not empty)"
                        ),
                    );
                } else if !seen.insert(a.clone()) {
                    diags.error(
                        Some(&s.origin),
                        Some(&s.value),
                        format!("cluster alias '{a}' is listed twice"),
                    );
                } else {
                    out.push(ClusterAlias::new(a));
                }
            }
            if out.is_empty() && !diags.has_errors() {
                diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    "no cluster aliases: expected e.g. clusters = A, B",
                );
            }
            out
        }
    }
}

/// Identity names both ways without loop prevention on both flows: refused.
fn refuse_identity_both_ways(flows: &[FlowConfig], all: &SettingMap, diags: &mut Diagnostics) {
    // Identity naming in both directions copies every record back and forth forever
    // (mm2-compatibility §4: the identity policy has no cycle detection), unless both flows leave out
    // what kmirror copied (docs/topologies.md, "Identity names both ways").
    for f in flows
        .iter()
        .filter(|f| f.replication && f.policy.kind == crate::policy::PolicyKind::Identity)
    {
        if flows.iter().any(|g| {
            g.replication
                && g.id.source == f.id.target
                && g.id.target == f.id.source
                && g.policy.kind == crate::policy::PolicyKind::Identity
                && !(f.loop_prevention && g.loop_prevention)
        }) && f.id.source < f.id.target
        {
            diags.error(
                all.get("replication.policy.class").map(|s| &s.origin),
                None,
                format!("flows {} and {}->{} both replicate with IdentityReplicationPolicy: topics would be copied back and forth forever; set kmirror.loop.prevention.enabled = true (for both flows) so each leaves out what kmirror copied from the other, or use DefaultReplicationPolicy (docs/topologies.md)", f.id, f.id.target, f.id.source),
            );
        }
    }
}

fn join(aliases: &[ClusterAlias]) -> String {
    aliases
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// MM2's `clusterProps(alias)`: `<alias>.x` stripped; its client keys copied into
/// `producer.`/`consumer.`/`admin.` unless set; top-level client keys as defaults for all.
pub fn cluster_props(all: &SettingMap, alias: &ClusterAlias) -> SettingMap {
    let prefix = format!("{alias}.");
    let mut props = SettingMap::new();
    for (k, v) in all {
        if let Some(rest) = k.strip_prefix(&prefix) {
            props.insert(rest.to_string(), v.clone());
        }
    }
    let own: Vec<(String, Setting)> = props
        .iter()
        .filter(|(k, _)| is_client_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in own {
        for role in ["producer.", "consumer.", "admin."] {
            props
                .entry(format!("{role}{k}"))
                .or_insert_with(|| v.clone());
        }
    }
    for (k, v) in all.iter().filter(|(k, _)| is_client_key(k)) {
        for role in ["producer.", "consumer.", "admin.", ""] {
            props
                .entry(format!("{role}{k}"))
                .or_insert_with(|| v.clone());
        }
    }
    props
}

/// The connector settings MM2 builds for flow `id` (mm2-compatibility §1.1, steps 1–7).
pub fn connector_props(
    all: &SettingMap,
    aliases: &[ClusterAlias],
    id: &FlowId,
    file: &Arc<str>,
) -> SettingMap {
    let mut p = SettingMap::new();
    // 1–2: top-level connector keys, providers and policy keys.
    for (k, v) in all {
        let connector_key = CONNECTOR_KEYS.contains(&k.as_str())
            || k.starts_with("config.providers")
            || k.starts_with("replication.policy")
            || keys::is_transform_key(k);
        if connector_key && !is_flow_or_cluster_key(k, aliases) {
            p.insert(k.clone(), v.clone());
        }
    }
    // 3–4: source and target cluster properties.
    for (alias, side) in [(&id.source, "source"), (&id.target, "target")] {
        for (k, v) in cluster_props(all, alias) {
            let key =
                if k.starts_with("consumer") || k.starts_with("producer") || k.starts_with("admin")
                {
                    format!("{side}.{k}")
                } else {
                    format!("{side}.cluster.{k}")
                };
            p.insert(key, v);
        }
    }
    // The worker's offset storage (MM2 adds top-level `offset.storage*` keys to the target's worker
    // config): kmirror keeps its source positions there.
    for (k, v) in all.iter().filter(|(k, _)| k.starts_with("offset.storage.")) {
        p.entry(format!("target.cluster.{k}"))
            .or_insert_with(|| v.clone());
    }
    // 5: defaults.
    let o = Origin::new(file, 0, &format!("{id} (default)"));
    p.entry("source.cluster.alias".into())
        .or_insert_with(|| flow::synthetic(id.source.as_str(), &o));
    p.entry("target.cluster.alias".into())
        .or_insert_with(|| flow::synthetic(id.target.as_str(), &o));
    // 6: flow keys override everything.
    let prefix = format!("{id}.");
    for (k, v) in all {
        if let Some(rest) = k.strip_prefix(&prefix) {
            p.insert(rest.to_string(), v.clone());
        }
    }
    p
}

fn is_flow_or_cluster_key(key: &str, aliases: &[ClusterAlias]) -> bool {
    key.contains("->") || aliases.iter().any(|a| key.starts_with(&format!("{a}.")))
}

/// Sorts every key into used or ignored (with the reason), and reports keys that name unknown
/// cluster aliases.
fn classify_keys(
    all: &SettingMap,
    aliases: &[ClusterAlias],
    diags: &mut Diagnostics,
) -> Vec<IgnoredKey> {
    let mut ignored = Vec::new();
    let mut ignore = |s: &Setting, reason: &str, hint: Option<String>| {
        ignored.push(IgnoredKey {
            origin: s.origin.clone(),
            reason: reason.to_string(),
            did_you_mean: hint,
        });
    };
    for (k, s) in all {
        // Longest alias first, so alias "A" does not capture "A2.x".
        let alias_match = aliases
            .iter()
            .filter(|a| k.starts_with(&format!("{a}.")))
            .max_by_key(|a| a.as_str().len());
        if let Some((flow, _)) = k.split_once("->").map(|(src, _)| (src, ())) {
            let rest = &k[flow.len() + 2..];
            let src_ok = aliases.iter().any(|a| a.as_str() == flow);
            let tgt = aliases
                .iter()
                .filter(|a| rest.starts_with(&format!("{a}.")))
                .max_by_key(|a| a.as_str().len());
            match (src_ok, tgt) {
                (true, Some(t)) if t.as_str() == flow => diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    "a flow from a cluster to itself would copy its data forever: source and target must differ",
                ),
                (true, Some(t)) => {
                    let key = &rest[t.as_str().len() + 1..];
                    if let Some(reason) = set_by_dedicated_mode(key) {
                        ignore(s, reason, None);
                    } else if let Some((reason, hint)) = classify_connector_key(key) {
                        ignore(s, &reason, hint.map(|h| format!("{flow}->{t}.{h}")));
                    }
                }
                _ => diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("flow key names an unknown cluster alias: expected <source>-><target>.<key> with aliases from 'clusters' ({})", join(aliases)),
                ),
            }
        } else if let Some(a) = alias_match {
            let key = &k[a.as_str().len() + 1..];
            if let Some((reason, hint)) = classify_cluster_key(key) {
                ignore(s, &reason, hint.map(|h| format!("{a}.{h}")));
            }
        } else if let Some((reason, hint)) = classify_top_key(k) {
            ignore(s, &reason, hint);
        }
    }
    ignored
}

/// Connector keys MM2's dedicated mode sets itself for every connector it builds, whatever the
/// file says (they mean something in connector files).
fn set_by_dedicated_mode(k: &str) -> Option<&'static str> {
    matches!(
        k,
        "name" | "connector.class" | "source.cluster.alias" | "target.cluster.alias"
    )
    .then_some("MM2's dedicated mode sets it for each connector it builds (a flow's aliases come from <source>-><target>); it applies in connector files (kmirror run --connector)")
}

/// Keys a flow reads that its other settings make moot: listed with why, once each.
fn unused_here(f: &FlowConfig, p: &SettingMap, ignored: &mut Vec<IgnoredKey>) {
    let moot = [(
        "transaction.boundary.interval.ms",
        f.transactions.boundary == TransactionBoundary::Poll,
        "used only with transaction.boundary = interval (the flow commits per poll)",
    )];
    for (key, unused, reason) in moot {
        let Some(s) = p.get(key).filter(|_| unused) else {
            continue;
        };
        if !ignored.iter().any(|i| i.origin == s.origin) {
            ignored.push(IgnoredKey {
                origin: s.origin.clone(),
                reason: reason.into(),
                did_you_mean: None,
            });
        }
    }
}

/// Schema keys of flows that sync no schemas: listed with why. A top-level key counts as used
/// when any flow syncs schemas; `kmirror.schemas.enabled` is moot only where the flow's clusters
/// do not both name a registry (false there is a choice, not a slip).
fn unused_schema_keys(all: &SettingMap, flows: &[FlowConfig], ignored: &mut Vec<IgnoredKey>) {
    const KEYS: [&str; 4] = [
        "kmirror.schemas.enabled",
        "kmirror.schemas.ids",
        "kmirror.schemas.subjects",
        "kmirror.schemas.refresh.interval.seconds",
    ];
    let reason = "used only while a flow syncs schemas: both of its clusters name a schema registry (<alias>.schema.registry.url) and kmirror.schemas.enabled is not false";
    let replicating = || flows.iter().filter(|f| f.replication);
    let registries = |f: &FlowConfig| {
        [&f.id.source, &f.id.target]
            .iter()
            .all(|a| all.contains_key(&format!("{a}.schema.registry.url")))
    };
    let used_by = |f: &FlowConfig, key: &str| {
        if key == KEYS[0] {
            registries(f)
        } else {
            f.schemas.is_some()
        }
    };
    // A cluster's registry keys act only through a flow that has a registry on both ends (and
    // one switched off with kmirror.schemas.enabled = false is a choice, not a slip).
    let registry_used = |alias: &str| {
        replicating().any(|f| {
            registries(f) && (f.id.source.as_str() == alias || f.id.target.as_str() == alias)
        })
    };
    for (k, s) in all {
        if k.contains("->") {
            continue;
        }
        let Some((alias, key)) = k.split_once('.') else {
            continue;
        };
        let is_cluster = flows
            .iter()
            .any(|f| f.id.source.as_str() == alias || f.id.target.as_str() == alias);
        if is_cluster
            && super::schemas::is_registry_key(key)
            && !registry_used(alias)
            && !ignored.iter().any(|i| i.origin == s.origin)
        {
            ignored.push(IgnoredKey {
                origin: s.origin.clone(),
                reason: format!("no flow syncs schemas with cluster {alias}: a replicating flow needs a registry on both of its clusters"),
                did_you_mean: None,
            });
        }
    }
    for (k, s) in all {
        let (flow, key) = match k.split_once("->").and_then(|_| k.split_once(".kmirror.")) {
            Some((flow, rest)) => (Some(flow), format!("kmirror.{rest}")),
            None => (None, k.clone()),
        };
        if !KEYS.contains(&key.as_str()) {
            continue;
        }
        let used = match flow {
            Some(id) => replicating().any(|f| f.id.to_string() == id && used_by(f, &key)),
            None => replicating().any(|f| used_by(f, &key)),
        };
        if !used && !ignored.iter().any(|i| i.origin == s.origin) {
            ignored.push(IgnoredKey {
                origin: s.origin.clone(),
                reason: reason.into(),
                did_you_mean: None,
            });
        }
    }
}

/// Worker offset-storage keys that kmirror honours for its position topic.
const POSITION_KEYS: &[&str] = &[
    "offset.storage.topic",
    "offset.storage.partitions",
    "offset.storage.replication.factor",
];

type Classified = Option<(String, Option<String>)>;

fn classify_top_key(k: &str) -> Classified {
    if let Some(c) = keys::classify_security_key(k) {
        return c;
    }
    if let Some(r) = set_by_dedicated_mode(k) {
        return Some((r.into(), None));
    }
    if k == "tasks.max" {
        return tasks_max();
    }
    if k == "clusters"
        || k.starts_with("config.providers")
        || keys::is_transform_key(k)
        || CONNECTOR_KEYS.contains(&k)
        || POSITION_KEYS.contains(&k)
    {
        return None;
    }
    if let Some(r) = keys::ignored_connector_key(k).or_else(|| keys::ignored_worker_key(k)) {
        return Some((r.to_string(), None));
    }
    if ["consumer.", "producer.", "admin."]
        .iter()
        .any(|p| k.starts_with(p))
    {
        return Some((
            "MM2 ignores top-level consumer./producer./admin. keys in dedicated mode (mm2-compatibility §10); write <alias>.consumer.<key> or <source>-><target>.consumer.<key>".into(),
            None,
        ));
    }
    unknown(
        k,
        CONNECTOR_KEYS.iter().copied().chain([
            "clusters",
            "bootstrap.servers",
            "security.protocol",
        ]),
    )
}

fn classify_cluster_key(k: &str) -> Classified {
    if let Some(c) = keys::classify_security_key(k) {
        return c;
    }
    if super::schemas::is_registry_key(k) {
        return None;
    }
    // group.id names the exactly-once transactional ids, as the worker's group.id does in MM2.
    if k == "client.id"
        || k == "exactly.once.source.support"
        || k == "group.id"
        || POSITION_KEYS.contains(&k)
    {
        return None;
    }
    for (prefix, honoured) in [
        ("consumer.", keys::CONSUMER_KEYS),
        ("producer.", keys::PRODUCER_KEYS),
        ("admin.", keys::ADMIN_KEYS),
    ] {
        if let Some(rest) = k.strip_prefix(prefix) {
            return classify_client_key(rest, honoured)
                .map(|(r, h)| (r, h.map(|h| format!("{prefix}{h}"))));
        }
    }
    if let Some(r) = keys::ignored_worker_key(k) {
        return Some((r.to_string(), None));
    }
    if keys::CONSUMER_KEYS.contains(&k) {
        return Some((
            "not a client key, so MM2 does not pass it to the consumer".into(),
            Some(format!("consumer.{k}")),
        ));
    }
    if keys::PRODUCER_KEYS.contains(&k) {
        return Some((
            "not a client key, so MM2 does not pass it to the producer".into(),
            Some(format!("producer.{k}")),
        ));
    }
    unknown(
        k,
        [
            "bootstrap.servers",
            "security.protocol",
            "sasl.mechanism",
            "sasl.jaas.config",
            "client.id",
        ],
    )
}

/// A key of the data producer's settings (a Connect worker's `producer.*`).
pub fn classify_producer_key(k: &str) -> Classified {
    classify_client_key(k, keys::PRODUCER_KEYS)
}

fn classify_client_key(k: &str, honoured: &[&str]) -> Classified {
    if let Some(c) = keys::classify_security_key(k) {
        return c;
    }
    if let Some(r) = keys::unused_in_mm2_mode(k) {
        return Some((r.to_string(), None));
    }
    if honoured.contains(&k) {
        return None;
    }
    if let Some(r) = keys::ignored_client_key(k) {
        return Some((r.to_string(), None));
    }
    unknown(
        k,
        honoured.iter().copied().chain([
            "bootstrap.servers",
            "security.protocol",
            "sasl.mechanism",
            "sasl.jaas.config",
        ]),
    )
}

/// Keys inside a flow (`A->B.<key>`) or a connector file.
/// `tasks.max` reaches the flow (exactly-once's slot count) but is listed as ignored with
/// why: most MM2 files set it, and at-least-once does not use it.
fn tasks_max() -> Classified {
    keys::ignored_connector_key("tasks.max").map(|r| (r.to_string(), None))
}

pub fn classify_connector_key(k: &str) -> Classified {
    if k == "tasks.max" {
        return tasks_max();
    }
    // transforms.<alias>.* / predicates.<alias>.*: checked key by key by config::transforms::parse.
    if CONNECTOR_KEYS.contains(&k) || k.starts_with("config.providers") || keys::is_transform_key(k)
    {
        return None;
    }
    if let Some(r) = keys::ignored_connector_key(k) {
        return Some((r.to_string(), None));
    }
    for side in ["source.cluster.", "target.cluster."] {
        if let Some(rest) = k.strip_prefix(side) {
            if rest == "exactly.once.source.support"
                || rest == "client.id"
                || super::schemas::is_registry_key(rest)
            {
                return None;
            }
            if let Some(c) = keys::classify_security_key(rest) {
                return c.map(|(r, h)| (r, h.map(|h| format!("{side}{h}"))));
            }
            return Some((
                format!("MM2 takes only bootstrap/security/SSL/SASL keys from {side}*"),
                None,
            ));
        }
    }
    for (prefix, honoured) in [
        ("source.consumer.", keys::CONSUMER_KEYS),
        ("consumer.", keys::CONSUMER_KEYS),
        ("target.producer.", keys::PRODUCER_KEYS),
        ("producer.override.", keys::PRODUCER_KEYS),
        ("producer.", keys::PRODUCER_KEYS),
        ("source.producer.", keys::PRODUCER_KEYS),
        ("source.admin.", keys::ADMIN_KEYS),
        ("target.admin.", keys::ADMIN_KEYS),
        ("admin.", keys::ADMIN_KEYS),
    ] {
        if let Some(rest) = k.strip_prefix(prefix) {
            return classify_client_key(rest, honoured)
                .map(|(r, h)| (r, h.map(|h| format!("{prefix}{h}"))));
        }
    }
    for prefix in ["target.consumer.", "consumer.override.", "admin.override."] {
        if k.starts_with(prefix) {
            return Some(("kmirror has no client in this role".into(), None));
        }
    }
    unknown(k, CONNECTOR_KEYS.iter().copied())
}

fn unknown<'a>(k: &str, candidates: impl IntoIterator<Item = &'a str>) -> Classified {
    Some((
        "unknown key: neither kmirror nor MM2 uses it".into(),
        keys::did_you_mean(k, candidates),
    ))
}
