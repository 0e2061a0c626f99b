//! A flow's control loop state and its round: discover the source's topics, leave out those
//! another flow writes, stop the tasks of deleted topics, create or grow remote topics (the
//! group's leader only, with sharing), and start one partition task per new source partition
//! this process owns. A topic that cannot be created is reported and skipped while the others
//! continue, and tried again within a minute.

use super::Running;
use crate::discovery;
use crate::engine::partition::{Context, PartitionTask};
use crate::engine::remote_topics::{self, Ensured};
use crate::engine::sharing::{assign, Shared};
use crate::engine::slot_keeper::SlotKeeper;
use crate::engine::topic_sync::Replicated;
use crate::engine::Shutdown;
use crate::events::{
    Event as _, SourceTopicDeleted, SourceTopicRecreated, TopicConflict, TopicSkipped,
};
use crate::metrics::ErrorKind;
use kmirror_kafka::cluster::{topic_id_text, TopicId};
use kmirror_kafka::KafkaError;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

pub(super) struct Control {
    pub(super) ctx: Arc<Context>,
    /// Source → remote topic of every topic being replicated (read by topic sync).
    pub(super) replicated: Replicated,
    /// Partitions started before in this flow (a restarted one needs its own producer id).
    pub(super) started: HashSet<(String, i32)>,
    /// Topics with running tasks that the last metadata answer did not list (see `reconcile`).
    pub(super) missing: HashSet<String>,
    pub(super) stored: HashMap<(String, i32), i64>,
    pub(super) running: BTreeMap<(String, i32), Running>,
    pub(super) topic_ids: HashMap<String, TopicId>,
    /// The last error reported per topic, so a failure repeating every refresh is logged once.
    pub(super) reported: HashMap<String, String>,
    pub(super) first_round: bool,
    /// Sharing: the last acknowledged offsets of partitions this process stopped when it lost
    /// its membership (see `lose`).
    pub(super) remembered: HashMap<(String, i32), i64>,
    /// Topics whose replication was logged, with their partition count then (with sharing, a
    /// topic may have no partition in this process).
    pub(super) announced: HashMap<String, i32>,
    /// With sharing: what the membership shares, and the partitions assigned to this process
    /// (only those are started); the slots assigned, for exactly-once flows.
    pub(super) sharing: Option<Assigned>,
    /// Exactly-once: the slots held (only their partitions are started).
    pub(super) slots: Option<SlotKeeper>,
    /// The flow's shutdown (taking a slot retries until it).
    pub(super) shutdown: Shutdown,
    /// The remote topics every flow of this process writes (`remote_claims`).
    pub(super) claims: Arc<crate::engine::remote_claims::RemoteClaims>,
    /// Source topics skipped because another flow writes their remote name (reported once).
    pub(super) conflicts: HashSet<String>,
}

/// With sharing: what the membership and the control loop share, and the partitions assigned
/// to this process.
pub(super) struct Assigned {
    pub(super) shared: Arc<Shared>,
    pub(super) partitions: BTreeSet<(String, i32)>,
}

impl Control {
    pub(super) fn new(
        ctx: Arc<Context>,
        replicated: Replicated,
        stored: crate::engine::positions::Stored,
        shared: Option<Arc<Shared>>,
        slots: Option<SlotKeeper>,
        shutdown: &Shutdown,
        claims: Arc<crate::engine::remote_claims::RemoteClaims>,
    ) -> Control {
        Control {
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
            claims,
            conflicts: HashSet::new(),
        }
    }

    /// Brings the running partition tasks in line with the source's topics.
    pub(super) async fn reconcile(&mut self) {
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
        self.drop_claimed(&mut decisions);
        self.stop_deleted(&md).await;
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
            if let Some(n) = self
                .copy_topic(&md, d.source, remote, leads, &created_now, &mut eligible)
                .await
            {
                topics += 1;
                partitions += n;
            }
        }
        self.publish_eligible(eligible);
        let m = &self.ctx.metrics;
        m.flow_topics.get_or_create(&self.ctx.labels).set(topics);
        m.flow_partitions
            .get_or_create(&self.ctx.labels)
            .set(partitions as i64);
        self.publish_share();
        self.first_round = false;
    }

    /// Leaves out topics whose remote name another flow of this process writes.
    fn drop_claimed(&mut self, decisions: &mut [discovery::TopicDecision]) {
        let ctx = self.ctx.clone();
        let flow = &ctx.flow;
        for d in decisions.iter_mut() {
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
    }

    /// A source topic deleted (gone from the metadata): its tasks would ask for its partitions
    /// forever. They stop and store their positions; the remote topic keeps what was copied.
    async fn stop_deleted(&mut self, md: &kmirror_kafka::cluster::Metadata) {
        let ctx = self.ctx.clone();
        let flow = &ctx.flow;
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
    }

    /// Creates or grows `source`'s remote topic and starts its partitions this process owns;
    /// the topic's partition count once it is replicated, None when it is not (yet).
    async fn copy_topic(
        &mut self,
        md: &kmirror_kafka::cluster::Metadata,
        source: String,
        remote: String,
        leads: bool,
        created_now: &BTreeMap<String, usize>,
        eligible: &mut BTreeSet<(String, i32)>,
    ) -> Option<i32> {
        let ctx = self.ctx.clone();
        let flow = &ctx.flow;
        let t = &md.topics[&source];
        if t.error.is_some() || t.partitions.is_empty() {
            return None; // still being created; next round
        }
        let n = t.partitions.len() as i32;
        // Brokers before 2.8 have no topic ids (nil): nothing to compare or record.
        let known = self.topic_ids.get(&source).copied();
        if !t.id.is_nil() && known != Some(t.id) {
            let forget = match known {
                Some(old) => self.recreated(&source, old, t.id).await,
                None => BTreeSet::new(),
            };
            self.ctx.board.log(&source, t.id, forget);
            self.topic_ids.insert(source.clone(), t.id);
        }
        let ensured = if leads {
            // `admin.timeout.ms` bounds one admin step, as it bounds MM2's admin calls: past
            // it the topic is reported and tried again with the other skipped ones, and the
            // topics after it are not held up.
            let ensure = remote_topics::ensure(flow, &ctx.source, &ctx.target, &source, &remote, n);
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
            return None; // the leader creates it; the next refresh of the target shows it
        };
        let created = match ensured {
            Ok(e) => {
                let e = match (e, created_now.get(&remote)) {
                    (Ensured::Exists, Some(&configs)) => Ensured::Created { configs },
                    (e, _) => e,
                };
                let created = matches!(e, Ensured::Created { .. });
                if self.reported.remove(&source).is_some() {
                    tracing::info!(flow = %flow.id, topic = %source, "topic recovered");
                }
                match e {
                    Ensured::Created { configs } => {
                        tracing::info!(flow = %flow.id, topic = %source, remote = %remote, partitions = n, configs, "created remote topic")
                    }
                    Ensured::Grown { from, to } => {
                        tracing::info!(flow = %flow.id, topic = %source, remote = %remote, from, to, "added partitions to remote topic")
                    }
                    Ensured::MorePartitions { remote: have } => {
                        if !self.running.keys().any(|(t, _)| *t == source) {
                            tracing::warn!(flow = %flow.id, topic = %source, remote = %remote, source_partitions = n, remote_partitions = have, "remote topic has more partitions than the source; records keep their partition numbers, the extra partitions stay empty");
                        }
                    }
                    Ensured::Exists => {}
                }
                created
            }
            Err(e) => {
                self.report(&source, ErrorKind::TopicCreate, &e);
                return None;
            }
        };
        self.replicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(source.clone(), remote.clone());
        let seen = self.announced.insert(source.clone(), n);
        let new_topic = seen.is_none();
        if new_topic {
            tracing::info!(flow = %flow.id, topic = %source, remote = %remote, partitions = n, "replicating topic");
            if !created {
                match remote_topics::cleanup_policy_mismatch(
                    &ctx.source,
                    &ctx.target,
                    &source,
                    &remote,
                )
                .await
                {
                    Ok(Some((s, t))) => {
                        tracing::warn!(flow = %flow.id, topic = %source, remote = %remote, source_policy = %s, remote_policy = %t, "remote topic existed with a different cleanup.policy; records are copied, but the two topics will not keep the same records")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(topic = %source, error = %e, "cannot compare cleanup.policy")
                    }
                }
            }
        }
        for p in 0..n {
            let key = (source.clone(), p);
            eligible.insert(key.clone());
            if seen.is_some_and(|had| p >= had) {
                tracing::info!(flow = %flow.id, topic = %source, partition = p, "replicating added partition");
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
        Some(n)
    }

    /// With sharing: the partitions the group may assign (exactly-once: the slots).
    fn publish_eligible(&self, mut eligible: BTreeSet<(String, i32)>) {
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
    }

    /// `kmirror_topics` and `kmirror_partitions`: what this process copies now, so the values
    /// of the processes sharing a flow add up to the flow's (`kmirror_flow_*`).
    pub(super) fn publish_share(&self) {
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

    pub(super) fn start(&mut self, key: (String, i32), remote: String) {
        self.ctx
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resumed(&key.0, key.1);
        let new_topic = self
            .running
            .range((key.0.clone(), i32::MIN)..=(key.0.clone(), i32::MAX))
            .next()
            .is_none();
        let stop = Shutdown::default();
        let stored = self.stored.get(&key).copied();
        // Watched from the moment it is assigned: lag and, past a bound, what it waits for.
        let watch = self.ctx.waiting.assigned(
            key.clone(),
            self.ctx.labels.partition(&remote, key.1),
            stored,
        );
        let task = PartitionTask {
            ctx: self.ctx.clone(),
            topic: key.0.clone(),
            remote,
            partition: key.1,
            stored,
            watch,
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
        // Counted as they start, not once the round ends: a round that starts thousands of
        // partitions takes tens of seconds, and `status` must not show 0 while they copy.
        let m = &self.ctx.metrics;
        m.partitions
            .get_or_create(&self.ctx.labels)
            .set(self.running.len() as i64);
        if new_topic {
            m.topics.get_or_create(&self.ctx.labels).inc();
        }
    }

    /// A source topic deleted and re-created: positions and translation runs belong to the old
    /// log. Its tasks are stopped and start again on the new log from `auto.offset.reset`
    /// (earliest by default); the remote topic keeps the old records, followed by the new ones.
    /// Stops a re-created topic's tasks and drops its positions; returns the partitions whose
    /// stored positions (of the old log) are to be removed from the positions topic.
    pub(super) async fn recreated(
        &mut self,
        topic: &str,
        old: TopicId,
        new: TopicId,
    ) -> BTreeSet<i32> {
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

    pub(super) fn report(&mut self, topic: &str, kind: ErrorKind, e: &KafkaError) {
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
}
