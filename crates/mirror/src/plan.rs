//! `kmirror plan`: what a configuration means, explained before anything connects. Pure: it
//! renders a validated [`MirrorConfig`] as text or as JSON.

use crate::config::diagnostics::Diagnostic;
use crate::config::model::{FlowConfig, IgnoredKey, MirrorConfig, Side, Source};
use crate::policy::PolicyKind;
use crate::wire::producers::PRODUCERS_TOPIC;
use kmirror_kafka::{ClientSettings, TrustMaterial};
use serde::Serialize;
use std::fmt::Write;
mod render;
pub(crate) use render::*;

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
                        kmirror_kafka::secret::redact_url(&cc.endpoint),
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
}

#[cfg(test)]
mod tests;
