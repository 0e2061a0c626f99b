//! Topic config sync and ACL sync for one flow (mm2-compatibility §5.4, §5.5): both run at start and then
//! every `sync.topic.configs.interval.seconds` / `sync.topic.acls.interval.seconds`, over the
//! topics the control loop replicates. What to change comes from [`crate::topic_sync`]; this
//! module does the I/O and reports each problem once instead of failing every interval.

use super::Shutdown;
use crate::config::model::FlowConfig;
use crate::events::{Emitter, Event, SyncNotApplied, SyncOf};
use crate::metrics::{FlowLabels, Metrics};
use crate::topic_sync::{config_ops, group_acls, topic_acls};
use kmirror_kafka::admin::{acl, AclBinding, ConfigOp};
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_kafka::{KafkaError, Refusal};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Source topic → remote topic, as the control loop replicates them.
pub(super) type Replicated = Arc<Mutex<BTreeMap<String, String>>>;

#[derive(Clone)]
pub(super) struct TopicSync {
    pub(super) flow: FlowConfig,
    pub(super) source: Arc<KafkaCluster>,
    pub(super) target: Arc<KafkaCluster>,
    pub(super) replicated: Replicated,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    /// The remote topics the process's flows write (`remote_claims`).
    pub(super) claims: Arc<super::remote_claims::RemoteClaims>,
}

#[derive(Default)]
struct State {
    /// (topic, key, value) the target refused: not sent again until the source value changes.
    rejected: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Problems already reported.
    reported: HashSet<String>,
    acls_off: bool,
}

impl TopicSync {
    pub(super) async fn run(self, stop: Shutdown) {
        let mut state = State::default();
        let (configs, acls) = (self.flow.sync_topic_configs, self.flow.sync_topic_acls);
        let mut next_configs = configs.enabled.then(Instant::now);
        let mut next_acls = acls.enabled.then(Instant::now);
        loop {
            let now = Instant::now();
            if next_configs.is_some_and(|t| t <= now) {
                self.sync_configs(&mut state).await;
                self.round("config_sync");
                next_configs = Some(Instant::now() + configs.interval);
            }
            if next_acls.is_some_and(|t| t <= now) {
                self.sync_acls(&mut state).await;
                self.round("acl_sync");
                next_acls = (!state.acls_off).then(|| Instant::now() + acls.interval);
            }
            let wake = [next_configs, next_acls]
                .into_iter()
                .flatten()
                .min()
                .map_or(Duration::from_secs(3600), |t| {
                    t.saturating_duration_since(Instant::now())
                });
            if stop.sleep(wake.max(Duration::from_millis(10))).await {
                return;
            }
        }
    }

    fn round(&self, kind: &str) {
        self.metrics
            .rounds
            .get_or_create(&self.labels.round(kind))
            .inc();
    }

    fn report(&self, state: &mut State, of: SyncOf, key: String, message: &str) {
        if state.reported.insert(key) {
            SyncNotApplied {
                flow: &self.flow.id,
                of,
                message,
            }
            .emit(Emitter {
                metrics: &self.metrics,
                labels: &self.labels,
            });
        }
    }

    async fn sync_configs(&self, state: &mut State) {
        let topics: Vec<(String, String)> = self
            .replicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect();
        for (topic, remote) in topics {
            let described = async {
                let s = self.source.describe_topic_configs(&topic).await;
                let s = s.map_err(|e| ("describe", self.flow.id.source.to_string(), e))?;
                let t = self.target.describe_topic_configs(&remote).await;
                let t = t.map_err(|e| ("describe", self.flow.id.target.to_string(), e))?;
                Ok::<_, (&str, String, KafkaError)>((s, t))
            }
            .await;
            let (src, tgt) = match described {
                Ok(x) => x,
                Err((op, cluster, e)) => {
                    let msg = format!("topic config sync: cannot {op} the configs of a topic on {cluster} (needs DESCRIBE_CONFIGS on the topic): {e}");
                    self.report(
                        state,
                        SyncOf::TopicConfigs,
                        format!("describe:{cluster}:{}", cause(&e)),
                        &msg,
                    );
                    continue;
                }
            };
            let rejected = state.rejected.entry(topic.clone()).or_default();
            // A rejected value the source has since changed may be tried again.
            rejected.retain(|(k, v)| {
                src.iter()
                    .any(|e| &e.name == k && e.value.as_deref() == Some(v.as_str()))
            });
            let ops = config_ops(&self.flow, &src, &tgt, rejected);
            if ops.is_empty() {
                continue;
            }
            match self.target.alter_topic_configs(&remote, &ops, false).await {
                Ok(()) => self.synced(&remote, &ops),
                Err(e) if e.is(Refusal::Invalid) => {
                    if let [op] = ops.as_slice() {
                        self.refused(state, &topic, &remote, op.clone(), e);
                    } else {
                        // One key was refused: find which, keep the rest.
                        for op in ops {
                            match self
                                .target
                                .alter_topic_configs(&remote, std::slice::from_ref(&op), false)
                                .await
                            {
                                Ok(()) => self.synced(&remote, &[op]),
                                Err(e) => self.refused(state, &topic, &remote, op, e),
                            }
                        }
                    }
                }
                Err(e) => {
                    let cluster = self.flow.id.target.to_string();
                    let msg = format!("topic config sync: cannot alter configs of {remote} on {cluster} (needs ALTER_CONFIGS on the topic): {e}");
                    self.report(
                        state,
                        SyncOf::TopicConfigs,
                        format!("alter:{cluster}:{}", cause(&e)),
                        &msg,
                    );
                }
            }
        }
    }

    fn synced(&self, remote: &str, ops: &[ConfigOp]) {
        tracing::info!(flow = %self.flow.id, topic = %remote, changes = ?ops, "topic configs synced");
        self.metrics
            .configs_synced
            .get_or_create(&self.labels)
            .inc_by(ops.len() as u64);
    }

    fn refused(&self, state: &mut State, topic: &str, remote: &str, op: ConfigOp, e: KafkaError) {
        if let ConfigOp::Set(k, v) = &op {
            state
                .rejected
                .entry(topic.to_string())
                .or_default()
                .insert((k.clone(), v.clone()));
        }
        let msg = format!("topic config sync: {remote} on {} refused {op:?}: {e}; not retried until the source value changes", self.flow.id.target);
        self.report(
            state,
            SyncOf::TopicConfigs,
            format!("refused:{remote}:{op:?}"),
            &msg,
        );
    }

    async fn sync_acls(&self, state: &mut State) {
        let filter = |resource_type| AclBinding {
            resource_type,
            ..AclBinding::any()
        };
        let mut wanted = match self
            .source
            .describe_acls(&filter(acl::RESOURCE_TOPIC))
            .await
        {
            Ok(b) => topic_acls(&self.flow, &b),
            Err(e) if e.is(Refusal::NoAuthorizer) => {
                tracing::info!(flow = %self.flow.id, cluster = %self.flow.id.source, "ACL sync off: the source cluster has no authorizer");
                state.acls_off = true;
                return;
            }
            Err(e) => {
                let msg = format!("ACL sync: cannot describe ACLs on {} (needs DESCRIBE on the CLUSTER resource): {e}", self.flow.id.source);
                self.report(state, SyncOf::Acls, format!("describe:{}", cause(&e)), &msg);
                return;
            }
        };
        if self.flow.sync_group_acls {
            match self
                .source
                .describe_acls(&filter(acl::RESOURCE_GROUP))
                .await
            {
                Ok(b) => wanted.extend(group_acls(&self.flow, &b)),
                Err(e) => {
                    let msg = format!(
                        "ACL sync: cannot describe group ACLs on {}: {e}",
                        self.flow.id.source
                    );
                    self.report(state, SyncOf::Acls, format!("groups:{}", cause(&e)), &msg);
                }
            }
        }
        // Only bindings the target lacks: creating is idempotent, but quieter this way.
        let existing: BTreeSet<AclBinding> = match self
            .target
            .describe_acls(&AclBinding::any())
            .await
        {
            Ok(b) => b.into_iter().collect(),
            Err(e) => {
                let msg = format!("ACL sync: cannot describe ACLs on {} (needs DESCRIBE on the CLUSTER resource): {e}", self.flow.id.target);
                self.report(state, SyncOf::Acls, format!("target:{}", cause(&e)), &msg);
                return;
            }
        };
        // Never the ACLs of this flow's topic onto a topic another flow writes.
        let (target, flow) = (self.flow.id.target.to_string(), self.flow.id.to_string());
        let missing: Vec<AclBinding> = wanted
            .into_iter()
            .filter(|b| !existing.contains(b))
            .filter(|b| {
                !(b.resource_type == acl::RESOURCE_TOPIC
                    && b.pattern_type == acl::PATTERN_LITERAL
                    && b.resource_name
                        .as_deref()
                        .is_some_and(|r| self.claims.taken_by_other(&target, r, &flow)))
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        match self.target.create_acls(&missing).await {
            Ok(()) => {
                tracing::info!(flow = %self.flow.id, created = missing.len(), "ACLs synced to the target");
                self.metrics
                    .acls_created
                    .get_or_create(&self.labels)
                    .inc_by(missing.len() as u64);
            }
            Err(e) => {
                let msg = format!(
                    "ACL sync: cannot create ACLs on {} (needs ALTER on the CLUSTER resource): {e}",
                    self.flow.id.target
                );
                self.report(state, SyncOf::Acls, format!("create:{}", cause(&e)), &msg);
            }
        }
    }
}

/// What a failure is about, without the details that vary from call to call (broker address,
/// message text), so each cause is reported once.
fn cause(e: &KafkaError) -> String {
    match e {
        KafkaError::Broker { api, error, .. } => format!("{api:?}:{error:?}"),
        other => other.to_string(),
    }
}
