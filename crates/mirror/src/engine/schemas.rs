//! A flow's schema sync at run time (docs/schemas.md): before any record is written, the
//! registries are reached and, with `kmirror.schemas.ids = keep`, the target is checked to keep
//! the ids it is given; then one task keeps the target registry up with the source's (a pass at
//! start, one every refresh interval, and one at once for ids that records name and the map
//! lacks). Partitions consult the [`IdMap`] before they send: the send gate for schemas.

use super::{EngineError, Shutdown};
use crate::config::model::{FlowConfig, IdsMode, SchemaSync};
use crate::copy::schema_ids::Target;
use crate::metrics::{FlowLabels, Metrics};
use crate::schemas::keep::{probe_ids, Probe};
use crate::schemas::subjects::{sync_ids, sync_subjects, Known, Selection, SyncError};
use kmirror_registry::{RegistryClient, RegistryError, SchemaId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How soon a pass that failed is tried again (a partition waiting for a schema waits that long
/// at most after the registry is back).
const RETRY: Duration = Duration::from_secs(2);

/// Source ids to what the target has, shared by the flow's partitions and its schema task.
#[derive(Debug)]
pub(crate) struct IdMap {
    state: Mutex<MapState>,
    /// Bumped after every pass: a waiting partition looks again.
    changed: watch::Sender<u64>,
    /// A partition wants ids the map lacks.
    wanted: Notify,
}

#[derive(Debug, Default)]
struct MapState {
    ids: HashMap<SchemaId, SchemaId>,
    /// Ids the source registry does not know: such payloads only look like the wire format.
    unknown: HashSet<SchemaId>,
    wanted: BTreeSet<SchemaId>,
}

impl Default for IdMap {
    fn default() -> Self {
        IdMap {
            state: Mutex::default(),
            changed: watch::channel(0).0,
            wanted: Notify::new(),
        }
    }
}

impl IdMap {
    fn state(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a partition may write for source id `id`.
    pub(crate) fn target(&self, id: SchemaId) -> Target {
        let s = self.state();
        match s.ids.get(&id) {
            Some(t) => Target::Id(*t),
            None if s.unknown.contains(&id) => Target::NoSchema,
            None => Target::Pending,
        }
    }

    /// Asks for `ids` and waits for the next pass; false when stopped first.
    pub(crate) async fn wait_for(&self, ids: &BTreeSet<SchemaId>, stop: &Shutdown) -> bool {
        let mut changed = self.changed.subscribe();
        changed.mark_unchanged();
        self.state().wanted.extend(ids.iter().copied());
        self.wanted.notify_one();
        tokio::select! {
            r = changed.changed() => r.is_ok(),
            _ = stop.wait() => false,
        }
    }

    /// Sets the map directly (tests of the partitions that consult it).
    #[cfg(test)]
    pub(crate) fn publish_ids(&self, ids: &[(i32, i32)]) {
        self.state().ids = ids
            .iter()
            .map(|(s, t)| (SchemaId(*s), SchemaId(*t)))
            .collect();
        self.changed.send_modify(|v| *v += 1);
    }

    fn take_wanted(&self) -> BTreeSet<SchemaId> {
        std::mem::take(&mut self.state().wanted)
    }

    fn ask_again(&self, ids: &BTreeSet<SchemaId>) {
        self.state().wanted.extend(ids.iter().copied());
    }

    /// Sets what was found and wakes the partitions that wait. `fresh`: ids earlier found
    /// unknown to the source are forgotten, so a record naming one asks again (a registry
    /// follower behind its leader may have answered 404 for a new id).
    fn publish(&self, known: &Known, unknown: &BTreeSet<SchemaId>, fresh: bool) {
        {
            let mut s = self.state();
            s.ids = known.ids().into_iter().collect();
            if fresh {
                s.unknown.clear();
            }
            s.unknown.extend(unknown.iter().copied());
        }
        self.changed.send_modify(|v| *v += 1);
    }
}

/// The flow's two registry clients.
pub(crate) struct Registries {
    source: RegistryClient,
    target: RegistryClient,
}

/// Reaches both registries and, with `keep`, checks the target keeps ids, before any partition
/// starts. Unreachable registries are tried again until `stop`; a target that does not keep
/// ids is a configuration error (exit 3), and the target is left as it was found.
pub(crate) async fn prepare(
    flow: &str,
    sync: &SchemaSync,
    stop: &Shutdown,
    metrics: &Metrics,
    labels: &FlowLabels,
) -> Result<Option<Registries>, EngineError> {
    let config = |message: String| EngineError::Config {
        flow: flow.to_string(),
        message,
    };
    let source = RegistryClient::new(&sync.source.0).map_err(|e| config(e.to_string()))?;
    let target = RegistryClient::new(&sync.target.0).map_err(|e| config(e.to_string()))?;
    if sync.ids == IdsMode::Translate {
        return Ok(Some(Registries { source, target }));
    }
    let nonce = (u64::from(std::process::id()) << 20) ^ (rand::random::<u64>() % (1 << 20));
    let mut attempt = 0;
    loop {
        match probe_ids(&target, nonce).await {
            Ok(Probe::Keeps) => {
                tracing::info!(flow, registry = target.shown(), "target schema registry keeps the ids it is given");
                return Ok(Some(Registries { source, target }));
            }
            Ok(Probe::NotKept(e)) => return Err(config(e.to_string())),
            Err(e) if e.is_retriable() => {
                count_error(metrics, labels, &e);
                let wait = super::backoff(attempt);
                attempt += 1;
                tracing::warn!(flow, error = %e, retry_in_s = wait.as_secs(), "cannot check that the target schema registry keeps ids; retrying");
                if stop.sleep(wait).await {
                    return Ok(None);
                }
            }
            Err(e) if matches!(e, RegistryError::Refused { status: 401 | 403, .. }) => {
                return Err(config(format!(
                    "{e}: the target schema registry refused kmirror's credentials or permissions (basic.auth.* or bearer.auth.* of the target)"
                )))
            }
            Err(e) => {
                return Err(config(format!(
                    "{e}: kmirror.schemas.ids = keep needs IMPORT mode on the target registry (set kmirror.schemas.ids = translate otherwise)"
                )))
            }
        }
    }
}

/// The schema task: keeps the target registry up with the source's.
pub(crate) struct SchemaTask {
    /// The flow's name, for logs.
    pub(crate) flow: String,
    pub(crate) sync: SchemaSync,
    pub(crate) subjects: Subjects,
    pub(crate) registries: Registries,
    pub(crate) map: Arc<IdMap>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) labels: FlowLabels,
}

impl SchemaTask {
    pub(crate) async fn run(self, stop: Shutdown) {
        // The series exist from the start, so `status` shows the flow syncs schemas.
        self.metrics
            .schema_registrations
            .get_or_create(&self.labels)
            .inc_by(0);
        let refresh = self.sync.refresh;
        let mut known = Known::default();
        let mut due = Instant::now();
        // After a failure, or ids the source named and the target still lacks, partitions'
        // asks wait until this (a partition asking again at once must not turn a registry that
        // is down into a busy loop).
        let mut retry_at: Option<Instant> = None;
        loop {
            if retry_at.is_some_and(|t| Instant::now() >= t) {
                retry_at = None;
            }
            if Instant::now() >= due {
                let result = self.pass(&mut known).await;
                // What the pass confirmed is usable even when it stopped half-way (one subject
                // the target refuses must not hold back every other): the map only holds
                // versions the target answered for. Unknown ids are looked up again.
                self.map.publish(&known, &BTreeSet::new(), true);
                match result {
                    Ok(()) => due = Instant::now() + refresh,
                    Err(e) => {
                        self.failed(&e);
                        due = Instant::now() + RETRY;
                    }
                }
            }
            if retry_at.is_none() {
                let asked = self.map.take_wanted();
                let missing = self.pending(&asked);
                if !missing.is_empty() {
                    let unknown = match self.named(&mut known, &missing).await {
                        Ok(unknown) => unknown,
                        Err(e) => {
                            self.failed(&e);
                            BTreeSet::new()
                        }
                    };
                    self.map.publish(&known, &unknown, false);
                    let still = self.pending(&missing);
                    if !still.is_empty() {
                        // Asked again after the wait; the partitions keep waiting meanwhile.
                        self.map.ask_again(&still);
                        retry_at = Some(Instant::now() + RETRY);
                    }
                } else if !asked.is_empty() {
                    // Found by a pass since they asked: the waiting partitions look again.
                    self.map.publish(&known, &BTreeSet::new(), false);
                }
            }
            let wake = retry_at.map_or(due, |t| t.min(due));
            tokio::select! {
                _ = stop.wait() => return,
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.map.wanted.notified(), if retry_at.is_none() => {}
            }
        }
    }

    /// Of `ids`, those the map has no answer for.
    fn pending(&self, ids: &BTreeSet<SchemaId>) -> BTreeSet<SchemaId> {
        ids.iter()
            .copied()
            .filter(|id| matches!(self.map.target(*id), Target::Pending))
            .collect()
    }

    /// A full pass over the selected subjects.
    async fn pass(&self, known: &mut Known) -> Result<(), SyncError> {
        let reg = &self.registries;
        self.check_target(known).await?;
        let selection = Selection {
            subjects: &*self.subjects.selected,
            keep_ids: self.sync.ids == IdsMode::Keep,
            rename: &*self.subjects.rename,
        };
        let done = sync_subjects(&reg.source, &reg.target, &selection, known).await?;
        self.registered(done.registered);
        Ok(())
    }

    /// The subjects of ids that records name and the map lacks; returns the ids the source
    /// registry does not know.
    async fn named(
        &self,
        known: &mut Known,
        ids: &BTreeSet<SchemaId>,
    ) -> Result<BTreeSet<SchemaId>, SyncError> {
        let reg = &self.registries;
        let keep = self.sync.ids == IdsMode::Keep;
        let (done, unknown) = sync_ids(
            &reg.source,
            &reg.target,
            ids,
            &*self.subjects.rename,
            keep,
            known,
        )
        .await?;
        self.registered(done.registered);
        if !unknown.is_empty() {
            tracing::warn!(flow = %self.flow, ids = ?unknown, "records start like the Confluent wire format but name ids the source schema registry does not know; copied as they are");
        }
        Ok(unknown)
    }

    /// An in-memory target registry that restarted has lost what was registered: records must
    /// not be written with ids it no longer has, so the map is emptied (partitions wait) and
    /// the pass registers everything again.
    async fn check_target(&self, known: &mut Known) -> Result<(), SyncError> {
        let Some((_, probe)) = known.ids().into_iter().next() else {
            return Ok(());
        };
        match self.registries.target.schema(probe).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => {
                tracing::warn!(flow = %self.flow, registry = self.registries.target.shown(), id = probe.0, "the target schema registry no longer has a schema kmirror registered (restarted empty?): registering again before any more records are written");
                self.metrics
                    .schema_registry_errors
                    .get_or_create(&self.labels.round("target_lost"))
                    .inc();
                known.forget_target();
                self.map.publish(known, &BTreeSet::new(), true);
                Ok(())
            }
            Err(e) => Err(SyncError::Target(e)),
        }
    }

    fn registered(&self, n: u64) {
        if n > 0 {
            tracing::info!(flow = %self.flow, versions = n, "schema versions registered on the target");
            self.metrics
                .schema_registrations
                .get_or_create(&self.labels)
                .inc_by(n);
        }
    }

    fn failed(&self, e: &SyncError) {
        let registry_error = match e {
            SyncError::Source(e) | SyncError::Target(e) => Some(e),
            _ => None,
        };
        match registry_error {
            Some(r) => count_error(&self.metrics, &self.labels, r),
            None => {
                self.metrics
                    .schema_registry_errors
                    .get_or_create(&self.labels.round("bad_answer"))
                    .inc();
            }
        }
        tracing::warn!(flow = %self.flow, error = %e, retry_in_s = RETRY.as_secs(), "schema sync failed; partitions that need a missing schema wait");
    }
}

fn count_error(metrics: &Metrics, labels: &FlowLabels, e: &RegistryError) {
    let kind = match e {
        RegistryError::Unreachable { .. } => "unreachable",
        RegistryError::BadAnswer { .. } => "bad_answer",
        _ => "refused",
    };
    metrics
        .schema_registry_errors
        .get_or_create(&labels.round(kind))
        .inc();
}

/// The topic a subject is named after under TopicNameStrategy.
pub(crate) fn topic_of(subject: &str) -> Option<&str> {
    subject
        .strip_suffix("-value")
        .or_else(|| subject.strip_suffix("-key"))
}

/// The flow's remote name of `topic`, when the flow replicates it.
fn remote_topic(flow: &FlowConfig, topic: &str) -> Option<String> {
    crate::discovery::decide(flow, [topic])
        .pop()
        .and_then(|d| d.remote)
}

/// Which source subjects a flow copies, and their names on the target.
pub(crate) struct Subjects {
    pub(crate) selected: Box<dyn Fn(&str) -> bool + Send + Sync>,
    pub(crate) rename: Box<dyn Fn(&str) -> String + Send + Sync>,
}

impl Subjects {
    /// MM2 mode: the subjects of the topics the flow replicates, named after their remote
    /// topics, and those `kmirror.schemas.subjects` names.
    pub(crate) fn of_flow(flow: &FlowConfig, sync: &SchemaSync) -> Subjects {
        let (f, s) = (flow.clone(), sync.clone());
        let g = flow.clone();
        Subjects {
            selected: Box::new(move |subject| selected(&f, &s, subject)),
            rename: Box::new(move |subject| target_subject(&g, subject)),
        }
    }

    /// MM1 mode: topics keep their names, so subjects do; those of the topics `--include`
    /// matches, and those `kmirror.schemas.subjects` names.
    pub(crate) fn same_names(topics: crate::filter::PatternList, sync: &SchemaSync) -> Subjects {
        let extra = sync.subjects.clone();
        Subjects {
            selected: Box::new(move |subject| {
                topic_of(subject).is_some_and(|t| topics.matches(t)) || extra.matches(subject)
            }),
            rename: Box::new(|subject| subject.to_string()),
        }
    }
}

/// A subject of a replicated topic, or one `kmirror.schemas.subjects` names.
fn selected(flow: &FlowConfig, sync: &SchemaSync, subject: &str) -> bool {
    topic_of(subject).is_some_and(|t| remote_topic(flow, t).is_some())
        || sync.subjects.matches(subject)
}

/// A subject's name on the target: a replicated topic's subjects follow the topic's remote
/// name (so a producer on the target using TopicNameStrategy finds them); others keep theirs.
pub(crate) fn target_subject(flow: &FlowConfig, subject: &str) -> String {
    match topic_of(subject).and_then(|t| Some((remote_topic(flow, t)?, t.len()))) {
        Some((remote, len)) => format!("{remote}{}", &subject[len..]),
        None => subject.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::flow;

    #[test]
    fn subjects_of_replicated_topics_follow_their_names_and_others_keep_theirs() {
        let f = flow(
            "A->B.topics = orders.*\nA.schema.registry.url = http://127.0.0.1:1\nB.schema.registry.url = http://127.0.0.1:2\nA->B.kmirror.schemas.subjects = common\\\\..*\n",
        );
        let sync = f.schemas.clone().unwrap();
        assert_eq!(target_subject(&f, "orders-value"), "A.orders-value");
        assert_eq!(target_subject(&f, "orders.eu-key"), "A.orders.eu-key");
        assert_eq!(target_subject(&f, "users-value"), "users-value");
        assert_eq!(target_subject(&f, "common.Money"), "common.Money");
        assert!(selected(&f, &sync, "orders-value"));
        assert!(selected(&f, &sync, "orders-key"));
        assert!(selected(&f, &sync, "common.Money"));
        assert!(!selected(&f, &sync, "users-value"));
        assert!(!selected(&f, &sync, "orders"));
        let identity = flow(
            "replication.policy.class = IdentityReplicationPolicy\nA.schema.registry.url = http://127.0.0.1:1\nB.schema.registry.url = http://127.0.0.1:2\n",
        );
        assert_eq!(target_subject(&identity, "orders-value"), "orders-value");
    }

    #[tokio::test]
    async fn a_waiting_partition_asks_for_its_ids_and_wakes_on_the_next_pass() {
        let map = Arc::new(IdMap::default());
        assert_eq!(map.target(SchemaId(5)), Target::Pending);
        let stop = Shutdown::default();
        let waiter = {
            let (map, stop) = (map.clone(), stop.clone());
            tokio::spawn(async move { map.wait_for(&BTreeSet::from([SchemaId(5)]), &stop).await })
        };
        map.wanted.notified().await;
        assert_eq!(map.take_wanted(), BTreeSet::from([SchemaId(5)]));
        map.publish(&Known::default(), &BTreeSet::from([SchemaId(5)]), false);
        assert!(waiter.await.unwrap());
        assert_eq!(map.target(SchemaId(5)), Target::NoSchema);
        // Stopped while waiting: false.
        let waiter = {
            let (map, stop) = (map.clone(), stop.clone());
            tokio::spawn(async move { map.wait_for(&BTreeSet::from([SchemaId(6)]), &stop).await })
        };
        tokio::task::yield_now().await;
        stop.trigger();
        assert!(!waiter.await.unwrap());
    }
}
