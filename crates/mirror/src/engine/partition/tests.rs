//! Unit tests of `partition`, kept apart so the module reads on its own.

use super::*;
use std::collections::VecDeque;

/// A scripted outside world: each call takes the next scripted answer and is logged.
#[derive(Default)]
struct Script {
    starts: VecDeque<Result<i64, KafkaError>>,
    lanes: VecDeque<Result<(), KafkaError>>,
    /// What each forward does: acknowledge through an offset, then return.
    forwards: VecDeque<(Option<i64>, Result<(), Failure>)>,
    fresh: VecDeque<Result<(), KafkaError>>,
    /// Where a resume after a stored position continues (none scripted: right after it).
    resumes: VecDeque<i64>,
    /// Backoffs before the task is stopped from outside (`usize::MAX`: never).
    waits_before_stop: usize,
    attempts: Vec<u32>,
    log: Vec<String>,
    /// The positions the lag was shown from, before copying.
    lags: Vec<i64>,
}

fn retriable() -> KafkaError {
    KafkaError::Disconnected {
        broker: "b1".into(),
    }
}

fn fatal() -> KafkaError {
    KafkaError::Config("broken".into())
}

impl PartitionIo for Script {
    type Feed = i64;
    type Lane = ();

    async fn fresh_producer(&mut self) -> Result<(), KafkaError> {
        self.log.push("fresh".into());
        self.fresh.pop_front().unwrap_or(Ok(()))
    }
    async fn start_offset(&mut self) -> Result<i64, KafkaError> {
        self.log.push("start".into());
        self.starts.pop_front().expect("an unscripted start lookup")
    }
    async fn show_lag(&mut self, next: i64) -> Option<i64> {
        self.lags.push(next);
        Some(1)
    }
    async fn resume(&mut self, next: i64, stored: bool) -> i64 {
        self.log.push(if stored {
            format!("resume {next}")
        } else {
            format!("resume {next} (no position)")
        });
        self.resumes.pop_front().unwrap_or(next)
    }
    async fn lane(&mut self) -> Result<(), KafkaError> {
        self.log.push("lane".into());
        self.lanes.pop_front().unwrap_or(Ok(()))
    }
    fn subscribe(&mut self, next: i64) -> Result<i64, KafkaError> {
        self.log.push(format!("subscribe {next}"));
        Ok(next)
    }
    fn seek(&mut self, feed: &mut i64, next: i64) {
        self.log.push(format!("seek {next}"));
        *feed = next;
    }
    async fn forward(
        &mut self,
        feed: &mut i64,
        _lane: &mut (),
        next: i64,
        acked: &mut Option<i64>,
    ) -> Result<(), Failure> {
        assert_eq!(*feed, next, "the feed is not where the copy starts");
        self.log.push(format!("forward {next}"));
        let (through, result) = self.forwards.pop_front().expect("an unscripted forward");
        if through.is_some() {
            *acked = through;
        }
        result
    }
    fn fatal(&self, next: i64, e: KafkaError) -> Stopped {
        Stopped::Kafka {
            topic: "t".into(),
            partition: 0,
            first: next,
            source: e,
        }
    }
    async fn retry_wait(&mut self, _e: &KafkaError, attempt: &mut u32) -> bool {
        *attempt += 1;
        self.attempts.push(*attempt);
        self.log.push("wait".into());
        if self.waits_before_stop == 0 {
            return true;
        }
        self.waits_before_stop -= 1;
        false
    }
}

fn run(mut script: Script, stored: Option<i64>, own: bool) -> (Result<(), Stopped>, Script) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let watch = Watch::new(tokio::time::Instant::now(), stored);
    let result = rt.block_on(drive(&mut script, stored, own, &watch));
    (result, script)
}

fn script() -> Script {
    Script {
        waits_before_stop: usize::MAX,
        ..Script::default()
    }
}

#[test]
fn a_stored_position_resumes_after_it_without_a_lookup() {
    let mut s = script();
    s.forwards.push_back((Some(120), Ok(())));
    let (r, s) = run(s, Some(99), false);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        ["resume 100", "lane", "subscribe 100", "forward 100"]
    );
    // Shown once, from the stored position, before anything that may wait.
    assert_eq!(s.lags, [100]);
}

/// A partition assigned and waiting (here: its target partition has no log yet, for good)
/// shows its lag before its first wait, not 0 as if caught up.
#[test]
fn a_partition_that_waits_for_its_target_shows_its_lag_first() {
    let mut s = script();
    s.starts.push_back(Ok(7));
    for _ in 0..3 {
        s.lanes.push_back(Err(retriable()));
    }
    s.waits_before_stop = 2;
    let (r, s) = run(s, None, false);
    assert!(r.is_ok());
    assert_eq!(s.lags, [7], "shown once, from where it starts");
    assert_eq!(
        s.log,
        [
            "start",
            "resume 7 (no position)",
            "lane",
            "wait",
            "lane",
            "wait",
            "lane",
            "wait"
        ]
    );
}

#[test]
fn records_the_target_holds_after_the_stored_position_are_skipped_once_at_the_start() {
    let mut s = script();
    s.resumes.push_back(150);
    s.forwards
        .push_back((None, Err(Failure::Retry(retriable()))));
    s.forwards.push_back((Some(160), Ok(())));
    let (r, s) = run(s, Some(99), false);
    assert!(r.is_ok());
    // A retry resumes from what was acknowledged (here: the resume point), not the store,
    // and the target is not read again.
    assert_eq!(
        s.log,
        [
            "resume 100",
            "lane",
            "subscribe 150",
            "forward 150",
            "wait",
            "fresh",
            "lane",
            "subscribe 150",
            "forward 150"
        ]
    );
}

#[test]
fn without_a_position_the_start_is_looked_up_once_even_across_retries() {
    // A retry before the first acknowledgement must not look up `latest` again (it would
    // skip what arrived meanwhile).
    let mut s = script();
    s.starts.push_back(Err(retriable()));
    s.starts.push_back(Ok(40));
    s.forwards
        .push_back((None, Err(Failure::Retry(retriable()))));
    s.forwards.push_back((None, Ok(())));
    let (r, s) = run(s, None, false);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        [
            "start",
            "wait",
            "start",
            "resume 40 (no position)",
            "lane",
            "subscribe 40",
            "forward 40",
            "wait",
            "fresh",
            "lane",
            "subscribe 40",
            "forward 40"
        ]
    );
    assert_eq!(s.lags, [40], "once, when the start is known");
}

#[test]
fn a_negative_stored_position_counts_as_none() {
    let mut s = script();
    s.starts.push_back(Ok(0));
    s.forwards.push_back((None, Ok(())));
    let (_, s) = run(s, Some(-1), false);
    assert_eq!(s.log[0], "start");
}

#[test]
fn a_failed_copy_resumes_after_the_last_acknowledgement_with_a_new_producer_id() {
    let mut s = script();
    s.forwards
        .push_back((Some(149), Err(Failure::Retry(retriable()))));
    s.forwards.push_back((Some(160), Ok(())));
    let (r, s) = run(s, Some(99), false);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        [
            "resume 100",
            "lane",
            "subscribe 100",
            "forward 100",
            "wait",
            "fresh",
            "lane",
            "subscribe 150",
            "forward 150"
        ]
    );
}

#[test]
fn backoff_grows_without_progress_and_starts_over_after_progress() {
    let mut s = script();
    s.forwards
        .push_back((None, Err(Failure::Retry(retriable()))));
    s.forwards
        .push_back((None, Err(Failure::Retry(retriable()))));
    s.forwards
        .push_back((Some(10), Err(Failure::Retry(retriable()))));
    s.forwards.push_back((None, Ok(())));
    let (_, s) = run(s, Some(0), false);
    assert_eq!(s.attempts, [1, 2, 1]);
}

#[test]
fn a_target_partition_not_ready_waits_without_holding_a_subscription() {
    let mut s = script();
    s.forwards
        .push_back((Some(5), Err(Failure::Retry(retriable()))));
    s.lanes.push_back(Ok(()));
    s.lanes.push_back(Err(retriable()));
    s.forwards.push_back((None, Ok(())));
    let (r, s) = run(s, Some(0), false);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        [
            "resume 1",
            "lane",
            "subscribe 1",
            "forward 1",
            "wait",
            "fresh",
            "lane",
            "wait",
            "lane",
            "subscribe 6",
            "forward 6"
        ]
    );
}

#[test]
fn truncation_with_continue_seeks_the_same_subscription_to_the_log_start() {
    let mut s = script();
    s.forwards
        .push_back((None, Err(Failure::Continue { log_start: 500 })));
    s.forwards.push_back((None, Ok(())));
    let (r, s) = run(s, Some(9), false);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        [
            "resume 10",
            "lane",
            "subscribe 10",
            "forward 10",
            "lane",
            "seek 500",
            "forward 500"
        ]
    );
}

#[test]
fn what_retrying_cannot_fix_stops_the_partition_at_the_offset_it_had_reached() {
    let mut s = script();
    s.lanes.push_back(Err(fatal()));
    let (r, s) = run(s, Some(41), false);
    match r {
        Err(Stopped::Kafka { first, .. }) => assert_eq!(first, 42),
        other => panic!("expected a stop at 42, got {other:?}"),
    }
    assert_eq!(s.log, ["resume 42", "lane"]);

    let mut s = script();
    s.starts.push_back(Err(fatal()));
    let (r, _) = run(s, None, false);
    assert!(matches!(r, Err(Stopped::Kafka { first: -1, .. })));

    let mut s = script();
    s.forwards.push_back((
        Some(70),
        Err(Failure::Stop(Stopped::Kafka {
            topic: "t".into(),
            partition: 0,
            first: 71,
            source: fatal(),
        })),
    ));
    let (r, s) = run(s, None.or(Some(50)), false);
    assert!(matches!(r, Err(Stopped::Kafka { first: 71, .. })));
    assert!(!s.log.contains(&"wait".to_string()));
}

#[test]
fn a_restarted_partition_takes_its_own_producer_id_first_and_retries_for_it() {
    let mut s = script();
    s.fresh.push_back(Err(retriable()));
    s.fresh.push_back(Err(retriable()));
    s.forwards.push_back((None, Ok(())));
    let (r, s) = run(s, Some(3), true);
    assert!(r.is_ok());
    assert_eq!(
        s.log,
        [
            "fresh",
            "wait",
            "fresh",
            "wait",
            "fresh",
            "resume 4",
            "lane",
            "subscribe 4",
            "forward 4"
        ]
    );
    assert_eq!(
        s.attempts,
        [1, 2],
        "the backoff grows while the id is refused"
    );
}

#[test]
fn a_stop_during_any_backoff_ends_the_task_quietly() {
    for case in 0..3 {
        let mut s = script();
        s.waits_before_stop = 0;
        match case {
            0 => s.starts.push_back(Err(retriable())),
            1 => s.lanes.push_back(Err(retriable())),
            _ => s
                .forwards
                .push_back((None, Err(Failure::Retry(retriable())))),
        }
        let stored = if case == 0 { None } else { Some(0) };
        let (r, s) = run(s, stored, false);
        assert!(r.is_ok(), "case {case}");
        assert_eq!(
            s.log.last().map(String::as_str),
            Some("wait"),
            "case {case}"
        );
    }
}

/// A partition whose start lookup fails (retriably) every time, backing off 1 s between tries.
struct FailingStarts;

impl PartitionIo for FailingStarts {
    type Feed = ();
    type Lane = ();
    async fn fresh_producer(&mut self) -> Result<(), KafkaError> {
        Ok(())
    }
    async fn start_offset(&mut self) -> Result<i64, KafkaError> {
        Err(retriable())
    }
    async fn show_lag(&mut self, _next: i64) -> Option<i64> {
        None
    }
    async fn resume(&mut self, next: i64, _stored: bool) -> i64 {
        next
    }
    async fn lane(&mut self) -> Result<(), KafkaError> {
        Ok(())
    }
    fn subscribe(&mut self, _next: i64) -> Result<(), KafkaError> {
        Ok(())
    }
    fn seek(&mut self, _feed: &mut (), _next: i64) {}
    async fn forward(
        &mut self,
        _feed: &mut (),
        _lane: &mut (),
        _next: i64,
        _acked: &mut Option<i64>,
    ) -> Result<(), Failure> {
        unreachable!("its start never succeeds")
    }
    fn fatal(&self, next: i64, e: KafkaError) -> Stopped {
        Stopped::Kafka {
            topic: "t".into(),
            partition: 0,
            first: next,
            source: e,
        }
    }
    async fn retry_wait(&mut self, _e: &KafkaError, attempt: &mut u32) -> bool {
        *attempt += 1;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        false
    }
}

mod waiting {
    use super::FailingStarts;
    use crate::engine::partition::drive;
    use crate::engine::waiting::tests::FiveRecords;
    use crate::engine::waiting::*;
    use crate::events::Emitter;
    use crate::metrics::{FlowLabels, Metrics};
    use crate::names::{ClusterAlias, FlowId};
    use std::sync::Arc;
    use tokio::time::Instant;

    fn key(p: i32) -> (String, i32) {
        ("orders".to_string(), p)
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
        let task = {
            let watch = watch.clone();
            tokio::spawn(async move { drive(&mut FailingStarts, None, false, &watch).await })
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
}
