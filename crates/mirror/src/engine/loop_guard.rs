//! Loop prevention for identity names both ways (docs/topologies.md, "Identity names both
//! ways"): a flow A->B records every producer id it writes into B with in B's
//! `kmirror-producers.internal` ([`Registrar`]), before it writes a batch with it; the flow B->A
//! reads that topic ([`LoopGuard`]) and leaves out the batches on B whose producer id came from
//! A. Batches keep being forwarded as they are: the producer id is in the batch header.
//!
//! Why a batch is never judged too early: the producer id is registered (acks=all) before any
//! batch carries it, so once a reader holds such a batch, reading the topic to its end finds the
//! id. A reader therefore reads the topic again whenever a batch shows a producer id it has not
//! seen, and an id still absent then belongs to some other producer, for good (brokers never
//! hand one id out twice).

use super::{remote_topics, Shutdown};
use crate::config::model::FlowConfig;
use crate::copy::origins::{ClusterName, Origins};
use crate::names::ClusterAlias;
use crate::wire::producers::{ProducerEntry, PRODUCERS_TOPIC};
use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, ProducerIdHook};
use kmirror_kafka::KafkaError;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The reading side: tells which batches of one cluster kmirror copied there from another
/// (`from`). A flow's source guard leaves out the copies from its target; its target guard
/// picks out its own copies, for the resume walk.
#[derive(Debug)]
pub(crate) struct LoopGuard {
    cluster: Arc<KafkaCluster>,
    from: ClusterName,
    origins: Mutex<Origins>,
    /// Where the next read of the topic starts, and when the last one began.
    reads: tokio::sync::Mutex<(Option<i64>, Option<Instant>)>,
}

impl LoopGuard {
    /// `from`: the cluster whose copies this guard recognises, and its id if known.
    pub(crate) fn new(
        cluster: Arc<KafkaCluster>,
        from: &ClusterAlias,
        from_id: Option<&str>,
    ) -> LoopGuard {
        LoopGuard {
            cluster,
            from: ClusterName::new(from.as_str(), from_id),
            origins: Mutex::default(),
            reads: tokio::sync::Mutex::new((None, None)),
        }
    }

    fn origins(&self) -> std::sync::MutexGuard<'_, Origins> {
        self.origins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The batches kmirror did not copy from `from`, in order, and the records left out.
    /// Reads the topic again (retrying until it can, or `stop`) when a batch shows an unknown
    /// producer id; None when stopped first.
    pub(crate) async fn keep<'b>(
        &self,
        batches: Vec<&'b RawBatch>,
        stop: &Shutdown,
    ) -> Option<(Vec<&'b RawBatch>, u64)> {
        self.split(batches, false, stop, None).await
    }

    /// As [`LoopGuard::keep`], giving up (None) after `attempts` failed reads of the topic: for
    /// the resume walk, which falls back to the stored position rather than wait.
    pub(crate) async fn keep_within<'b>(
        &self,
        batches: Vec<&'b RawBatch>,
        attempts: u32,
    ) -> Option<Vec<&'b RawBatch>> {
        let never = Shutdown::default();
        self.split(batches, false, &never, Some(attempts))
            .await
            .map(|(kept, _)| kept)
    }

    /// The batches kmirror copied from `from`, in order; None after `attempts` failed reads.
    pub(crate) async fn copies_within<'b>(
        &self,
        batches: Vec<&'b RawBatch>,
        attempts: u32,
    ) -> Option<Vec<&'b RawBatch>> {
        let never = Shutdown::default();
        self.split(batches, true, &never, Some(attempts))
            .await
            .map(|(kept, _)| kept)
    }

    async fn split<'b>(
        &self,
        batches: Vec<&'b RawBatch>,
        copies: bool,
        stop: &Shutdown,
        attempts: Option<u32>,
    ) -> Option<(Vec<&'b RawBatch>, u64)> {
        let seen = Instant::now();
        let mut attempt = 0;
        loop {
            let unknown = self.origins().unknown(&batches, &self.from);
            if unknown.is_empty() {
                break;
            }
            // Boxed: a read of the topic is rare and its future kilobytes, and `keep` is awaited
            // inline in every partition task (docs/benchmarks.md, peak RSS at 10,000 partitions).
            match Box::pin(self.read_since(seen)).await {
                Ok(()) => {
                    let mut o = self.origins();
                    for p in unknown {
                        o.settle(p);
                    }
                }
                Err(e) => {
                    if attempts.is_some_and(|n| attempt + 1 >= n) {
                        tracing::debug!(topic = PRODUCERS_TOPIC, error = %e, "loop prevention: cannot read kmirror's producer ids; giving up");
                        return None;
                    }
                    if attempt == 0 {
                        tracing::warn!(topic = PRODUCERS_TOPIC, error = %e, "loop prevention: cannot read kmirror's producer ids; holding the partition until it can");
                    }
                    let wait = match attempts {
                        Some(_) => std::time::Duration::from_millis(200),
                        None => super::backoff(attempt),
                    };
                    if stop.sleep(wait).await {
                        return None;
                    }
                    attempt += 1;
                }
            }
        }
        Some(self.origins().keep(batches, &self.from, copies))
    }

    /// Whether some flow copies into this cluster from `from` (for a flow's source guard: the
    /// pair copies both ways).
    pub(crate) async fn both_ways(&self) -> Result<bool, KafkaError> {
        self.read_since(Instant::now()).await?;
        Ok(self.origins().copies_from(&self.from))
    }

    /// Reads the topic to its end, unless a read that began at or after `seen` has finished
    /// meanwhile (it saw everything written before `seen`).
    async fn read_since(&self, seen: Instant) -> Result<(), KafkaError> {
        let mut reads = self.reads.lock().await;
        if reads.1.is_some_and(|began| began >= seen) {
            return Ok(());
        }
        let began = Instant::now();
        let k = &self.cluster;
        // A broker may answer before it has applied a topic just created (the first
        // registration creates it): asked a few times before it counts as absent, since an
        // absent topic settles every id seen as not kmirror's.
        let mut asked = 0;
        while !k.metadata().topics.contains_key(PRODUCERS_TOPIC) {
            if asked == 3 {
                // Nobody registered anything here yet.
                reads.1 = Some(began);
                return Ok(());
            }
            if asked > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            k.refresh_metadata(Some(&[PRODUCERS_TOPIC])).await?;
            asked += 1;
        }
        let (records, next) =
            super::log_reader::read_to_end(k, PRODUCERS_TOPIC, 0, reads.0).await?;
        let mut o = self.origins();
        for r in records {
            let (Some(key), Some(value)) = (r.key.as_deref(), r.value.as_deref()) else {
                continue;
            };
            match ProducerEntry::decode(key, value) {
                Ok(e) => o.learn(&e),
                Err(e) => {
                    tracing::warn!(topic = PRODUCERS_TOPIC, offset = r.offset, error = %e, "loop prevention: ignoring a record that is not a producer entry")
                }
            }
        }
        *reads = (Some(next), Some(began));
        Ok(())
    }
}

/// How registry entries name a copy: its source and target aliases, its flow, and the
/// replication factor of the registry topic when this process creates it.
#[derive(Debug)]
pub(crate) struct Names {
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) flow: String,
    pub(crate) replication_factor: i16,
}

/// The writing side, on a flow's target cluster: every producer id the cluster hands this
/// process is recorded before it is used.
#[derive(Debug)]
pub(crate) struct Registrar {
    cluster: std::sync::Weak<KafkaCluster>,
    source: String,
    source_cluster_id: Option<String>,
    target: String,
    flow: String,
    replication_factor: i16,
    registered: Mutex<HashSet<i64>>,
    created: std::sync::atomic::AtomicBool,
    count: prometheus_client::metrics::counter::Counter,
}

impl Registrar {
    /// Hooks a registrar onto `target` (kept weakly: the cluster holds the hook).
    pub(crate) fn install(
        target: &Arc<KafkaCluster>,
        flow: &FlowConfig,
        source_cluster_id: Option<String>,
        count: prometheus_client::metrics::counter::Counter,
    ) {
        Registrar::install_named(
            target,
            Names {
                source: flow.id.source.to_string(),
                target: flow.id.target.to_string(),
                flow: flow.id.to_string(),
                replication_factor: flow.internal.positions_replication_factor,
            },
            source_cluster_id,
            count,
        );
    }

    /// As [`Registrar::install`], for a copy without MM2's flow (MM1 mode).
    pub(crate) fn install_named(
        target: &Arc<KafkaCluster>,
        names: Names,
        source_cluster_id: Option<String>,
        count: prometheus_client::metrics::counter::Counter,
    ) {
        target.set_producer_id_hook(Arc::new(Registrar {
            cluster: Arc::downgrade(target),
            source: names.source,
            source_cluster_id,
            target: names.target,
            flow: names.flow,
            replication_factor: names.replication_factor,
            registered: Mutex::default(),
            created: Default::default(),
            count,
        }));
    }

    async fn register(&self, producer_id: i64) -> Result<(), KafkaError> {
        use std::sync::atomic::Ordering;
        if self
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&producer_id)
        {
            return Ok(());
        }
        let Some(k) = self.cluster.upgrade() else {
            return Err(KafkaError::Config("the target cluster was closed".into()));
        };
        if !self.created.load(Ordering::Relaxed) {
            remote_topics::create_internal(
                &k,
                NewTopic {
                    name: PRODUCERS_TOPIC.into(),
                    partitions: 1,
                    replication_factor: self.replication_factor,
                    configs: vec![("cleanup.policy".into(), "compact".into())],
                },
            )
            .await?;
            self.created.store(true, Ordering::Relaxed);
        }
        let now = super::now_ms();
        let entry = ProducerEntry {
            producer_id,
            version: 1,
            source: self.source.clone(),
            target: self.target.clone(),
            flow: self.flow.clone(),
            registered_ms: now,
            source_cluster_id: self.source_cluster_id.clone(),
        };
        // acks=all: once this returns, a reader that later sees a batch of this id finds it.
        remote_topics::write_record(
            &k,
            PRODUCERS_TOPIC,
            0,
            now,
            entry.key(),
            Some(entry.value()),
        )
        .await?;
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(producer_id);
        self.count.inc();
        tracing::debug!(flow = %self.flow, producer_id, "loop prevention: producer id registered");
        Ok(())
    }
}

impl ProducerIdHook for Registrar {
    fn obtained(
        &self,
        producer_id: i64,
    ) -> Pin<Box<dyn Future<Output = kmirror_kafka::Result<()>> + Send + '_>> {
        Box::pin(self.register(producer_id))
    }
}
