//! MirrorMaker 1 mode (`kmirror legacy`, mm2-compatibility §9): members of an ordinary consumer group on
//! the source share the matching topics' partitions (`--num.streams` members per process, and
//! every process started with the same files), and each record goes to the same topic name on
//! the target, to the partition Java's default partitioner picks for its key. Offsets are
//! committed to the source group, only for records the target acknowledged, so a crash or
//! `kill -9` loses nothing; records after the last commit may be copied again (at-least-once,
//! as MM1).
//!
//! Unlike MM1: missing target topics are created with the source's partition count and
//! configs, new matching topics are picked up while running, and the built-in transforms
//! replace Java message handlers. Records are always decoded and re-encoded (the target
//! partition depends on each key), with the producer file's `compression.type`. Fetching is
//! per source broker, with the broker's long poll while idle, and what was fetched and not yet
//! handed to the producer is bounded by the producer file's `buffer.memory`.

mod ledger;
pub mod plan;
mod stream;
mod targets;

use crate::config::legacy::LegacyConfig;
use crate::engine::loop_guard::{LoopGuard, Names, Registrar};
use crate::engine::{Shutdown, Supervisor};
use crate::events::{ClusterUnreachable, Emitter, Event};
use crate::metrics::{FlowLabels, Metrics};
use crate::names::{ClusterAlias, FlowId};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::fetcher::{Fetcher, FetcherConfig};
use kmirror_kafka::KafkaError;
use std::collections::BTreeMap;
use std::sync::Arc;
use stream::{Shared, TopicSet};
use targets::Targets;

/// Failures that stop MM1 mode.
#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("connecting to the {side} cluster: {source}")]
    Connect {
        side: &'static str,
        #[source]
        source: KafkaError,
    },
    #[error("the consumer and the producer reach the same cluster (cluster id {0}); mirroring a cluster into itself would copy its data forever")]
    SameCluster(String),
    #[error("consumer group {group}: {source}")]
    Group {
        group: String,
        #[source]
        source: KafkaError,
    },
    #[error(
        "{topic}-{partition}: group {group} has no committed offset and auto.offset.reset is none"
    )]
    NoOffset {
        group: String,
        topic: String,
        partition: i32,
    },
    #[error("sending to {topic}-{partition} failed: {source} (with --abort.on.send.failure true the process stops; records not acknowledged were not committed and are copied on restart)")]
    Send {
        topic: String,
        partition: i32,
        #[source]
        source: KafkaError,
    },
    #[error("{topic}-{partition} at source offset {offset}: {message}")]
    Records {
        topic: String,
        partition: i32,
        offset: i64,
        message: String,
    },
    #[error("a stream task panicked: {0}")]
    Panicked(String),
    /// A setting the clusters prove wrong before anything is written (a target schema registry
    /// that does not keep ids): exit 3, as a configuration error.
    #[error("{0}")]
    Config(String),
}

/// How MM1 mode names its one flow in logs.
const FLOW: &str = "source->target";

/// The labels MM1 mode's metrics carry (it has no cluster aliases).
pub fn labels() -> FlowLabels {
    FlowLabels {
        source: "source".into(),
        target: "target".into(),
    }
}

/// Loop prevention without MM2's aliases: the clusters are named by their ids (every
/// supported broker has one), so registry entries match whatever process wrote them. The
/// producer ids this process gets from the target are registered there before it writes with
/// them; what kmirror copied into the source from the target is left out of the copy.
fn loop_guard(
    source: &Arc<KafkaCluster>,
    target: &Arc<KafkaCluster>,
    metrics: &Metrics,
    labels: &FlowLabels,
) -> Arc<LoopGuard> {
    let (source_id, target_id) = (
        source.metadata().cluster_id.clone(),
        target.metadata().cluster_id.clone(),
    );
    let name = |id: &Option<String>, side: &str| id.clone().unwrap_or_else(|| side.to_string());
    let names = Names {
        source: name(&source_id, "source"),
        target: name(&target_id, "target"),
        flow: FLOW.to_string(),
        replication_factor: -1,
    };
    let registered = metrics
        .producer_ids_registered
        .get_or_create(labels)
        .clone();
    Registrar::install_named(target, names, source_id, registered);
    Arc::new(LoopGuard::new(
        source.clone(),
        &ClusterAlias::new(name(&target_id, "target")),
        target_id.as_deref(),
    ))
}

/// The matching source topics (full-match Java regex; Kafka's internal topics excluded unless
/// `exclude.internal.topics=false`) and their partition counts.
fn matching(cfg: &LegacyConfig, source: &KafkaCluster) -> TopicSet {
    Arc::new(
        source
            .metadata()
            .topics
            .values()
            .filter(|t| t.error.is_none() && !t.partitions.is_empty())
            .filter(|t| !(cfg.exclude_internal_topics && t.is_internal))
            .filter(|t| cfg.topics.matches(&t.name))
            // With schema sync, the registry's own topic stays behind (docs/schemas.md).
            .filter(|t| {
                cfg.schemas.is_none() || t.name != crate::config::model::SchemaSync::REGISTRY_TOPIC
            })
            .map(|t| (t.name.clone(), t.partitions.len() as i32))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// Connects to both clusters. One that cannot be reached (down, restarting, a network path
/// not up yet) is tried again with backoff until it answers or the process stops, as in MM2
/// mode: a cluster down at start delays MM1 mode instead of ending it. Refused credentials, a
/// bad TLS setup and the same cluster on both sides end it at once. `None`: stopped meanwhile.
async fn connect(
    cfg: &LegacyConfig,
    shutdown: &Shutdown,
    metrics: &Metrics,
) -> Result<Option<(Arc<KafkaCluster>, Arc<KafkaCluster>)>, LegacyError> {
    let flow = FlowId::new(ClusterAlias::new("source"), ClusterAlias::new("target"));
    let labels = labels();
    let mut attempt = 0;
    loop {
        let pair = async {
            let s = KafkaCluster::connect(cfg.consumer.clone()).await;
            let s = s.map_err(|e| ("source", e))?;
            let t = KafkaCluster::connect(cfg.producer.clone()).await;
            let t = t.map_err(|e| ("target", e))?;
            Ok::<_, (&'static str, KafkaError)>((s, t))
        }
        .await;
        match pair {
            Ok((source, target)) => {
                if let (Some(a), Some(b)) = (
                    source.metadata().cluster_id.clone(),
                    target.metadata().cluster_id.clone(),
                ) {
                    if a == b {
                        return Err(LegacyError::SameCluster(a));
                    }
                }
                return Ok(Some((Arc::new(source), Arc::new(target))));
            }
            Err((side, e)) if e.is_retriable() => {
                let retry_in = crate::engine::backoff(attempt);
                attempt += 1;
                ClusterUnreachable {
                    flow: &flow,
                    cluster: side,
                    error: &e,
                    retry_in,
                }
                .emit(Emitter {
                    metrics,
                    labels: &labels,
                });
                if shutdown.sleep(retry_in).await {
                    return Ok(None);
                }
            }
            Err((side, source)) => return Err(LegacyError::Connect { side, source }),
        }
    }
}

/// Replicates until `shutdown`, then flushes, commits and leaves the group.
pub async fn run(
    cfg: Arc<LegacyConfig>,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
) -> Result<(), LegacyError> {
    let Some((source, target)) = connect(&cfg, &shutdown, &metrics).await? else {
        return Ok(());
    };
    let connected = metrics.connected_gauge(&labels());
    // The probe and the topic discovery run beside the streams: a panic in either stops the
    // streams (they flush and commit what the target acknowledged) and fails the run, as a
    // helper's panic fails a flow in MM2 mode, instead of vanishing with its task.
    let helpers = Supervisor::default();
    let probe = helpers.spawn(
        "connection probe",
        FLOW,
        crate::engine::probe::probe(
            vec![source.clone(), target.clone()],
            connected,
            shutdown.clone(),
        ),
    );
    let targets = Arc::new(Targets::new(
        source.clone(),
        target.clone(),
        cfg.create_topics,
    ));
    let first = matching(&cfg, &source);
    tracing::info!(topics = first.len(), group = %cfg.group_id, streams = cfg.num_streams, "MM1 mode started");
    let (topics_tx, topics_rx) = tokio::sync::watch::channel(first.clone());
    let labels = labels();
    // One fetcher for every stream: one fetch session per source broker, bounded by the
    // producer file's buffer.memory (Java's producer key: what the process may hold in memory).
    let fetcher = Arc::new(Fetcher::start(
        source.clone(),
        FetcherConfig::from_tuning(
            &cfg.consumer_tuning,
            usize::try_from(cfg.producer_tuning.buffer_memory).unwrap_or(0),
        ),
    ));
    metrics
        .rate_limit
        .get_or_create(&labels)
        .set(cfg.rate_limit.map_or(0, |l| l as i64));
    let limiter = cfg.rate_limit.map(|l| {
        Arc::new(crate::engine::throttle::RateLimiter::new(
            l,
            metrics.throttled_ms.get_or_create(&labels).clone(),
        ))
    });
    let loop_guard = cfg
        .loop_prevention
        .then(|| loop_guard(&source, &target, &metrics, &labels));
    // Schemas before any record (docs/schemas.md), as in MM2 mode.
    let schemas = match &cfg.schemas {
        None => None,
        Some(sync) => {
            let prepared =
                crate::engine::schemas::prepare(FLOW, sync, &shutdown, &metrics, &labels).await;
            let registries = match prepared {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()),
                Err(crate::engine::EngineError::Config { message, .. }) => {
                    return Err(LegacyError::Config(message))
                }
                Err(e) => return Err(LegacyError::Config(e.to_string())),
            };
            let map = Arc::new(crate::engine::schemas::IdMap::default());
            let task = crate::engine::schemas::SchemaTask {
                flow: FLOW.into(),
                sync: sync.clone(),
                subjects: crate::engine::schemas::Subjects::same_names(cfg.topics.clone(), sync),
                registries,
                map: map.clone(),
                metrics: metrics.clone(),
                labels: labels.clone(),
            };
            Some((
                map,
                helpers.spawn("schema sync", FLOW, task.run(shutdown.clone())),
            ))
        }
    };
    let shared = Arc::new(Shared {
        loop_guard,
        schemas: schemas.as_ref().map(|(m, _)| m.clone()),
        cfg: cfg.clone(),
        source: source.clone(),
        fetcher: fetcher.clone(),
        target,
        targets: targets.clone(),
        topics: topics_rx,
        metrics: metrics.clone(),
        labels: labels.clone(),
        shutdown: shutdown.clone(),
        limiter,
        shares: Default::default(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..cfg.num_streams {
        tasks.spawn(stream::run(shared.clone(), i));
    }
    let discovery = helpers.spawn(
        "topic discovery",
        FLOW,
        discover(
            cfg.clone(),
            source,
            targets,
            topics_tx,
            shutdown.clone(),
            metrics,
            labels,
        ),
    );
    let stop_on_panic = {
        let (helpers, shutdown) = (helpers.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = helpers.failed() => shutdown.trigger(),
                _ = shutdown.wait() => {}
            }
        })
    };
    let mut first_error = None;
    while let Some(ended) = tasks.join_next().await {
        let result = ended
            .map_err(|e| LegacyError::Panicked(e.to_string()))
            .and_then(|r| r);
        if let Err(e) = result {
            shutdown.trigger();
            first_error.get_or_insert(e);
        }
    }
    shutdown.trigger();
    fetcher.shutdown().await;
    // Their panics were caught inside (`Supervisor::spawn`): these handles end without one.
    let _ = discovery.await;
    let _ = probe.await;
    if let Some((_, task)) = schemas {
        let _ = task.await;
    }
    let _ = stop_on_panic.await;
    if let Some((task, message)) = helpers.failure() {
        first_error.get_or_insert(LegacyError::Panicked(format!("{task}: {message}")));
    }
    first_error.map_or(Ok(()), Err)
}

/// Re-reads the source's topics every `metadata.max.age.ms`: new matching topics and added
/// partitions reach the group (its members rejoin), and their target topics are created ahead
/// of the data when their name does not depend on the records.
async fn discover(
    cfg: Arc<LegacyConfig>,
    source: Arc<KafkaCluster>,
    targets: Arc<Targets>,
    topics: tokio::sync::watch::Sender<TopicSet>,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    labels: FlowLabels,
) {
    let mut known: TopicSet = Arc::new(BTreeMap::new());
    loop {
        let now = topics.borrow().clone();
        metrics
            .flow_topics
            .get_or_create(&labels)
            .set(now.len() as i64);
        metrics
            .flow_partitions
            .get_or_create(&labels)
            .set(now.values().map(|n| *n as i64).sum());
        if cfg.create_topics {
            for t in now.keys().filter(|t| !known.contains_key(*t)) {
                let Some(remote) = cfg.transforms.route_topic(t) else {
                    continue;
                };
                if let Err(e) = targets.partitions(&remote, t).await {
                    tracing::warn!(error = %e, "cannot create the target topic yet; will retry");
                }
            }
        }
        known = now;
        if shutdown.sleep(cfg.metadata_refresh).await {
            return;
        }
        match source.refresh_metadata(None).await {
            Ok(_) => {
                targets.refresh();
                topics.send_if_modified(|current| {
                    let next = matching(&cfg, &source);
                    if next != *current {
                        *current = next;
                        true
                    } else {
                        false
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "refreshing the source's topics failed"),
        }
    }
}
