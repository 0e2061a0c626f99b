//! Events of MM1 mode's streams (`kmirror legacy`): each logs and counts at once. MM1 mode has
//! no flow id; its lines name the stream or the partition instead.

use super::{Cause, Emitter, Event};
use crate::metrics::ErrorKind;

/// Why an assigned partition is not copied until the next rebalance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotFetchedBecause {
    /// The fetcher would not take the partition.
    Subscribe,
    /// Fetching it failed in a way its retries could not fix.
    Failed,
}

/// An assigned partition is left alone until the next rebalance.
#[derive(Debug)]
pub struct PartitionNotFetched<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub because: NotFetchedBecause,
    pub error: &'a dyn Cause,
}

impl Event for PartitionNotFetched<'_> {
    fn emit(self, to: Emitter<'_>) {
        let (topic, partition, error) = (self.topic, self.partition, self.error);
        match self.because {
            NotFetchedBecause::Subscribe => {
                tracing::error!(topic, partition, error = %error, "cannot fetch this partition; it is not copied until the next rebalance")
            }
            NotFetchedBecause::Failed => {
                tracing::error!(topic, partition, error = %error, "fetching this partition failed for good; it is not copied until the next rebalance")
            }
        }
        to.count(ErrorKind::Fetch);
    }
}

/// The source deleted records before they were copied; the stream goes on per
/// `auto.offset.reset`, as MM1 did.
#[derive(Debug)]
pub struct RecordsDeletedUncopied<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub requested: i64,
    pub log_start: i64,
}

impl Event for RecordsDeletedUncopied<'_> {
    fn emit(self, to: Emitter<'_>) {
        let (topic, partition, requested, log_start) =
            (self.topic, self.partition, self.requested, self.log_start);
        tracing::error!(
            topic,
            partition,
            requested,
            log_start,
            lost = log_start - requested,
            "the source deleted records before they were copied; continuing per auto.offset.reset"
        );
        to.count(ErrorKind::Truncation);
    }
}

/// A target topic cannot be written yet (missing and not creatable, no metadata); the stream
/// tries again.
#[derive(Debug)]
pub struct TargetTopicUnavailable<'a> {
    pub stream: u32,
    pub error: &'a dyn Cause,
}

impl Event for TargetTopicUnavailable<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(stream = self.stream, error = %self.error, "cannot write to the target topic yet; will retry");
        to.count(ErrorKind::TargetTopic);
    }
}

/// The target refused a batch or did not acknowledge it in time. What follows (the stream
/// stops, or the batch is skipped: [`RecordsSkipped`]) logs it.
#[derive(Debug)]
pub struct SendFailed<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub error: &'a dyn Cause,
}

impl Event for SendFailed<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::debug!(topic = self.topic, partition = self.partition, error = %self.error, "send failed");
        to.count(ErrorKind::Send);
    }
}

/// `--abort.on.send.failure false`: a batch the target refused is given up; its records are
/// counted one by one.
#[derive(Debug)]
pub struct RecordsSkipped<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub records: i32,
    pub error: &'a dyn Cause,
}

impl Event for RecordsSkipped<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::error!(topic = self.topic, partition = self.partition, records = self.records, error = %self.error, "send failed; records skipped (--abort.on.send.failure false)");
        to.metrics
            .errors
            .get_or_create(&to.labels.error(ErrorKind::RecordsSkipped))
            .inc_by(self.records.max(0) as u64);
    }
}

/// The group coordinator refused an offset commit; the records after the last commit may be
/// copied again after a restart.
#[derive(Debug)]
pub struct CommitRefused<'a> {
    pub stream: u32,
    pub error: &'a dyn Cause,
}

impl Event for CommitRefused<'_> {
    fn emit(self, to: Emitter<'_>) {
        tracing::warn!(stream = self.stream, error = %self.error, "offset commit refused; the records after the last commit may be copied again");
        to.count(ErrorKind::Commit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{FlowLabels, Metrics};

    #[test]
    fn each_stream_event_counts_its_kind_and_skipped_records_one_by_one() {
        let m = Metrics::new();
        let labels = FlowLabels {
            source: "source".into(),
            target: "target".into(),
        };
        let to = Emitter {
            metrics: &m,
            labels: &labels,
        };
        let error = "refused";
        for because in [NotFetchedBecause::Subscribe, NotFetchedBecause::Failed] {
            PartitionNotFetched {
                topic: "t",
                partition: 0,
                because,
                error: &error,
            }
            .emit(to);
        }
        RecordsDeletedUncopied {
            topic: "t",
            partition: 0,
            requested: 5,
            log_start: 10,
        }
        .emit(to);
        TargetTopicUnavailable {
            stream: 1,
            error: &error,
        }
        .emit(to);
        SendFailed {
            topic: "t",
            partition: 0,
            error: &error,
        }
        .emit(to);
        RecordsSkipped {
            topic: "t",
            partition: 0,
            records: 25,
            error: &error,
        }
        .emit(to);
        CommitRefused {
            stream: 1,
            error: &error,
        }
        .emit(to);
        for (kind, n) in [
            ("fetch", 2.0),
            ("truncation", 1.0),
            ("target_topic", 1.0),
            ("send", 1.0),
            ("records_skipped", 25.0),
            ("commit", 1.0),
        ] {
            assert_eq!(
                m.sum("kmirror_errors_total", &[("kind", kind)]),
                n,
                "{kind}"
            );
        }
    }
}
