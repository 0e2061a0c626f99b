//! Unit tests of `waiting`: the verdicts on a clock, and a partition whose start keeps failing
//! driven through the partition task's seam.

use super::*;
use crate::engine::partition::tests_support::{failing_starts, Driven};
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

/// A scripted source: every partition ends at 5 and starts (`auto.offset.reset`) at 0.
struct FiveRecords;

impl Ends for FiveRecords {
    async fn ends(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        keys.iter().map(|k| (k.clone(), 5)).collect()
    }
    async fn starts(&self, keys: &[(String, i32)]) -> HashMap<(String, i32), i64> {
        keys.iter().map(|k| (k.clone(), 0)).collect()
    }
}

/// The stall's invisible half: a partition whose start keeps failing showed lag 0 and
/// nothing in the status. Driven through the task's seam, it shows its lag from the first look
/// and, past the bound, as waiting for a retry, with the error.
#[tokio::test(start_paused = true)]
async fn a_partition_whose_start_keeps_failing_shows_as_lag_and_as_waiting_after_the_bound() {
    let metrics = Arc::new(Metrics::new());
    let flow_id = FlowId::new(ClusterAlias::new("A"), ClusterAlias::new("B"));
    let labels = FlowLabels {
        source: "A".into(),
        target: "B".into(),
    };
    // Known to the flow figures `/status` reads, as a running flow is.
    metrics.connected_gauge(&labels);
    let watches = Watches::default();
    let plabels = labels.partition("A.orders", 0);
    let watch = watches.assigned(key(0), plabels.clone(), None);
    // Its task: every start lookup fails with a retriable error, for as long as it runs.
    let mut driven: Driven = failing_starts();
    let task = {
        let watch = watch.clone();
        tokio::spawn(async move { driven.run(&watch).await })
    };
    let to = Emitter {
        metrics: &metrics,
        labels: &labels,
    };
    let mut fold = Fold::default();
    tokio::time::sleep(TICK).await;
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert!(v.newly.is_empty(), "not past the bound yet");
    assert_eq!(
        metrics.partition_series(&plabels).lag.get(),
        5,
        "lag from the moment it is assigned: the source's end minus where it will start"
    );
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
    assert_eq!(v.newly.len(), 1);
    assert_eq!(v.newly[0].stage, Stage::Retrying);
    assert!(
        v.newly[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("b1")),
        "{:?}",
        v.newly[0].error
    );
    assert_eq!(
        metrics
            .partitions_waiting
            .get_or_create(&labels.reason("retrying"))
            .get(),
        1
    );
    assert_eq!(
        metrics
            .partitions_reported_waiting
            .get_or_create(&labels.reason("retrying"))
            .get(),
        1
    );
    let figures = metrics.flow_figures();
    let f = figures
        .iter()
        .find(|f| &*f.labels.source == "A")
        .expect("the flow's figures");
    assert_eq!(
        (f.partitions_waiting, f.waiting_reason),
        (1, Some("retrying"))
    );
    assert_eq!(f.lag_records, 5);
    // Ended (stopped, revoked): not watched any more.
    task.abort();
    watches.ended(&key(0), &watch);
    let v = look(
        &watches,
        &FiveRecords,
        &flow_id,
        to,
        Instant::now(),
        &mut fold,
    )
    .await;
    assert_eq!(summary(&v.counts), (0, None));
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
