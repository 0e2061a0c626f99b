//! A partition's series, taken once when its task starts (a lookup takes the family's lock): the
//! records, bytes, age, latency and lag `/status` adds up, the batch-mode counters, the flow's
//! buffered bytes, the loop guard's skipped records and the schema gate's counts.

use crate::metrics::{FlowLabels, Metrics, PartitionLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

pub(crate) struct Gauges {
    pub(crate) records: Counter,
    pub(crate) bytes: Counter,
    pub(crate) age: Gauge,
    pub(crate) latency: Gauge,
    pub(crate) lag: Gauge,
    pub(crate) batch_mode: Counter,
    pub(crate) record_mode: Counter,
    pub(crate) merged_mode: Counter,
    pub(crate) buffered: Gauge,
    pub(crate) loop_skipped: Counter,
    pub(crate) schema_translated: Counter,
    pub(crate) schema_unknown: Counter,
    pub(crate) schema_waiting: Gauge,
}

impl Gauges {
    pub(crate) fn new(m: &Metrics, flow: &FlowLabels, partition: &PartitionLabels) -> Gauges {
        // One statement per lookup: a family's guard lives to the end of its statement, and a
        // second lookup in the same family within it would deadlock on the family's lock.
        let series = m.partition_series(partition);
        let batch_mode = m.batches.get_or_create(&flow.mode("batch")).clone();
        let record_mode = m.batches.get_or_create(&flow.mode("record")).clone();
        let merged_mode = m.batches.get_or_create(&flow.mode("merged")).clone();
        let buffered = m.buffered_bytes.get_or_create(flow).clone();
        let loop_skipped = m.loop_records_skipped.get_or_create(flow).clone();
        let schema_translated = m.schema_ids_translated.get_or_create(flow).clone();
        let schema_unknown = m.schema_ids_unknown.get_or_create(flow).clone();
        let schema_waiting = m.records_waiting_for_schema.get_or_create(flow).clone();
        Gauges {
            schema_translated,
            schema_unknown,
            schema_waiting,
            loop_skipped,
            records: series.records,
            bytes: series.bytes,
            age: series.age_ms,
            latency: series.latency_ms,
            lag: series.lag,
            batch_mode,
            record_mode,
            merged_mode,
            buffered,
        }
    }

    /// Records left to copy, before the fetcher's answers keep it current.
    pub(crate) fn show_lag(&self, records: i64) {
        self.lag.set(records.max(0));
    }
}
