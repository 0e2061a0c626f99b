//! The flow's fetcher and producer counters as metrics. The client (kafka crate) keeps plain
//! totals and knows nothing of Prometheus; this copies their growth into the flow's metrics once
//! a second and once more when the flow stops.

use super::Shutdown;
use crate::metrics::ErrorKind;
use crate::metrics::{FlowLabels, Metrics};
use kmirror_kafka::fetcher::{Fetcher, FetcherStats};
use kmirror_kafka::producer::sender::ProduceCounts;
use kmirror_kafka::producer::IdempotentProducer;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

const EVERY: Duration = Duration::from_secs(1);

pub(super) async fn export(
    fetcher: Arc<Fetcher>,
    producer: Arc<IdempotentProducer>,
    metrics: Arc<Metrics>,
    labels: FlowLabels,
    stop: Shutdown,
) {
    let mut was = FetcherStats::default();
    let mut produced = ProduceCounts::default();
    loop {
        let stopped = stop.sleep(EVERY).await;
        let now = fetcher.stats();
        add(&metrics, &labels, &was, &now);
        was = now;
        let now = producer.stats();
        add_produced(&metrics, &labels, &produced, &now);
        produced = now;
        if stopped {
            return;
        }
    }
}

/// Adds to a counter what a client total grew by between two readings.
fn grow<L: Clone + Hash + Eq>(family: &Family<L, Counter>, labels: &L, was: u64, now: u64) {
    family.get_or_create(labels).inc_by(now.saturating_sub(was));
}

/// The producer's growth. Partitions restarted after a failure write with a fresh producer id
/// through the same senders ([`IdempotentProducer::fresh`]), so they are counted here too.
fn add_produced(m: &Metrics, labels: &FlowLabels, was: &ProduceCounts, now: &ProduceCounts) {
    grow(&m.produce_requests, labels, was.requests, now.requests);
    grow(&m.produce_batches, labels, was.batches, now.batches);
    grow(
        &m.producer_new_ids,
        labels,
        was.new_identities,
        now.new_identities,
    );
    let (t0, t1) = (was.truncated_offsets, now.truncated_offsets);
    grow(&m.target_truncated_offsets, labels, t0, t1);
    m.produce_max_batches
        .get_or_create(labels)
        .set(now.max_batches_per_request as i64);
}

/// Adds what grew between two readings.
fn add(m: &Metrics, labels: &FlowLabels, was: &FetcherStats, now: &FetcherStats) {
    let (s0, s1) = (&was.session, &now.session);
    grow(
        &m.fetch_requests,
        &labels.fetch("full"),
        s0.full_requests,
        s1.full_requests,
    );
    let (i0, i1) = (s0.incremental_requests, s1.incremental_requests);
    grow(&m.fetch_requests, &labels.fetch("incremental"), i0, i1);
    grow(
        &m.fetch_session_fallbacks,
        labels,
        s0.fallbacks,
        s1.fallbacks,
    );
    // One count per failed request (for all of a broker's partitions) and one per partition
    // error in an answer; the fetcher retries both itself.
    let errors = labels.error(ErrorKind::Fetch);
    grow(&m.errors, &errors, was.failed_requests, now.failed_requests);
    grow(
        &m.errors,
        &errors,
        was.partition_errors,
        now.partition_errors,
    );
    m.fetch_max_partitions
        .get_or_create(labels)
        .set(now.max_partitions_per_request as i64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmirror_kafka::fetch_session::SessionStats;

    fn stats(full: u64, incremental: u64, fallbacks: u64, failed: u64) -> FetcherStats {
        // Failures split between whole requests and partitions, to see both counted.
        FetcherStats {
            requests: full + incremental,
            session: SessionStats {
                full_requests: full,
                incremental_requests: incremental,
                fallbacks,
                ..SessionStats::default()
            },
            max_partitions_per_request: 7,
            rerouted: 0,
            failed_requests: failed - failed / 2,
            partition_errors: failed / 2,
        }
    }

    #[test]
    fn only_growth_is_added() {
        let m = Metrics::new();
        let labels = FlowLabels {
            source: "A".into(),
            target: "B".into(),
        };
        let a = stats(1, 10, 0, 0);
        let b = stats(2, 25, 1, 3);
        add(&m, &labels, &FetcherStats::default(), &a);
        add(&m, &labels, &a, &b);
        add(&m, &labels, &b, &b);
        let p = |requests, batches| ProduceCounts {
            requests,
            batches,
            max_batches_per_request: 9,
            new_identities: requests / 3,
            truncated_offsets: batches * 2,
            ..ProduceCounts::default()
        };
        add_produced(&m, &labels, &ProduceCounts::default(), &p(3, 20));
        add_produced(&m, &labels, &p(3, 20), &p(5, 31));
        let text = m.render();
        for want in [
            r#"kmirror_produce_requests_total{source="A",target="B"} 5"#,
            r#"kmirror_produce_batches_total{source="A",target="B"} 31"#,
            r#"kmirror_produce_max_batches_per_request{source="A",target="B"} 9"#,
            r#"kmirror_producer_new_ids_total{source="A",target="B"} 1"#,
            r#"kmirror_target_truncated_offsets_total{source="A",target="B"} 62"#,
            r#"kmirror_fetch_requests_total{source="A",target="B",kind="full"} 2"#,
            r#"kmirror_fetch_requests_total{source="A",target="B",kind="incremental"} 25"#,
            r#"kmirror_fetch_session_fallbacks_total{source="A",target="B"} 1"#,
            r#"kmirror_errors_total{source="A",target="B",kind="fetch"} 3"#,
            r#"kmirror_fetch_max_partitions_per_request{source="A",target="B"} 7"#,
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }
}
