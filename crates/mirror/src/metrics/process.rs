//! The process's state that is not a metric: what `/health`, `/ready` and `/status` need
//! besides the series (the flows known and whether their clusters answer, the partitions
//! stopped by an error, each partition's series handles, topic-refresh rounds running, each
//! flow's group). Kept apart from the registry so the registry stays a table of families.

use super::{FlowLabels, PartitionLabels, PartitionSeries};
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One member's share of a shared flow, in the group view every member is sent (and `/status`
/// shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub member: String,
    /// Where it runs (host name and process id).
    pub host: String,
    pub partitions: usize,
    pub leader: bool,
}

/// The engine's state as readiness and `/status` need it (see [`Metrics::readiness`],
/// [`Metrics::flow_figures`]): handles on the series themselves, never the exposition parsed
/// back.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// `(source, target)` -> the flow's labels and its `kmirror_flow_connected` gauge.
    pub(super) flows: std::collections::BTreeMap<(String, String), (FlowLabels, Gauge)>,
    /// `(flow, remote topic, partition)` of every partition stopped by an error.
    pub(super) stopped: std::collections::BTreeSet<(String, String, i32)>,
    /// Every partition's series, created once per partition by [`Metrics::partition_series`].
    pub(super) partitions: std::collections::HashMap<PartitionLabels, PartitionSeries>,
    /// Flow -> partitions assigned and not copying past the bound, and the most common reason
    /// (`engine/waiting.rs`).
    pub(super) waiting: std::collections::BTreeMap<String, (i64, Option<&'static str>)>,
}

pub(super) fn flow_name(source: &str, target: &str) -> String {
    format!("{source}->{target}")
}

/// The process's state beside its metrics.
#[derive(Debug, Default)]
pub struct ProcessState {
    /// Flows whose topic-refresh round is running, and since when (`/health` reads it, see
    /// [`ProcessState::stalled_round`]).
    rounds_running: Mutex<BTreeMap<String, Instant>>,
    /// Sharing: each flow's group as the leader's last assignment describes it.
    groups: Mutex<BTreeMap<String, Vec<Share>>>,
    health: Mutex<Health>,
}

impl ProcessState {
    pub(super) fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A flow's partitions assigned and not copying past the bound, and what most wait for.
    pub fn set_waiting(&self, flow: &str, partitions: i64, reason: Option<&'static str>) {
        self.health()
            .waiting
            .insert(flow.to_string(), (partitions, reason));
    }

    /// A flow's control loop starts a round (topic discovery, remote topics, partition tasks).
    pub fn round_started(&self, flow: &str) {
        self.rounds_running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(flow.to_string(), Instant::now());
    }

    /// The round [`ProcessState::round_started`] began is over.
    pub fn round_ended(&self, flow: &str) {
        self.rounds_running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(flow);
    }

    /// A flow whose round has run longer than `limit`, and for how long: its control loop is
    /// wedged (every request in a round is bounded by the request timeout, so a healthy round
    /// ends long before).
    pub fn stalled_round(&self, limit: Duration) -> Option<(String, Duration)> {
        self.rounds_running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(flow, t)| (flow.clone(), t.elapsed()))
            .find(|(_, running)| *running > limit)
    }

    /// Readiness: at least one flow, every flow's clusters answer, no partition stopped for
    /// good. The reason says what is missing.
    pub fn readiness(&self) -> (bool, Option<String>) {
        let h = self.health();
        if h.flows.is_empty() {
            return (false, Some("no flow has started yet".into()));
        }
        let down: Vec<String> = h
            .flows
            .iter()
            .filter(|(_, (_, g))| g.get() < 1)
            .map(|((s, t), _)| flow_name(s, t))
            .collect();
        if !down.is_empty() {
            return (
                false,
                Some(format!("cluster not answering for {}", down.join(", "))),
            );
        }
        if !h.stopped.is_empty() {
            return (
                false,
                Some(format!(
                    "{} partition(s) stopped by an error",
                    h.stopped.len()
                )),
            );
        }
        (true, None)
    }

    /// Records a flow's group (sharing), shown by `/status`; empty when this process is not a
    /// member.
    pub fn set_group(&self, flow: &str, members: Vec<Share>) {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(flow.to_string(), members);
    }

    /// A flow's group as [`ProcessState::set_group`] last recorded it.
    pub fn group(&self, flow: &str) -> Vec<Share> {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(flow)
            .cloned()
            .unwrap_or_default()
    }
}
