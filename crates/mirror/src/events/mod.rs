//! Typed internal events, after Vector's `internal_events`: each thing that happens is a small
//! struct whose `emit` both logs it and counts it, so a log line never goes without its count
//! or the other way round. What each metric counts: docs/metrics.md.
//!
//! The failures of the flow's background writers and syncs are here, the copy path's in
//! [`copy`], MM1 mode's in [`legacy`]; the data path's own figures (records, bytes, lag) are
//! gauges and counters set in place, where a log line per batch would be noise.

pub mod copy;
pub mod legacy;

use crate::metrics::{ErrorKind, FlowLabels, Metrics, PartitionLabels};
use crate::names::FlowId;
use std::fmt::{Debug, Display};
use std::time::Duration;

/// What went wrong, as an event carries it: shown in the log line (Display), and in Debug output.
pub trait Cause: Display + Debug {}
impl<T: Display + Debug + ?Sized> Cause for T {}

/// Where an event is counted: the process's metrics under one flow's labels.
#[derive(Debug, Clone, Copy)]
pub struct Emitter<'a> {
    pub metrics: &'a Metrics,
    pub labels: &'a FlowLabels,
}

impl Emitter<'_> {
    fn count(&self, kind: ErrorKind) {
        self.metrics
            .errors
            .get_or_create(&self.labels.error(kind))
            .inc();
    }
}

/// Something that happened, logged and counted at once.
pub trait Event {
    fn emit(self, to: Emitter<'_>);
}

/// One of the internal topics a flow writes in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InternalWrite {
    Heartbeats,
    OffsetSyncs,
    Checkpoints,
    Positions,
}

impl InternalWrite {
    fn kind(self) -> ErrorKind {
        match self {
            InternalWrite::Heartbeats => ErrorKind::Heartbeat,
            InternalWrite::OffsetSyncs => ErrorKind::OffsetSyncs,
            InternalWrite::Checkpoints => ErrorKind::Checkpoints,
            InternalWrite::Positions => ErrorKind::Positions,
        }
    }

    fn what(self) -> &'static str {
        match self {
            InternalWrite::Heartbeats => "heartbeats",
            InternalWrite::OffsetSyncs => "offset syncs",
            InternalWrite::Checkpoints => "checkpoints",
            InternalWrite::Positions => "source positions",
        }
    }
}

/// Writing `what` to `topic` failed; its writer tries again.
#[derive(Debug)]
pub struct InternalWriteFailed<'a> {
    pub flow: &'a FlowId,
    pub what: InternalWrite,
    pub topic: &'a str,
    pub error: &'a dyn Cause,
}

impl Event for InternalWriteFailed<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, topic = %self.topic, error = %self.error, "cannot write {}; retrying", self.what.what());
        to.count(self.what.kind());
    }
}

/// A topic left out of this round of the control loop (its metadata could not be read, or its
/// remote topic could not be created); tried again with backoff.
#[derive(Debug)]
pub struct TopicSkipped<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
    pub kind: ErrorKind,
    pub error: &'a dyn Cause,
}

impl Event for TopicSkipped<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::error!(flow = %self.flow, topic = %self.topic, error = %self.error, "topic skipped; trying again in 5 s, backing off to a minute (or refresh.topics.interval.seconds if shorter)");
        to.count(self.kind);
    }
}

/// Topic config sync or ACL sync could not apply something; `message` says what and which
/// permission it needs.
#[derive(Debug)]
pub struct SyncNotApplied<'a> {
    pub flow: &'a FlowId,
    pub of: SyncOf,
    pub message: &'a str,
}

/// What a sync copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOf {
    TopicConfigs,
    Acls,
}

impl Event for SyncNotApplied<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, "{}", self.message);
        to.count(match self.of {
            SyncOf::TopicConfigs => ErrorKind::ConfigSync,
            SyncOf::Acls => ErrorKind::AclSync,
        });
    }
}

/// A flow could not reach one of its clusters at start; it tries again after `retry_in`.
#[derive(Debug)]
pub struct ClusterUnreachable<'a> {
    pub flow: &'a FlowId,
    pub cluster: &'a str,
    pub error: &'a dyn Cause,
    pub retry_in: Duration,
}

impl Event for ClusterUnreachable<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, cluster = %self.cluster, error = %self.error, retry_in = ?self.retry_in, "cannot reach cluster; retrying");
        to.count(ErrorKind::Connect);
    }
}

/// A flow's setup (stored positions, its producer, the offset-syncs cluster) failed in a way
/// worth retrying.
#[derive(Debug)]
pub struct FlowSetupFailed<'a> {
    pub flow: &'a FlowId,
    pub error: &'a dyn Cause,
    pub retry_in: Duration,
}

impl Event for FlowSetupFailed<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, error = %self.error, retry_in = ?self.retry_in, "flow setup failed; retrying");
        to.count(ErrorKind::Setup);
    }
}

/// The stored positions of newly assigned partitions could not be read; tried again.
#[derive(Debug)]
pub struct PositionsUnreadable<'a> {
    pub flow: &'a FlowId,
    pub error: &'a dyn Cause,
    pub retry_in: Duration,
}

impl Event for PositionsUnreadable<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, error = %self.error, retry_in = ?self.retry_in, "cannot read the positions of the partitions assigned; retrying");
        to.count(ErrorKind::Positions);
    }
}

/// Two flows of the process would write one remote topic; the later one skips the topic (for
/// as long as the conflict lasts, logged once).
#[derive(Debug)]
pub struct TopicConflict<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
    pub error: &'a dyn Cause,
}

impl Event for TopicConflict<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::error!(flow = %self.flow, topic = %self.topic, error = %self.error, "topic skipped");
        to.count(ErrorKind::TopicConflict);
    }
}

/// A source topic disappeared; its partitions stopped (the remote topic keeps its records).
#[derive(Debug)]
pub struct SourceTopicDeleted<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
}

impl Event for SourceTopicDeleted<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(flow = %self.flow, topic = %self.topic, "source topic deleted; no longer copied (the remote topic keeps what was copied)");
        to.count(ErrorKind::TopicDeleted);
    }
}

/// A source topic has a new topic id: deleted and created again under its name. The new log
/// is copied from its start; the remote topic keeps the old records before the new ones.
#[derive(Debug)]
pub struct SourceTopicRecreated<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
    pub old_topic_id: &'a str,
    pub new_topic_id: &'a str,
    /// Found at start: the topic was re-created while kmirror was not running.
    pub while_stopped: bool,
}

impl Event for SourceTopicRecreated<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::error!(
            flow = %self.flow,
            topic = %self.topic,
            old_topic_id = %self.old_topic_id,
            new_topic_id = %self.new_topic_id,
            while_stopped = self.while_stopped,
            "source topic was deleted and re-created; copying the new topic from its start (the remote topic keeps the old records)"
        );
        to.count(ErrorKind::TopicRecreated);
    }
}

/// A partition task panicked (a bug); the partition stops.
#[derive(Debug)]
pub struct PartitionPanicked;

impl Event for PartitionPanicked {
    fn emit(self, to: Emitter<'_>) {
        // The panic's message is logged with the stop that follows (PartitionStopped).
        to.count(ErrorKind::Panic);
    }
}

/// A partition stopped for good; `/ready` turns false until it runs again.
#[derive(Debug)]
pub struct PartitionStopped<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
    pub partition: &'a PartitionLabels,
    pub error: &'a dyn Cause,
}

impl Event for PartitionStopped<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::error!(flow = %self.flow, topic = %self.topic, partition = self.partition.partition, error = %self.error, "partition stopped");
        to.metrics.set_partition_stopped(self.partition, true);
    }
}

/// Remembers the last error text of a retrying loop, so that an error repeated every round is
/// logged and counted once, and a recovery is noticed.
#[derive(Debug, Default)]
pub struct LastError(Option<String>);

impl LastError {
    /// Whether `error` differs from the last one (remembering it).
    pub fn is_new(&mut self, error: &dyn Cause) -> bool {
        let text = error.to_string();
        if self.0.as_deref() == Some(text.as_str()) {
            return false;
        }
        self.0 = Some(text);
        true
    }

    /// Forgets the last error; true if there was one (the loop has recovered).
    pub fn clear(&mut self) -> bool {
        self.0.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ClusterAlias;

    fn setup() -> (Metrics, FlowLabels, FlowId) {
        let labels = FlowLabels {
            source: "A".into(),
            target: "B".into(),
        };
        let id = FlowId::new(ClusterAlias::new("A"), ClusterAlias::new("B"));
        (Metrics::new(), labels, id)
    }

    #[test]
    fn each_event_counts_its_kind() {
        let (m, labels, flow) = setup();
        let to = Emitter {
            metrics: &m,
            labels: &labels,
        };
        let error = "broker gone";
        InternalWriteFailed {
            flow: &flow,
            what: InternalWrite::OffsetSyncs,
            topic: "mm2-offset-syncs.B.internal",
            error: &error,
        }
        .emit(to);
        SyncNotApplied {
            flow: &flow,
            of: SyncOf::Acls,
            message: "no DESCRIBE",
        }
        .emit(to);
        TopicSkipped {
            flow: &flow,
            topic: "t",
            kind: ErrorKind::TopicCreate,
            error: &error,
        }
        .emit(to);
        PartitionPanicked.emit(to);
        let p = labels.partition("A.t", 2);
        PartitionStopped {
            flow: &flow,
            topic: "t",
            partition: &p,
            error: &error,
        }
        .emit(to);
        for kind in ["offset_syncs", "acl_sync", "topic_create", "panic"] {
            assert_eq!(
                m.sum("kmirror_errors_total", &[("kind", kind)]),
                1.0,
                "{kind}"
            );
        }
        assert_eq!(m.sum("kmirror_errors_total", &[]), 4.0);
        assert_eq!(
            m.sum("kmirror_partition_stopped", &[("partition", "2")]),
            1.0
        );
        assert!(!m.process.readiness().0);
    }

    #[test]
    fn a_repeated_error_is_new_once_and_a_recovery_is_seen() {
        let mut last = LastError::default();
        assert!(last.is_new(&"timeout"));
        assert!(!last.is_new(&"timeout"));
        assert!(last.is_new(&"refused"));
        assert!(last.clear());
        assert!(!last.clear());
        assert!(last.is_new(&"refused"));
    }
}
