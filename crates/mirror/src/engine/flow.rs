//! One flow A->B: connect (retrying an unreachable cluster with backoff), refuse the same cluster
//! twice, load positions, then a control loop that discovers topics every
//! `refresh.topics.interval.seconds`, creates or grows remote topics and starts one task per new
//! source partition. A topic that cannot be created is reported and skipped while the others
//! continue, and tried again within a minute; a partition that fails for good stops alone.
//!
//! Why one file of this size: `replicate` starts the flow's helper tasks, runs the control loop
//! and stops them in an order that matters (leader tasks, partitions, slots, group, fetcher,
//! writers), so start and stop read together, and its loop uses `Control`'s private fields.
//! Next to split out: `Control` and its methods (`reconcile`, `apply`, `lose`) into its own file.

use super::checkpoints::CheckpointTask;
use super::heartbeats;
use super::offset_syncs::{self, Outbox};
use super::orphans::Orphans;
use super::partition::{Context, PartitionTask, Stopped};
use super::positions::{self, Board, Writer};
use super::remote_topics::{self, Ensured};
use super::sharing::{self, assign, Event, Membership, Shared};
use super::slot_keeper::SlotKeeper;
use super::slots::Committer;
use super::topic_sync::{Replicated, TopicSync};
use super::{EngineError, Helpers, Shutdown};
use crate::config::model::{ExactlyOnce, FlowConfig, Side};
use crate::discovery;
use crate::events::{
    ClusterUnreachable, Emitter, Event as _, FlowSetupFailed, PositionsUnreadable,
    SourceTopicDeleted, SourceTopicRecreated, TopicConflict, TopicSkipped,
};
use crate::metrics::ErrorKind;
use crate::metrics::{FlowLabels, Metrics};
use crate::offsets::runs::Runs;
use kmirror_kafka::cluster::{topic_id_text, KafkaCluster, NewTopic, TopicId};
use kmirror_kafka::fetcher::{Fetcher, FetcherConfig};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

struct Running {
    stop: Shutdown,
    task: JoinHandle<Result<(), Stopped>>,
}

/// The first wait before a skipped topic is tried again (see `replicate`).
const RETRY_SKIPPED: Duration = Duration::from_secs(5);

pub(super) async fn run(
    flow: FlowConfig,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    process: super::ProcessShared,
) -> Result<(), EngineError> {
    let name = flow.id.to_string();
    let labels = flow_labels(&flow);
    // Not ready until both clusters answer.
    let connected = metrics.connected_gauge(&labels);
    connected.set(0);
    let Some((source, target)) = connect(&flow, &shutdown, &metrics, &labels).await? else {
        return Ok(());
    };
    let helpers = Helpers::default();
    let probe_stop = Shutdown::default();
    let probe = helpers.spawn(
        "cluster probe",
        &name,
        crate::status::probe(
            vec![source.clone(), target.clone()],
            connected,
            probe_stop.clone(),
        ),
    );
    // With sharing, the flow's control work (heartbeats, checkpoints, topic sync) runs on the
    // group's leader only; alone, this process is always the leader.
    let shared = flow.replication && flow.sharing.enabled;
    let (leader_tx, leader) = watch::channel(!shared);
    let heartbeats = flow.emit_heartbeats.enabled.then(|| {
        let stop = Shutdown::default();
        let (flow, target, metrics, labels) = (
            flow.clone(),
            target.clone(),
            metrics.clone(),
            labels.clone(),
        );
        let task = helpers.spawn(
            "heartbeats",
            &name,
            sharing::while_leader(leader.clone(), stop.clone(), move |s| {
                heartbeats::emit(
                    flow.clone(),
                    target.clone(),
                    metrics.clone(),
                    labels.clone(),
                    s,
                )
            }),
        );
        (stop, task)
    });
    let result = if flow.replication {
        replicate(
            &flow,
            (source, target),
            &shutdown,
            &metrics,
            process,
            &helpers,
            (leader_tx, leader),
        )
        .await
    } else {
        tokio::select! {
            _ = shutdown.wait() => {}
            _ = helpers.failed() => {}
        }
        Ok(())
    };
    if let Some((stop, task)) = heartbeats {
        stop.trigger();
        let _ = task.await;
    }
    probe_stop.trigger();
    let _ = probe.await;
    tracing::info!(flow = %name, "flow stopped");
    match helpers.failure() {
        Some((task, message)) => Err(EngineError::Panicked {
            flow: name,
            task,
            message,
        }),
        None => result,
    }
}

fn flow_labels(flow: &FlowConfig) -> FlowLabels {
    FlowLabels {
        source: flow.id.source.to_string().into(),
        target: flow.id.target.to_string().into(),
    }
}

/// Connects to both clusters, retrying transient failures with backoff until shutdown.
/// None when shut down first.
async fn connect(
    flow: &FlowConfig,
    shutdown: &Shutdown,
    metrics: &Metrics,
    labels: &FlowLabels,
) -> Result<Option<(Arc<KafkaCluster>, Arc<KafkaCluster>)>, EngineError> {
    let name = flow.id.to_string();
    let mut attempt = 0;
    loop {
        let pair = async {
            let s = KafkaCluster::connect(flow.clients.source_consumer.clone()).await;
            let s = s.map_err(|e| (flow.id.source.to_string(), e))?;
            let t = KafkaCluster::connect(flow.clients.target_producer.clone()).await;
            let t = t.map_err(|e| (flow.id.target.to_string(), e))?;
            Ok::<_, (String, KafkaError)>((s, t))
        }
        .await;
        match pair {
            Ok((s, t)) => {
                let (a, b) = (
                    s.metadata().cluster_id.clone(),
                    t.metadata().cluster_id.clone(),
                );
                if let (Some(a), Some(b)) = (&a, &b) {
                    if a == b {
                        return Err(EngineError::SameCluster {
                            flow: name,
                            cluster_id: a.clone(),
                        });
                    }
                }
                tracing::info!(flow = %name, source_cluster = ?a, target_cluster = ?b, "flow started");
                return Ok(Some((Arc::new(s), Arc::new(t))));
            }
            Err((cluster, e)) if e.is_retriable() => {
                let wait = super::backoff(attempt);
                attempt += 1;
                ClusterUnreachable {
                    flow: &flow.id,
                    cluster: &cluster,
                    error: &e,
                    retry_in: wait,
                }
                .emit(Emitter { metrics, labels });
                if shutdown.sleep(wait).await {
                    return Ok(None);
                }
            }
            Err((_, source)) => return Err(EngineError::Kafka { flow: name, source }),
        }
    }
}

async fn replicate(
    flow: &FlowConfig,
    (source, target): (Arc<KafkaCluster>, Arc<KafkaCluster>),
    shutdown: &Shutdown,
    metrics: &Arc<Metrics>,
    process: super::ProcessShared,
    helpers: &Helpers,
    (leader_tx, leader): (watch::Sender<bool>, watch::Receiver<bool>),
) -> Result<(), EngineError> {
    let name = flow.id.to_string();
    let labels = &flow_labels(flow);
    let k = |source| EngineError::Kafka {
        flow: name.clone(),
        source,
    };
    let positions_topic = flow.internal.positions_topic.clone();
    // Loop prevention: every producer id the target hands this flow is registered there before
    // it writes (the hook runs inside each InitProducerId), and the batches kmirror copied into
    // the source from the target are left out (docs/topologies.md, "Identity names both ways").
    let loop_guard = flow.loop_prevention.then(|| {
        let (source_id, target_id) = (
            source.metadata().cluster_id.clone(),
            target.metadata().cluster_id.clone(),
        );
        super::loop_guard::Registrar::install(
            &target,
            flow,
            source_id.clone(),
            metrics
                .producer_ids_registered
                .get_or_create(labels)
                .clone(),
        );
        let guard = super::loop_guard::LoopGuard::new;
        (
            Arc::new(guard(source.clone(), &flow.id.target, target_id.as_deref())),
            Arc::new(guard(target.clone(), &flow.id.source, source_id.as_deref())),
        )
    });
    let (loop_guard, own_copies) = match loop_guard {
        Some((s, t)) => (Some(s), Some(t)),
        None => (None, None),
    };
    // Transient failures here (a broker restarting, a coordinator loading) are retried with
    // backoff; only what retrying cannot fix ends the flow.
    let mut attempt = 0;
    let Setup {
        stored,
        producer,
        syncs_cluster,
    } = loop {
        match setup(flow, &target).await {
            Ok(s) => break s,
            Err(e) if e.is_retriable() || e.is_stale_metadata() => {
                let wait = super::backoff(attempt);
                attempt += 1;
                FlowSetupFailed {
                    flow: &flow.id,
                    error: &e,
                    retry_in: wait,
                }
                .emit(Emitter { metrics, labels });
                if shutdown.sleep(wait).await {
                    return Ok(());
                }
            }
            Err(e) => return Err(k(e)),
        }
    };
    let shared = flow.sharing.enabled.then(|| {
        let settings =
            sharing::assign::settings_digest(&serde_json::to_value(flow).unwrap_or_default());
        let shared = Shared::new(
            settings,
            flow.sharing.session_timeout,
            flow.sharing.rebalance_timeout,
        );
        // Exactly-once: the group assigns slots (transactional ids), each with its partitions.
        Arc::new(match flow.exactly_once {
            ExactlyOnce::Disabled => shared,
            _ => shared.with_slots(),
        })
    });
    let board = Arc::new(Board::default());
    let runs = Arc::new(Mutex::new(Runs::default()));
    let writer_stop = Shutdown::default();
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
    let writer = helpers.spawn("positions writer", &name, writer.run(writer_stop.clone()));
    let outbox = syncs_cluster.is_some().then(|| Arc::new(Outbox::default()));
    let syncs_stop = Shutdown::default();
    let syncs_writer = match (&outbox, &syncs_cluster) {
        (Some(o), Some(c)) => Some(helpers.spawn(
            "offset syncs writer",
            &name,
            offset_syncs::run(
                flow.clone(),
                c.clone(),
                o.clone(),
                metrics.clone(),
                labels.clone(),
                syncs_stop.clone(),
            ),
        )),
        _ => None,
    };
    let checkpoints_stop = Shutdown::default();
    let checkpoints = match &syncs_cluster {
        Some(c) if flow.emit_checkpoints.enabled => {
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
            Some(helpers.spawn(
                "checkpoints",
                &name,
                sharing::while_leader(leader.clone(), checkpoints_stop.clone(), move |s| {
                    task.clone().run(s)
                }),
            ))
        }
        _ => None,
    };
    // Exactly-once: the slots this process holds, each a transactional producer (its
    // InitProducerId fences whoever held the id before, a killed kmirror or MM2, and aborts what
    // it left open) with a committer. With sharing the group assigns them; alone, this process
    // takes them all before it starts any partition. A slot that fails stops the flow.
    let slots = (flow.exactly_once != ExactlyOnce::Disabled).then(|| {
        let t = &flow.transactions;
        tracing::info!(flow = %name, slots = t.slots, ids = %t.id_range(), interval_ms = t.interval.as_millis() as u64, shared = shared.is_some(), "exactly-once: data and positions are committed together");
        let committer = Committer {
            lease: shared.clone(),
            flow: name.clone(),
            interval: t.interval,
            max_bytes: t.max_bytes,
            timeout: t.timeout,
            slots: t.slots,
            target: target.clone(),
            positions_topic: positions_topic.clone(),
            source_alias: flow.id.source.to_string(),
            metrics: metrics.clone(),
            labels: labels.clone(),
        };
        SlotKeeper::new(t, committer, helpers.clone())
    });
    let (slots_failed, slots_failure) = match &slots {
        Some(k) => (k.failed.clone(), k.failure.clone()),
        None => (Shutdown::default(), Arc::default()),
    };
    // At-least-once: a starting partition finds what the target holds past its stored
    // position through the newest offset sync. Exactly-once needs none.
    let resume = match (&syncs_cluster, &slots) {
        (Some(c), None) if flow.resume_from_target => Some(Arc::new(
            super::resume::SyncIndex::new(c.clone(), flow.offset_syncs_topic().0),
        )),
        _ => None,
    };
    let ctx = Arc::new(Context {
        interruptions: super::interruptions::Interruptions::new(super::interruptions::QUIET),
        loop_guard,
        own_copies,
        resume,
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
        limiters: {
            metrics
                .rate_limit
                .get_or_create(labels)
                .set(flow.rate_limit.map_or(0, |l| l as i64));
            let own = flow.rate_limit.map(|l| {
                let waited = metrics.throttled_ms.get_or_create(labels).clone();
                Arc::new(super::throttle::RateLimiter::new(l, waited))
            });
            own.into_iter().chain(process.limiter.clone()).collect()
        },
        fetcher: Arc::new(Fetcher::start(
            source.clone(),
            FetcherConfig::from_tuning(
                &flow.clients.consumer_tuning,
                usize::try_from(flow.clients.producer_tuning.buffer_memory).unwrap_or(0),
            ),
        )),
    });
    let client_metrics_stop = Shutdown::default();
    let client_metrics = helpers.spawn(
        "client metrics",
        &name,
        super::client_metrics::export(
            ctx.fetcher.clone(),
            ctx.producer.clone(),
            metrics.clone(),
            labels.clone(),
            client_metrics_stop.clone(),
        ),
    );
    let replicated: Replicated = Arc::default();
    let sync_stop = Shutdown::default();
    let topic_sync = (flow.sync_topic_configs.enabled || flow.sync_topic_acls.enabled).then(|| {
        let task = TopicSync {
            flow: flow.clone(),
            source: source.clone(),
            target: target.clone(),
            replicated: replicated.clone(),
            metrics: metrics.clone(),
            labels: labels.clone(),
            claims: process.claims.clone(),
        };
        helpers.spawn(
            "topic sync",
            &name,
            sharing::while_leader(leader.clone(), sync_stop.clone(), move |s| {
                task.clone().run(s)
            }),
        )
    });
    // Exactly-once: the leader aborts what ids above the slot count left open.
    let orphans = (flow.exactly_once != ExactlyOnce::Disabled).then(|| {
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
        helpers.spawn(
            "orphan transactions",
            &name,
            sharing::while_leader(leader.clone(), sync_stop.clone(), move |s| {
                task.clone().run(s)
            }),
        )
    });
    let mut control = Control {
        ctx,
        replicated,
        started: HashSet::new(),
        missing: HashSet::new(),
        stored: stored.positions,
        running: BTreeMap::new(),
        // The logs the stored positions belong to: a topic whose id differs in the first
        // metadata answer was re-created while kmirror was stopped (`recreated`).
        topic_ids: stored.logs,
        reported: HashMap::new(),
        first_round: true,
        announced: HashMap::new(),
        remembered: HashMap::new(),
        sharing: shared.map(|shared| Assigned {
            shared,
            partitions: BTreeSet::new(),
        }),
        slots,
        shutdown: shutdown.clone(),
        claims: process.claims,
        conflicts: HashSet::new(),
    };
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
    let (events_tx, mut events) = mpsc::channel::<Event>(1);
    let membership_stop = Shutdown::default();
    let membership = match control.sharing.as_ref().map(|a| a.shared.clone()) {
        Some(shared) => {
            control.reconcile().await;
            Some(
                helpers.spawn(
                    "membership",
                    &name,
                    Membership {
                        target: target.clone(),
                        config: sharing::group_config(flow),
                        shared,
                        events: events_tx,
                        leader: leader_tx,
                        flow: name.clone(),
                        metrics: metrics.clone(),
                        labels: labels.clone(),
                    }
                    .run(membership_stop.clone()),
                ),
            )
        }
        None => {
            drop((events_tx, leader_tx));
            None
        }
    };
    let mut refused = None;
    // A topic skipped after an error (a CreateTopics that timed out while the target broker was
    // busy creating thousands of logs, a metadata failure) is tried again after 5 s, doubling to
    // a minute, rather than after the whole refresh interval: MM2's default is 10 minutes, and
    // with refreshes off it would never be tried again.
    let mut retry = RETRY_SKIPPED;
    loop {
        metrics.round_started(&name);
        control.reconcile().await;
        metrics.round_ended(&name);
        control
            .ctx
            .metrics
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
            _ = slots_failed.wait() => {
                refused = slots_failure.lock().unwrap_or_else(|p| p.into_inner()).clone();
                true
            }
            Some(event) = events.recv() => {
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
            break;
        }
        if let Err(e) = source.refresh_metadata(None).await {
            control.report("*", ErrorKind::Metadata, &e);
            continue;
        }
        control.reported.remove("*");
        let _ = target.refresh_metadata(None).await;
    }
    sync_stop.trigger();
    if let Some(t) = topic_sync {
        let _ = t.await;
    }
    if let Some(t) = orphans {
        let _ = t.await;
    }
    control.stop_all().await;
    // After the partitions: their last commit (what they handed in while stopping) comes first.
    if let Some(k) = &mut control.slots {
        k.release_all().await;
    }
    // Leaves the group once every partition is drained and its position stored: the others
    // take over at once, from those positions.
    if membership.is_some() && !control.ctx.board.flushed(sharing::HANDOVER_FLUSH).await {
        tracing::warn!(flow = %name, "positions not stored before leaving the flow's group; the next owners may copy some records again");
    }
    membership_stop.trigger();
    if let Some(m) = membership {
        // The membership may be waiting for an answer to an assignment: nobody answers now.
        drop(events);
        let _ = m.await;
    }
    control.ctx.fetcher.shutdown().await;
    client_metrics_stop.trigger();
    let _ = client_metrics.await;
    writer_stop.trigger();
    let _ = writer.await;
    syncs_stop.trigger();
    if let Some(w) = syncs_writer {
        let _ = w.await;
    }
    checkpoints_stop.trigger();
    if let Some(c) = checkpoints {
        let _ = c.await;
    }
    match refused {
        Some(reason) => Err(EngineError::Refused { flow: name, reason }),
        None => Ok(()),
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

struct Control {
    ctx: Arc<Context>,
    /// Source → remote topic of every topic being replicated (read by topic sync).
    replicated: Replicated,
    /// Partitions started before in this flow (a restarted one needs its own producer id).
    started: HashSet<(String, i32)>,
    /// Topics with running tasks that the last metadata answer did not list (see `reconcile`).
    missing: HashSet<String>,
    stored: HashMap<(String, i32), i64>,
    running: BTreeMap<(String, i32), Running>,
    topic_ids: HashMap<String, TopicId>,
    /// The last error reported per topic, so a failure repeating every refresh is logged once.
    reported: HashMap<String, String>,
    first_round: bool,
    /// Sharing: the last acknowledged offsets of partitions this process stopped when it lost
    /// its membership (see `lose`).
    remembered: HashMap<(String, i32), i64>,
    /// Topics whose replication was logged, with their partition count then (with sharing, a
    /// topic may have no partition in this process).
    announced: HashMap<String, i32>,
    /// With sharing: what the membership shares, and the partitions assigned to this process
    /// (only those are started); the slots assigned, for exactly-once flows.
    sharing: Option<Assigned>,
    /// Exactly-once: the slots held (only their partitions are started).
    slots: Option<SlotKeeper>,
    /// The flow's shutdown (taking a slot retries until it).
    shutdown: Shutdown,
    /// The remote topics every flow of this process writes (`remote_claims`).
    claims: Arc<super::remote_claims::RemoteClaims>,
    /// Source topics skipped because another flow writes their remote name (reported once).
    conflicts: HashSet<String>,
}

/// With sharing: what the membership and the control loop share, and the partitions assigned
/// to this process.
struct Assigned {
    shared: Arc<Shared>,
    partitions: BTreeSet<(String, i32)>,
}

impl Control {
    /// Brings the running partition tasks in line with the source's topics.
    async fn reconcile(&mut self) {
        let ctx = self.ctx.clone();
        let flow = &ctx.flow;
        let md = ctx.source.metadata();
        let mut decisions = discovery::decide(flow, md.topics.keys().map(String::as_str));
        // A skipped topic that was deleted or is no longer selected has nothing left to retry.
        let selected: HashSet<&str> = decisions
            .iter()
            .filter(|d| d.remote.is_some())
            .map(|d| d.source.as_str())
            .collect();
        self.reported
            .retain(|t, _| t == "*" || selected.contains(t.as_str()));
        for d in &mut decisions {
            let Some(remote) = &d.remote else { continue };
            let target = flow.id.target.to_string();
            if let Err(held) = self
                .claims
                .claim(&target, remote, &flow.id.to_string(), &d.source)
            {
                let e = KafkaError::Config(format!(
                    "remote topic {remote} on {target} is written by flow {} (its topic {}) already: two flows cannot write one remote topic, their records and positions would mix (IdentityReplicationPolicy fan-in); exclude the topic from one flow's topics, rename it in one (kmirror.topics.rename), or use DefaultReplicationPolicy",
                    held.flow, held.source_topic
                ));
                // Logged and counted once per conflict; kept out of `reported`, which
                // holds retriable problems (and shortens the topic refresh while any is).
                if self.conflicts.insert(d.source.clone()) {
                    TopicConflict {
                        flow: &flow.id,
                        topic: &d.source,
                        error: &e,
                    }
                    .emit(ctx.emitter());
                }
                d.remote = None;
            }
        }
        // A source topic deleted (gone from the metadata): its tasks would ask for its
        // partitions forever. They stop and store their positions; the remote topic
        // keeps what was copied. Re-created under the same name, it is copied from its start
        // (`recreated`, since its topic id changed).
        // Missing from two metadata answers 5 s apart: a broker that just restarted may answer
        // before its metadata cache is complete, and one answer is not enough to stop a topic.
        let missing_now: HashSet<String> = self
            .running
            .keys()
            .map(|(t, _)| t)
            .filter(|t| !md.topics.contains_key(*t))
            .cloned()
            .collect();
        let gone: Vec<(String, i32)> = self
            .running
            .keys()
            .filter(|(t, _)| missing_now.contains(t) && self.missing.contains(t))
            .cloned()
            .collect();
        self.missing = missing_now;
        let mut stopped_topics = BTreeSet::new();
        for key in gone {
            if let Some(r) = self.running.remove(&key) {
                r.stop.trigger();
                let _ = r.task.await;
            }
            stopped_topics.insert(key.0);
        }
        for topic in stopped_topics {
            self.announced.remove(&topic);
            SourceTopicDeleted {
                flow: &flow.id,
                topic: &topic,
            }
            .emit(ctx.emitter());
        }
        let (mut topics, mut partitions) = (0, 0);
        let mut eligible = BTreeSet::new();
        // New remote topics are created together first (the loop below then finds them).
        let wanted: Vec<(String, String, i32)> = decisions
            .iter()
            .filter_map(|d| {
                let t = md.topics.get(&d.source)?;
                let ok = t.error.is_none() && !t.partitions.is_empty();
                let remote = d.remote.clone().filter(|_| ok)?;
                Some((d.source.clone(), remote, t.partitions.len() as i32))
            })
            .collect();
        // With sharing, only the group's leader creates and grows remote topics (it assigns a
        // partition only once its remote topic is in place); the others wait to see them.
        let leads = self.sharing.as_ref().is_none_or(|a| a.shared.is_leader());
        let created_now = match match leads {
            true => remote_topics::create_missing(flow, &ctx.source, &ctx.target, &wanted).await,
            false => Ok(Default::default()),
        } {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(flow = %flow.id, error = %e, "creating remote topics together failed; one at a time");
                Default::default()
            }
        };
        for d in decisions {
            let Some(remote) = d.remote else {
                if self.first_round {
                    tracing::debug!(flow = %flow.id, topic = %d.source, skip = ?d.skip, "not replicated");
                }
                continue;
            };
            let t = &md.topics[&d.source];
            if t.error.is_some() || t.partitions.is_empty() {
                continue; // still being created; next round
            }
            let n = t.partitions.len() as i32;
            // Brokers before 2.8 have no topic ids (nil): nothing to compare or record.
            let known = self.topic_ids.get(&d.source).copied();
            if !t.id.is_nil() && known != Some(t.id) {
                let forget = match known {
                    Some(old) => self.recreated(&d.source, old, t.id).await,
                    None => BTreeSet::new(),
                };
                self.ctx.board.log(&d.source, t.id, forget);
                self.topic_ids.insert(d.source.clone(), t.id);
            }
            let ensured = if leads {
                // `admin.timeout.ms` bounds one admin step, as it bounds MM2's admin calls: past
                // it the topic is reported and tried again with the other skipped ones, and the
                // topics after it are not held up.
                let ensure =
                    remote_topics::ensure(flow, &ctx.source, &ctx.target, &d.source, &remote, n);
                tokio::time::timeout(flow.admin_timeout, ensure)
                    .await
                    .unwrap_or_else(|_| {
                        Err(KafkaError::Timeout {
                            broker: format!("{} (admin.timeout.ms)", flow.id.target),
                            api: kafka_protocol::messages::ApiKey::CreateTopics,
                            after: flow.admin_timeout,
                        })
                    })
            } else if ctx.target.metadata().topics.contains_key(&remote) {
                Ok(Ensured::Exists)
            } else {
                continue; // the leader creates it; the next refresh of the target shows it
            };
            let created = match ensured {
                Ok(e) => {
                    let e = match (e, created_now.get(&remote)) {
                        (Ensured::Exists, Some(&configs)) => Ensured::Created { configs },
                        (e, _) => e,
                    };
                    let created = matches!(e, Ensured::Created { .. });
                    if self.reported.remove(&d.source).is_some() {
                        tracing::info!(flow = %flow.id, topic = %d.source, "topic recovered");
                    }
                    match e {
                        Ensured::Created { configs } => {
                            tracing::info!(flow = %flow.id, topic = %d.source, remote = %remote, partitions = n, configs, "created remote topic")
                        }
                        Ensured::Grown { from, to } => {
                            tracing::info!(flow = %flow.id, topic = %d.source, remote = %remote, from, to, "added partitions to remote topic")
                        }
                        Ensured::MorePartitions { remote: have } => {
                            if !self.running.keys().any(|(t, _)| *t == d.source) {
                                tracing::warn!(flow = %flow.id, topic = %d.source, remote = %remote, source_partitions = n, remote_partitions = have, "remote topic has more partitions than the source; records keep their partition numbers, the extra partitions stay empty");
                            }
                        }
                        Ensured::Exists => {}
                    }
                    created
                }
                Err(e) => {
                    self.report(&d.source, ErrorKind::TopicCreate, &e);
                    continue;
                }
            };
            topics += 1;
            partitions += n;
            self.replicated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(d.source.clone(), remote.clone());
            let seen = self.announced.insert(d.source.clone(), n);
            let new_topic = seen.is_none();
            if new_topic {
                tracing::info!(flow = %flow.id, topic = %d.source, remote = %remote, partitions = n, "replicating topic");
                if !created {
                    match remote_topics::cleanup_policy_mismatch(
                        &ctx.source,
                        &ctx.target,
                        &d.source,
                        &remote,
                    )
                    .await
                    {
                        Ok(Some((s, t))) => {
                            tracing::warn!(flow = %flow.id, topic = %d.source, remote = %remote, source_policy = %s, remote_policy = %t, "remote topic existed with a different cleanup.policy; records are copied, but the two topics will not keep the same records")
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(topic = %d.source, error = %e, "cannot compare cleanup.policy")
                        }
                    }
                }
            }
            for p in 0..n {
                let key = (d.source.clone(), p);
                eligible.insert(key.clone());
                if seen.is_some_and(|had| p >= had) {
                    tracing::info!(flow = %flow.id, topic = %d.source, partition = p, "replicating added partition");
                }
                if self.running.contains_key(&key) {
                    continue;
                }
                let here = match (&self.slots, &self.sharing) {
                    (Some(k), _) => k.table.owns(&key.0, key.1),
                    (None, Some(a)) => a.partitions.contains(&key),
                    (None, None) => true,
                };
                if !here {
                    continue;
                }
                self.start(key, remote.clone());
            }
        }
        match (&self.sharing, &self.slots) {
            // Exactly-once: the group shares the slots, always all of them; a new partition
            // starts wherever its slot is held, without a rebalance.
            (Some(a), Some(k)) => a
                .shared
                .set_eligible((0..k.table.count()).map(assign::slot_key).collect()),
            (Some(a), None) => {
                // A topic missing from one metadata answer is not gone yet (see above): its
                // partitions stay where they are rather than being revoked and given back.
                eligible.extend(a.shared.eligible_of(&self.missing));
                a.shared.set_eligible(eligible);
            }
            (None, _) => {}
        }
        let m = &self.ctx.metrics;
        m.flow_topics.get_or_create(&self.ctx.labels).set(topics);
        m.flow_partitions
            .get_or_create(&self.ctx.labels)
            .set(partitions as i64);
        self.publish_share();
        self.first_round = false;
    }

    /// `kmirror_topics` and `kmirror_partitions`: what this process copies now, so the values
    /// of the processes sharing a flow add up to the flow's (`kmirror_flow_*`).
    fn publish_share(&self) {
        let m = &self.ctx.metrics;
        let mut topics = 0;
        let mut last: Option<&str> = None;
        // Keys are ordered by topic: count each topic once.
        for (t, _) in self.running.keys() {
            if last != Some(t.as_str()) {
                topics += 1;
                last = Some(t);
            }
        }
        m.topics.get_or_create(&self.ctx.labels).set(topics);
        m.partitions
            .get_or_create(&self.ctx.labels)
            .set(self.running.len() as i64);
    }

    fn start(&mut self, key: (String, i32), remote: String) {
        self.ctx
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resumed(&key.0, key.1);
        let stop = Shutdown::default();
        let task = PartitionTask {
            ctx: self.ctx.clone(),
            topic: key.0.clone(),
            remote,
            partition: key.1,
            stored: self.stored.get(&key).copied(),
            stop: stop.clone(),
            // The shared producer id already holds sequence numbers for this partition.
            own_producer: !self.started.insert(key.clone()),
        };
        self.running.insert(
            key,
            Running {
                stop,
                task: tokio::spawn(task.run()),
            },
        );
    }

    /// A source topic deleted and re-created: positions and translation runs belong to the old
    /// log. Its tasks are stopped and start again on the new log from `auto.offset.reset`
    /// (earliest by default); the remote topic keeps the old records, followed by the new ones.
    /// Stops a re-created topic's tasks and drops its positions; returns the partitions whose
    /// stored positions (of the old log) are to be removed from the positions topic.
    async fn recreated(&mut self, topic: &str, old: TopicId, new: TopicId) -> BTreeSet<i32> {
        let while_stopped = self.first_round;
        self.announced.remove(topic);
        SourceTopicRecreated {
            flow: &self.ctx.flow.id,
            topic,
            old_topic_id: &topic_id_text(&old),
            new_topic_id: &topic_id_text(&new),
            while_stopped,
        }
        .emit(self.ctx.emitter());
        let keys: Vec<(String, i32)> = self
            .running
            .keys()
            .filter(|(t, _)| t == topic)
            .cloned()
            .collect();
        let mut forget: BTreeSet<i32> = keys.iter().map(|(_, p)| *p).collect();
        for key in keys {
            if let Some(r) = self.running.remove(&key) {
                r.stop.trigger();
                let _ = r.task.await;
            }
        }
        forget.extend(
            self.stored
                .keys()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p),
        );
        self.stored.retain(|(t, _), _| t != topic);
        self.remembered.retain(|(t, _), _| t != topic);
        self.ctx.board.forget(topic);
        self.ctx
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(topic);
        forget
    }

    fn report(&mut self, topic: &str, kind: ErrorKind, e: &KafkaError) {
        let text = e.to_string();
        if self.reported.get(topic) != Some(&text) {
            TopicSkipped {
                flow: &self.ctx.flow.id,
                topic,
                kind,
                error: e,
            }
            .emit(self.ctx.emitter());
            self.reported.insert(topic.to_string(), text);
        }
    }

    /// Serves exactly `partitions` from now on (sharing): the partitions given up are drained,
    /// their positions stored and released before this returns (so that the membership only
    /// then rejoins and their next owner starts where this process stopped); the new ones are
    /// started from the positions stored now (their previous owner stored them last).
    async fn apply(&mut self, partitions: BTreeSet<(String, i32)>) {
        if self.slots.is_some() {
            return self.apply_slots(partitions).await;
        }
        let Some(a) = &mut self.sharing else {
            return;
        };
        let shared = a.shared.clone();
        let before = std::mem::replace(&mut a.partitions, partitions.clone());
        let revoked: BTreeSet<(String, i32)> = before.difference(&partitions).cloned().collect();
        let added: BTreeSet<(String, i32)> = partitions.difference(&before).cloned().collect();
        shared.set_owned(partitions);
        if !revoked.is_empty() {
            self.stop_keys(&revoked).await;
            if !self.ctx.board.flushed(sharing::HANDOVER_FLUSH).await {
                tracing::warn!(flow = %self.ctx.flow.id, partitions = revoked.len(), "positions of the partitions handed over not stored in time; their next owner may copy some records again");
            }
            self.ctx.board.release(&revoked);
            self.release_runs(&revoked);
            self.stored.retain(|k, _| !revoked.contains(k));
        }
        if !added.is_empty() {
            self.load_positions(|k| added.contains(k)).await;
            // The leader may know topics or partitions this process's last refresh did not.
            let (source, target) = (&self.ctx.source, &self.ctx.target);
            let md = source.metadata();
            let unknown = added
                .iter()
                .any(|(t, p)| md.partition_count(t).is_none_or(|n| n <= *p));
            if unknown {
                let _ = source.refresh_metadata(None).await;
                let _ = target.refresh_metadata(None).await;
            }
        }
        self.reconcile().await;
    }

    /// Exactly-once: serves exactly the slots `keys` name from now on. A slot given up: its
    /// partitions stop (handing in their positions), then its committer commits them and ends,
    /// before the membership answers. A slot taken: its id is fenced first, then its
    /// partitions' positions are read (final now: the last holder can no longer commit) and its
    /// partitions start (docs/sharing.md, "Exactly-once").
    async fn apply_slots(&mut self, keys: BTreeSet<(String, i32)>) {
        let (Some(a), Some(k)) = (&mut self.sharing, &self.slots) else {
            return;
        };
        let table = k.table.clone();
        let shared = a.shared.clone();
        let before = std::mem::replace(&mut a.partitions, keys.clone());
        let revoked: BTreeSet<u32> = before
            .difference(&keys)
            .filter_map(assign::slot_index)
            .collect();
        let added: BTreeSet<u32> = keys
            .difference(&before)
            .filter_map(assign::slot_index)
            .collect();
        shared.set_owned(keys);
        let of = |revoked: &BTreeSet<u32>, (t, p): &(String, i32)| {
            revoked.contains(&table.index_of(t, *p))
        };
        if !revoked.is_empty() {
            let moving: BTreeSet<(String, i32)> = self
                .running
                .keys()
                .filter(|k| of(&revoked, k))
                .cloned()
                .collect();
            self.stop_keys(&moving).await;
            if let Some(k) = &mut self.slots {
                for i in &revoked {
                    k.release(*i).await;
                }
            }
            self.ctx.board.release(&moving);
            self.release_runs(&moving);
            self.stored.retain(|k, _| !of(&revoked, k));
            tracing::info!(flow = %self.ctx.flow.id, slots = ?revoked, partitions = moving.len(), "exactly-once slots handed over");
        }
        if !added.is_empty() {
            let shutdown = self.shutdown.clone();
            let mut taken = BTreeSet::new();
            if let Some(k) = &mut self.slots {
                for i in &added {
                    if !k.acquire(*i, &shutdown).await {
                        break;
                    }
                    taken.insert(*i);
                }
            }
            let missed: Vec<u32> = added.difference(&taken).copied().collect();
            if let (false, Some(a)) = (missed.is_empty(), &mut self.sharing) {
                // Not held (stopping, or the membership lapsed meanwhile): not claimed, and
                // the group is asked at once to give them again (a quiet group would leave
                // them unserved).
                for i in missed {
                    a.partitions.remove(&assign::slot_key(i));
                }
                a.shared.set_owned(a.partitions.clone());
                if !shutdown.is_triggered() {
                    a.shared.ask_rejoin();
                }
            }
            // Always after the fence, also when not every slot could be taken: the positions
            // read at setup (or by an earlier holder's time) may be older than its last commit.
            if !taken.is_empty() {
                self.load_positions(|k| of(&taken, k)).await;
                tracing::info!(flow = %self.ctx.flow.id, slots = ?taken, "exactly-once slots taken");
            }
        }
        self.reconcile().await;
    }

    /// This process lost its membership: its partitions may be served elsewhere already, so
    /// they stop now, and their positions are not stored any more (the new owner's are newer).
    /// Exactly-once slots are given up as well: their ids may be fenced by their next holders
    /// already, and nothing of theirs was committed after that.
    async fn lose(&mut self) {
        let exactly_once = self.slots.is_some();
        let Some(a) = &mut self.sharing else {
            return;
        };
        let shared = a.shared.clone();
        let mut all = std::mem::take(&mut a.partitions);
        if exactly_once {
            all = self.running.keys().cloned().collect();
        }
        shared.set_owned(BTreeSet::new());
        // Exactly-once: the partitions are told first (a partition not stopping would take its
        // slot's end for a failure), then the committers, which may be waiting for the group's
        // answer before a new epoch and must give up at once.
        for k in &all {
            if let Some(r) = self.running.get(k) {
                r.stop.trigger();
            }
        }
        if let Some(k) = &self.slots {
            k.stop_committing();
        }
        self.stop_keys(&all).await;
        if let Some(k) = &mut self.slots {
            k.release_all().await;
        }
        // Not stored (another owner's may be newer), but remembered: if a partition comes back
        // here, everything up to what this process had acknowledged is on the target, so it
        // resumes from the later of that and the stored position. Starting from the stored one
        // alone would copy again all that was acknowledged since (a coordinator that went
        // silent makes a lone process lose its membership with nobody else taking over).
        for (k, o) in self.ctx.board.take(&all) {
            let e = self.remembered.entry(k).or_insert(o);
            *e = (*e).max(o);
        }
        self.release_runs(&all);
        self.stored.retain(|k, _| !all.contains(k));
    }

    /// Partitions served elsewhere from now on: their next owner's runs describe them.
    fn release_runs(&self, keys: &BTreeSet<(String, i32)>) {
        self.ctx
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(keys);
    }

    async fn stop_keys(&mut self, keys: &BTreeSet<(String, i32)>) {
        let stopping: Vec<Running> = keys.iter().filter_map(|k| self.running.remove(k)).collect();
        for r in &stopping {
            r.stop.trigger();
        }
        for r in stopping {
            let _ = r.task.await;
        }
    }

    /// Reads the stored positions of partitions just assigned (those `assigned` accepts),
    /// retrying until it can (starting without them would copy them again from the start).
    async fn load_positions(&mut self, assigned: impl Fn(&(String, i32)) -> bool) {
        let flow = &self.ctx.flow;
        let mut attempt = 0;
        let stored = loop {
            match positions::load(
                &self.ctx.target,
                &flow.internal.positions_topic,
                flow.id.source.as_str(),
            )
            .await
            {
                Ok(s) => break s,
                Err(e) => {
                    let wait = super::backoff(attempt);
                    attempt += 1;
                    PositionsUnreadable {
                        flow: &flow.id,
                        error: &e,
                        retry_in: wait,
                    }
                    .emit(self.ctx.emitter());
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let keys: BTreeSet<(String, i32)> = stored
            .positions
            .keys()
            .chain(self.stored.keys())
            .chain(self.remembered.keys())
            .filter(|k| assigned(k))
            .cloned()
            .collect();
        for k in &keys {
            // A position stored for another log of the topic (it was re-created, and the
            // tombstones of its old positions are not stored yet) means nothing on this one.
            let same_log = match (stored.logs.get(&k.0), self.topic_ids.get(&k.0)) {
                (Some(recorded), Some(known)) => recorded == known,
                _ => true,
            };
            let stored = stored.positions.get(k).filter(|_| same_log).copied();
            match stored.max(self.remembered.remove(k)) {
                Some(o) => {
                    self.stored.insert(k.clone(), o);
                }
                None => {
                    self.stored.remove(k);
                }
            }
        }
    }

    /// Stops every partition task; each drains its in-flight produces and reports its last
    /// acknowledged offset before it ends.
    async fn stop_all(&mut self) {
        for r in self.running.values() {
            r.stop.trigger();
        }
        for (_, r) in std::mem::take(&mut self.running) {
            let _ = r.task.await;
        }
    }
}
