//! Unit tests of `waiting`: the verdicts on a clock, the lookups and the WARN lines
//! (`engine/partition/tests.rs` drives a partition whose start keeps failing through it).

use super::*;
use crate::metrics::{FlowLabels, Metrics};
use crate::names::ClusterAlias;

fn key(p: i32) -> (String, i32) {
    ("orders".to_string(), p)
}

#[tokio::test(start_paused = true)]
async fn a_partition_is_reported_once_past_the_bound_and_counted_while_it_waits() {
    let t0 = Instant::now();
    let w = Arc::new(Watch::new(t0, None));
    let copying = Arc::new(Watch::new(t0, Some(9)));
    copying.copying();
    let watches = vec![(key(0), w.clone()), (key(1), copying.clone())];
    w.stage(Stage::TargetPartition);
    // Before the bound: not waiting yet, but its lag is to be looked up (no start known).
    let v = judge(&watches, t0 + Duration::from_secs(29));
    assert!(v.newly.is_empty());
    assert_eq!(v.counts["target_partition"], 0);
    assert_eq!(v.lag_unknown, vec![(key(0), None)]);
    // Past it: reported once, with what it waits for, and counted while it waits.
    let v = judge(&watches, t0 + Duration::from_secs(31));
    assert_eq!(v.newly.len(), 1);
    assert_eq!(v.newly[0].key, key(0));
    assert_eq!(v.newly[0].stage, Stage::TargetPartition);
    assert_eq!(v.counts["target_partition"], 1);
    assert_eq!(summary(&v.counts), (1, Some("target_partition")));
    let v = judge(&watches, t0 + Duration::from_secs(60));
    assert!(v.newly.is_empty(), "reported once");
    assert_eq!(v.counts["target_partition"], 1, "still counted");
    // Copying from then on: neither counted nor looked up.
    w.copying();
    let v = judge(&watches, t0 + Duration::from_secs(62));
    assert_eq!(summary(&v.counts), (0, None));
    assert!(v.lag_unknown.is_empty());
}

#[test]
fn a_stored_position_is_where_the_lag_counts_from() {
    let t0 = Instant::now();
    let w = Arc::new(Watch::new(t0, Some(41)));
    let v = judge(&[(key(3), w.clone())], t0);
    assert_eq!(v.lag_unknown, vec![(key(3), Some(42))]);
    w.lag_shown();
    assert!(judge(&[(key(3), w)], t0).lag_unknown.is_empty());
}

/// A scripted source: partition 99 is empty; every other ends at 5 and starts
/// (`auto.offset.reset`) at 0.
pub(crate) struct FiveRecords;

impl Ends for FiveRecords {
    async fn ends(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        keys.iter()
            .map(|k| (k.clone(), if k.1 == 99 { 0 } else { 5 }))
            .collect()
    }
    async fn starts(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        keys.iter().map(|k| (k.clone(), 0)).collect()
    }
}

/// A start of thousands of partitions against a slow target: each is counted once, and the
/// WARN lines are one per quiet period, not one per partition.
#[tokio::test(start_paused = true)]
async fn many_partitions_waiting_make_one_warn_line_per_quiet_period() {
    let metrics = Metrics::new();
    let flow_id = FlowId::new(ClusterAlias::new("A"), ClusterAlias::new("B"));
    let labels = FlowLabels {
        source: "A".into(),
        target: "B".into(),
    };
    let to = Emitter {
        metrics: &metrics,
        labels: &labels,
    };
    let watches = Watches::default();
    for p in 0..1000 {
        watches.assigned(key(p), labels.partition("A.orders", p), Some(0));
    }
    // Five more, assigned 5 s later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for p in 1000..1005 {
        watches.assigned(key(p), labels.partition("A.orders", p), Some(0));
    }
    let mut fold = Fold::default();
    tokio::time::sleep(BOUND - Duration::from_secs(4)).await;
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert_eq!(v.newly.len(), 1000);
    assert_eq!(fold.newly, 0, "logged in one line");
    let warned = fold.last_warn.expect("a WARN line");
    // The five, found within the quiet period: counted, their line held back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert_eq!(v.newly.len(), 5);
    assert_eq!((fold.newly, fold.last_warn), (5, Some(warned)));
    // After it, their line, though nothing new was found since.
    tokio::time::sleep(QUIET).await;
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert!(v.newly.is_empty());
    assert_eq!(fold.newly, 0);
    assert!(fold.last_warn.is_some_and(|t| t > warned));
    assert_eq!(
        metrics
            .partitions_reported_waiting
            .get_or_create(&labels.reason("assigned"))
            .get(),
        1005,
        "each partition counted once"
    );
}

/// An empty partition gets no data from the fetcher until records arrive: it is not waiting,
/// and it is never reported as waiting for data.
#[tokio::test(start_paused = true)]
async fn an_empty_partition_is_not_waiting_for_anything() {
    let metrics = Metrics::new();
    let flow_id = FlowId::new(ClusterAlias::new("A"), ClusterAlias::new("B"));
    let labels = FlowLabels {
        source: "A".into(),
        target: "B".into(),
    };
    let to = Emitter {
        metrics: &metrics,
        labels: &labels,
    };
    let watches = Watches::default();
    let empty = watches.assigned(key(99), labels.partition("A.orders", 99), None);
    empty.stage(Stage::Fetch);
    let mut fold = Fold::default();
    tokio::time::sleep(TICK).await;
    look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert!(empty.is_copying());
    tokio::time::sleep(BOUND).await;
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert!(v.newly.is_empty());
    assert_eq!(summary(&v.counts), (0, None));
}
