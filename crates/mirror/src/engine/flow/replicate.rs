//! A flow's runtime once both clusters answer: load its setup (positions, producer, offset-sync
//! cluster) with retries, start its helper tasks under the flow's supervisor, serve the control
//! loop (topic refreshes, group events, failures), then stop in the order that keeps positions:
//! leader work, partitions, slots, the group, the fetcher, then the writers.

use super::control::Control;
use super::{flow_labels, RETRY_SKIPPED};
use crate::config::model::{ExactlyOnce, FlowConfig, Side};
use crate::engine::checkpoints::CheckpointTask;
use crate::engine::loop_guard::{LoopGuard, Registrar};
use crate::engine::offset_syncs::{self, Outbox};
use crate::engine::orphans::Orphans;
use crate::engine::partition::Context;
use crate::engine::positions::{self, Board, Writer};
use crate::engine::remote_topics;
use crate::engine::sharing::{self, Event, Membership, Shared};
use crate::engine::slot_keeper::SlotKeeper;
use crate::engine::slots::Committer;
use crate::engine::throttle::RateLimiter;
use crate::engine::topic_sync::{Replicated, TopicSync};
use crate::engine::{EngineError, ProcessShared, Shutdown, Supervisor};
use crate::events::{Emitter, Event as _, FlowSetupFailed};
use crate::metrics::{ErrorKind, FlowLabels, Metrics};
use crate::offsets::runs::Runs;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::fetcher::{Fetcher, FetcherConfig};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::KafkaError;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The stages of a flow's helper tasks, in the order they stop.
const LEADER_WORK: &str = "leader work";
const MEMBERSHIP: &str = "membership";
const CLIENT_METRICS: &str = "client metrics";
const POSITIONS: &str = "positions";
const OFFSET_SYNCS: &str = "offset syncs";
const CHECKPOINTS: &str = "checkpoints";
const SCHEMAS: &str = "schemas";

/// What `replicate` starts from.
pub(super) struct Clusters {
    pub(super) source: Arc<KafkaCluster>,
    pub(super) target: Arc<KafkaCluster>,
}

pub(super) async fn replicate(
    flow: &FlowConfig,
    Clusters { source, target }: Clusters,
    shutdown: &Shutdown,
    metrics: &Arc<Metrics>,
    process: ProcessShared,
    helpers: &Supervisor,
    (leader_tx, leader): (watch::Sender<bool>, watch::Receiver<bool>),
) -> Result<(), EngineError> {
    let name = flow.id.to_string();
    let labels = &flow_labels(flow);
    let (loop_guard, own_copies) = loop_guards(flow, &source, &target, metrics, labels);
    let Some(Setup {
        stored,
        producer,
        syncs_cluster,
    }) = setup_retrying(flow, &target, shutdown, metrics, labels)
        .await
        .map_err(|source| EngineError::Kafka {
            flow: name.clone(),
            source,
        })?
    else {
        return Ok(());
    };
    // Schemas before any record: the registries answer, and a target that must keep ids does.
    let schemas = match &flow.schemas {
        None => None,
        Some(sync) => {
            let Some(registries) =
                crate::engine::schemas::prepare(&name, sync, shutdown, metrics, labels).await?
            else {
                return Ok(());
            };
            let map = Arc::new(crate::engine::schemas::IdMap::default());
            let task = crate::engine::schemas::SchemaTask {
                flow: name.clone(),
                sync: sync.clone(),
                subjects: crate::engine::schemas::Subjects::of_flow(flow, sync),
                registries,
                map: map.clone(),
                metrics: metrics.clone(),
                labels: labels.clone(),
            };
            helpers.start(SCHEMAS, "schema sync", &name, |s| task.run(s));
            Some(map)
        }
    };
    let shared = sharing_state(flow);
    let board = Arc::new(Board::default());
    let runs = Arc::new(Mutex::new(Runs::default()));
    let positions_topic = flow.internal.positions_topic.clone();
    let mut writer = Writer::new(
        flow.id.source.to_string(),
        positions_topic.clone(),
        target.clone(),
        producer.clone(),
        board.clone(),
        metrics.clone(),
        labels.clone(),
    )
    .with_lease(shared.clone())
    .with_interval(flow.positions_interval);
    if let (Some(s), Some(_), true) = (&shared, &syncs_cluster, flow.emit_checkpoints.enabled) {
        // The leader checkpoints every owner's partitions exactly from these (docs/sharing.md,
        // "Exact checkpoints").
        // Named after the process, plus a random part: engines in one process (tests), or
        // containers that share a host name and process id, must not overwrite each other.
        let member = format!("{}/{:08x}", s.host(), rand::random::<u32>());
        writer = writer.with_runs(runs.clone(), member);
    }
    helpers.start(POSITIONS, "positions writer", &name, |s| writer.run(s));
    let outbox = syncs_cluster.is_some().then(|| Arc::new(Outbox::default()));
    if let (Some(o), Some(c)) = (&outbox, &syncs_cluster) {
        let (flow, c, o, m, l) = (
            flow.clone(),
            c.clone(),
            o.clone(),
            metrics.clone(),
            labels.clone(),
        );
        helpers.start(OFFSET_SYNCS, "offset syncs writer", &name, |s| {
            offset_syncs::run(flow, c, o, m, l, s)
        });
    }
    if let (Some(c), true) = (&syncs_cluster, flow.emit_checkpoints.enabled) {
        let task = CheckpointTask {
            flow: flow.clone(),
            source: source.clone(),
            target: target.clone(),
            syncs_cluster: c.clone(),
            metrics: metrics.clone(),
            labels: labels.clone(),
            runs: runs.clone(),
            positions_topic: positions_topic.clone(),
            claims: process.claims.clone(),
            loop_guard: loop_guard.clone(),
        };
        let leader = leader.clone();
        helpers.start(CHECKPOINTS, "checkpoints", &name, |s| {
            sharing::while_leader(leader, s, move |s| task.clone().run(s))
        });
    }
    let slots = exactly_once_slots(flow, &shared, &target, metrics, labels, helpers);
    let (slots_failed, slots_failure) = match &slots {
        Some(k) => (k.failed.clone(), k.failure.clone()),
        None => (Shutdown::default(), Arc::default()),
    };
    // At-least-once: a starting partition finds what the target holds past its stored
    // position through the newest offset sync. Exactly-once needs none.
    let resume = match (&syncs_cluster, &slots) {
        (Some(c), None) if flow.resume_from_target => {
            Some(Arc::new(crate::engine::partition::resume::SyncIndex::new(
                c.clone(),
                flow.offset_syncs_topic().0,
            )))
        }
        _ => None,
    };
    let ctx = Arc::new(Context {
        waiting: Arc::default(),
        interruptions: crate::engine::interruptions::Interruptions::new(
            crate::engine::interruptions::QUIET,
        ),
        loop_guard,
        own_copies,
        resume,
        schemas,
        slots: slots.as_ref().map(|k| k.table.clone()),
        lease: shared.clone(),
        flow: flow.clone(),
        source: source.clone(),
        target: target.clone(),
        producer,
        board,
        offset_syncs: outbox,
        runs,
        metrics: metrics.clone(),
        labels: labels.clone(),
        limiters: limiters(flow, metrics, labels, &process),
        fetcher: Arc::new(Fetcher::start(
            source.clone(),
            FetcherConfig::from_tuning(
                &flow.clients.consumer_tuning,
                usize::try_from(flow.clients.producer_tuning.buffer_memory).unwrap_or(0),
            ),
        )),
    });
    {
        let (f, p, m, l) = (
            ctx.fetcher.clone(),
            ctx.producer.clone(),
            metrics.clone(),
            labels.clone(),
        );
        helpers.start(CLIENT_METRICS, "client metrics", &name, |s| {
            crate::engine::client_metrics::export(f, p, m, l, s)
        });
        let ends = crate::engine::waiting::SourceEnds {
            source: source.clone(),
            isolation: flow.clients.consumer_tuning.isolation_level,
            start_at: crate::engine::waiting::start_at(flow.start),
        };
        let (w, id, m, l) = (
            ctx.waiting.clone(),
            flow.id.clone(),
            metrics.clone(),
            labels.clone(),
        );
        helpers.start(CLIENT_METRICS, "waiting partitions", &name, |s| {
            crate::engine::waiting::monitor(w, ends, id, m, l, s)
        });
    }
    let replicated: Replicated = Arc::default();
    start_leader_work(
        flow,
        &source,
        &target,
        &replicated,
        metrics,
        labels,
        &process,
        &leader,
        helpers,
    );
    let mut control = Control::new(
        ctx,
        replicated,
        stored,
        shared,
        slots,
        shutdown,
        process.claims,
    );
    if control.sharing.is_none() {
        if let Some(k) = &mut control.slots {
            for i in 0..k.table.count() {
                if !k.acquire(i, shutdown).await {
                    break;
                }
            }
            // Read again now that the ids are fenced: a commit the last holder had sent just
            // before it died completes during the fence, after the positions read at setup.
            // (Partitions of a slot not taken are not started.)
            control.load_positions(|_| true).await;
        }
    }
    // With sharing, the first topic refresh only finds the flow's partitions (nothing is
    // assigned yet); then this process joins the flow's group.
    let (events_tx, events) = mpsc::channel::<Event>(1);
    match control.sharing.as_ref().map(|a| a.shared.clone()) {
        Some(shared) => {
            control.reconcile().await;
            let membership = Membership {
                target: target.clone(),
                config: sharing::group_config(flow),
                shared,
                events: events_tx,
                leader: leader_tx,
                flow: name.clone(),
                metrics: metrics.clone(),
                labels: labels.clone(),
            };
            helpers.start(MEMBERSHIP, "membership", &name, |s| membership.run(s));
        }
        None => drop((events_tx, leader_tx)),
    }
    let mut serving = Serving {
        events,
        slots_failed,
        slots_failure,
    };
    let refused = serving
        .serve(&mut control, flow, shutdown, helpers, &source, &target)
        .await;
    helpers.stop(LEADER_WORK).await;
    control.stop_all().await;
    // After the partitions: their last commit (what they handed in while stopping) comes first.
    if let Some(k) = &mut control.slots {
        k.release_all().await;
    }
    // Leaves the group once every partition is drained and its position stored: the others
    // take over at once, from those positions.
    if control.sharing.is_some() && !control.ctx.board.flushed(sharing::HANDOVER_FLUSH).await {
        tracing::warn!(flow = %name, "positions not stored before leaving the flow's group; the next owners may copy some records again");
    }
    // The membership may be waiting for an answer to an assignment: nobody answers now.
    drop(serving);
    helpers.stop(MEMBERSHIP).await;
    control.ctx.fetcher.shutdown().await;
    for stage in [
        CLIENT_METRICS,
        POSITIONS,
        OFFSET_SYNCS,
        CHECKPOINTS,
        SCHEMAS,
    ] {
        helpers.stop(stage).await;
    }
    match refused {
        Some(reason) => Err(EngineError::Refused { flow: name, reason }),
        None => Ok(()),
    }
}

/// What the control loop waits on besides its refresh timer.
struct Serving {
    /// The flow group's assignments (with sharing).
    events: mpsc::Receiver<Event>,
    /// Exactly-once: a slot gave up, and why.
    slots_failed: Shutdown,
    slots_failure: Arc<Mutex<Option<String>>>,
}

impl Serving {
    /// The control loop: a topic refresh every `refresh.topics.interval.seconds` (sooner while
    /// a topic is skipped after an error), and the group's assignments as they come. Returns
    /// why the flow was refused, if it was.
    async fn serve(
        &mut self,
        control: &mut Control,
        flow: &FlowConfig,
        shutdown: &Shutdown,
        helpers: &Supervisor,
        source: &KafkaCluster,
        target: &KafkaCluster,
    ) -> Option<String> {
        let name = flow.id.to_string();
        let mut refused = None;
        // A topic skipped after an error (a CreateTopics that timed out while the target broker
        // was busy creating thousands of logs, a metadata failure) is tried again after 5 s,
        // doubling to a minute, rather than after the whole refresh interval: MM2's default is
        // 10 minutes, and with refreshes off it would never be tried again.
        let mut retry = RETRY_SKIPPED;
        loop {
            let metrics = control.ctx.metrics.clone();
            metrics.process.round_started(&name);
            control.reconcile().await;
            metrics.process.round_ended(&name);
            metrics
                .rounds
                .get_or_create(&control.ctx.labels.round("topic_refresh"))
                .inc();
            let settled = control.reported.is_empty() && control.missing.is_empty();
            let pause = match (settled, flow.refresh_topics.enabled) {
                (true, true) => {
                    retry = RETRY_SKIPPED;
                    flow.refresh_topics.interval
                }
                // Refreshes off: no periodic discovery, but the group's assignments are still
                // served (a shared flow waiting here copied nothing); the topics are looked up
                // again only when an assignment changes.
                (true, false) => Duration::from_secs(86_400),
                (false, enabled) => {
                    let pause = if enabled {
                        retry.min(flow.refresh_topics.interval)
                    } else {
                        retry
                    };
                    retry = (retry * 2).min(Duration::from_secs(60));
                    pause
                }
            };
            let stopped = tokio::select! {
                s = shutdown.sleep(pause) => s,
                _ = helpers.failed() => true,
                _ = self.slots_failed.wait() => {
                    refused = self.slots_failure.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    true
                }
                Some(event) = self.events.recv() => {
                    match event {
                        Event::Assigned { partitions, done } => {
                            control.apply(partitions).await;
                            control.publish_share();
                            let _ = done.send(());
                        }
                        Event::Lost { done } => {
                            control.lose().await;
                            control.publish_share();
                            let _ = done.send(());
                        }
                        Event::Refused(reason) => refused = Some(reason),
                    }
                    refused.is_some()
                }
            };
            if stopped {
                return refused;
            }
            if let Err(e) = source.refresh_metadata(None).await {
                control.report("*", ErrorKind::Metadata, &e);
                continue;
            }
            control.reported.remove("*");
            let _ = target.refresh_metadata(None).await;
        }
    }
}

/// Loop prevention: every producer id the target hands this flow is registered there before it
/// writes (the hook runs inside each InitProducerId), and the batches kmirror copied into the
/// source from the target are left out (docs/topologies.md, "Identity names both ways").
/// Returns the source's guard and the target's (its own copies, for the resume walk).
fn loop_guards(
    flow: &FlowConfig,
    source: &Arc<KafkaCluster>,
    target: &Arc<KafkaCluster>,
    metrics: &Metrics,
    labels: &FlowLabels,
) -> (Option<Arc<LoopGuard>>, Option<Arc<LoopGuard>>) {
    if !flow.loop_prevention {
        return (None, None);
    }
    let (source_id, target_id) = (
        source.metadata().cluster_id.clone(),
        target.metadata().cluster_id.clone(),
    );
    let registered = metrics
        .producer_ids_registered
        .get_or_create(labels)
        .clone();
    Registrar::install(target, flow, source_id.clone(), registered);
    (
        Some(Arc::new(LoopGuard::new(
            source.clone(),
            &flow.id.target,
            target_id.as_deref(),
        ))),
        Some(Arc::new(LoopGuard::new(
            target.clone(),
            &flow.id.source,
            source_id.as_deref(),
        ))),
    )
}

/// The flow's setup. Transient failures (a broker restarting, a coordinator loading) are
/// retried with backoff; only what retrying cannot fix ends the flow. None when stopped first.
async fn setup_retrying(
    flow: &FlowConfig,
    target: &Arc<KafkaCluster>,
    shutdown: &Shutdown,
    metrics: &Metrics,
    labels: &FlowLabels,
) -> Result<Option<Setup>, KafkaError> {
    let mut attempt = 0;
    loop {
        match setup(flow, target).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                let wait = crate::engine::backoff(attempt);
                attempt += 1;
                FlowSetupFailed {
                    flow: &flow.id,
                    error: &e,
                    retry_in: wait,
                }
                .emit(Emitter { metrics, labels });
                if shutdown.sleep(wait).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// With sharing: what the membership and the flow share (exactly-once: the group assigns
/// slots, transactional ids, each with its partitions).
fn sharing_state(flow: &FlowConfig) -> Option<Arc<Shared>> {
    flow.sharing.enabled.then(|| {
        let settings =
            sharing::assign::settings_digest(&serde_json::to_value(flow).unwrap_or_default());
        let shared = Shared::new(
            settings,
            flow.sharing.session_timeout,
            flow.sharing.rebalance_timeout,
        );
        Arc::new(match flow.exactly_once {
            ExactlyOnce::Disabled => shared,
            _ => shared.with_slots(),
        })
    })
}

/// Exactly-once: the slots this process holds, each a transactional producer (its
/// InitProducerId fences whoever held the id before, a killed kmirror or MM2, and aborts what it
/// left open) with a committer. With sharing the group assigns them; alone, this process takes
/// them all before it starts any partition. A slot that fails stops the flow.
fn exactly_once_slots(
    flow: &FlowConfig,
    shared: &Option<Arc<Shared>>,
    target: &Arc<KafkaCluster>,
    metrics: &Arc<Metrics>,
    labels: &FlowLabels,
    helpers: &Supervisor,
) -> Option<SlotKeeper> {
    if flow.exactly_once == ExactlyOnce::Disabled {
        return None;
    }
    let t = &flow.transactions;
    tracing::info!(flow = %flow.id, slots = t.slots, ids = %t.id_range(), interval_ms = t.interval.as_millis() as u64, shared = shared.is_some(), "exactly-once: data and positions are committed together");
    let committer = Committer {
        lease: shared.clone(),
        flow: flow.id.to_string(),
        interval: t.interval,
        max_bytes: t.max_bytes,
        timeout: t.timeout,
        slots: t.slots,
        target: target.clone(),
        positions_topic: flow.internal.positions_topic.clone(),
        source_alias: flow.id.source.to_string(),
        metrics: metrics.clone(),
        labels: labels.clone(),
    };
    Some(SlotKeeper::new(t, committer, helpers.clone()))
}

/// The flow's and the process's rate limits, paid by each partition for each response.
fn limiters(
    flow: &FlowConfig,
    metrics: &Metrics,
    labels: &FlowLabels,
    process: &ProcessShared,
) -> Vec<Arc<RateLimiter>> {
    metrics
        .rate_limit
        .get_or_create(labels)
        .set(flow.rate_limit.map_or(0, |l| l as i64));
    let own = flow.rate_limit.map(|l| {
        let waited = metrics.throttled_ms.get_or_create(labels).clone();
        Arc::new(RateLimiter::new(l, waited))
    });
    own.into_iter().chain(process.limiter.clone()).collect()
}

/// The group leader's work: topic config and ACL sync, and (exactly-once) aborting what
/// transactional ids above the slot count left open.
#[allow(clippy::too_many_arguments)]
fn start_leader_work(
    flow: &FlowConfig,
    source: &Arc<KafkaCluster>,
    target: &Arc<KafkaCluster>,
    replicated: &Replicated,
    metrics: &Arc<Metrics>,
    labels: &FlowLabels,
    process: &ProcessShared,
    leader: &watch::Receiver<bool>,
    helpers: &Supervisor,
) {
    let name = flow.id.to_string();
    if flow.sync_topic_configs.enabled || flow.sync_topic_acls.enabled {
        let task = TopicSync {
            flow: flow.clone(),
            source: source.clone(),
            target: target.clone(),
            replicated: replicated.clone(),
            metrics: metrics.clone(),
            labels: labels.clone(),
            claims: process.claims.clone(),
        };
        let leader = leader.clone();
        helpers.start(LEADER_WORK, "topic sync", &name, |s| {
            sharing::while_leader(leader, s, move |s| task.clone().run(s))
        });
    }
    if flow.exactly_once != ExactlyOnce::Disabled {
        let t = &flow.transactions;
        let task = Orphans {
            flow: name.clone(),
            target: target.clone(),
            prefix: t.transactional_id_prefix.clone(),
            slots: t.slots,
            timeout: t.timeout,
            metrics: metrics.clone(),
            labels: labels.clone(),
        };
        let leader = leader.clone();
        helpers.start(LEADER_WORK, "orphan transactions", &name, |s| {
            sharing::while_leader(leader, s, move |s| task.clone().run(s))
        });
    }
}

/// What a flow loads before it copies anything.
struct Setup {
    stored: positions::Stored,
    producer: Arc<IdempotentProducer>,
    /// The cluster of the offset-syncs topic, when syncs are emitted.
    syncs_cluster: Option<Arc<KafkaCluster>>,
}

async fn setup(flow: &FlowConfig, target: &Arc<KafkaCluster>) -> Result<Setup, KafkaError> {
    // Positions topic (MM2's Connect offsets topic) and the positions stored in it.
    let positions_topic = &flow.internal.positions_topic;
    if !target.metadata().topics.contains_key(positions_topic) {
        remote_topics::create_internal(
            target,
            NewTopic {
                name: positions_topic.clone(),
                partitions: flow.internal.positions_partitions,
                replication_factor: flow.internal.positions_replication_factor,
                configs: positions::topic_configs(),
            },
        )
        .await?;
    }
    let stored = positions::load(target, positions_topic, flow.id.source.as_str()).await?;
    let producer = IdempotentProducer::new(target.clone()).await?;
    // Offset syncs, written where offset-syncs.topic.location says (the source by default).
    let syncs_cluster = if flow.internal.emit_offset_syncs {
        let (_, side) = flow.offset_syncs_topic();
        Some(match side {
            Side::Target => target.clone(),
            Side::Source => {
                Arc::new(KafkaCluster::connect(flow.clients.offset_syncs_producer.clone()).await?)
            }
        })
    } else {
        None
    };
    Ok(Setup {
        stored,
        producer,
        syncs_cluster,
    })
}
