//! Whether a flow's clusters answer: the `kmirror_flow_connected` gauge that readiness and
//! `/status` read.

use super::Shutdown;
use kmirror_kafka::cluster::KafkaCluster;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Duration;

/// How often the clusters of a flow are asked whether they answer.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// How long an answer may take. A cluster busy creating thousands of partitions answers
/// metadata in seconds and is still there; one that is down refuses the connection at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sets `gauge` to 1 while every cluster answers a metadata request within [`PROBE_TIMEOUT`],
/// 0 otherwise, until `stop`.
pub(crate) async fn probe(clusters: Vec<Arc<KafkaCluster>>, gauge: Gauge, stop: Shutdown) {
    loop {
        // Both clusters at once, and a stop is not held up by a cluster that does not answer.
        let answers = futures_util::future::join_all(
            clusters
                .iter()
                .map(|k| tokio::time::timeout(PROBE_TIMEOUT, k.refresh_metadata(Some(&[])))),
        );
        let up = tokio::select! {
            a = answers => a.iter().all(|x| matches!(x, Ok(Ok(_)))),
            _ = stop.wait() => return,
        };
        gauge.set(i64::from(up));
        if stop.sleep(PROBE_INTERVAL).await {
            return;
        }
    }
}
