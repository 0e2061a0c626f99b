//! Events of the copy path (MM2 mode's partitions): failures found while forwarding. Each
//! counts its error kind; the ones whose outcome is a retry or a stop log at debug level, since
//! the retry loop or [`PartitionStopped`](super::PartitionStopped) logs what follows once.

use super::{Cause, Emitter, Event};
use crate::metrics::ErrorKind;
use crate::names::FlowId;

/// Where a partition's copy event happened.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub flow: &'a FlowId,
    pub topic: &'a str,
    /// The remote topic's name: the per-partition figures are labelled with it.
    pub remote: &'a str,
    pub partition: i32,
}

/// The source deleted records before they were copied (retention, DeleteRecords): `lost`
/// offsets are gone. `continuing` is kmirror.source.truncation=continue, which goes on from the
/// log start; otherwise the partition stops (docs/engine.md, "Source truncation and
/// re-creation").
#[derive(Debug)]
pub struct SourceTruncated<'a> {
    pub at: At<'a>,
    pub lost: u64,
    pub continuing: bool,
    pub error: &'a dyn Cause,
}

impl Event for SourceTruncated<'_> {
    fn emit(self, to: Emitter<'_>) {
        let at = self.at;
        if self.continuing {
            tracing::error!(flow = %at.flow, error = %self.error, "records lost; continuing from the source log start (kmirror.source.truncation=continue)");
        } else {
            tracing::debug!(flow = %at.flow, topic = at.topic, partition = at.partition, lost = self.lost, "source truncated; the partition stops");
        }
        to.metrics
            .truncated_offsets
            .get_or_create(&to.labels.partition(at.remote, at.partition))
            .inc_by(self.lost);
        to.count(ErrorKind::Truncation);
    }
}

/// The partition's position lies past the source log's end (the log was replaced by a shorter
/// one); the partition stops.
#[derive(Debug)]
pub struct PositionBeyondEnd<'a> {
    pub at: At<'a>,
    pub requested: i64,
    pub log_end: i64,
}

impl Event for PositionBeyondEnd<'_> {
    fn emit(self, to: Emitter<'_>) {
        let at = self.at;
        tracing::debug!(flow = %at.flow, topic = at.topic, partition = at.partition, requested = self.requested, log_end = self.log_end, "position beyond the source log end; the partition stops");
        to.count(ErrorKind::PositionBeyondEnd);
    }
}

/// A batch could not be copied from `offset` on. `retrying`: the target refused or lost it
/// for now, and the partition copies again from there (counted `produce`); otherwise retrying
/// cannot fix it and the partition stops there (counted `fatal`).
#[derive(Debug)]
pub struct CopyFailed<'a> {
    pub at: At<'a>,
    pub offset: i64,
    pub retrying: bool,
    pub error: &'a dyn Cause,
}

impl Event for CopyFailed<'_> {
    fn emit(self, to: Emitter<'_>) {
        let at = self.at;
        tracing::debug!(flow = %at.flow, topic = at.topic, partition = at.partition, offset = self.offset, retrying = self.retrying, error = %self.error, "copy failed");
        to.count(if self.retrying {
            ErrorKind::Produce
        } else {
            ErrorKind::Fatal
        });
    }
}

/// Exactly-once: the slot's transaction cannot go on (aborted by the coordinator at its
/// timeout, fenced by another process, the producer's state lost); the slot's partitions copy
/// again from the last commit.
#[derive(Debug)]
pub struct TransactionFailed<'a> {
    pub at: At<'a>,
    pub error: &'a dyn Cause,
}

impl Event for TransactionFailed<'_> {
    fn emit(self, to: Emitter<'_>) {
        let at = self.at;
        tracing::warn!(flow = %at.flow, topic = at.topic, partition = at.partition, error = %self.error, "the slot's transaction failed; going back to the last commit");
        to.count(ErrorKind::Transaction);
    }
}

/// A transaction of a slot stayed open on a partition after its coordinator completed it (its
/// marker dropped, KAFKA-20734), or such a transaction was settled (docs/engine.md).
#[derive(Debug)]
pub struct HangingTransaction<'a> {
    pub flow: &'a str,
    pub transactional_id: &'a str,
    pub found: &'a kmirror_kafka::producer::transaction::Hanging,
}

impl Event for HangingTransaction<'_> {
    fn emit(self, to: Emitter<'_>) {
        let h = self.found;
        let result = if h.committed { "commit" } else { "abort" };
        let outcome = if h.settled {
            tracing::warn!(flow = %self.flow, transactional_id = self.transactional_id, topic = %h.topic, partition = h.partition, producer_id = h.producer_id, offset = h.open_since, result, "hanging transaction settled with its own result");
            "settled"
        } else {
            tracing::warn!(flow = %self.flow, transactional_id = self.transactional_id, topic = %h.topic, partition = h.partition, producer_id = h.producer_id, offset = h.open_since, result, "a transaction stayed open on this target partition after its coordinator completed it (a dropped marker); settling it");
            "found"
        };
        to.metrics
            .hanging_transactions
            .get_or_create(&to.labels.outcome(outcome))
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{FlowLabels, Metrics};
    use crate::names::ClusterAlias;

    #[test]
    fn each_copy_event_counts_its_kind_and_a_truncation_its_lost_offsets() {
        let m = Metrics::new();
        let labels = FlowLabels {
            source: "A".into(),
            target: "B".into(),
        };
        let flow = FlowId::new(ClusterAlias::new("A"), ClusterAlias::new("B"));
        let to = Emitter {
            metrics: &m,
            labels: &labels,
        };
        let at = At {
            flow: &flow,
            topic: "t",
            remote: "A.t",
            partition: 3,
        };
        let error = "gone";
        for continuing in [false, true] {
            SourceTruncated {
                at,
                lost: 40,
                continuing,
                error: &error,
            }
            .emit(to);
        }
        PositionBeyondEnd {
            at,
            requested: 9,
            log_end: 5,
        }
        .emit(to);
        for retrying in [true, false, false] {
            CopyFailed {
                at,
                offset: 7,
                retrying,
                error: &error,
            }
            .emit(to);
        }
        TransactionFailed { at, error: &error }.emit(to);
        let mut found = kmirror_kafka::producer::transaction::Hanging {
            topic: "A.t".into(),
            partition: 3,
            producer_id: 9,
            open_since: 40,
            committed: true,
            settled: false,
        };
        for settled in [false, true] {
            found.settled = settled;
            HangingTransaction {
                flow: "A->B",
                transactional_id: "A-mm2-MirrorSourceConnector-0",
                found: &found,
            }
            .emit(to);
        }
        for outcome in ["found", "settled"] {
            assert_eq!(
                m.sum(
                    "kmirror_hanging_transactions_total",
                    &[("outcome", outcome)]
                ),
                1.0,
                "{outcome}"
            );
        }
        for (kind, n) in [
            ("truncation", 2.0),
            ("position_beyond_end", 1.0),
            ("produce", 1.0),
            ("fatal", 2.0),
            ("transaction", 1.0),
        ] {
            assert_eq!(
                m.sum("kmirror_errors_total", &[("kind", kind)]),
                n,
                "{kind}"
            );
        }
        assert_eq!(
            m.sum(
                "kmirror_source_truncated_offsets_total",
                &[("topic", "A.t"), ("partition", "3")]
            ),
            80.0
        );
    }
}
