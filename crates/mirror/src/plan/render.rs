//! The plan as text, as `kmirror plan` prints it: the clusters, then each flow's topics, naming,
//! start position, reads, internal topics and settings.

use crate::config::model::{ExactlyOnce, Periodic, Source, StartPosition};
use crate::plan::*;
use serde::Serialize;
use std::fmt::Write;

impl Plan {
    /// The human-readable plan.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let what = match &self.source {
            Source::Mm2 { file } => format!("{file} (MirrorMaker 2 dedicated mode)"),
            Source::Connectors { files, worker } => format!(
                "{} (MirrorMaker 2 connectors{})",
                files.join(", "),
                worker
                    .as_ref()
                    .map(|w| format!(", worker {w}"))
                    .unwrap_or_default()
            ),
        };
        let _ = writeln!(o, "kmirror plan for {what}");
        if let Some(t) = &self.served_targets {
            let _ = writeln!(
                o,
                "--clusters {}: this process serves flows into {}",
                t.join(" "),
                t.join(", ")
            );
        }
        let _ = writeln!(o, "\nClusters");
        let w = self
            .clusters
            .iter()
            .map(|c| c.alias.len())
            .max()
            .unwrap_or(0);
        for c in &self.clusters {
            let _ = writeln!(
                o,
                "  {:w$}  {}  {}",
                c.alias,
                c.bootstrap.join(","),
                c.security
            );
        }
        for pf in &self.flows {
            render_flow(&mut o, pf);
        }
        if !self.ignored.is_empty() {
            let _ = writeln!(o, "\nIgnored keys ({})", self.ignored.len());
            for i in &self.ignored {
                let hint = i
                    .did_you_mean
                    .as_ref()
                    .map(|h| format!(" (did you mean '{h}'?)"))
                    .unwrap_or_default();
                let _ = writeln!(o, "  {}: {}{hint}", i.origin, i.reason);
            }
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(o, "\nWarnings ({})", self.warnings.len());
            for w in &self.warnings {
                let _ = writeln!(o, "  {w}");
            }
        }
        o
    }
}

/// One flow's part of the plan.
pub(crate) fn render_flow(o: &mut String, pf: &PlanFlow) {
    let f = &pf.config;
    let served = if pf.served {
        "served by this process"
    } else {
        "NOT served (target not in --clusters)"
    };
    let _ = writeln!(o, "\nFlow {}  [{}]  {}", pf.flow, pf.mode, served);
    if f.replication {
        let _ = writeln!(
            o,
            "  topics         include {}  exclude {}",
            f.topics.include.items().join(", "),
            f.topics.exclude.items().join(", ")
        );
        let _ = writeln!(
            o,
            "  groups         include {}  exclude {}",
            f.groups.include.items().join(", "),
            f.groups.exclude.items().join(", ")
        );
        let _ = writeln!(o, "  naming         {}", pf.naming);
        let rf = if f.replication_factor == -1 {
            "broker default".to_string()
        } else {
            f.replication_factor.to_string()
        };
        let _ = writeln!(o, "  remote topics  created on {} before any data, replication factor {rf}, source partition count", f.id.target);
        let _ = writeln!(
            o,
            "  start          {} when no position is stored",
            match f.start {
                StartPosition::Earliest => "earliest offset".to_string(),
                StartPosition::Latest =>
                    "latest offset (only records written from then on)".to_string(),
                StartPosition::Timestamp(ms) => format!(
                    "first record at or after {} ({ms} ms; the log end if none)",
                    rfc3339(ms)
                ),
                StartPosition::Fail => "fail (auto.offset.reset = none)".to_string(),
            }
        );
        let _ = writeln!(
            o,
            "  reads          {:?}, {}",
            f.clients.consumer_tuning.isolation_level,
            crc_check(f.clients.consumer_tuning.check_crcs)
        );
    }
    let _ = writeln!(o, "  internal topics");
    for t in &pf.internal_topics {
        let _ = writeln!(
            o,
            "    {:40} on {}  ({} partition{}, RF {})  {}",
            t.topic,
            t.cluster,
            t.partitions,
            if t.partitions == 1 { "" } else { "s" },
            t.replication_factor,
            t.purpose
        );
    }
    let _ = writeln!(o, "  periodic work");
    let every = |p: &Periodic| {
        if p.enabled {
            format!("every {} s", p.interval.as_secs())
        } else {
            "off".into()
        }
    };
    let mut rows = vec![("heartbeats", every(&f.emit_heartbeats))];
    if f.replication {
        rows.extend([
            ("refresh topics", every(&f.refresh_topics)),
            ("topic configs", every(&f.sync_topic_configs)),
            ("topic ACLs", every(&f.sync_topic_acls)),
            ("refresh groups", every(&f.refresh_groups)),
            ("checkpoints", every(&f.emit_checkpoints)),
            ("group offsets", every(&f.sync_group_offsets)),
        ]);
    }
    for (name, v) in rows {
        let _ = writeln!(o, "    {name:15} {v}");
    }
    if f.replication {
        let t = &f.transactions;
        let eos = match (f.exactly_once, t.support) {
                (ExactlyOnce::Disabled, "preparing") => {
                    "off: exactly.once.source.support = preparing (at-least-once, no loss; kmirror needs no preparing step, set enabled)"
                }
                (ExactlyOnce::Disabled, _) => "off (at-least-once, no loss)",
                (ExactlyOnce::Requested | ExactlyOnce::Required, _) => {
                    "on: data and positions committed together in transactions (read_committed readers see each record once; one process serves the flow)"
                }
            };
        if !f.transforms.is_empty() {
            let _ = writeln!(o, "  transforms     (every batch decoded and re-encoded)");
            for t in f.transforms.describe() {
                let _ = writeln!(o, "    {t}");
            }
        }
        let _ = writeln!(o, "  exactly-once   {eos}");
        if f.exactly_once != ExactlyOnce::Disabled {
            // What the exactly-once engine will use (docs/engine.md,
            // "Exactly-once"): shown now so ids and ACLs can be prepared.
            let _ = writeln!(
                o,
                "    slots        {} ({}), transactional ids {}",
                t.slots,
                if t.slots_from_tasks_max {
                    "tasks.max"
                } else {
                    "default; set tasks.max to change"
                },
                t.id_range()
            );
            let _ = writeln!(
                o,
                "    commits      every {} ms ({}) or at {} bytes; transaction.timeout.ms {}",
                t.interval.as_millis(),
                match t.boundary {
                    crate::config::model::TransactionBoundary::Poll => {
                        "transaction.boundary = poll"
                    }
                    crate::config::model::TransactionBoundary::Interval => {
                        "transaction.boundary.interval.ms"
                    }
                },
                t.max_bytes,
                t.timeout.as_millis()
            );
            let _ = writeln!(
                    o,
                    "    ACLs on {}    TransactionalId prefix {}: WRITE, DESCRIBE (docs/permissions.md)",
                    f.id.target, t.transactional_id_prefix
                );
        }
        let _ = writeln!(
            o,
            "  sharing        {}",
            if f.sharing.enabled {
                let share = if f.exactly_once != ExactlyOnce::Disabled {
                    format!(
                        "a share of the {} exactly-once slots (each with its partitions)",
                        f.transactions.slots
                    )
                } else {
                    "a share of the partitions".to_string()
                };
                let member = match &f.sharing.instance_id {
                        Some(id) => format!(", this process as static member {id}: restarted under it within the session timeout, it gets its share back without a rebalance"),
                        None => String::new(),
                    };
                format!(
                        "group {} on {} (session timeout {} s{member}): every process started with this configuration serves {share}; the group's leader also does the periodic work",
                        f.sharing.group_id,
                        f.id.target,
                        f.sharing.session_timeout.as_secs()
                    )
            } else if f.exactly_once != ExactlyOnce::Disabled {
                "off: this process holds every exactly-once slot (a second process started with this configuration fences the first, which stops)".into()
            } else {
                "off: this process serves every partition (start only one per flow)".into()
            }
        );
        render_schemas(o, f);
        render_keys_set(o, f);
        let _ = writeln!(o, "  clients");
        let _ = writeln!(
            o,
            "    source consumer  {}",
            describe_security(&f.clients.source_consumer)
        );
        // Tuning by the keys that set it, with the values in effect (the producer's
        // batching keys are not among them: listed as ignored below when set).
        let c = &f.clients.consumer_tuning;
        let _ = writeln!(
                o,
                "      fetch.max.bytes {}, max.partition.fetch.bytes {}, fetch.min.bytes {}, fetch.max.wait.ms {}, isolation.level {}, auto.offset.reset {}",
                c.fetch_max_bytes,
                c.max_partition_fetch_bytes,
                c.fetch_min_bytes,
                c.fetch_max_wait.as_millis(),
                as_written(&c.isolation_level),
                as_written(&c.auto_offset_reset)
            );
        let p = &f.clients.producer_tuning;
        let _ = writeln!(
            o,
            "    target producer  {}",
            describe_security(&f.clients.target_producer)
        );
        let _ = writeln!(
                o,
                "      compression.type {} (for re-encoded batches), acks {}, max.request.size {}, buffer.memory {}, request.timeout.ms {}",
                as_written(&p.compression),
                match p.acks {
                    kmirror_kafka::Acks::All => "all",
                    kmirror_kafka::Acks::Leader => "1",
                    kmirror_kafka::Acks::None => "0",
                },
                p.max_request_size,
                p.buffer_memory,
                f.clients.target_producer.request_timeout.as_millis()
            );
    }
}

/// Every connector key the configuration sets for the flow, by its key, with its value in
/// effect (what the lines above describe in words, and the tuning they do not show, such as
/// `admin.timeout.ms` or `offset.lag.max`).
fn render_keys_set(o: &mut String, f: &crate::config::model::FlowConfig) {
    if f.keys_set.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  keys set       (for this flow, or at the top of the file)"
    );
    for (k, v) in &f.keys_set {
        let _ = writeln!(o, "    {k} = {v}");
    }
}

/// The flow's schema sync (docs/schemas.md): registries, subjects, ids and the wait for schemas.
fn render_schemas(o: &mut String, f: &crate::config::model::FlowConfig) {
    use crate::config::model::{IdsMode, RegistryAt, SchemaSync};
    let Some(s) = &f.schemas else {
        let _ = writeln!(
            o,
            "  schemas        off (set {}.schema.registry.url and {}.schema.registry.url to copy subjects and schema ids)",
            f.id.source, f.id.target
        );
        return;
    };
    let show = |r: &RegistryAt| {
        let auth = match r.0.auth {
            kmirror_registry::Auth::None => "",
            kmirror_registry::Auth::Basic { .. } => ", basic auth",
            kmirror_registry::Auth::Bearer(_) => ", bearer token",
        };
        let tls = match &r.0.tls {
            Some(t) => format!(" (TLS {})", super::describe_tls(t)),
            None => String::new(),
        };
        format!("{}{auth}{tls}", kmirror_kafka::secret::redact_url(&r.0.url))
    };
    let _ = writeln!(
        o,
        "  schemas        from {} to {}, every {} s",
        show(&s.source),
        show(&s.target),
        s.refresh.as_secs()
    );
    let extra = if s.subjects.items().is_empty() {
        String::new()
    } else {
        format!(", and subjects matching {}", s.subjects.items().join(", "))
    };
    let _ = writeln!(
        o,
        "    subjects     <topic>-key and <topic>-value of the replicated topics, named on the target as their topics are{extra}; every version in order, soft-deleted ones too; {} is not replicated",
        SchemaSync::REGISTRY_TOPIC
    );
    let ids = match s.ids {
        IdsMode::Keep => "keep: registered under the source's ids (IMPORT mode), checked before any record is written; a target that assigns its own ids stops the flow (set kmirror.schemas.ids = translate)",
        IdsMode::Translate => "translate: the target assigns its own ids, and the id in every record key and value in the Confluent wire format is rewritten to it",
    };
    let _ = writeln!(o, "    ids          {ids}");
    let _ = writeln!(
        o,
        "    records      a partition waits until the schemas its records name are on the target; nothing is written with an id the target lacks"
    );
}

/// How `plan` describes `check.crcs`: turning it off is a risk the operator should see.
pub(crate) fn crc_check(on: bool) -> &'static str {
    if on {
        "CRC-32C of every batch checked"
    } else {
        "CRC-32C NOT checked (check.crcs=false: a corrupt source batch is copied under a fresh checksum)"
    }
}

/// Epoch milliseconds as an RFC 3339 time in UTC.
pub(crate) fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// A setting's value as a properties file writes it (`read_committed`, `lz4`), from its
/// serialized name.
pub(crate) fn as_written<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
