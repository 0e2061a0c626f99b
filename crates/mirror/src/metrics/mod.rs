//! The engine's Prometheus metrics. One registry per engine (tests run several engines in one
//! process). Names follow MM2's source metrics (mm2-compatibility §5.8: `record-count`, `byte-count`,
//! `record-age-ms`, `replication-latency-ms`, tagged source, target, topic = the remote topic,
//! partition) with a `kmirror_` prefix and Prometheus spelling; the rest are kmirror's own.
//!
//! The registry is a table: each metric is a field of `Metrics`, an entry in `Metrics::new` and
//! a `register` call with its name and help, kept side by side so none is missed. The label
//! types are in `labels.rs`; what is not a metric (readiness, rounds, groups) in `process.rs`.

mod labels;
pub mod process;
mod register;

pub use labels::*;
use process::{flow_name, ProcessState};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use register::{register_control, register_copy, register_runtime, register_schemas};

/// One partition's series that `/status` adds up per flow: the same atomics the exposition
/// shows, so the two cannot disagree.
#[derive(Clone, Debug)]
pub struct PartitionSeries {
    pub records: Counter,
    pub bytes: Counter,
    pub age_ms: Gauge,
    pub latency_ms: Gauge,
    pub lag: Gauge,
}

/// One flow's per-partition series added up (see [`Metrics::flow_figures`]).
#[derive(Clone, Debug)]
pub struct FlowFigures {
    pub labels: FlowLabels,
    pub connected: bool,
    pub records: u64,
    pub bytes: u64,
    pub lag_records: i64,
    /// The largest `record-age-ms` over the flow's partitions.
    pub max_age_ms: i64,
    pub partitions_stopped: i64,
    /// Partitions assigned and not copying for longer than 30 s, and what most of them wait for.
    pub partitions_waiting: i64,
    pub waiting_reason: Option<&'static str>,
}

/// Every metric the engine keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// What `/health`, `/ready` and `/status` need besides the series.
    pub process: ProcessState,
    // The five per-partition series below are private: they are created only through
    // `partition_series`, so that `/status` adds up every one `/metrics` shows.
    /// MM2 `record-count`: records acknowledged by the target.
    record_count: Family<PartitionLabels, Counter>,
    /// MM2 `byte-count`, but counting the record batches' bytes as sent (MM2 counts values only).
    byte_count: Family<PartitionLabels, Counter>,
    /// MM2 `record-age-ms`: now minus the newest timestamp of the last fetched batch.
    record_age_ms: Family<PartitionLabels, Gauge>,
    /// MM2 `replication-latency-ms`: now minus the newest timestamp of the last acknowledged batch.
    replication_latency_ms: Family<PartitionLabels, Gauge>,
    /// Source end offset (last stable offset for read_committed) minus the next offset to copy.
    lag_records: Family<PartitionLabels, Gauge>,
    /// Offsets the source deleted before they were copied.
    pub truncated_offsets: Family<PartitionLabels, Counter>,
    /// 1 while a partition is stopped by an error that needs an operator.
    pub partition_stopped: Family<PartitionLabels, Gauge>,
    /// Records a starting partition found on the target already, after its stored position.
    pub records_already_on_target: Family<FlowLabels, Counter>,
    /// Starting partitions that copy from the stored position, unable to tell what the target
    /// holds, by reason.
    pub resume_fallbacks: Family<ReasonLabels, Counter>,
    /// Partitions assigned and not copying for longer than 30 s, by what they wait for
    /// (`engine/waiting.rs`).
    pub partitions_waiting: Family<ReasonLabels, Gauge>,
    /// Partitions reported waiting (once each), by what they waited for then.
    pub partitions_reported_waiting: Family<ReasonLabels, Counter>,
    pub batches: Family<ModeLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    /// Source topics and partitions this process copies now: with sharing, the processes'
    /// values add up to the flow's.
    pub topics: Family<FlowLabels, Gauge>,
    pub partitions: Family<FlowLabels, Gauge>,
    /// Source topics and partitions the flow replicates, over every process sharing it.
    pub flow_topics: Family<FlowLabels, Gauge>,
    pub flow_partitions: Family<FlowLabels, Gauge>,
    pub heartbeats: Family<FlowLabels, Counter>,
    pub positions_stored: Family<FlowLabels, Counter>,
    pub checkpoints: Family<FlowLabels, Counter>,
    pub checkpoint_translations: Family<ViaLabels, Counter>,
    /// Exactly-once: transactions committed, aborted (by reason), and the time from closing a
    /// slot's gate to the commit's answer (a commit's pause).
    pub transactions_committed: Family<FlowLabels, Counter>,
    pub transactions_aborted: Family<ReasonLabels, Counter>,
    pub hanging_transactions: Family<OutcomeLabels, Counter>,
    pub transaction_commit_ms: Family<FlowLabels, Counter>,
    /// Exactly-once: the slots (transactional ids) this process holds.
    pub exactly_once_slots: Family<FlowLabels, Gauge>,
    /// Exactly-once: transactional ids above the slot count whose open transaction was aborted.
    pub orphans_fenced: Family<FlowLabels, Counter>,
    pub group_offsets_synced: Family<FlowLabels, Counter>,
    pub configs_synced: Family<FlowLabels, Counter>,
    pub acls_created: Family<FlowLabels, Counter>,
    /// 1 while both clusters of the flow answer (probed every 2 s), else 0.
    pub flow_connected: Family<FlowLabels, Gauge>,
    /// `kmirror.rate.limit.bytes.per.second` of the flow (0: none).
    pub rate_limit: Family<FlowLabels, Gauge>,
    /// Milliseconds the flow's partitions waited for its rate limit.
    pub throttled_ms: Family<FlowLabels, Counter>,
    /// The process-wide limit and the time waited for it.
    pub process_rate_limit: Gauge,
    pub process_throttled_ms: Counter,
    /// Unix time (seconds) of the last checkpoint round that completed.
    pub checkpoint_timestamp: Family<FlowLabels, Gauge>,
    /// Bytes fetched and not yet acknowledged by the target (bounded by `buffer.memory`).
    pub buffered_bytes: Family<FlowLabels, Gauge>,
    /// Rounds of periodic work completed: a loop that stops counting has stopped working.
    pub rounds: Family<RoundLabels, Counter>,
    /// Fetch requests sent to the source (one per broker carries all its partitions), by kind.
    pub fetch_requests: Family<FetchLabels, Counter>,
    /// Fetch sessions the source lost or refused, each followed by a full request (KIP-227).
    pub fetch_session_fallbacks: Family<FlowLabels, Counter>,
    /// The most partitions one fetch request carried so far.
    pub fetch_max_partitions: Family<FlowLabels, Gauge>,
    /// Produce requests sent to the target and the partition batches they carried.
    pub produce_requests: Family<FlowLabels, Counter>,
    pub produce_batches: Family<FlowLabels, Counter>,
    /// The most partition batches one produce request carried so far.
    pub produce_max_batches: Family<FlowLabels, Gauge>,
    /// Times a target partition started its sequences over under a new producer id.
    pub producer_new_ids: Family<FlowLabels, Counter>,
    /// Offsets the target acknowledged and then lost (its log truncated below them).
    pub target_truncated_offsets: Family<FlowLabels, Counter>,
    /// Sharing: assignments this process received from the flow's group, and the partitions
    /// of the last one; whether it leads the group.
    pub rebalances: Family<FlowLabels, Counter>,
    pub assigned_partitions: Family<FlowLabels, Gauge>,
    pub group_leader: Family<FlowLabels, Gauge>,
    /// On the leader: the processes in the flow's group.
    pub group_members: Family<FlowLabels, Gauge>,
    /// Time from the start of a rejoin to its assignment applied (partitions handed over).
    pub rebalance_ms: Family<FlowLabels, Counter>,
    /// Partitions this process was given, and gave up, in rebalances.
    pub partitions_added: Family<FlowLabels, Counter>,
    pub partitions_revoked: Family<FlowLabels, Counter>,
    /// Loop prevention (docs/topologies.md): producer ids registered on the target, records
    /// left out because kmirror copied them from the flow's target, and whether checkpoints
    /// are held back because the pair copies both ways under identity names.
    pub producer_ids_registered: Family<FlowLabels, Counter>,
    pub loop_records_skipped: Family<FlowLabels, Counter>,
    pub checkpoints_both_ways: Family<FlowLabels, Gauge>,
    /// Schema sync (docs/schemas.md): versions registered on the target, ids rewritten in
    /// records, wire-format payloads whose id the source registry does not know, records held
    /// back until their schemas are on the target, and registry failures by kind.
    pub schema_registrations: Family<FlowLabels, Counter>,
    pub schema_ids_translated: Family<FlowLabels, Counter>,
    pub schema_ids_unknown: Family<FlowLabels, Counter>,
    pub records_waiting_for_schema: Family<FlowLabels, Gauge>,
    pub schema_registry_errors: Family<RoundLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kmirror");
        let m = Metrics {
            registry: Registry::default(),
            process: ProcessState::default(),
            record_count: Family::default(),
            byte_count: Family::default(),
            record_age_ms: Family::default(),
            replication_latency_ms: Family::default(),
            lag_records: Family::default(),
            truncated_offsets: Family::default(),
            partition_stopped: Family::default(),
            records_already_on_target: Family::default(),
            resume_fallbacks: Family::default(),
            partitions_waiting: Family::default(),
            partitions_reported_waiting: Family::default(),
            batches: Family::default(),
            errors: Family::default(),
            topics: Family::default(),
            partitions: Family::default(),
            flow_topics: Family::default(),
            flow_partitions: Family::default(),
            heartbeats: Family::default(),
            positions_stored: Family::default(),
            checkpoints: Family::default(),
            checkpoint_translations: Family::default(),
            transactions_committed: Family::default(),
            exactly_once_slots: Family::default(),
            orphans_fenced: Family::default(),
            transactions_aborted: Family::default(),
            hanging_transactions: Family::default(),
            transaction_commit_ms: Family::default(),
            group_offsets_synced: Family::default(),
            configs_synced: Family::default(),
            acls_created: Family::default(),
            flow_connected: Family::default(),
            rate_limit: Family::default(),
            throttled_ms: Family::default(),
            process_rate_limit: Gauge::default(),
            process_throttled_ms: Counter::default(),
            checkpoint_timestamp: Family::default(),
            buffered_bytes: Family::default(),
            rounds: Family::default(),
            fetch_requests: Family::default(),
            fetch_session_fallbacks: Family::default(),
            fetch_max_partitions: Family::default(),
            produce_requests: Family::default(),
            produce_batches: Family::default(),
            produce_max_batches: Family::default(),
            producer_new_ids: Family::default(),
            target_truncated_offsets: Family::default(),
            rebalances: Family::default(),
            assigned_partitions: Family::default(),
            group_leader: Family::default(),
            group_members: Family::default(),
            rebalance_ms: Family::default(),
            partitions_added: Family::default(),
            partitions_revoked: Family::default(),
            producer_ids_registered: Family::default(),
            loop_records_skipped: Family::default(),
            checkpoints_both_ways: Family::default(),
            schema_registrations: Family::default(),
            schema_ids_translated: Family::default(),
            schema_ids_unknown: Family::default(),
            records_waiting_for_schema: Family::default(),
            schema_registry_errors: Family::default(),
        };
        register_copy(&mut registry, &m);
        register_control(&mut registry, &m);
        register_runtime(&mut registry, &m);
        register_schemas(&mut registry, &m);
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition (OpenMetrics flavour) of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// A flow's `kmirror_flow_connected` gauge (1 while both clusters answer), known from now
    /// on to readiness.
    pub fn connected_gauge(&self, labels: &FlowLabels) -> Gauge {
        let g = self.flow_connected.get_or_create(labels).clone();
        self.process.health().flows.insert(
            (labels.source.to_string(), labels.target.to_string()),
            (labels.clone(), g.clone()),
        );
        g
    }

    /// A partition's record, byte, age, latency and lag series (created on first use), known
    /// from now on to [`Metrics::flow_figures`]. Callers keep the handles: a lookup takes a
    /// lock.
    pub fn partition_series(&self, labels: &PartitionLabels) -> PartitionSeries {
        if let Some(s) = self.process.health().partitions.get(labels) {
            return s.clone();
        }
        // One statement per lookup, and no lock of ours held meanwhile: a family's guard lives
        // to the end of its statement.
        let records = self.record_count.get_or_create(labels).clone();
        let bytes = self.byte_count.get_or_create(labels).clone();
        let age_ms = self.record_age_ms.get_or_create(labels).clone();
        let latency_ms = self.replication_latency_ms.get_or_create(labels).clone();
        let lag = self.lag_records.get_or_create(labels).clone();
        let s = PartitionSeries {
            records,
            bytes,
            age_ms,
            latency_ms,
            lag,
        };
        self.process
            .health()
            .partitions
            .entry(labels.clone())
            .or_insert(s)
            .clone()
    }

    /// Every flow started so far, with its partitions' series added up.
    pub fn flow_figures(&self) -> Vec<FlowFigures> {
        let h = self.process.health();
        let mut out: std::collections::BTreeMap<(&str, &str), FlowFigures> = h
            .flows
            .iter()
            .map(|((s, t), (labels, g))| {
                let f = FlowFigures {
                    labels: labels.clone(),
                    connected: g.get() >= 1,
                    records: 0,
                    bytes: 0,
                    lag_records: 0,
                    max_age_ms: 0,
                    partitions_stopped: 0,
                    partitions_waiting: 0,
                    waiting_reason: None,
                };
                ((s.as_str(), t.as_str()), f)
            })
            .collect();
        for (p, series) in &h.partitions {
            let Some(f) = out.get_mut(&(&*p.source, &*p.target)) else {
                continue;
            };
            f.records += series.records.get();
            f.bytes += series.bytes.get();
            f.lag_records += series.lag.get();
            f.max_age_ms = f.max_age_ms.max(series.age_ms.get());
        }
        for f in out.values_mut() {
            let name = flow_name(&f.labels.source, &f.labels.target);
            f.partitions_stopped = h.stopped.iter().filter(|(n, _, _)| *n == name).count() as i64;
            if let Some((n, reason)) = h.waiting.get(&name) {
                (f.partitions_waiting, f.waiting_reason) = (*n, *reason);
            }
        }
        out.into_values().collect()
    }

    /// Marks a partition stopped by an error (or started again): the gauge
    /// `kmirror_partition_stopped` and readiness together.
    pub fn set_partition_stopped(&self, labels: &PartitionLabels, stopped: bool) {
        self.partition_stopped
            .get_or_create(labels)
            .set(i64::from(stopped));
        let key = (
            flow_name(&labels.source, &labels.target),
            labels.topic.to_string(),
            labels.partition,
        );
        let mut h = self.process.health();
        if stopped {
            h.stopped.insert(key);
        } else {
            h.stopped.remove(&key);
        }
    }

    /// Sum of every sample of `name` whose labels include all of `labels`, read from the
    /// exposition (for tests: what a scraper would see).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        sum_samples(&self.render(), name, labels)
    }
}

/// Sums the samples of one metric in a text exposition, filtered by label values.
pub fn sum_samples(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds docs/metrics.md lists under "Error kinds" are exactly the ones the code counts.
    #[test]
    fn every_error_kind_is_documented_and_every_documented_kind_exists() {
        let doc = include_str!("../../../../docs/metrics.md");
        let section = doc
            .split("### Error kinds")
            .nth(1)
            .expect("docs/metrics.md has an \"Error kinds\" section");
        let documented: std::collections::BTreeSet<&str> = section
            .lines()
            .take_while(|l| !l.starts_with('#'))
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once('`').map(|(kind, _)| kind))
            .collect();
        // A new kind fails to compile here until it is added to ErrorKind::ALL (which `/status`
        // adds up) and to this list.
        let _every = |k: ErrorKind| match k {
            ErrorKind::Setup
            | ErrorKind::Connect
            | ErrorKind::Metadata
            | ErrorKind::Fetch
            | ErrorKind::Produce
            | ErrorKind::Fatal
            | ErrorKind::Panic
            | ErrorKind::TopicDeleted
            | ErrorKind::TopicRecreated
            | ErrorKind::TopicCreate
            | ErrorKind::TopicConflict
            | ErrorKind::TargetTopic
            | ErrorKind::Truncation
            | ErrorKind::PositionBeyondEnd
            | ErrorKind::RecordsSkipped
            | ErrorKind::Positions
            | ErrorKind::Heartbeat
            | ErrorKind::OffsetSyncs
            | ErrorKind::Checkpoints
            | ErrorKind::ConfigSync
            | ErrorKind::AclSync
            | ErrorKind::Send
            | ErrorKind::Commit
            | ErrorKind::Transaction => {}
        };
        let code: std::collections::BTreeSet<&str> =
            ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(code.len(), ErrorKind::ALL.len(), "a kind is listed twice");
        assert_eq!(
            documented, code,
            "docs/metrics.md's error kinds differ from ErrorKind::ALL"
        );
    }

    #[test]
    fn renders_prefixed_names_with_labels_and_sums_them() {
        let m = Metrics::new();
        let f = FlowLabels {
            source: "A".into(),
            target: "B".into(),
        };
        m.record_count
            .get_or_create(&f.partition("A.t", 0))
            .inc_by(5);
        m.record_count
            .get_or_create(&f.partition("A.t", 1))
            .inc_by(7);
        m.batches.get_or_create(&f.mode("batch")).inc_by(3);
        m.lag_records.get_or_create(&f.partition("A.t", 0)).set(42);
        let text = m.render();
        assert!(
            text.contains("# TYPE kmirror_record_count counter"),
            "{text}"
        );
        assert!(text.contains(
            "kmirror_record_count_total{source=\"A\",target=\"B\",topic=\"A.t\",partition=\"1\"} 7"
        ));
        assert_eq!(m.sum("kmirror_record_count_total", &[]), 12.0);
        assert_eq!(
            m.sum("kmirror_record_count_total", &[("partition", "0")]),
            5.0
        );
        assert_eq!(m.sum("kmirror_batches_total", &[("mode", "batch")]), 3.0);
        assert_eq!(m.sum("kmirror_batches_total", &[("mode", "record")]), 0.0);
        assert_eq!(m.sum("kmirror_replication_lag_records", &[]), 42.0);
    }
}
