//! One flow A->B: connect (retrying an unreachable cluster with backoff), refuse the same cluster
//! twice, then run it: `replicate.rs` starts the flow's helper tasks under its supervisor,
//! serves the control loop and stops everything in order; `control.rs` is the control loop's
//! state and its round (discover topics, create or grow remote topics, start one task per new
//! source partition); `assignments.rs` applies what the flow's group assigns (partitions,
//! exactly-once slots) and what a lost membership takes away.

mod assignments;
mod control;
mod replicate;

use super::heartbeats;
use super::partition::Stopped;
use super::sharing;
use super::{EngineError, Shutdown, Supervisor};
use crate::config::model::FlowConfig;
use crate::events::{ClusterUnreachable, Emitter, Event as _};
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::KafkaError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(super) struct Running {
    stop: Shutdown,
    task: JoinHandle<Result<(), Stopped>>,
}

/// The first wait before a skipped topic is tried again (see `replicate`).
pub(super) const RETRY_SKIPPED: Duration = Duration::from_secs(5);

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
    let helpers = Supervisor::default();
    let probe_stop = Shutdown::default();
    let probe = helpers.spawn(
        "cluster probe",
        &name,
        crate::engine::probe::probe(
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
        replicate::replicate(
            &flow,
            replicate::Clusters { source, target },
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

pub(super) fn flow_labels(flow: &FlowConfig) -> FlowLabels {
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
