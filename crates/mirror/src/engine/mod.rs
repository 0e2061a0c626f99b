//! The replication engine: for each served flow, a control loop (discovery, remote topics,
//! heartbeats) and one data task per source partition (fetch → forward → acknowledge), with
//! positions stored in MM2's own topic and format once the target acknowledged the data.
//!
//! - Batch mode (whole fetched batches forwarded with only their header rewritten, the compressed
//!   records untouched) whenever a batch can be forwarded as is; record mode (decode, re-encode
//!   with the producer's codec) for batches with offset gaps (compaction), LogAppendTime batches
//!   (so every record keeps its append time) and a first batch that starts before the position.
//!   Small batches that arrive back to back are merged (records re-encoded with their codec), so
//!   a producer writing a batch per record does not cost a produce request per record.
//! - Fetching: one fetcher per source broker serves all of a flow's partitions it leads (one
//!   Fetch request per broker, in an incremental fetch session, KIP-227), and the broker's own
//!   wait (`fetch.max.wait.ms`) wakes idle partitions, not a timer.
//! - Memory: bytes fetched and not yet acknowledged stay within the producer's `buffer.memory`
//!   (the fetcher's buffer; a response's share is released with its last batch's ack).
//! - read_committed by default: control batches and aborted transactions are not copied.
//! - Nothing is lost across crashes: a position is stored only after the target acknowledged
//!   every record before it, so MM2 and kmirror can take over from each other.
//!
//! Not yet: sharing a flow's partitions among processes (issue 17; the control loop already
//! starts and stops partition tasks one by one).

mod checkpoints;
mod client_metrics;
mod flow;
mod forward;
mod heartbeats;
mod log_reader;
mod offset_syncs;
mod partition;
mod positions;
pub mod remote_topics;
pub(crate) mod throttle;
mod topic_sync;

pub(crate) use log_reader::read_to_end;
pub use positions::load as load_positions;

use crate::config::model::MirrorConfig;
use crate::metrics::Metrics;
use kmirror_kafka::KafkaError;
use std::sync::Arc;
use std::time::Duration;

/// Engine failures that end `run` (configuration problems found at connect time). Everything
/// else is retried or isolated to a topic or partition, logged and counted.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("flow {flow}: {source}")]
    Kafka {
        flow: String,
        #[source]
        source: KafkaError,
    },
    #[error("flow {flow}: source and target are the same cluster (cluster id {cluster_id}) behind different addresses; replicating a cluster into itself would copy its data forever")]
    SameCluster { flow: String, cluster_id: String },
}

/// Stops the engine (or one partition task): set it, and tasks drain and store their positions.
/// A flag and a `Notify` rather than a watch channel: every partition task holds one, and a
/// watch channel's state is about 300 bytes against 60 (docs/benchmarks.md, peak RSS at 10,000
/// partitions).
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<Trigger>);

#[derive(Debug, Default)]
struct Trigger {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Shutdown {
    pub fn trigger(&self) {
        self.0.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }
    pub fn is_triggered(&self) -> bool {
        self.0.set.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Sleeps for `d` or until triggered; true if triggered.
    pub async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.wait() => true,
            _ = tokio::time::sleep(d) => self.is_triggered(),
        }
    }
    /// Counts one more failed attempt and sleeps [`backoff`] for it; true if stopped meanwhile.
    pub(crate) async fn retry_after(&self, attempt: &mut u32) -> bool {
        *attempt += 1;
        self.sleep(backoff(*attempt - 1)).await
    }
    /// Waits until triggered. Cancel-safe.
    pub async fn wait(&self) {
        loop {
            // Registered before the flag is read: a trigger in between still wakes this waiter.
            let notified = self.0.notify.notified();
            if self.is_triggered() {
                return;
            }
            notified.await;
        }
    }
}

/// Runs every served flow until `shutdown` is triggered: replicating flows, and flows that only
/// emit heartbeats into their target (MM2's extra herders, mm2-spec §1.5).
pub async fn run(
    config: &MirrorConfig,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
) -> Result<(), EngineError> {
    let mut tasks = tokio::task::JoinSet::new();
    let process_limit = config
        .served_flows()
        .filter_map(|f| f.process_rate_limit)
        .min();
    metrics
        .process_rate_limit
        .set(process_limit.map_or(0, |l| l as i64));
    let process_limiter = process_limit.map(|l| {
        Arc::new(throttle::RateLimiter::new(
            l,
            metrics.process_throttled_ms.clone(),
        ))
    });
    for flow in config.served_flows() {
        if !flow.replication && !flow.emit_heartbeats.enabled {
            continue;
        }
        let flow = flow.clone();
        let (shutdown, metrics) = (shutdown.clone(), metrics.clone());
        let process_limiter = process_limiter.clone();
        tasks.spawn(async move { flow::run(flow, shutdown, metrics, process_limiter).await });
    }
    let mut first_error = None;
    // As flows end: one that cannot run (same cluster twice, bad credentials) stops the others
    // at once, since an operator must fix the configuration.
    while let Some(ended) = tasks.join_next().await {
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "flow failed; stopping");
                shutdown.trigger();
                first_error.get_or_insert(e);
            }
            Err(join) => {
                shutdown.trigger();
                tracing::error!(error = %join, "flow task panicked");
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Exponential backoff with jitter for reconnecting: 1 s doubling to 30 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_secs(1) * 2u32.saturating_pow(attempt.min(5));
    let base = base.min(Duration::from_secs(30));
    base + Duration::from_millis(rand::random::<u64>() % (base.as_millis() as u64 / 4 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_trigger_wakes_every_waiter_and_later_waits_return_at_once() {
        let stop = Shutdown::default();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let s = stop.clone();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        let sleeper = {
            let s = stop.clone();
            tokio::spawn(async move { s.sleep(Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        assert!(!stop.is_triggered());
        stop.trigger();
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("a waiter was not woken")
                .unwrap();
        }
        let slept = tokio::time::timeout(Duration::from_secs(5), sleeper).await;
        assert!(slept.expect("the sleeper was not woken").unwrap());
        tokio::time::timeout(Duration::from_millis(100), stop.wait())
            .await
            .expect("a wait after the trigger must return at once");
        assert!(stop.sleep(Duration::from_secs(60)).await);
    }

    #[tokio::test]
    async fn a_sleep_without_a_trigger_runs_out() {
        let stop = Shutdown::default();
        assert!(!stop.sleep(Duration::from_millis(20)).await);
    }
}
