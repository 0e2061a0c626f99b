//! What the copy task of an MM1 stream reads: each assigned partition's fetcher subscription is
//! drained by a small forwarding task into one queue, which applies `auto.offset.reset` itself so
//! that fetching goes on at once.

use crate::engine::throttle::RateLimiter;
use crate::engine::Shutdown;
use kmirror_kafka::cluster::PartitionFetch;
use kmirror_kafka::fetcher::{BufferShare, FetchEvent, Subscription};
use kmirror_kafka::{AutoOffsetReset, KafkaError};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a partition's forwarding task passes on to the copy task.
#[derive(Debug)]
pub(super) enum Event {
    /// Batches from the partition's position on; the share counts against `buffer.memory`
    /// until dropped.
    Data(PartitionFetch, BufferShare),
    /// The position was outside the source log; fetching went on at `to` (`auto.offset.reset`).
    Reset {
        requested: i64,
        log_start: i64,
        log_end: i64,
        to: i64,
    },
    /// The position was outside the log and `auto.offset.reset` is none.
    NoOffset,
    /// The partition cannot be fetched (authorization, corrupt data, topic re-created).
    Failed(KafkaError),
}

/// Drains one subscription into the copy task's queue. It applies `auto.offset.reset` itself,
/// so that fetching goes on at once; the copy task learns the new position before any data
/// from it (one queue, in order).
pub(super) async fn forward(
    i: usize,
    mut sub: Subscription,
    policy: AutoOffsetReset,
    limiter: Option<Arc<RateLimiter>>,
    stop: Shutdown,
    tx: mpsc::Sender<(usize, Event)>,
) {
    while let Some(ev) = sub.recv().await {
        let event = match ev {
            FetchEvent::Data { data, share } => {
                // Paid before the data reaches the stream, as MM2 mode pays before producing;
                // meanwhile the fetcher's buffer holds it, so fetching slows down too.
                if let Some(l) = &limiter {
                    if l.acquire(share.bytes(), &stop).await {
                        return;
                    }
                }
                Event::Data(data, share)
            }
            FetchEvent::OutOfRange {
                requested,
                log_start,
                log_end,
            } => match reset_to(policy, log_start, log_end) {
                Some(to) => {
                    sub.seek(to);
                    Event::Reset {
                        requested,
                        log_start,
                        log_end,
                        to,
                    }
                }
                None => Event::NoOffset,
            },
            FetchEvent::Failed(e) => Event::Failed(e),
        };
        let last = matches!(event, Event::NoOffset | Event::Failed(_));
        if tx.send((i, event)).await.is_err() || last {
            return;
        }
    }
}

/// Where `auto.offset.reset` continues in a log spanning `log_start..log_end`.
pub(super) fn reset_to(policy: AutoOffsetReset, log_start: i64, log_end: i64) -> Option<i64> {
    match policy {
        AutoOffsetReset::Earliest => Some(log_start),
        AutoOffsetReset::Latest => Some(log_end),
        AutoOffsetReset::None => None,
    }
}
