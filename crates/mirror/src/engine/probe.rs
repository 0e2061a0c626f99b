//! Whether a flow's clusters answer: the `kmirror_flow_connected` gauge that readiness and
//! `/status` read.

use super::Shutdown;
use kmirror_kafka::cluster::KafkaCluster;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Duration;

/// How often the clusters of a flow are asked whether they answer.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Sets `gauge` to 1 while every cluster answers a metadata request within the interval, 0
/// otherwise, until `stop`.
pub(crate) async fn probe(clusters: Vec<Arc<KafkaCluster>>, gauge: Gauge, stop: Shutdown) {
    loop {
        let mut up = true;
        for k in &clusters {
            let answered =
                tokio::time::timeout(PROBE_INTERVAL, k.refresh_metadata(Some(&[]))).await;
            up &= matches!(answered, Ok(Ok(_)));
        }
        gauge.set(i64::from(up));
        if stop.sleep(PROBE_INTERVAL).await {
            return;
        }
    }
}
