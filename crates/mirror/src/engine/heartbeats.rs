//! Heartbeats (MM2's MirrorHeartbeatTask, mm2-compatibility §1.5, §2, §3): every
//! `emit.heartbeats.interval.seconds`, one record keyed (source, target) into the target's
//! `heartbeats` topic (1 partition, compacted). Downstream, heartbeats topics are replicated
//! like any topic (discovery keeps them), so `A.heartbeats` on B proves A->B is alive end to end.

use super::{remote_topics, Shutdown};
use crate::config::model::FlowConfig;
use crate::events::{Emitter, Event, InternalWrite, InternalWriteFailed, LastError};
use crate::metrics::{FlowLabels, Metrics};
use crate::wire::internal::Heartbeat;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::KafkaError;
use std::sync::Arc;

/// Emits heartbeats until `stop`. Failures are logged (once per distinct error) and retried.
pub(super) async fn emit(
    flow: FlowConfig,
    target: Arc<KafkaCluster>,
    metrics: Arc<Metrics>,
    labels: FlowLabels,
    stop: Shutdown,
) {
    let topic = flow.policy.heartbeats_topic().to_string();
    let mut created = false;
    let mut last_error = LastError::default();
    loop {
        let result = async {
            if !created {
                // MM2 creates the topic at start; one that already exists is fine.
                remote_topics::create_internal(
                    &target,
                    NewTopic {
                        name: topic.clone(),
                        partitions: 1,
                        replication_factor: flow.internal.heartbeats_replication_factor,
                        configs: vec![("cleanup.policy".into(), "compact".into())],
                    },
                )
                .await?;
                created = true;
            }
            beat(&flow, &target, &topic).await
        }
        .await;
        match result {
            Ok(()) => {
                metrics.heartbeats.get_or_create(&labels).inc();
                if last_error.clear() {
                    tracing::info!(flow = %flow.id, topic = %topic, "heartbeats written again");
                }
            }
            Err(e) => {
                if last_error.is_new(&e) {
                    InternalWriteFailed {
                        flow: &flow.id,
                        what: InternalWrite::Heartbeats,
                        topic: &topic,
                        error: &e,
                    }
                    .emit(Emitter {
                        metrics: &metrics,
                        labels: &labels,
                    });
                }
            }
        }
        if stop.sleep(flow.emit_heartbeats.interval).await {
            return;
        }
    }
}

async fn beat(flow: &FlowConfig, target: &KafkaCluster, topic: &str) -> Result<(), KafkaError> {
    let now = super::now_ms();
    let h = Heartbeat {
        source_cluster_alias: flow.id.source.to_string(),
        target_cluster_alias: flow.id.target.to_string(),
        timestamp: now,
    };
    let key = h.key().map_err(|e| KafkaError::Config(e.to_string()))?;
    remote_topics::write_record(target, topic, 0, now, key, Some(h.value())).await
}
