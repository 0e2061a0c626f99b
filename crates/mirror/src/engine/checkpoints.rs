//! Checkpoints and group offset sync for one flow A->B (MM2's MirrorCheckpointTask, mm2-compatibility
//! §6): every `emit.checkpoints.interval.seconds`, the committed offsets of A's groups that match
//! `groups` are translated through the offset syncs and written to `A.checkpoints.internal` on B
//! in MM2's format; with `sync.group.offsets.enabled`, translated offsets are also committed into
//! B for groups with no active members there, never rewinding a B offset. Groups on A that read
//! topics copied from B (consumers that failed over to A) are checkpointed back to B's own topic
//! names with B->A's syncs inverted, so failback works.

use super::log_reader::read_to_end;
use super::offset_syncs::read_syncs_from;
use super::{remote_topics, Shutdown};
use crate::config::model::{FlowConfig, Side};
use crate::discovery;
use crate::events::{Emitter, Event, InternalWrite, InternalWriteFailed, LastError};
use crate::metrics::{FlowLabels, Metrics};
use crate::offsets::checkpoint_rules::CheckpointRules;
use crate::offsets::runs::{Published, Runs};
use crate::offsets::sync_store::{SyncStore, Translation};
use crate::wire::internal::{Checkpoint, OffsetSync};
use crate::wire::positions::StoredRecord;
use bytes::Bytes;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{topic_id_text, KafkaCluster, NewTopic};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A process's published runs that describe no partition any more are removed once it has
/// published nothing for this long (a live process republishes within a second of copying).
const STALE_RUNS: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub(super) struct CheckpointTask {
    pub(super) flow: FlowConfig,
    pub(super) source: Arc<KafkaCluster>,
    pub(super) target: Arc<KafkaCluster>,
    /// The cluster holding the offset-syncs topic.
    pub(super) syncs_cluster: Arc<KafkaCluster>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) labels: FlowLabels,
    /// What this process copied: exact translation where it covers a group's position.
    pub(super) runs: Arc<Mutex<Runs>>,
    /// Where the flow's processes publish their runs (with sharing): exact translation of the
    /// partitions other processes copy.
    pub(super) positions_topic: String,
    /// The remote topics the process's flows write: a topic another flow writes is not this
    /// flow's to checkpoint (`remote_claims`).
    pub(super) claims: Arc<super::remote_claims::RemoteClaims>,
    /// Loop prevention: tells whether the target also copies into the source under identity
    /// names, which leaves a group's position with no equivalent on the target.
    pub(super) loop_guard: Option<Arc<super::loop_guard::LoopGuard>>,
}

struct State {
    store: SyncStore,
    syncs_next: Option<i64>,
    /// Syncs of the opposite flow (B->A for this A->B), inverted: for groups on A that read
    /// B's topics copied into A (`B.t`), i.e. consumers failing back (mm2-compatibility §10 notes MM2
    /// cannot translate these).
    reverse: SyncStore,
    reverse_next: Option<i64>,
    rules: CheckpointRules,
    /// Every process's published runs, and where reading the positions topic continues.
    published: Published,
    positions_next: HashMap<i32, i64>,
    groups: Vec<String>,
    groups_listed: Option<Instant>,
    last_group_sync: Option<Instant>,
    /// Why a group was last skipped by the group offset sync, so each reason is logged once.
    skipped: HashMap<String, String>,
    last_error: LastError,
}

impl CheckpointTask {
    pub(super) async fn run(self, stop: Shutdown) {
        let checkpoints_topic = self.flow.checkpoints_topic();
        let mut state = State {
            store: SyncStore::default(),
            syncs_next: None,
            reverse: SyncStore::default(),
            reverse_next: None,
            rules: CheckpointRules::default(),
            published: Published::default(),
            positions_next: HashMap::new(),
            groups: vec![],
            groups_listed: None,
            last_group_sync: None,
            skipped: HashMap::new(),
            last_error: LastError::default(),
        };
        let mut ready = false;
        loop {
            let result = async {
                if !ready {
                    self.prepare(&checkpoints_topic, &mut state).await?;
                    ready = true;
                }
                self.tick(&checkpoints_topic, &mut state).await
            }
            .await;
            match result {
                Ok(()) => {
                    state.last_error.clear();
                }
                Err(e) => {
                    if state.last_error.is_new(&e) {
                        InternalWriteFailed {
                            flow: &self.flow.id,
                            what: InternalWrite::Checkpoints,
                            topic: &checkpoints_topic,
                            error: &e,
                        }
                        .emit(Emitter {
                            metrics: &self.metrics,
                            labels: &self.labels,
                        });
                    }
                }
            }
            if stop.sleep(self.flow.emit_checkpoints.interval).await {
                return;
            }
        }
    }

    /// Creates the checkpoints topic and reads back the checkpoints already in it, so no
    /// checkpoint moves backwards across restarts (mm2-compatibility §6.2).
    async fn prepare(&self, topic: &str, state: &mut State) -> Result<(), KafkaError> {
        remote_topics::create_internal(
            &self.target,
            NewTopic {
                name: topic.into(),
                partitions: 1,
                replication_factor: self.flow.internal.checkpoints_replication_factor,
                configs: vec![("cleanup.policy".into(), "compact".into())],
            },
        )
        .await?;
        let (records, _) = read_to_end(&self.target, topic, 0, None).await?;
        for r in records {
            if let (Some(k), Some(v)) = (r.key.as_deref(), r.value.as_deref()) {
                if let Ok(c) = Checkpoint::decode(k, v) {
                    state.rules.seen(&c);
                }
            }
        }
        Ok(())
    }

    async fn tick(&self, topic: &str, state: &mut State) -> Result<(), KafkaError> {
        if self.held_back().await? {
            return Ok(());
        }
        self.read_syncs(state).await?;
        if self.flow.sharing.enabled {
            // Best effort: without them, other processes' partitions go through the syncs.
            if let Err(e) = self.read_published(state).await {
                tracing::debug!(flow = %self.flow.id, error = %e, "published runs unreadable; translating through the offset syncs");
            }
        }
        let refresh = self.flow.refresh_groups;
        if state.groups_listed.is_none()
            || (refresh.enabled
                && state
                    .groups_listed
                    .is_some_and(|t| t.elapsed() >= refresh.interval))
        {
            let listed = self.source.list_groups().await?;
            state.groups = listed
                .into_iter()
                .map(|(g, _)| g)
                .filter(|g| self.flow.groups.accepts(g))
                .collect();
            state.groups_listed = Some(Instant::now());
        }
        let mut fresh = Vec::new();
        let mut remote_of: HashMap<String, Option<(String, bool)>> = HashMap::new();
        for group in state.groups.clone() {
            let offsets = match self.source.fetch_group_offsets(&group).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::debug!(group, error = %e, "checkpoints: group offsets unavailable");
                    continue;
                }
            };
            for (src_topic, parts) in offsets {
                let route = remote_of
                    .entry(src_topic.clone())
                    .or_insert_with(|| self.route(&src_topic))
                    .clone();
                let Some((remote, reverse)) = route else {
                    continue;
                };
                // The source topic's log, which published runs must belong to.
                let log = self
                    .source
                    .metadata()
                    .topics
                    .get(&src_topic)
                    .map(|t| t.id)
                    .filter(|id| !id.is_nil())
                    .map(|id| topic_id_text(&id));
                for (p, committed) in parts {
                    if committed.offset < 0 {
                        continue;
                    }
                    let own = (!reverse)
                        .then(|| {
                            self.runs
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .translate(&src_topic, p, committed.offset)
                        })
                        .flatten();
                    let published = || {
                        state
                            .published
                            .translate(&src_topic, p, committed.offset, log.as_deref())
                    };
                    let exact = own.or_else(|| (!reverse).then(published).flatten());
                    let via = match (own, exact) {
                        (Some(_), _) => "runs",
                        (None, Some(_)) => "published_runs",
                        (None, None) => "syncs",
                    };
                    self.metrics
                        .checkpoint_translations
                        .get_or_create(&self.labels.via(via))
                        .inc();
                    let translation = match exact {
                        Some(d) => Translation::Offset(d),
                        None if reverse => state.reverse.translate(&remote, p, committed.offset),
                        None => state.store.translate(&src_topic, p, committed.offset),
                    };
                    let Translation::Offset(down) = translation else {
                        continue;
                    };
                    if state
                        .rules
                        .should_emit(&group, &remote, p, committed.offset, down)
                    {
                        fresh.push(Checkpoint {
                            group: group.clone(),
                            topic: remote.clone(),
                            partition: p,
                            upstream_offset: committed.offset,
                            downstream_offset: down,
                            metadata: committed.metadata.clone(),
                        });
                    }
                }
            }
        }
        if !fresh.is_empty() {
            // In batches well below the broker's default max.message.bytes (1 MiB): a
            // checkpoint with its commit metadata is at most a few KiB.
            for chunk in fresh.chunks(200) {
                if let Err(e) = self.write(topic, chunk).await {
                    // Forget the unwritten ones, so they are emitted again next time.
                    for c in chunk {
                        state.rules.forget(&c.group, &c.topic, c.partition);
                    }
                    return Err(e);
                }
            }
            self.metrics
                .checkpoints
                .get_or_create(&self.labels)
                .inc_by(fresh.len() as u64);
            tracing::debug!(flow = %self.flow.id, checkpoints = fresh.len(), "checkpoints written");
        }
        // Every group's checkpoint is current as of now (written, or unchanged since).
        self.metrics
            .checkpoint_timestamp
            .get_or_create(&self.labels)
            .set(super::now_ms() / 1000);
        let sync = self.flow.sync_group_offsets;
        if sync.enabled
            && state
                .last_group_sync
                .is_none_or(|t| t.elapsed() >= sync.interval)
        {
            self.sync_group_offsets(state).await;
            state.last_group_sync = Some(Instant::now());
        }
        Ok(())
    }

    /// Where a group's source topic is checkpointed: a topic this flow replicates goes to its
    /// remote name, translated with this flow's syncs; a topic that came from the target
    /// (`B.t` on A for A->B) goes back to its name there (`t`), translated with the opposite
    /// flow's syncs inverted. None: not checkpointed.
    /// Identity names both ways (docs/topologies.md, "Checkpoints both ways"): a topic on the
    /// source then holds records written there and records copied from the target, in an order
    /// the target's copy does not share, so no target offset stands for a group's position
    /// without skipping records the group has not read or re-reading ones it has. Checkpoints
    /// and the group offset sync are held back rather than written wrong.
    async fn held_back(&self) -> Result<bool, KafkaError> {
        let Some(guard) = &self.loop_guard else {
            return Ok(false);
        };
        // With prefixed names the two directions write different topics (`A.orders` is never
        // copied back), so positions translate as always.
        if self.flow.policy.kind != crate::policy::PolicyKind::Identity {
            return Ok(false);
        }
        let both = guard.both_ways().await?;
        let gauge = self
            .metrics
            .checkpoints_both_ways
            .get_or_create(&self.labels)
            .clone();
        let was = gauge.get() == 1;
        gauge.set(both as i64);
        if both && !was {
            tracing::warn!(flow = %self.flow.id, "checkpoints and group offset sync held back: {} also copies into {} under the same topic names, so a group's position on {} has no exact equivalent on {}; move consumers by timestamp instead (docs/topologies.md)", self.flow.id.target, self.flow.id.source, self.flow.id.source, self.flow.id.target);
        }
        Ok(both)
    }

    fn route(&self, topic: &str) -> Option<(String, bool)> {
        if let Some(remote) = discovery::decide(&self.flow, [topic])
            .pop()
            .and_then(|d| d.remote)
        {
            let (target, flow) = (self.flow.id.target.to_string(), self.flow.id.to_string());
            if self.claims.claim(&target, &remote, &flow, topic).is_err() {
                return None;
            }
            return Some((remote, false));
        }
        let policy = &self.flow.policy;
        let from_target =
            policy.topic_source(topic).as_deref() == Some(self.flow.id.target.as_str());
        if from_target && self.flow.topics.accepts(topic) {
            return policy
                .upstream_topic(topic)
                .filter(|t| t != topic)
                .map(|t| (t, true));
        }
        None
    }

    /// Applies the runs the flow's processes published since the last read (docs/sharing.md,
    /// "Exact checkpoints"), from every partition of the positions topic.
    async fn read_published(&self, state: &mut State) -> Result<(), KafkaError> {
        let topic = &self.positions_topic;
        if !self.target.metadata().topics.contains_key(topic) {
            self.target.refresh_metadata(Some(&[topic])).await?;
        }
        let cluster = self.flow.id.source.as_str();
        let published = &mut state.published;
        super::positions::visit(&self.target, topic, &mut state.positions_next, |rec| {
            if let StoredRecord::Runs {
                cluster: c,
                member,
                publication,
            } = rec
            {
                if c == cluster {
                    published.apply(&member, publication.as_ref(), Instant::now());
                }
            }
        })
        .await?;
        let partitions = self
            .target
            .metadata()
            .partition_count(topic)
            .unwrap_or(1)
            .max(1);
        // Records of processes killed before they could remove theirs, once later owners
        // replaced all they described: removed, so the topic does not keep one per process
        // that ever ran.
        for member in state.published.stale(STALE_RUNS, Instant::now()) {
            let key = crate::wire::positions::runs_key(cluster, &member);
            let partition = crate::wire::positions::positions_partition(&key, partitions);
            remote_topics::write_record(&self.target, topic, partition, super::now_ms(), key, None)
                .await?;
            tracing::info!(flow = %self.flow.id, member, "removed the published runs of a process that describes no partition any more");
            state.published.apply(&member, None, Instant::now());
        }
        Ok(())
    }

    /// Applies offset syncs written since the last read: this flow's, and the opposite flow's
    /// (inverted) when that flow writes them.
    async fn read_syncs(&self, state: &mut State) -> Result<(), KafkaError> {
        let (topic, _) = self.flow.offset_syncs_topic();
        if let Some(next) = read_syncs_from(&self.syncs_cluster, &topic, state.syncs_next, |s| {
            state.store.apply(&s)
        })
        .await?
        {
            state.syncs_next = Some(next);
        }
        let (topic, side) = self.flow.opposite_offset_syncs_topic();
        let cluster = match side {
            Side::Target => &self.target,
            Side::Source => &self.source,
        };
        // Optional (failback only): a failure here must not hold up this flow's checkpoints.
        match read_syncs_from(cluster, &topic, state.reverse_next, |s| {
            state.reverse.apply(&OffsetSync {
                topic: s.topic,
                partition: s.partition,
                upstream_offset: s.downstream_offset,
                downstream_offset: s.upstream_offset,
            })
        })
        .await
        {
            Ok(Some(next)) => state.reverse_next = Some(next),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(flow = %self.flow.id, topic, error = %e, "opposite flow's offset syncs unreadable; failback checkpoints skipped")
            }
        }
        Ok(())
    }

    async fn write(&self, topic: &str, checkpoints: &[Checkpoint]) -> Result<(), KafkaError> {
        let now = super::now_ms();
        let records = checkpoints
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let bad = |e: crate::wire::internal::WireError| KafkaError::Config(e.to_string());
                Ok(Record {
                    offset: i as i64,
                    timestamp: now,
                    key: Some(Bytes::from(c.key().map_err(bad)?)),
                    value: Some(Bytes::from(c.value().map_err(bad)?)),
                    headers: vec![],
                })
            })
            .collect::<Result<Vec<_>, KafkaError>>()?;
        let batch = encode_batch(&records, &BatchOptions::default())
            .map_err(|e| KafkaError::Config(e.to_string()))?;
        self.target.produce(topic, 0, &batch).await?;
        Ok(())
    }

    /// Commits translated offsets into B for every checkpointed group with no active members
    /// there; an offset B already holds that is at or past the translation is left alone.
    async fn sync_group_offsets(&self, state: &mut State) {
        // Only groups the filter accepts and the source still has (the checkpoints read back at
        // start may hold others, e.g. written by MM2 with other settings).
        let groups: Vec<String> = state
            .rules
            .groups()
            .into_iter()
            .filter(|g| state.groups.contains(g))
            .collect();
        for group in groups {
            let outcome = self.sync_group(&group, &state.rules).await;
            let reason = match outcome {
                Ok(None) => {
                    state.skipped.remove(&group);
                    continue;
                }
                Ok(Some(reason)) => reason,
                Err(e) => format!("error: {e}"),
            };
            if state.skipped.get(&group) != Some(&reason) {
                tracing::info!(flow = %self.flow.id, group, reason = %reason, "group offsets not synced to the target");
                state.skipped.insert(group.clone(), reason);
            }
        }
    }

    /// None when synced (or nothing to do); otherwise why not.
    async fn sync_group(
        &self,
        group: &str,
        rules: &CheckpointRules,
    ) -> Result<Option<String>, KafkaError> {
        let desc = self.target.describe_group(group).await?;
        if desc.members > 0 {
            return Ok(Some(format!(
                "{} active member(s) on the target (state {}); their own commits win",
                desc.members, desc.state
            )));
        }
        let current = self.target.fetch_group_offsets(group).await?;
        let partitions: HashSet<(String, i32)> = self
            .target
            .metadata()
            .topics
            .iter()
            .flat_map(|(t, m)| m.partitions.iter().map(move |p| (t.clone(), p.partition)))
            .collect();
        let mut commit: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = BTreeMap::new();
        let mut missing = 0;
        for (topic, p, down) in rules.group(group) {
            if !partitions.contains(&(topic.clone(), p)) {
                missing += 1;
                continue;
            }
            let have = current
                .get(&topic)
                .and_then(|m| m.get(&p))
                .map(|c| c.offset);
            // Never rewind what the target holds (a consumer there may have moved on).
            if have.is_none_or(|h| h < down) {
                commit.entry(topic).or_default().insert(
                    p,
                    CommittedOffset {
                        offset: down,
                        leader_epoch: -1,
                        metadata: String::new(),
                    },
                );
            }
        }
        if !commit.is_empty() {
            self.target.commit_group_offsets(group, &commit).await?;
            let n: usize = commit.values().map(|m| m.len()).sum();
            tracing::info!(flow = %self.flow.id, group, partitions = n, "group offsets synced to the target");
            self.metrics
                .group_offsets_synced
                .get_or_create(&self.labels)
                .inc_by(n as u64);
        }
        if missing > 0 {
            return Ok(Some(format!(
                "{missing} partition(s) not on the target yet (topic or partition count differs)"
            )));
        }
        Ok(None)
    }
}
