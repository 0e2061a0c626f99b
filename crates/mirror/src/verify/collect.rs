//! Reads what `verify` compares, from both clusters of a flow, with batched requests (offsets
//! one ListOffsets per broker, configs a few hundred topics per DescribeConfigs) so that thousands
//! of partitions take seconds.
//!
//! Why one file of this size: it is verify's I/O half (judging is in `mod.rs`): `flow` reads
//! metadata, configs and offsets once and hands them to every check (source configs also mark
//! compacted topics, source starts feed `groups`), each adding rows through `Ctx`. Next to
//! split out: the `acls` and `groups` checks into their own file.

use super::{
    judge_counted, judge_deep, judge_freshness, judge_open_transactions, judge_records, Count,
    PartitionCounts, Report, Row, Status,
};
use crate::config::model::{ExactlyOnce, FlowConfig, MirrorConfig};
use crate::discovery;
use crate::engine::read_to_end;
use crate::filter::PatternList;
use crate::topic_sync::{config_ops, topic_acls};
use crate::wire::internal::Checkpoint;
use kmirror_kafka::admin::{acl, AclBinding, ConfigEntry, ConfigOp};
use kmirror_kafka::cluster::{KafkaCluster, EARLIEST, LATEST};
use kmirror_kafka::records::{decode_batch, Record};
use kmirror_kafka::Refusal;
use kmirror_kafka::{IsolationLevel, KafkaError};
use kmirror_registry::RegistryClient;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// What to verify of a flow.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only source topics matching this (whole-name Java regex list).
    pub topics: Option<PatternList>,
    /// Compare the last N records of each partition.
    pub deep: usize,
    /// How `records` rows count.
    pub count: Count,
}

/// A failure to read a cluster (not a difference: verify cannot tell).
#[derive(Debug, thiserror::Error)]
#[error("flow {flow}: {what}: {source}")]
pub struct CollectError {
    pub flow: String,
    pub what: String,
    #[source]
    pub source: KafkaError,
}

/// Why `verify` could not give a verdict.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("no replicating flow {asked} to verify (flows: {known})")]
    NoFlow { asked: String, known: String },
    #[error("connecting to {cluster}")]
    Connect {
        cluster: String,
        #[source]
        source: KafkaError,
    },
    #[error(transparent)]
    Collect(#[from] CollectError),
}

/// Verifies every replicating flow this process serves (or only `only`, a flow such as
/// `A->B`), connecting to each flow's clusters with its admin settings.
pub async fn all(
    cfg: &MirrorConfig,
    only: Option<&str>,
    options: &Options,
) -> Result<Report, VerifyError> {
    let t0 = std::time::Instant::now();
    let flows: Vec<_> = cfg
        .served_flows()
        .filter(|f| f.replication)
        .filter(|f| only.is_none_or(|o| f.id.to_string() == o))
        .collect();
    if flows.is_empty() {
        let known: Vec<String> = cfg
            .flows
            .iter()
            .filter(|f| f.replication)
            .map(|f| f.id.to_string())
            .collect();
        return Err(VerifyError::NoFlow {
            asked: only.unwrap_or("").to_string(),
            known: known.join(", "),
        });
    }
    let mut report = Report::default();
    for f in flows {
        let connect = |settings: &kmirror_kafka::ClientSettings,
                       alias: &crate::names::ClusterAlias| {
            let settings = settings.clone();
            let cluster = alias.to_string();
            async move {
                KafkaCluster::connect(settings)
                    .await
                    .map_err(|source| VerifyError::Connect { cluster, source })
            }
        };
        let source = connect(&f.clients.source_admin, &f.id.source).await?;
        let target = connect(&f.clients.target_admin, &f.id.target).await?;
        let (rows, topics, partitions) = flow(f, &source, &target, options).await?;
        report.rows.extend(rows);
        report.topics += topics;
        report.partitions += partitions;
    }
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

struct Ctx<'a> {
    flow: &'a FlowConfig,
    rows: Vec<Row>,
}

impl Ctx<'_> {
    fn row(
        &mut self,
        check: &'static str,
        subject: &str,
        partition: Option<i32>,
        (status, detail): (Status, String),
    ) {
        self.rows.push(Row {
            flow: self.flow.id.to_string(),
            check,
            subject: subject.to_string(),
            partition,
            status,
            detail,
        });
    }
}

/// Verifies one flow; returns its rows and how many topics and partitions it covered.
pub async fn flow(
    flow: &FlowConfig,
    source: &KafkaCluster,
    target: &KafkaCluster,
    options: &Options,
) -> Result<(Vec<Row>, usize, usize), CollectError> {
    let err = |what: &str| {
        let flow = flow.id.to_string();
        let what = what.to_string();
        move |source| CollectError { flow, what, source }
    };
    source
        .refresh_metadata(None)
        .await
        .map_err(err("source metadata"))?;
    target
        .refresh_metadata(None)
        .await
        .map_err(err("target metadata"))?;
    let smd = source.metadata();
    let tmd = target.metadata();
    let mut cx = Ctx {
        flow,
        rows: Vec::new(),
    };

    // Replicated topics in scope (heartbeats are kmirror's own traffic, never complete).
    let decided = discovery::decide(flow, smd.topics.keys().map(String::as_str));
    let topics: Vec<(String, String)> = decided
        .into_iter()
        .filter_map(|d| Some((d.source, d.remote?)))
        .filter(|(s, _)| !flow.policy.is_heartbeats_topic(s))
        .filter(|(s, _)| options.topics.as_ref().is_none_or(|p| p.matches(s)))
        .collect();

    // Topics and partition counts.
    let mut pairs: Vec<(String, String, i32)> = Vec::new();
    for (src, remote) in &topics {
        let n = smd.topics[src].partitions.len() as i32;
        match tmd.topics.get(remote) {
            None => cx.row(
                "topic",
                src,
                None,
                (
                    Status::Failed,
                    format!("{remote} does not exist on {}", flow.id.target),
                ),
            ),
            Some(t) => {
                cx.row("topic", src, None, (Status::Ok, format!("as {remote}")));
                let m = t.partitions.len() as i32;
                cx.row(
                    "partitions",
                    src,
                    None,
                    if m == n {
                        (Status::Ok, format!("{n}"))
                    } else {
                        (
                            Status::Failed,
                            format!("{n} on the source, {m} on {remote}"),
                        )
                    },
                );
                pairs.push((src.clone(), remote.clone(), n.min(m)));
            }
        }
    }

    // Configs of both sides, once: for the configs check, and to know compacted topics.
    let source_configs = source
        .describe_topics_configs(&pairs.iter().map(|(s, _, _)| s.clone()).collect::<Vec<_>>())
        .await;
    let target_configs = target
        .describe_topics_configs(&pairs.iter().map(|(_, r, _)| r.clone()).collect::<Vec<_>>())
        .await;
    let compacted: BTreeSet<&str> = match &source_configs {
        Ok(m) => m
            .iter()
            .filter(|(_, c)| {
                c.as_ref().is_ok_and(|c| {
                    c.iter().any(|e| {
                        e.name == "cleanup.policy"
                            && e.value.as_deref().is_some_and(|v| v.contains("compact"))
                    })
                })
            })
            .map(|(t, _)| t.as_str())
            .collect(),
        Err(_) => BTreeSet::new(),
    };

    // Schemas first: `deep` compares records whose ids were rewritten through their id map.
    let (mut ids, registries) = schemas(&mut cx, options).await;

    // Record counts per partition, against the stored positions.
    let positions = crate::engine::load_positions(
        target,
        &flow.internal.positions_topic,
        flow.id.source.as_str(),
    )
    .await
    .unwrap_or_default()
    .positions;
    let src_parts: Vec<(String, i32)> = pairs
        .iter()
        .flat_map(|(s, _, n)| (0..*n).map(move |p| (s.clone(), p)))
        .collect();
    let dst_parts: Vec<(String, i32)> = pairs
        .iter()
        .flat_map(|(_, r, n)| (0..*n).map(move |p| (r.clone(), p)))
        .collect();
    let iso = flow.clients.consumer_tuning.isolation_level;
    let s_start = source
        .list_offsets(&src_parts, EARLIEST, iso)
        .await
        .map_err(err("source offsets"))?;
    let s_end = source
        .list_offsets(&src_parts, LATEST, iso)
        .await
        .map_err(err("source offsets"))?;
    // An exactly-once flow's target holds transaction markers and aborted batches: its offsets
    // are not records (a missing record could hide behind an aborted one), so it is read as a
    // read_committed consumer reads it, and every caught-up partition is counted record by
    // record.
    let eos = flow.exactly_once != ExactlyOnce::Disabled;
    let t_iso = if eos {
        IsolationLevel::ReadCommitted
    } else {
        IsolationLevel::ReadUncommitted
    };
    let t_start = target
        .list_offsets(&dst_parts, EARLIEST, t_iso)
        .await
        .map_err(err("target offsets"))?;
    let t_end = target
        .list_offsets(&dst_parts, LATEST, t_iso)
        .await
        .map_err(err("target offsets"))?;
    for (src, remote, n) in &pairs {
        for p in 0..*n {
            let get =
                |m: &HashMap<(String, i32), i64>, t: &str| m.get(&(t.to_string(), p)).copied();
            let (Some(ss), Some(se), Some(ts), Some(te)) = (
                get(&s_start, src),
                get(&s_end, src),
                get(&t_start, remote),
                get(&t_end, remote),
            ) else {
                cx.row(
                    "records",
                    src,
                    Some(p),
                    (Status::Failed, "offsets could not be read".into()),
                );
                continue;
            };
            let c = PartitionCounts {
                source_start: ss,
                source_end: se,
                target_start: ts,
                target_end: te,
                position: positions.get(&(src.clone(), p)).copied(),
            };
            let mut verdict = judge_records(&c, compacted.contains(src.as_str()));
            let count = match options.count {
                Count::Auto if eos => verdict.0 != Status::Pending,
                Count::Auto => verdict.0 == Status::Failed,
                Count::Records => verdict.0 != Status::Pending,
                Count::Offsets => false,
            };
            if count {
                let s = count_records(source, src, p, ss, se, iso).await;
                let t = count_records(target, remote, p, ts, te, t_iso).await;
                verdict = match (s, t) {
                    (Ok(s), Ok(t)) => judge_counted(s, t, (se - ss, te - ts)),
                    (Err(e), _) | (_, Err(e)) => {
                        (Status::Failed, format!("cannot count records: {e}"))
                    }
                };
            }
            let caught_up = verdict.0 == Status::Ok;
            cx.row("records", src, Some(p), verdict);
            if se > ss {
                let newest_s = newest_timestamp(source, src, p, se, iso).await;
                let newest_t = newest_timestamp(target, remote, p, te, t_iso).await;
                cx.row(
                    "freshness",
                    src,
                    Some(p),
                    judge_freshness(newest_s, newest_t),
                );
            }
            if options.deep > 0 && caught_up {
                let s = last_records(source, src, p, ss, se, options.deep, iso).await;
                let t = last_records(target, remote, p, ts, te, options.deep, t_iso).await;
                let verdict = match (s, t) {
                    (Ok(s), Ok(t)) => {
                        if let Some(r) = &registries {
                            let named = super::schemas::ids_named(&s);
                            let rename = &*r.subjects.rename;
                            super::schemas::map_more(&mut ids, named, &r.source, &r.target, rename)
                                .await;
                        }
                        judge_deep(&s, &t, &ids)
                    }
                    (Err(e), _) | (_, Err(e)) => (Status::Failed, format!("cannot read: {e}")),
                };
                cx.row("deep", src, Some(p), verdict);
            }
        }
    }

    open_transactions(&mut cx, target, &pairs, &dst_parts)
        .await
        .map_err(err("target transactions"))?;
    configs(&mut cx, &pairs, source_configs, target_configs);
    acls(&mut cx, source, target, &topics).await;
    groups(&mut cx, source, target, &topics, &s_start).await;
    let partitions = src_parts.len();
    Ok((cx.rows, topics.len(), partitions))
}

/// A flow's two registries and its subject names, for `deep`'s ids the subject checks left out.
struct Registries {
    source: RegistryClient,
    target: RegistryClient,
    subjects: crate::engine::schemas::Subjects,
}

/// The `subject` and `settings` rows of a flow that syncs schemas (docs/verify.md, "Schemas");
/// returns the source-to-target ids of the versions found equal, and the registries. With
/// `--topics`, only the subjects of the topics it matches (and those they refer to).
async fn schemas(cx: &mut Ctx<'_>, options: &Options) -> (BTreeMap<i32, i32>, Option<Registries>) {
    let Some(sync) = &cx.flow.schemas else {
        return (BTreeMap::new(), None);
    };
    let subjects = crate::engine::schemas::Subjects::of_flow(cx.flow, sync);
    let read = async {
        let source = RegistryClient::new(&sync.source.0).map_err(|e| ("source", e))?;
        let target = RegistryClient::new(&sync.target.0).map_err(|e| ("target", e))?;
        let mut listed = source.subjects(false).await.map_err(|e| ("source", e))?;
        listed.retain(|s| (subjects.selected)(s));
        if let Some(p) = &options.topics {
            listed.retain(|s| crate::engine::schemas::topic_of(s).is_none_or(|t| p.matches(t)));
        }
        let on_source = super::schemas::read(&source, listed)
            .await
            .map_err(|e| ("source", e))?;
        let renamed = on_source
            .subjects
            .keys()
            .map(|s| (subjects.rename)(s))
            .collect();
        let on_target = super::schemas::read(&target, renamed)
            .await
            .map_err(|e| ("target", e))?;
        Ok::<_, (&str, kmirror_registry::RegistryError)>((on_source, on_target, source, target))
    };
    match read.await {
        Ok((on_source, on_target, source, target)) => {
            let keep = sync.ids == crate::config::model::IdsMode::Keep;
            let judged = super::schemas::judge(&on_source, &on_target, &*subjects.rename, keep);
            for (check, subject, verdict) in judged.verdicts {
                cx.row(check, &subject, None, verdict);
            }
            let registries = Registries {
                source,
                target,
                subjects,
            };
            (judged.ids, Some(registries))
        }
        Err((side, e)) => {
            cx.row(
                "subject",
                "(registry)",
                None,
                (
                    Status::Failed,
                    format!("cannot read the {side} registry: {e}"),
                ),
            );
            (BTreeMap::new(), None)
        }
    }
}

/// A `transactions` row for each target partition whose last stable offset lags its high
/// watermark because of a transaction open past the target's `transaction.max.timeout.ms`
/// (docs/engine.md, "Transactions whose marker was dropped"). Partitions whose stable offset is
/// at the end, or whose open transactions are younger, get no row.
async fn open_transactions(
    cx: &mut Ctx<'_>,
    target: &KafkaCluster,
    pairs: &[(String, String, i32)],
    dst_parts: &[(String, i32)],
) -> Result<(), KafkaError> {
    let stable = target
        .list_offsets(dst_parts, LATEST, IsolationLevel::ReadCommitted)
        .await?;
    let end = target
        .list_offsets(dst_parts, LATEST, IsolationLevel::ReadUncommitted)
        .await?;
    let behind: Vec<(std::sync::Arc<str>, i32)> = dst_parts
        .iter()
        .filter(|k| matches!((stable.get(*k), end.get(*k)), (Some(s), Some(e)) if s < e))
        .map(|(t, p)| (std::sync::Arc::from(t.as_str()), *p))
        .collect();
    if behind.is_empty() {
        return Ok(());
    }
    // Kafka's default: 15 minutes.
    let max_timeout_ms = target
        .describe_broker_config("transaction.max.timeout.ms")
        .await
        .ok()
        .flatten()
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(900_000);
    let now = crate::engine::now_ms();
    for ((remote, p), answer) in target.describe_producers(&behind).await {
        let Some((src, _, _)) = pairs.iter().find(|(_, r, _)| **r == *remote) else {
            continue;
        };
        let verdict = match answer {
            Ok(producers) => judge_open_transactions(&producers, now, max_timeout_ms),
            Err(e) => Some((
                Status::Failed,
                format!(
                    "the stable offset lags the end, and its producers cannot be described: {e}"
                ),
            )),
        };
        if let Some(v) = verdict {
            cx.row("transactions", src, Some(p), v);
        }
    }
    Ok(())
}

/// The newest timestamp of a partition: the max timestamp of the batch holding its last offset.
async fn newest_timestamp(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    end: i64,
    iso: IsolationLevel,
) -> Option<i64> {
    // Control batches (transaction markers) at the end carry no record: look a little further
    // back for the last data batch.
    let from = (end - 1).max(0);
    let f = k
        .fetch(topic, partition, from, 64 << 10, Duration::ZERO, iso)
        .await
        .ok()?;
    let newest = f
        .batches
        .iter()
        .filter(|b| !b.is_control())
        .map(|b| b.max_timestamp())
        .max();
    if newest.is_some() || from == 0 {
        return newest;
    }
    let f = k
        .fetch(
            topic,
            partition,
            (end - 50).max(0),
            1 << 20,
            Duration::ZERO,
            iso,
        )
        .await
        .ok()?;
    f.batches
        .iter()
        .filter(|b| !b.is_control())
        .map(|b| b.max_timestamp())
        .max()
}

/// The records a reader with `iso` sees in `start..end`, counted from batch headers (nothing
/// is decompressed): control batches left out, and with read_committed the batches of aborted
/// transactions.
async fn count_records(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    iso: IsolationLevel,
) -> Result<i64, KafkaError> {
    let mut offset = start;
    let mut n = 0i64;
    while offset < end {
        let f = k
            .fetch(topic, partition, offset, 1 << 20, Duration::ZERO, iso)
            .await?;
        let Some(last) = f.batches.last().map(|b| b.last_offset()) else {
            break;
        };
        for b in f.visible(iso) {
            let records = i64::from(b.record_count().max(0));
            // The first batch may begin before `start` (records deleted inside it).
            n += if b.base_offset() < start && b.offsets_contiguous() {
                (b.last_offset() - start + 1).clamp(0, records)
            } else {
                records
            };
        }
        offset = last + 1;
    }
    Ok(n)
}

/// The last `n` records of a partition (control batches, and with read_committed aborted
/// transactions, left out).
async fn last_records(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    n: usize,
    iso: IsolationLevel,
) -> Result<Vec<Record>, KafkaError> {
    // Transaction markers take offsets: read a little more than n, keep the last n.
    let from = (end - 2 * n as i64).max(start);
    let mut out = Vec::new();
    k.read_until(topic, partition, from..end, iso, |f| {
        for b in f.visible(iso) {
            out.extend(
                decode_batch(b)
                    .map_err(|e| KafkaError::Config(e.to_string()))?
                    .into_iter()
                    .filter(|r| r.offset >= from && r.offset < end),
            );
        }
        Ok(())
    })
    .await?;
    let skip = out.len().saturating_sub(n);
    Ok(out.split_off(skip))
}

type Described = Result<BTreeMap<String, Result<Vec<ConfigEntry>, KafkaError>>, KafkaError>;

fn configs(
    cx: &mut Ctx<'_>,
    pairs: &[(String, String, i32)],
    source: Described,
    target: Described,
) {
    if !cx.flow.sync_topic_configs.enabled {
        for (src, _, _) in pairs {
            cx.row(
                "configs",
                src,
                None,
                (Status::Skipped, "sync.topic.configs.enabled = false".into()),
            );
        }
        return;
    }
    let (s, t) = match (source, target) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            for (src, _, _) in pairs {
                cx.row(
                    "configs",
                    src,
                    None,
                    (Status::Failed, format!("cannot describe configs: {e}")),
                );
            }
            return;
        }
    };
    for (src, remote, _) in pairs {
        let verdict = match (s.get(src), t.get(remote)) {
            (Some(Ok(se)), Some(Ok(te))) => {
                let ops = config_ops(cx.flow, se, te, &BTreeSet::new());
                if ops.is_empty() {
                    (Status::Ok, "as the source (per the sync rules)".into())
                } else {
                    let on_target: HashMap<&str, Option<&str>> = te
                        .iter()
                        .map(|e| (e.name.as_str(), e.value.as_deref()))
                        .collect();
                    let diffs: Vec<String> = ops
                        .iter()
                        .map(|op| match op {
                            ConfigOp::Set(k, v) => format!(
                                "{k}: source {v}, target {}",
                                on_target
                                    .get(k.as_str())
                                    .copied()
                                    .flatten()
                                    .unwrap_or("(unset)")
                            ),
                            ConfigOp::Delete(k) => {
                                format!("{k}: default on the source, set on the target")
                            }
                        })
                        .collect();
                    (Status::Failed, diffs.join("; "))
                }
            }
            (Some(Err(e)), _) | (_, Some(Err(e))) => {
                (Status::Failed, format!("cannot describe configs: {e}"))
            }
            _ => (Status::Failed, "no configs returned".into()),
        };
        cx.row("configs", src, None, verdict);
    }
}

async fn acls(
    cx: &mut Ctx<'_>,
    source: &KafkaCluster,
    target: &KafkaCluster,
    topics: &[(String, String)],
) {
    let subject = format!("{} topic ACLs", cx.flow.id.source);
    if !cx.flow.sync_topic_acls.enabled {
        cx.row(
            "acls",
            &subject,
            None,
            (Status::Skipped, "sync.topic.acls.enabled = false".into()),
        );
        return;
    }
    let filter = AclBinding {
        resource_type: acl::RESOURCE_TOPIC,
        ..AclBinding::any()
    };
    let src = match source.describe_acls(&filter).await {
        Ok(b) => b,
        Err(e) if e.is(Refusal::NoAuthorizer) => {
            cx.row(
                "acls",
                &subject,
                None,
                (Status::Skipped, "the source has no authorizer".into()),
            );
            return;
        }
        Err(e) => {
            cx.row(
                "acls",
                &subject,
                None,
                (Status::Failed, format!("cannot describe source ACLs: {e}")),
            );
            return;
        }
    };
    let in_scope: BTreeSet<&str> = topics.iter().map(|(s, _)| s.as_str()).collect();
    let src: Vec<AclBinding> = src
        .into_iter()
        .filter(|b| {
            b.resource_name
                .as_deref()
                .is_some_and(|n| n == "*" || in_scope.contains(n))
        })
        .collect();
    let wanted = topic_acls(cx.flow, &src);
    let have: BTreeSet<AclBinding> = match target.describe_acls(&filter).await {
        Ok(b) => b.into_iter().collect(),
        Err(e) => {
            cx.row(
                "acls",
                &subject,
                None,
                (Status::Failed, format!("cannot describe target ACLs: {e}")),
            );
            return;
        }
    };
    let missing: Vec<String> = wanted
        .iter()
        .filter(|b| !have.contains(b))
        .map(describe_acl)
        .collect();
    cx.row(
        "acls",
        &subject,
        None,
        if missing.is_empty() {
            (
                Status::Ok,
                format!(
                    "{} binding(s) present on {}",
                    wanted.len(),
                    cx.flow.id.target
                ),
            )
        } else {
            (
                Status::Failed,
                format!("missing on {}: {}", cx.flow.id.target, missing.join("; ")),
            )
        },
    );
}

fn describe_acl(b: &AclBinding) -> String {
    let op = match b.operation {
        acl::OP_READ => "READ",
        acl::OP_WRITE => "WRITE",
        acl::OP_ALL => "ALL",
        acl::OP_CREATE => "CREATE",
        _ => "other",
    };
    let perm = if b.permission == acl::PERMISSION_DENY {
        "DENY"
    } else {
        "ALLOW"
    };
    let pattern = if b.pattern_type == acl::PATTERN_PREFIXED {
        " (prefixed)"
    } else {
        ""
    };
    format!(
        "{perm} {op} {} on topic {}{pattern}",
        b.principal.as_deref().unwrap_or("?"),
        b.resource_name.as_deref().unwrap_or("?")
    )
}

/// Each group the flow's group filter accepts that committed offsets on replicated topics:
/// every such partition has a checkpoint on the target (its translated offset), and with
/// `sync.group.offsets.enabled` the group's offset on the target is at least the translation.
async fn groups(
    cx: &mut Ctx<'_>,
    source: &KafkaCluster,
    target: &KafkaCluster,
    topics: &[(String, String)],
    source_starts: &HashMap<(String, i32), i64>,
) {
    if !cx.flow.emit_checkpoints.enabled {
        cx.row(
            "group",
            "(all)",
            None,
            (Status::Skipped, "emit.checkpoints.enabled = false".into()),
        );
        return;
    }
    let remote_of: HashMap<&str, &str> = topics
        .iter()
        .map(|(s, r)| (s.as_str(), r.as_str()))
        .collect();
    let groups = match source.list_groups().await {
        Ok(g) => g,
        Err(e) => {
            cx.row(
                "group",
                "(all)",
                None,
                (Status::Failed, format!("cannot list source groups: {e}")),
            );
            return;
        }
    };
    let checkpoints_topic = cx.flow.checkpoints_topic();
    let mut newest: BTreeMap<(String, String, i32), Checkpoint> = BTreeMap::new();
    if target.metadata().topics.contains_key(&checkpoints_topic) {
        if let Ok((records, _)) = read_to_end(target, &checkpoints_topic, 0, None).await {
            for r in records {
                if let (Some(k), Some(v)) = (r.key.as_deref(), r.value.as_deref()) {
                    if let Ok(c) = Checkpoint::decode(k, v) {
                        newest.insert((c.group.clone(), c.topic.clone(), c.partition), c);
                    }
                }
            }
        }
    }
    for (group, _) in groups.iter().filter(|(g, _)| cx.flow.groups.accepts(g)) {
        let Ok(committed) = source.fetch_group_offsets(group).await else {
            cx.row(
                "group",
                group,
                None,
                (Status::Failed, "cannot read its committed offsets".into()),
            );
            continue;
        };
        let mut want: Vec<(String, i32, i64)> = Vec::new();
        for (t, parts) in &committed {
            if let Some(remote) = remote_of.get(t.as_str()) {
                for (p, o) in parts {
                    // At the log start (e.g. 0 on an empty partition) there is nothing to
                    // translate: a consumer starting from the beginning on the target reads
                    // the same records, and neither MM2 nor kmirror writes a checkpoint.
                    let start = source_starts.get(&(t.clone(), *p)).copied().unwrap_or(0);
                    if o.offset > start {
                        want.push((remote.to_string(), *p, o.offset));
                    }
                }
            }
        }
        if want.is_empty() {
            continue;
        }
        let on_target = if cx.flow.sync_group_offsets.enabled {
            target.fetch_group_offsets(group).await.ok()
        } else {
            None
        };
        let mut missing = Vec::new();
        let mut stale = Vec::new();
        let mut behind = Vec::new();
        for (remote, p, offset) in &want {
            match newest.get(&(group.clone(), remote.clone(), *p)) {
                None => missing.push(format!("{remote}-{p}")),
                Some(c) if c.upstream_offset < *offset => stale.push(format!(
                    "{remote}-{p} (checkpoint at {}, group at {offset})",
                    c.upstream_offset
                )),
                Some(c) => {
                    if let Some(t) = &on_target {
                        let have = t.get(remote).and_then(|m| m.get(p)).map(|o| o.offset);
                        if have.is_none_or(|h| h < c.downstream_offset) {
                            behind.push(format!(
                                "{remote}-{p} (target group at {}, translation {})",
                                have.map_or("none".to_string(), |h| h.to_string()),
                                c.downstream_offset
                            ));
                        }
                    }
                }
            }
        }
        let verdict = if !missing.is_empty() {
            (
                Status::Failed,
                format!(
                    "not translated on {}: {}",
                    cx.flow.id.target,
                    missing.join(", ")
                ),
            )
        } else if !stale.is_empty() || !behind.is_empty() {
            let mut all = stale;
            all.extend(behind);
            (Status::Pending, all.join(", "))
        } else {
            (
                Status::Ok,
                format!("{} partition(s) translated", want.len()),
            )
        };
        cx.row("group", group, None, verdict);
    }
}
