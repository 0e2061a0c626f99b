//! What `/health`, `/ready` and `/status` report, and what `kmirror status` prints: per flow
//! the topics and partitions replicating, records/s and MB/s (from two samples of the
//! counters), lag in records and seconds, the time to catch up at the current rate, errors,
//! and whether both clusters answer. Read from the series `/metrics` shows (the same atomics,
//! never the exposition parsed back), so the endpoints and `/metrics` cannot disagree.

use crate::metrics::{ErrorKind, FlowLabels, Metrics, ABORT_REASONS};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

use std::time::Instant;

/// One flow's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowStatus {
    pub flow: String,
    pub connected: bool,
    /// Topics and partitions this process copies now.
    pub topics: i64,
    pub partitions: i64,
    /// Topics and partitions of the whole flow (every process sharing it).
    #[serde(default)]
    pub flow_topics: i64,
    #[serde(default)]
    pub flow_partitions: i64,
    pub partitions_stopped: i64,
    /// Partitions assigned and not copying for longer than 30 s, and what most of them wait
    /// for (docs/engine.md, "Starting many partitions").
    #[serde(default)]
    pub partitions_waiting: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<String>,
    pub records: u64,
    pub bytes: u64,
    pub records_per_second: f64,
    pub megabytes_per_second: f64,
    pub lag_records: i64,
    /// The age of the newest record fetched, over the partitions (MM2's record-age-ms).
    pub lag_seconds: f64,
    /// `lag_records / records_per_second`, when records are flowing.
    pub eta_seconds: Option<f64>,
    pub errors: u64,
    /// Sharing (docs/sharing.md): this process's share of the flow's partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_partitions: Option<i64>,
    /// Sharing: whether this process leads the flow's group, and (on the leader) how many
    /// processes share the flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_leader: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_members: Option<i64>,
    /// Sharing: every process in the flow's group and its share, as the leader last assigned
    /// them (every member is sent the whole list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Exactly-once (docs/engine.md#exactly-once): the slots this process holds (with sharing,
    /// the group's assignment counts slots), and its transactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactly_once_slots: Option<i64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transactions_committed: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transactions_aborted: u64,
    /// Schema sync (docs/schemas.md), when the flow syncs schemas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemas: Option<SchemaStatus>,
}

/// A flow's schema sync: what it registered and rewrote, and what waits for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SchemaStatus {
    pub versions_registered: u64,
    pub ids_translated: u64,
    /// Wire-format payloads naming ids the source registry does not know (copied as they are).
    pub ids_unknown: u64,
    pub records_waiting: i64,
    pub registry_errors: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Every `kind` of `kmirror_schema_registry_errors_total` (docs/metrics.md).
pub const SCHEMA_ERROR_KINDS: [&str; 4] = ["unreachable", "refused", "bad_answer", "target_lost"];

/// One process sharing a flow: its share as the leader's assignment describes it.
pub use crate::metrics::process::Share as MemberStatus;

/// The whole process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    /// Why not ready, when not.
    pub reason: Option<String>,
    pub uptime_seconds: f64,
    pub flows: Vec<FlowStatus>,
}

/// Figures per flow, read from the engine's series (rates are filled in by [`Sampler`]).
pub fn flows(metrics: &Metrics) -> Vec<FlowStatus> {
    metrics
        .flow_figures()
        .into_iter()
        .map(|f| {
            let l = &f.labels;
            // `get` leaves out a series that was never created, as the exposition does.
            let gauge = |family: &Family<FlowLabels, Gauge>| family.get(l).map(|g| g.get());
            let counter =
                |family: &Family<FlowLabels, Counter>| family.get(l).map_or(0, |c| c.get());
            let errors = ErrorKind::ALL
                .iter()
                .filter_map(|k| metrics.errors.get(&l.error(*k)).map(|c| c.get()))
                .sum();
            let aborted = ABORT_REASONS
                .iter()
                .filter_map(|r| {
                    metrics
                        .transactions_aborted
                        .get(&l.reason(r))
                        .map(|c| c.get())
                })
                .sum();
            FlowStatus {
                flow: format!("{}->{}", &*l.source, &*l.target),
                connected: f.connected,
                topics: gauge(&metrics.topics).unwrap_or(0),
                partitions: gauge(&metrics.partitions).unwrap_or(0),
                flow_topics: gauge(&metrics.flow_topics).unwrap_or(0),
                flow_partitions: gauge(&metrics.flow_partitions).unwrap_or(0),
                partitions_stopped: f.partitions_stopped,
                partitions_waiting: f.partitions_waiting,
                waiting_reason: f.waiting_reason.map(str::to_string),
                records: f.records,
                bytes: f.bytes,
                lag_records: f.lag_records,
                lag_seconds: f.max_age_ms.max(0) as f64 / 1000.0,
                errors,
                assigned_partitions: gauge(&metrics.assigned_partitions),
                group_leader: gauge(&metrics.group_leader).map(|v| v >= 1),
                group_members: gauge(&metrics.group_members).filter(|v| *v >= 1),
                exactly_once_slots: gauge(&metrics.exactly_once_slots),
                transactions_committed: counter(&metrics.transactions_committed),
                transactions_aborted: aborted,
                schemas: metrics
                    .schema_registrations
                    .get(l)
                    .map(|registered| SchemaStatus {
                        versions_registered: registered.get(),
                        ids_translated: counter(&metrics.schema_ids_translated),
                        ids_unknown: counter(&metrics.schema_ids_unknown),
                        records_waiting: gauge(&metrics.records_waiting_for_schema).unwrap_or(0),
                        registry_errors: SCHEMA_ERROR_KINDS
                            .iter()
                            .filter_map(|k| {
                                metrics
                                    .schema_registry_errors
                                    .get(&l.round(k))
                                    .map(|c| c.get())
                            })
                            .sum(),
                    }),
                ..FlowStatus::default()
            }
        })
        .collect()
}

/// Samples the counters about once a second (see [`Sampler::tick`]) so that rates cover the last
/// few seconds, whenever `/status` is asked.
#[derive(Debug)]
pub struct Sampler {
    started: Instant,
    ticks: std::sync::Mutex<std::collections::VecDeque<(Instant, Vec<FlowStatus>)>>,
}

/// The window rates are computed over.
const RATE_WINDOW: usize = 5;

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            started: Instant::now(),
            ticks: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }
}

impl Sampler {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(Instant, Vec<FlowStatus>)>> {
        self.ticks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the counters now (call about once a second).
    pub fn tick(&self, metrics: &Metrics) {
        let now = flows(metrics);
        let mut t = self.lock();
        t.push_back((Instant::now(), now));
        while t.len() > RATE_WINDOW + 1 {
            t.pop_front();
        }
    }

    /// The status now, with rates over the sampled window.
    pub fn status(&self, metrics: &Metrics) -> Status {
        let mut flows = flows(metrics);
        let ticks = self.lock();
        if let (Some((t0, first)), Some((t1, last))) = (ticks.front(), ticks.back()) {
            let dt = t1.duration_since(*t0).as_secs_f64();
            for f in flows.iter_mut() {
                let (Some(a), Some(b)) = (
                    first.iter().find(|x| x.flow == f.flow),
                    last.iter().find(|x| x.flow == f.flow),
                ) else {
                    continue;
                };
                if dt > 0.0 {
                    f.records_per_second = b.records.saturating_sub(a.records) as f64 / dt;
                    f.megabytes_per_second =
                        b.bytes.saturating_sub(a.bytes) as f64 / dt / 1_000_000.0;
                }
                if f.records_per_second > 0.0 {
                    f.eta_seconds = Some(f.lag_records as f64 / f.records_per_second);
                }
            }
        }
        for f in flows.iter_mut() {
            f.members = metrics.process.group(&f.flow);
        }
        let (ready, reason) = metrics.process.readiness();
        Status {
            ready,
            reason,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            flows,
        }
    }
}

/// Plain lines, one per flow (what `kmirror status` prints when not on a terminal).
pub fn render(s: &Status) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} (up {:.0} s){}",
        if s.ready { "ready" } else { "not ready" },
        s.uptime_seconds,
        s.reason
            .as_ref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    );
    for f in &s.flows {
        let eta = match f.eta_seconds {
            Some(e) if f.lag_records > 0 => format!("{e:.0} s"),
            _ if f.lag_records == 0 => "caught up".into(),
            _ => "-".into(),
        };
        let mut stopped = if f.partitions_stopped > 0 {
            format!(" ({} STOPPED)", f.partitions_stopped)
        } else {
            String::new()
        };
        if f.partitions_waiting > 0 {
            let why = f
                .waiting_reason
                .as_deref()
                .map(|r| format!(", most for {r}"))
                .unwrap_or_default();
            let _ = write!(
                stopped,
                " ({} WAITING over 30 s{why})",
                f.partitions_waiting
            );
        }
        // This process's partitions first: with sharing, "of" the flow's.
        let of = if f.flow_partitions > f.partitions {
            format!(" of {}", f.flow_partitions)
        } else {
            String::new()
        };
        let share = match (f.group_leader, f.group_members) {
            (Some(true), Some(m)) => format!(" (leads {m} processes)"),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "{}  {}  topics {}  partitions {}{of}{stopped}{share}  {:.0} records/s  {:.2} MB/s  lag {} records ({:.1} s)  eta {}  records {}  errors {}",
            f.flow,
            if f.connected { "connected" } else { "DISCONNECTED" },
            f.topics,
            f.partitions,
            f.records_per_second,
            f.megabytes_per_second,
            f.lag_records,
            f.lag_seconds,
            eta,
            f.records,
            f.errors
        );
        if !f.members.is_empty() {
            let members: Vec<String> = f
                .members
                .iter()
                .map(|m| {
                    format!(
                        "{} {}{}",
                        m.host,
                        m.partitions,
                        if m.leader { " (leader)" } else { "" }
                    )
                })
                .collect();
            let _ = writeln!(o, "  processes: {}", members.join(", "));
        }
        if let Some(sc) = &f.schemas {
            let waiting = if sc.records_waiting > 0 {
                format!("{} records WAITING for a schema", sc.records_waiting)
            } else {
                "no record waiting for a schema".into()
            };
            let _ = writeln!(
                o,
                "  schemas: {} versions registered, {} ids translated, {} unknown ids copied as they are, {waiting}, registry errors {}",
                sc.versions_registered, sc.ids_translated, sc.ids_unknown, sc.registry_errors
            );
        }
        if let Some(slots) = f.exactly_once_slots {
            let _ = writeln!(
                o,
                "  exactly-once: this process holds {slots} slot(s); transactions committed {}, aborted {}",
                f.transactions_committed, f.transactions_aborted
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(s: &str, t: &str) -> FlowLabels {
        FlowLabels {
            source: s.into(),
            target: t.into(),
        }
    }

    /// Two flows, A->B copying two partitions and B->A not answering, set up through the
    /// calls the engine makes.
    fn two_flows() -> Metrics {
        let m = Metrics::new();
        let ab = flow("A", "B");
        m.connected_gauge(&ab).set(1);
        m.connected_gauge(&flow("B", "A")).set(0);
        m.topics.get_or_create(&ab).set(2);
        m.partitions.get_or_create(&ab).set(6);
        m.flow_topics.get_or_create(&ab).set(2);
        m.flow_partitions.get_or_create(&ab).set(6);
        let p0 = m.partition_series(&ab.partition("A.t", 0));
        let p1 = m.partition_series(&ab.partition("A.t", 1));
        p0.records.inc_by(100);
        p1.records.inc_by(50);
        p0.bytes.inc_by(2_000_000);
        p0.lag.set(30);
        p0.age_ms.set(1500);
        p1.age_ms.set(500);
        m.errors
            .get_or_create(&ab.error(ErrorKind::Fetch))
            .inc_by(2);
        m
    }

    #[test]
    fn figures_per_flow_from_the_engine_s_series() {
        let m = two_flows();
        let f = flows(&m);
        assert_eq!(f.len(), 2);
        let ab = &f[0];
        assert_eq!(ab.flow, "A->B");
        assert!(ab.connected);
        assert_eq!((ab.topics, ab.partitions), (2, 6));
        assert_eq!(
            (ab.records, ab.bytes, ab.lag_records, ab.errors),
            (150, 2_000_000, 30, 2)
        );
        assert_eq!(ab.lag_seconds, 1.5);
        assert_eq!(ab.partitions_stopped, 0);
        assert!(!f[1].connected);
        assert_eq!(f[1].records, 0);
        m.set_partition_stopped(&flow("A", "B").partition("A.t", 1), true);
        assert_eq!(flows(&m)[0].partitions_stopped, 1);
        assert_eq!(flows(&m)[1].partitions_stopped, 0);
    }

    /// `/status` and `/metrics` read the same atomics: every figure equals the exposition's sum.
    #[test]
    fn figures_agree_with_the_exposition() {
        let m = two_flows();
        let sum = |name: &str, s: &str, t: &str| m.sum(name, &[("source", s), ("target", t)]);
        for f in flows(&m) {
            let (s, t) = f.flow.split_once("->").unwrap();
            assert_eq!(f.records as f64, sum("kmirror_record_count_total", s, t));
            assert_eq!(f.bytes as f64, sum("kmirror_byte_count_total", s, t));
            assert_eq!(
                f.lag_records as f64,
                sum("kmirror_replication_lag_records", s, t)
            );
            assert_eq!(f.errors as f64, sum("kmirror_errors_total", s, t));
            assert_eq!(f.topics as f64, sum("kmirror_topics", s, t));
            assert_eq!(f.partitions as f64, sum("kmirror_partitions", s, t));
            assert_eq!(f.flow_topics as f64, sum("kmirror_flow_topics", s, t));
            assert_eq!(
                f.flow_partitions as f64,
                sum("kmirror_flow_partitions", s, t)
            );
            assert_eq!(
                f64::from(u8::from(f.connected)),
                sum("kmirror_flow_connected", s, t)
            );
        }
    }

    #[test]
    fn schema_figures_show_only_for_flows_that_sync_schemas_and_agree_with_the_exposition() {
        let m = two_flows();
        assert!(flows(&m).iter().all(|f| f.schemas.is_none()));
        let ab = flow("A", "B");
        m.schema_registrations.get_or_create(&ab).inc_by(3);
        m.schema_ids_translated.get_or_create(&ab).inc_by(40);
        m.schema_ids_unknown.get_or_create(&ab).inc_by(1);
        m.records_waiting_for_schema.get_or_create(&ab).set(7);
        m.schema_registry_errors
            .get_or_create(&ab.round("unreachable"))
            .inc_by(2);
        m.schema_registry_errors
            .get_or_create(&ab.round("target_lost"))
            .inc();
        let f = flows(&m);
        let sc = f[0].schemas.clone().expect("A->B syncs schemas");
        assert_eq!(
            sc,
            SchemaStatus {
                versions_registered: 3,
                ids_translated: 40,
                ids_unknown: 1,
                records_waiting: 7,
                registry_errors: 3,
            }
        );
        assert_eq!(
            sc.registry_errors as f64,
            m.sum("kmirror_schema_registry_errors_total", &[("source", "A")])
        );
        assert!(f[1].schemas.is_none());
        let text = render(&Status {
            ready: true,
            reason: None,
            uptime_seconds: 1.0,
            flows: f,
        });
        assert!(
            text.contains("schemas: 3 versions registered, 40 ids translated, 1 unknown ids copied as they are, 7 records WAITING for a schema, registry errors 3"),
            "{text}"
        );
    }

    #[test]
    fn ready_only_when_every_flow_answers_and_nothing_stopped() {
        let m = Metrics::new();
        assert_eq!(
            m.process.readiness(),
            (false, Some("no flow has started yet".into()))
        );
        let ab = m.connected_gauge(&flow("A", "B"));
        let ba = m.connected_gauge(&flow("B", "A"));
        ab.set(1);
        let (ready, why) = m.process.readiness();
        assert!(!ready);
        assert!(why.unwrap().contains("B->A"));
        ba.set(1);
        assert_eq!(m.process.readiness(), (true, None));
        let p = flow("A", "B").partition("A.t", 0);
        m.set_partition_stopped(&p, true);
        assert_eq!(
            m.process.readiness(),
            (false, Some("1 partition(s) stopped by an error".into()))
        );
        // The gauge shows the same state.
        assert_eq!(m.sum("kmirror_partition_stopped", &[]), 1.0);
        m.set_partition_stopped(&p, false);
        assert_eq!(m.process.readiness(), (true, None));
    }

    #[test]
    fn render_shows_lag_and_eta() {
        let s = Status {
            ready: true,
            reason: None,
            uptime_seconds: 12.0,
            flows: vec![FlowStatus {
                flow: "A->B".into(),
                connected: true,
                records_per_second: 100.0,
                lag_records: 500,
                eta_seconds: Some(5.0),
                ..FlowStatus::default()
            }],
        };
        let text = render(&s);
        assert!(text.starts_with("ready (up 12 s)"), "{text}");
        assert!(text.contains("lag 500 records"), "{text}");
        assert!(text.contains("eta 5 s"), "{text}");
        assert!(!text.contains("this process"), "not shared: {text}");
        assert!(!text.contains("WAITING"), "{text}");
    }

    /// Partitions assigned and not copying past the bound are named, with why.
    #[test]
    fn render_shows_partitions_waiting_and_the_most_common_reason() {
        let s = Status {
            ready: true,
            flows: vec![FlowStatus {
                flow: "A->B".into(),
                connected: true,
                partitions: 10001,
                partitions_waiting: 4001,
                waiting_reason: Some("target_partition".into()),
                lag_records: 20005,
                ..FlowStatus::default()
            }],
            ..Status::default()
        };
        let text = render(&s);
        assert!(
            text.contains("partitions 10001 (4001 WAITING over 30 s, most for target_partition)"),
            "{text}"
        );
        assert!(text.contains("lag 20005 records"), "{text}");
    }

    #[test]
    fn an_exactly_once_flow_shows_its_slots_and_transactions() {
        let m = Metrics::new();
        let ab = flow("A", "B");
        m.connected_gauge(&ab).set(1);
        m.exactly_once_slots.get_or_create(&ab).set(4);
        m.transactions_committed.get_or_create(&ab).inc_by(120);
        m.transactions_aborted
            .get_or_create(&ab.reason("failed"))
            .inc_by(2);
        m.transactions_aborted
            .get_or_create(&ab.reason("fenced"))
            .inc();
        let f = &flows(&m)[0];
        assert_eq!(
            (
                f.exactly_once_slots,
                f.transactions_committed,
                f.transactions_aborted
            ),
            (Some(4), 120, 3)
        );
        let out = render(&Status {
            ready: true,
            flows: flows(&m),
            ..Status::default()
        });
        assert!(
            out.contains(
                "exactly-once: this process holds 4 slot(s); transactions committed 120, aborted 3"
            ),
            "{out}"
        );
        assert!(!render(&Status {
            flows: flows(&two_flows()),
            ..Status::default()
        })
        .contains("exactly-once"));
    }

    #[test]
    fn a_shared_flow_shows_this_process_s_share_and_the_leader_the_members() {
        let m = two_flows();
        let ab = flow("A", "B");
        m.assigned_partitions.get_or_create(&ab).set(2);
        m.partitions.get_or_create(&ab).set(2);
        m.flow_partitions.get_or_create(&ab).set(6);
        m.group_leader.get_or_create(&ab).set(1);
        m.group_members.get_or_create(&ab).set(3);
        let f = &flows(&m)[0];
        assert_eq!(
            (f.assigned_partitions, f.group_leader, f.group_members),
            (Some(2), Some(true), Some(3))
        );
        let text = render(&Status {
            flows: vec![f.clone()],
            ..Status::default()
        });
        assert!(
            text.contains("partitions 2 of 6 (leads 3 processes)"),
            "{text}"
        );
        // Another process: not the leader, so it does not count the members.
        m.group_leader.get_or_create(&ab).set(0);
        m.group_members.get_or_create(&ab).set(0);
        let f = &flows(&m)[0];
        assert_eq!((f.group_leader, f.group_members), (Some(false), None));
        // Every process shows the whole group, as the leader assigned it.
        let mut f = f.clone();
        f.members = vec![
            MemberStatus {
                member: "m-1".into(),
                host: "pod-a:7".into(),
                partitions: 4,
                leader: true,
            },
            MemberStatus {
                member: "m-2".into(),
                host: "pod-b:7".into(),
                partitions: 2,
                leader: false,
            },
        ];
        let text = render(&Status {
            flows: vec![f.clone()],
            ..Status::default()
        });
        assert!(
            text.contains("\n  processes: pod-a:7 4 (leader), pod-b:7 2\n"),
            "{text}"
        );
        let back: FlowStatus = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back.members, f.members);
        let json = serde_json::to_string(&flows(&two_flows())[0]).unwrap();
        assert!(
            !json.contains("assigned"),
            "not shared: nothing in JSON: {json}"
        );
    }
}
