//! The label sets of kmirror's metric families (the families' keys) and the error kinds of
//! `kmirror_errors_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::sync::Arc;

/// A label value whose clones share one allocation (prometheus-client encodes `Arc<T>` only for
/// sized `T`, so not `Arc<str>`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Label(Arc<str>);

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label(s.into())
    }
}

impl From<String> for Label {
    fn from(s: String) -> Label {
        Label(s.into())
    }
}

impl std::ops::Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// A flow.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    pub source: Label,
    pub target: Label,
}

/// One partition of a remote topic (MM2 tags the remote topic name). Label values are shared
/// (`Label`, the partition a number): seven families hold a series per partition, and owned
/// strings cost four allocations per series, megabytes at 10,000 partitions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub source: Label,
    pub target: Label,
    pub topic: Label,
    pub partition: i32,
}

/// Batches forwarded as fetched (`batch`) or decoded and re-encoded (`record`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub source: Label,
    pub target: Label,
    pub mode: String,
}

/// Errors by kind: the `kind` label of `kmirror_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub source: Label,
    pub target: Label,
    pub kind: &'static str,
}

/// Every kind of `kmirror_errors_total` the code counts. A closed list, so that docs/metrics.md
/// can say what each means and a test holds the two together (an alert rule written against the
/// docs must not miss a kind).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ErrorKind {
    Setup,
    Connect,
    Metadata,
    Fetch,
    Produce,
    Fatal,
    Panic,
    TopicDeleted,
    TopicRecreated,
    TopicCreate,
    TopicConflict,
    TargetTopic,
    Truncation,
    PositionBeyondEnd,
    RecordsSkipped,
    Positions,
    Heartbeat,
    OffsetSyncs,
    Checkpoints,
    ConfigSync,
    AclSync,
    Send,
    Commit,
    Transaction,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 24] = [
        ErrorKind::Setup,
        ErrorKind::Connect,
        ErrorKind::Metadata,
        ErrorKind::Fetch,
        ErrorKind::Produce,
        ErrorKind::Fatal,
        ErrorKind::Panic,
        ErrorKind::TopicDeleted,
        ErrorKind::TopicRecreated,
        ErrorKind::TopicCreate,
        ErrorKind::TopicConflict,
        ErrorKind::TargetTopic,
        ErrorKind::Truncation,
        ErrorKind::PositionBeyondEnd,
        ErrorKind::RecordsSkipped,
        ErrorKind::Positions,
        ErrorKind::Heartbeat,
        ErrorKind::OffsetSyncs,
        ErrorKind::Checkpoints,
        ErrorKind::ConfigSync,
        ErrorKind::AclSync,
        ErrorKind::Send,
        ErrorKind::Commit,
        ErrorKind::Transaction,
    ];

    /// The label value, as docs/metrics.md lists it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Setup => "setup",
            ErrorKind::Connect => "connect",
            ErrorKind::Metadata => "metadata",
            ErrorKind::Fetch => "fetch",
            ErrorKind::Produce => "produce",
            ErrorKind::Fatal => "fatal",
            ErrorKind::Panic => "panic",
            ErrorKind::TopicDeleted => "topic_deleted",
            ErrorKind::TopicRecreated => "topic_recreated",
            ErrorKind::TopicCreate => "topic_create",
            ErrorKind::TopicConflict => "topic_conflict",
            ErrorKind::TargetTopic => "target_topic",
            ErrorKind::Truncation => "truncation",
            ErrorKind::PositionBeyondEnd => "position_beyond_end",
            ErrorKind::RecordsSkipped => "records_skipped",
            ErrorKind::Positions => "positions",
            ErrorKind::Heartbeat => "heartbeat",
            ErrorKind::OffsetSyncs => "offset_syncs",
            ErrorKind::Checkpoints => "checkpoints",
            ErrorKind::ConfigSync => "config_sync",
            ErrorKind::AclSync => "acl_sync",
            ErrorKind::Send => "send",
            ErrorKind::Commit => "commit",
            ErrorKind::Transaction => "transaction",
        }
    }
}

/// Fetch requests of a flow, by kind (`full`, `incremental`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchLabels {
    pub source: Label,
    pub target: Label,
    pub kind: String,
}

/// Periodic work of a flow, by kind (`topic_refresh`, `config_sync`, `acl_sync`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoundLabels {
    pub source: Label,
    pub target: Label,
    pub kind: String,
}

/// How a group's offset was translated for a checkpoint: `runs` (exact, copied here),
/// `published_runs` (exact, copied by another process of the flow), `syncs` (MM2's rule).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ViaLabels {
    pub source: Label,
    pub target: Label,
    pub via: &'static str,
}

/// Why an exactly-once transaction was aborted (docs/metrics.md).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub source: Label,
    pub target: Label,
    pub reason: &'static str,
}

/// What became of a transaction found open after its coordinator completed it (its marker
/// dropped): `found`, then `settled` (docs/engine.md).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub source: Label,
    pub target: Label,
    pub outcome: &'static str,
}

/// Why an exactly-once transaction was aborted: every `reason` of
/// `kmirror_transactions_aborted_total` (docs/metrics.md), so `/status` can add them up.
pub const ABORT_REASONS: [&str; 4] = ["failed", "timeout", "commit_failed", "fenced"];

impl FlowLabels {
    pub fn partition(&self, topic: &str, partition: i32) -> PartitionLabels {
        PartitionLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            topic: topic.into(),
            partition,
        }
    }
    pub fn mode(&self, mode: &str) -> ModeLabels {
        ModeLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            mode: mode.to_string(),
        }
    }
    pub fn round(&self, kind: &str) -> RoundLabels {
        RoundLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            kind: kind.to_string(),
        }
    }
    pub fn fetch(&self, kind: &str) -> FetchLabels {
        FetchLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            kind: kind.to_string(),
        }
    }
    pub fn via(&self, via: &'static str) -> ViaLabels {
        ViaLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            via,
        }
    }
    pub fn outcome(&self, outcome: &'static str) -> OutcomeLabels {
        OutcomeLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            outcome,
        }
    }
    pub fn reason(&self, reason: &'static str) -> ReasonLabels {
        ReasonLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            reason,
        }
    }
    pub fn error(&self, kind: ErrorKind) -> ErrorLabels {
        ErrorLabels {
            source: self.source.clone(),
            target: self.target.clone(),
            kind: kind.as_str(),
        }
    }
}
