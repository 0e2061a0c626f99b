//! `kmirror plan`: what a configuration means, explained before anything connects. Pure: it
//! renders a validated [`MirrorConfig`] as text or as JSON.

use crate::config::diagnostics::Diagnostic;
use crate::config::model::{
    ExactlyOnce, FlowConfig, IgnoredKey, MirrorConfig, Periodic, Side, Source, StartPosition,
};
use crate::policy::PolicyKind;
use crate::wire::producers::PRODUCERS_TOPIC;
use kmirror_kafka::{ClientSettings, TrustMaterial};
use serde::Serialize;
use std::fmt::Write;

/// The plan as data (`--format json`).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub source: Source,
    pub served_targets: Option<Vec<String>>,
    pub clusters: Vec<PlanCluster>,
    pub flows: Vec<PlanFlow>,
    pub ignored: Vec<IgnoredKey>,
    pub warnings: Vec<Diagnostic>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanCluster {
    pub alias: String,
    pub bootstrap: Vec<String>,
    pub security: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InternalTopic {
    pub topic: String,
    pub cluster: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub purpose: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanFlow {
    pub flow: String,
    pub mode: &'static str,
    pub served: bool,
    pub naming: String,
    pub internal_topics: Vec<InternalTopic>,
    pub config: FlowConfig,
}

/// Describes a cluster's security in one line; secrets masked.
pub fn describe_security(c: &ClientSettings) -> String {
    let mut s = c.security_protocol.as_str().to_string();
    match c.sasl.as_ref().map(|s| (s, s.oauth.as_ref())) {
        Some((sasl, None)) if sasl.aws.is_some() => {
            if let Some(aws) = &sasl.aws {
                let _ = write!(
                    s,
                    " AWS_MSK_IAM SigV4 credentials from {}",
                    aws_credentials(aws)
                );
            }
        }
        Some((sasl, None)) if sasl.kerberos.is_some() => {
            if let Some(k) = &sasl.kerberos {
                let _ = write!(
                    s,
                    " GSSAPI principal={} keytab={} brokers={}/<host>@{} krb5.conf={}, tickets renewed from the keytab at 80 % of their life",
                    k.principal,
                    k.keytab.display(),
                    k.service_name,
                    kmirror_kafka::kerberos::realm_of(&k.principal),
                    k.krb5_conf.display()
                );
            }
        }
        Some((sasl, None)) => {
            let _ = write!(
                s,
                " {} user={} password={}",
                sasl.mechanism.as_str(),
                sasl.username,
                sasl.password
            );
        }
        Some((_, Some(o))) => {
            use kmirror_kafka::settings::TokenSource;
            let r = &o.refresh;
            let refresh = format!(
                "renewed at {}-{} % of its lifetime (min period {} s, buffer {} s)",
                r.window_factor_permille / 10,
                (r.window_factor_permille + r.window_jitter_permille) / 10,
                r.min_period.as_secs(),
                r.buffer.as_secs()
            );
            match &o.source {
                TokenSource::Unsecured {
                    principal,
                    lifetime_secs,
                    ..
                } => {
                    let _ = write!(s, " OAUTHBEARER unsecured JWS (test setups only) principal={principal} lifetime={lifetime_secs}s, {refresh}");
                }
                TokenSource::AwsMskIam { aws } => {
                    let _ = write!(
                        s,
                        " OAUTHBEARER Amazon MSK IAM token, credentials from {}, {refresh}",
                        aws_credentials(aws)
                    );
                }
                TokenSource::ClientCredentials(cc) => {
                    let _ = write!(
                        s,
                        " OAUTHBEARER OIDC client credentials at {} client={} secret={} scope={}, {refresh}",
                        kmirror_kafka::oauth::redact(&cc.endpoint),
                        cc.client_id,
                        cc.client_secret,
                        cc.scope.as_deref().unwrap_or("(none)")
                    );
                    let _ = write!(
                        s,
                        "; token endpoint timeouts connect {} ms, read {} ms",
                        cc.connect_timeout.as_millis(),
                        cc.read_timeout.as_millis()
                    );
                    if cc.endpoint.starts_with("https:") {
                        let tls = cc
                            .tls
                            .as_ref()
                            .map_or("trust=system roots".into(), describe_tls);
                        let _ = write!(s, ", TLS {tls}");
                    }
                }
            }
            if !o.extensions.is_empty() {
                let names: Vec<&str> = o.extensions.iter().map(|(k, _)| k.as_str()).collect();
                let _ = write!(s, " extensions={}", names.join(","));
            }
        }
        None => {}
    }
    if let Some(tls) = &c.tls {
        let _ = write!(s, " {}", describe_tls(tls));
    }
    s
}

/// TLS trust and identity in a few words; secrets are never part of it.
fn describe_tls(tls: &kmirror_kafka::settings::TlsSettings) -> String {
    let mut s = match &tls.trust {
        TrustMaterial::SystemRoots => "trust=system roots".to_string(),
        TrustMaterial::PemFile { path } => format!("trust=CA {}", path.display()),
        TrustMaterial::PemInline { .. } => "trust=inline CA".to_string(),
        TrustMaterial::Pkcs12File { path, .. } => format!("trust=truststore {}", path.display()),
    };
    if tls.identity.is_some() {
        s.push_str(" client-cert=yes");
    }
    if !tls.verify_hostname {
        s.push_str(" hostname-verification=OFF");
    }
    s
}

/// Where MSK IAM credentials come from, and the role they assume.
fn aws_credentials(aws: &kmirror_kafka::settings::AwsIam) -> String {
    let mut s = match aws.profile.as_deref() {
        Some(p) => format!("profile '{p}' (awsProfileName)"),
        None => "the default chain (environment, web identity, shared files' profile, container, instance metadata)".into(),
    };
    if let Some(r) = &aws.role {
        let _ = write!(
            s,
            ", assuming role {} (session {}, STS {})",
            r.arn,
            r.session_name,
            r.sts_region.as_deref().unwrap_or("us-east-1")
        );
    }
    s
}

fn naming(f: &FlowConfig) -> String {
    let example = "orders";
    let remote = f.policy.format_remote_topic(&f.id.source, example);
    let renamed = if f.renames.is_empty() {
        String::new()
    } else {
        let pairs: Vec<String> = f
            .renames
            .iter()
            .map(|(from, to)| format!("'{from}' becomes '{to}'"))
            .collect();
        format!(
            "; renamed (kmirror.topics.rename): {} (checkpoints and verify follow; MM2 and failback cannot trace these names back)",
            pairs.join(", ")
        )
    };
    let policy = match f.policy.kind {
        PolicyKind::Default => format!(
            "DefaultReplicationPolicy (separator \"{}\"): '{example}' on {} becomes '{remote}' on {}",
            f.policy.separator, f.id.source, f.id.target
        ),
        PolicyKind::Identity if f.loop_prevention => format!(
            "IdentityReplicationPolicy: '{example}' on {} stays '{remote}' on {}; loop prevention on (kmirror.loop.prevention.enabled): the producer ids this flow writes with are registered in {}'s {}, and batches kmirror copied into {} from {} are left out, so {}->{} may copy the same names back; with both ways, checkpoints and group offset sync are held back (a position has no equivalent across)",
            f.id.source, f.id.target, f.id.target, PRODUCERS_TOPIC, f.id.source, f.id.target, f.id.target, f.id.source
        ),
        PolicyKind::Identity => format!(
            "IdentityReplicationPolicy: '{example}' on {} stays '{remote}' on {} (no cycle detection: never use it for {}->{} as well unless kmirror.loop.prevention.enabled = true for both)",
            f.id.source, f.id.target, f.id.target, f.id.source
        ),
    };
    policy + &renamed
}

fn internal_topics(f: &FlowConfig) -> Vec<InternalTopic> {
    let mut out = Vec::new();
    let (src, tgt) = (f.id.source.to_string(), f.id.target.to_string());
    if f.replication {
        if f.internal.emit_offset_syncs {
            let (topic, side) = f.offset_syncs_topic();
            let cluster = match side {
                Side::Source => src.clone(),
                Side::Target => tgt.clone(),
            };
            out.push(InternalTopic {
                topic,
                cluster,
                partitions: 1,
                replication_factor: f.internal.offset_syncs_replication_factor,
                purpose: "offset syncs (MM2 format)",
            });
        }
        if f.emit_checkpoints.enabled {
            out.push(InternalTopic {
                topic: f.checkpoints_topic(),
                cluster: tgt.clone(),
                partitions: 1,
                replication_factor: f.internal.checkpoints_replication_factor,
                purpose: "consumer-group checkpoints (MM2 format)",
            });
        }
        if f.loop_prevention {
            out.push(InternalTopic {
                topic: PRODUCERS_TOPIC.into(),
                cluster: tgt.clone(),
                partitions: 1,
                replication_factor: f.internal.positions_replication_factor,
                purpose: "producer ids kmirror writes with, for loop prevention (kmirror's own)",
            });
        }
        out.push(InternalTopic {
            topic: f.internal.positions_topic.clone(),
            cluster: tgt.clone(),
            partitions: f.internal.positions_partitions,
            replication_factor: f.internal.positions_replication_factor,
            purpose: "source positions (MM2's Connect offset format)",
        });
    }
    if f.emit_heartbeats.enabled {
        out.push(InternalTopic {
            topic: f.policy.heartbeats_topic().to_string(),
            cluster: tgt,
            partitions: 1,
            replication_factor: f.internal.heartbeats_replication_factor,
            purpose: "heartbeats (MM2 format)",
        });
    }
    out
}

impl Plan {
    pub fn new(config: &MirrorConfig) -> Self {
        let mut clusters: Vec<PlanCluster> = Vec::new();
        for c in &config.clusters {
            let settings = config.flows.iter().find_map(|f| {
                if f.id.source == c.alias {
                    Some(&f.clients.source_admin)
                } else if f.id.target == c.alias {
                    Some(&f.clients.target_admin)
                } else {
                    None
                }
            });
            clusters.push(PlanCluster {
                alias: c.alias.to_string(),
                bootstrap: c.bootstrap.iter().map(|b| b.to_string()).collect(),
                security: settings
                    .map(describe_security)
                    .unwrap_or_else(|| "(in no flow)".into()),
            });
        }
        Plan {
            source: config.source.clone(),
            served_targets: config
                .served_targets
                .as_ref()
                .map(|v| v.iter().map(|a| a.to_string()).collect()),
            clusters,
            flows: config
                .flows
                .iter()
                .map(|f| PlanFlow {
                    flow: f.id.to_string(),
                    mode: if f.replication {
                        "replicate"
                    } else {
                        "heartbeats only"
                    },
                    served: f.served,
                    naming: naming(f),
                    internal_topics: internal_topics(f),
                    config: f.clone(),
                })
                .collect(),
            ignored: config.ignored.clone(),
            warnings: config.diagnostics.warnings().cloned().collect(),
        }
    }

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

/// How `plan` describes `check.crcs`: turning it off is a risk the operator should see.
pub fn crc_check(on: bool) -> &'static str {
    if on {
        "CRC-32C of every batch checked"
    } else {
        "CRC-32C NOT checked (check.crcs=false: a corrupt source batch is copied under a fresh checksum)"
    }
}

/// Epoch milliseconds as an RFC 3339 time in UTC.
fn rfc3339(ms: i64) -> String {
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
fn as_written<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
