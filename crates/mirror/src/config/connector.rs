//! MM2 connector files, as run with connect-standalone (`name`, `connector.class`,
//! `source.cluster.*`, `target.cluster.*`, ...), plus an optional worker file.
//!
//! One file is one connector. Files naming the same source and target aliases form one flow: a
//! MirrorSourceConnector replicates data, a MirrorCheckpointConnector emits checkpoints (and syncs
//! group offsets), a MirrorHeartbeatConnector emits heartbeats. The Connect worker's producer
//! writes the data, so the worker's `producer.*` settings apply to it, and its bootstrap must be
//! the target cluster.

use super::diagnostics::{ConfigError, Diagnostics, Origin};
use super::flow;
use super::keys::{self, is_client_key};
use super::mm2::classify_connector_key;
use super::model::{ClusterInfo, IgnoredKey, MirrorConfig, Source};
use super::properties::Properties;
use super::providers::Environment;
use super::values::SettingMap;
use crate::names::{ClusterAlias, FlowId};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectorKind {
    Source,
    Checkpoint,
    Heartbeat,
}

pub fn load(
    connectors: &[Properties],
    worker: Option<&Properties>,
    env: &dyn Environment,
) -> Result<MirrorConfig, ConfigError> {
    let mut diags = Diagnostics::default();
    let mut ignored = Vec::new();

    // Config providers are a worker setting; a connector file may declare its own too.
    let worker_read = worker.map(|w| super::front::read(w, None, env, &mut diags));
    let worker_map = worker_read
        .as_ref()
        .map(|w| w.settings.clone())
        .unwrap_or_default();
    let worker_providers = worker_read.map(|w| w.providers);

    let mut flows: BTreeMap<FlowId, (SettingMap, Vec<ConnectorKind>)> = BTreeMap::new();
    for props in connectors {
        let file: Arc<str> = Arc::from(props.source.as_str());
        let map = super::front::read(props, worker_providers.as_ref(), env, &mut diags).settings;
        let kind = match map.get("connector.class") {
            None => {
                diags.error(None, None, format!("{}: connector.class is not set: expected MirrorSourceConnector, MirrorCheckpointConnector or MirrorHeartbeatConnector", props.source));
                continue;
            }
            Some(s) => match s.value.trim().rsplit('.').next().unwrap_or("") {
                "MirrorSourceConnector" => ConnectorKind::Source,
                "MirrorCheckpointConnector" => ConnectorKind::Checkpoint,
                "MirrorHeartbeatConnector" => ConnectorKind::Heartbeat,
                _ => {
                    diags.error(Some(&s.origin), Some(&s.value), "not a MirrorMaker 2 connector: expected MirrorSourceConnector, MirrorCheckpointConnector or MirrorHeartbeatConnector");
                    continue;
                }
            },
        };
        let Some(source) = map
            .get("source.cluster.alias")
            .map(|s| s.value.trim().to_string())
            .filter(|s| !s.is_empty())
        else {
            diags.error(
                None,
                None,
                format!(
                    "{}: source.cluster.alias is not set (MM2 requires it)",
                    props.source
                ),
            );
            continue;
        };
        // MM2's default target alias.
        let target = map
            .get("target.cluster.alias")
            .map(|s| s.value.trim().to_string())
            .unwrap_or_else(|| "target".into());
        for p in props.iter() {
            if let Some((reason, hint)) = classify_connector_key(&p.key) {
                ignored.push(IgnoredKey {
                    origin: Origin::new(&file, p.line, &p.key),
                    reason,
                    did_you_mean: hint,
                });
            }
        }
        let id = FlowId::new(ClusterAlias::new(source), ClusterAlias::new(target));
        let entry = flows.entry(id).or_default();
        if kind == ConnectorKind::Source {
            if let Some(name) = map.get("name") {
                entry
                    .0
                    .insert(flow::SOURCE_CONNECTOR_NAME.into(), name.clone());
            }
        }
        for (k, v) in map {
            if let Some(prev) = entry.0.get(&k) {
                if prev.value != v.value && k != "name" && k != "connector.class" {
                    diags.warning(
                        Some(&v.origin),
                        None,
                        format!(
                            "also set to a different value in {}; this file's value is used",
                            prev.origin.file
                        ),
                    );
                }
            }
            entry.0.insert(k, v);
        }
        entry.1.push(kind);
    }

    // The worker's producer writes the data.
    let mut worker_producer = SettingMap::new();
    if let Some(w) = worker {
        let file: Arc<str> = Arc::from(w.source.as_str());
        for (k, v) in &worker_map {
            if is_client_key(k) {
                worker_producer.insert(k.clone(), v.clone());
            } else if let Some(rest) = k.strip_prefix("producer.") {
                if let Some((reason, hint)) = super::mm2::classify_producer_key(rest) {
                    ignored.push(IgnoredKey {
                        origin: v.origin.clone(),
                        reason,
                        did_you_mean: hint.map(|h| format!("producer.{h}")),
                    });
                }
                worker_producer.insert(rest.to_string(), v.clone());
            } else if k == "exactly.once.source.support"
                || k == "group.id"
                || k.starts_with("config.providers")
            {
            } else if let Some(reason) = keys::ignored_worker_key(k) {
                ignored.push(IgnoredKey {
                    origin: v.origin.clone(),
                    reason: reason.into(),
                    did_you_mean: None,
                });
            } else if let Some(reason) = keys::ignored_connector_key(k) {
                ignored.push(IgnoredKey {
                    origin: v.origin.clone(),
                    reason: reason.into(),
                    did_you_mean: None,
                });
            } else {
                ignored.push(IgnoredKey {
                    origin: Origin::new(&file, v.origin.line, k),
                    reason: "not used by kmirror".into(),
                    did_you_mean: None,
                });
            }
        }
    }

    let mut out = Vec::new();
    let mut clusters: BTreeMap<ClusterAlias, ClusterInfo> = BTreeMap::new();
    for (id, (mut map, kinds)) in flows {
        let file = map
            .values()
            .next()
            .map(|s| s.origin.file.clone())
            .unwrap_or_else(|| Arc::from(""));
        let o = Origin::new(&file, 0, &format!("{id} (connector files)"));
        let set = |m: &mut SettingMap, k: &str, v: &str| {
            m.insert(k.into(), flow::synthetic(v, &o));
        };
        // A connector's `enabled` defaults to true in connector mode (mm2-compatibility §1.2).
        let has = |k: ConnectorKind| kinds.contains(&k);
        let enabled = match map.get("enabled") {
            None => true,
            Some(s) => match s.value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    diags.error(Some(&s.origin), Some(&s.value), "expected true or false");
                    false
                }
            },
        };
        set(
            &mut map,
            "enabled",
            if has(ConnectorKind::Source) && enabled {
                "true"
            } else {
                "false"
            },
        );
        if !has(ConnectorKind::Checkpoint) {
            set(&mut map, "emit.checkpoints.enabled", "false");
            set(&mut map, "sync.group.offsets.enabled", "false");
        }
        if !has(ConnectorKind::Heartbeat) {
            set(&mut map, "emit.heartbeats.enabled", "false");
        }
        if let Some(s) = worker_map.get("exactly.once.source.support") {
            map.insert(
                "target.cluster.exactly.once.source.support".into(),
                s.clone(),
            );
        }
        // Connect names a task's transactional id after the worker's group.id.
        if let Some(s) = worker_map.get("group.id") {
            map.insert("target.cluster.group.id".into(), s.clone());
        }
        if let (Some(wb), Some(tb)) = (
            worker_producer.get("bootstrap.servers"),
            map.get("target.cluster.bootstrap.servers"),
        ) {
            let norm = |s: &str| {
                let mut v: Vec<String> = super::client::parse_bootstrap(s)
                    .0
                    .iter()
                    .map(|b| b.to_string())
                    .collect();
                v.sort();
                v
            };
            if norm(&wb.value) != norm(&tb.value) {
                diags.error(
                    Some(&wb.origin),
                    Some(&wb.value),
                    format!("the Connect worker writes replicated data to its own cluster, but target.cluster.bootstrap.servers is {} ({}): they must name the same cluster", tb.value, tb.origin),
                );
            }
        }
        let extra = (!worker_producer.is_empty()).then_some(&worker_producer);
        if let Some(f) = flow::build(id, &map, extra, &mut diags) {
            for (alias, c) in [
                (&f.id.source, &f.clients.source_admin),
                (&f.id.target, &f.clients.target_admin),
            ] {
                clusters
                    .entry(alias.clone())
                    .or_insert_with(|| ClusterInfo {
                        alias: alias.clone(),
                        bootstrap: c.bootstrap.clone(),
                    });
            }
            out.push(f);
        }
    }
    if connectors.is_empty() {
        diags.error(None, None, "no connector file given");
    }
    flow::refuse_loops(&out, &mut diags);
    flow::warn_identity_fan_in(&out, &mut diags);
    if diags.has_errors() {
        return Err(ConfigError(diags));
    }
    Ok(MirrorConfig {
        source: Source::Connectors {
            files: connectors.iter().map(|c| c.source.clone()).collect(),
            worker: worker.map(|w| w.source.clone()),
        },
        clusters: clusters.into_values().collect(),
        flows: out,
        served_targets: None,
        ignored,
        diagnostics: diags,
    })
}
