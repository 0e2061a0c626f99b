//! How a partition's copy ends when it does not simply stop: retried, rewound to the last commit
//! (exactly-once), continued past a truncation, or stopped for good with the reason an operator
//! reads.

use kmirror_kafka::KafkaError;

/// Why an exactly-once partition goes back to its last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rewound {
    /// The slot's transaction was aborted, or its epoch changed.
    Aborted,
    /// This run's lane belonged to an earlier epoch: nothing of it is in the open transaction.
    Stale,
    /// This run's lane was fenced from outside.
    Fenced,
    /// This run's lane failed inside the transaction.
    Failed,
}

pub(crate) enum Failure {
    /// Transient: resume from the last acknowledged offset.
    Retry(KafkaError),
    /// Exactly-once: the slot's transaction was aborted (or its producer epoch changed): resume
    /// after the last committed position, with a new lane.
    Rewind(Rewound),
    /// Source truncated and `kmirror.source.truncation=continue`.
    Continue {
        log_start: i64,
    },
    Stop(Stopped),
}

/// Why a partition stopped for good (until restart or an operator acts).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stopped {
    #[error("{topic}-{partition}: the source deleted offsets {requested}..{log_start} before they were copied ({lost} records lost; the log now spans {log_start}..{log_end}); set kmirror.source.truncation=continue to go on from the log start")]
    Truncated {
        topic: String,
        partition: i32,
        requested: i64,
        log_start: i64,
        log_end: i64,
        lost: i64,
    },
    #[error("{topic}-{partition}: the stored position {requested} is beyond the source log end {log_end}: the topic was deleted and re-created, or the source lost data (unclean leader election); positions no longer match this log")]
    BeyondEnd {
        topic: String,
        partition: i32,
        requested: i64,
        log_end: i64,
    },
    #[error("{topic}-{partition}: the partition's task panicked: {message} (a bug in kmirror; please report it with the log; restarting the process resumes from the stored position)")]
    Panicked {
        topic: String,
        partition: i32,
        message: String,
    },
    #[error("{topic}-{partition} at source offset {first}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        first: i64,
        #[source]
        source: KafkaError,
    },
}
