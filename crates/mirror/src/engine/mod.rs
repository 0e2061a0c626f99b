//! The replication engine: for each served flow, a control loop (discovery, remote topics,
//! topic config and ACL sync, heartbeats, offset syncs and checkpoints) and one data task per
//! source partition (fetch → forward → acknowledge), with positions stored in MM2's own topic and
//! format once the target acknowledged the data.
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
//! - Sharing: several processes divide a flow's partitions through Kafka's group coordinator
//!   (`sharing`, docs/sharing.md); the control loop starts and stops partition tasks one by one
//!   as assignments change.
//! - Schemas (`schemas`, docs/schemas.md): with both clusters' registries named, a task keeps
//!   the target registry up with the source's, and partitions wait for the schemas their records
//!   name (ids translated when the target assigns its own).

mod checkpoints;
mod client_metrics;
mod flow;
mod forward;
mod fresh_reads;
mod heartbeats;
mod interruptions;
mod log_reader;
pub(crate) mod loop_guard;
mod offset_syncs;
mod orphans;
mod partition;
mod positions;
pub(crate) mod probe;
pub(crate) mod remote_claims;
pub mod remote_topics;
pub(crate) mod schemas;
pub mod sharing;
mod slot_keeper;
mod slots;
pub(crate) mod throttle;
mod topic_sync;
mod waiting;

pub(crate) use log_reader::read_to_end;
pub use positions::load as load_positions;

use crate::config::model::MirrorConfig;
use crate::metrics::Metrics;
use kmirror_kafka::KafkaError;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

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
    /// The flow's group refused this process (docs/sharing.md).
    #[error("flow {flow}: {reason}")]
    Refused { flow: String, reason: String },
    /// A setting the clusters prove wrong before anything is written (a target schema registry
    /// that does not keep ids): the configuration must change, so the exit code is
    /// configuration's (3).
    #[error("flow {flow}: {message}")]
    Config { flow: String, message: String },
    /// A bug: reported so that the process exits non-zero and a supervisor restarts it.
    #[error(
        "flow {flow}: {task} panicked: {message} (a bug in kmirror; please report it with the log)"
    )]
    Panicked {
        flow: String,
        task: String,
        message: String,
    },
}

/// The text a panic carried.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs `task` to its end; a panic in it comes back as its message instead of vanishing with the
/// task (a spawned task's panic is only seen by whoever awaits its handle).
///
/// Not an `async fn`: one would keep `task` as its argument beside the future it awaits, twice
/// the task's size in every partition task (docs/benchmarks.md, peak RSS at 10,000 partitions).
pub(crate) fn catch_panic<T>(
    task: impl std::future::Future<Output = T>,
) -> impl std::future::Future<Output = Result<T, String>> {
    use futures_util::FutureExt;
    std::panic::AssertUnwindSafe(task)
        .catch_unwind()
        .map(|r| r.map_err(|p| panic_message(&*p)))
}

/// Runs the flow `name`; a panic in it becomes [`EngineError::Panicked`], so the process exits
/// non-zero and `Restart=on-failure` restarts it.
async fn supervised(
    name: String,
    flow: impl std::future::Future<Output = Result<(), EngineError>>,
) -> Result<(), EngineError> {
    catch_panic(flow).await.unwrap_or_else(|message| {
        Err(EngineError::Panicked {
            flow: name,
            task: "flow".into(),
            message,
        })
    })
}

/// The supervisor of a flow's (or MM1 mode's, or the process's) helper tasks: positions writer,
/// offset syncs, checkpoints, topic sync, membership, probes, the metrics endpoint. A panic in one of them is logged and fails the
/// parent, which would otherwise go on without it, for example without storing positions.
/// Tasks started in a stage get a stop of their own and stop together, in the order the parent
/// names its stages ([`Supervisor::stop`]): the order that keeps positions (docs/engine.md).
#[derive(Debug, Clone, Default)]
pub struct Supervisor {
    failed: Shutdown,
    first: Arc<std::sync::Mutex<Option<(String, String)>>>,
    staged: Arc<std::sync::Mutex<Vec<Staged>>>,
}

/// A helper task started in a stage.
#[derive(Debug)]
struct Staged {
    stage: &'static str,
    stop: Shutdown,
    task: JoinHandle<()>,
}

impl Supervisor {
    /// Starts `task` in `stage` with a stop of its own, triggered by [`Supervisor::stop`].
    pub fn start<F, T>(&self, stage: &'static str, what: &'static str, flow: &str, task: T)
    where
        T: FnOnce(Shutdown) -> F,
        F: std::future::Future + Send + 'static,
    {
        let stop = Shutdown::default();
        let task = self.spawn(what, flow, task(stop.clone()));
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Staged { stage, stop, task });
    }

    /// Asks every task of `stage` to stop, then waits for them in the order they started.
    pub async fn stop(&self, stage: &'static str) {
        let tasks: Vec<Staged> = {
            let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
            let (now, later) = std::mem::take(&mut *staged)
                .into_iter()
                .partition(|t| t.stage == stage);
            *staged = later;
            now
        };
        for t in &tasks {
            t.stop.trigger();
        }
        for t in tasks {
            // A panic was caught, logged and recorded by `spawn`.
            let _ = t.task.await;
        }
    }

    pub fn spawn<F>(&self, what: &'static str, flow: &str, task: F) -> JoinHandle<()>
    where
        F: std::future::Future + Send + 'static,
    {
        let (this, flow) = (self.clone(), flow.to_string());
        tokio::spawn(async move {
            if let Err(message) = catch_panic(task).await {
                tracing::error!(flow, task = what, panic = %message, "task panicked; stopping the flow");
                this.first
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert((what.to_string(), message));
                this.failed.trigger();
            }
        })
    }

    /// Waits until a helper panicked. Cancel-safe.
    pub async fn failed(&self) {
        self.failed.wait().await
    }

    /// The first helper that panicked, and its message.
    pub fn failure(&self) -> Option<(String, String)> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
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

/// What the flows of one process share.
#[derive(Debug, Clone)]
pub(crate) struct ProcessShared {
    /// `kmirror.process.rate.limit.bytes.per.second`, over every flow.
    pub(crate) limiter: Option<Arc<throttle::RateLimiter>>,
    /// The remote topics each flow writes, so two flows never write one.
    pub(crate) claims: Arc<remote_claims::RemoteClaims>,
}

/// Runs every served flow until `shutdown` is triggered: replicating flows, and flows that only
/// emit heartbeats into their target (MM2's extra herders, mm2-compatibility §1.5).
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
    let claims = Arc::new(remote_claims::RemoteClaims::default());
    for flow in config.served_flows() {
        if !flow.replication && !flow.emit_heartbeats.enabled {
            continue;
        }
        let flow = flow.clone();
        let (shutdown, metrics) = (shutdown.clone(), metrics.clone());
        let process = ProcessShared {
            limiter: process_limiter.clone(),
            claims: claims.clone(),
        };
        let name = flow.id.to_string();
        tasks.spawn(supervised(
            name,
            flow::run(flow, shutdown, metrics, process),
        ));
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
            // Panics come back as EngineError::Panicked; this is a cancelled task.
            Err(join) => {
                shutdown.trigger();
                tracing::error!(error = %join, "flow task ended abnormally");
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
    async fn stages_stop_in_the_order_asked_and_a_panic_fails_the_parent() {
        let h = Supervisor::default();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        for (stage, what) in [
            ("writers", "positions"),
            ("leader", "sync"),
            ("writers", "syncs"),
        ] {
            let order = order.clone();
            h.start(stage, what, "A->B", move |stop: Shutdown| async move {
                stop.wait().await;
                order.lock().unwrap().push(what);
            });
        }
        h.stop("leader").await;
        assert_eq!(
            *order.lock().unwrap(),
            vec!["sync"],
            "only its stage stopped"
        );
        h.stop("writers").await;
        assert_eq!(*order.lock().unwrap(), vec!["sync", "positions", "syncs"]);
        assert!(h.failure().is_none());
        h.start("late", "bad", "A->B", |_stop: Shutdown| async {
            panic!("boom")
        });
        tokio::time::timeout(Duration::from_secs(5), h.failed())
            .await
            .expect("the parent learns of the panic");
        assert_eq!(h.failure(), Some(("bad".to_string(), "boom".to_string())));
        h.stop("late").await;
    }

    #[tokio::test]
    async fn a_panic_comes_back_as_its_message() {
        assert_eq!(catch_panic(async { 7 }).await, Ok(7));
        // The task is held once, not twice (an argument beside its awaited self).
        let big = [0u8; 4096];
        let task = async move { big.len() };
        let size = std::mem::size_of_val(&task);
        assert!(std::mem::size_of_val(&catch_panic(task)) < size + 64);
        let n = 3;
        let e = catch_panic(async move {
            if n > 2 {
                panic!("index {n} out of range");
            }
        })
        .await;
        assert_eq!(e, Err("index 3 out of range".into()));
        assert_eq!(
            catch_panic(async { panic!("plain") }).await,
            Err::<(), _>("plain".into())
        );
    }

    #[tokio::test]
    async fn a_panicking_helper_fails_its_flow_and_the_others_do_not() {
        let helpers = Supervisor::default();
        let quiet = helpers.spawn("quiet", "A->B", async {});
        quiet.await.unwrap();
        assert_eq!(helpers.failure(), None);
        let stop = Shutdown::default();
        let long = {
            let s = stop.clone();
            helpers.spawn("long", "A->B", async move { s.wait().await })
        };
        let bad = helpers.spawn("positions writer", "A->B", async {
            tokio::task::yield_now().await;
            panic!("boom");
        });
        tokio::time::timeout(Duration::from_secs(5), helpers.failed())
            .await
            .expect("the flow learns of the panic");
        // The handle itself ends normally: the panic was caught and reported.
        bad.await.unwrap();
        assert_eq!(
            helpers.failure(),
            Some(("positions writer".into(), "boom".into()))
        );
        stop.trigger();
        long.await.unwrap();
    }

    #[tokio::test]
    async fn a_panicking_flow_is_an_engine_error() {
        let r = supervised("A->B".into(), async { panic!("flow bug") }).await;
        let text = r.unwrap_err().to_string();
        assert!(text.contains("A->B") && text.contains("flow bug"), "{text}");
    }

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
