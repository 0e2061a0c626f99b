//! Unit tests of `sender`, kept apart so the module reads on its own.

use super::*;

fn entry(topic: &str, partition: i32, size: usize) -> (Entry, oneshot::Receiver<Answer>) {
    let (reply, rx) = oneshot::channel();
    (
        Entry {
            topic: topic.into(),
            partition,
            batch: Bytes::from(vec![0u8; size]),
            request_limit: 1000,
            reply,
        },
        rx,
    )
}

fn keys(entries: &[Entry]) -> Vec<(String, i32)> {
    entries
        .iter()
        .map(|e| (e.topic.to_string(), e.partition))
        .collect()
}

#[test]
fn a_request_takes_one_batch_per_partition_in_order() {
    let mut rxs = Vec::new();
    let mut queue = VecDeque::new();
    for (t, p) in [("a", 0), ("a", 0), ("a", 1), ("b", 0), ("a", 1), ("a", 0)] {
        let (e, rx) = entry(t, p, 10);
        queue.push_back(e);
        rxs.push(rx);
    }
    let first = take_request(&mut queue);
    assert_eq!(
        keys(&first),
        vec![("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]
    );
    let second = take_request(&mut queue);
    assert_eq!(keys(&second), vec![("a".into(), 0), ("a".into(), 1)]);
    let third = take_request(&mut queue);
    assert_eq!(keys(&third), vec![("a".into(), 0)]);
    assert!(queue.is_empty());
}

#[test]
fn a_request_stays_within_the_limit_and_a_skipped_partition_keeps_its_order() {
    let mut rxs = Vec::new();
    let mut queue = VecDeque::new();
    // Limit 1000: a(600) is taken, b(600) does not fit, so b's next batch (10) must wait
    // too although it would fit; c(300) fits.
    for (t, size) in [("a", 600), ("b", 600), ("b", 10), ("c", 300)] {
        let (e, rx) = entry(t, 0, size);
        queue.push_back(e);
        rxs.push(rx);
    }
    let first = take_request(&mut queue);
    assert_eq!(keys(&first), vec![("a".into(), 0), ("c".into(), 0)]);
    let second = take_request(&mut queue);
    assert_eq!(keys(&second), vec![("b".into(), 0)]);
    assert_eq!(second[0].batch.len(), 600);
    let third = take_request(&mut queue);
    assert_eq!(third[0].batch.len(), 10);
}

#[test]
fn the_first_batch_goes_even_above_the_limit() {
    let (e, _rx) = entry("a", 0, 5000);
    let mut queue = VecDeque::from([e]);
    assert_eq!(take_request(&mut queue).len(), 1);
}

#[test]
fn batches_nobody_waits_for_are_dropped_unsent() {
    let (a, rx_a) = entry("a", 0, 10);
    let (b, _rx_b) = entry("a", 0, 10);
    drop(rx_a);
    let mut queue = VecDeque::from([a, b]);
    let taken = take_request(&mut queue);
    assert_eq!(taken.len(), 1);
    assert!(!taken[0].reply.is_closed(), "the live one");
    assert!(queue.is_empty());
}

#[test]
fn after_a_failure_the_partitions_queued_batches_fail_unsent() {
    let (a1, mut rx_a1) = entry("a", 0, 1);
    let (b1, mut rx_b1) = entry("b", 0, 1);
    let (a2, mut rx_a2) = entry("a", 0, 1);
    let mut queue = VecDeque::from([a1, b1, a2]);
    fail_queued(&mut queue, &[(Arc::<str>::from("a"), 0)], "broker 1");
    assert_eq!(keys(queue.make_contiguous()), vec![("b".into(), 0)]);
    for rx in [&mut rx_a1, &mut rx_a2] {
        let err = rx.try_recv().unwrap().unwrap_err();
        assert!(err.is_retriable(), "{err}");
    }
    assert!(rx_b1.try_recv().is_err(), "b is still queued, unanswered");
}

#[test]
fn requests_group_partitions_by_topic_and_name_topics_by_id_from_v13() {
    let (a0, _r1) = entry("a", 0, 1);
    let (b0, _r2) = entry("b", 0, 1);
    let (a1, _r3) = entry("a", 1, 1);
    let entries = vec![a0, b0, a1];
    let id = uuid::Uuid::from_u128(7);
    let ids = HashMap::from([("a".to_string(), id)]);
    let v12 = build(&entries, 12, 30_000, &ids, None);
    assert_eq!(v12.topic_data.len(), 2);
    assert_eq!(v12.topic_data[0].name.0.as_str(), "a");
    let parts: Vec<i32> = v12.topic_data[0]
        .partition_data
        .iter()
        .map(|p| p.index)
        .collect();
    assert_eq!(parts, vec![0, 1]);
    let v13 = build(&entries, 13, 30_000, &ids, None);
    assert_eq!(v13.topic_data[0].topic_id, id);
    assert_eq!(v13.acks, -1);
}

#[test]
fn every_partition_of_a_request_gets_its_own_answer() {
    let (tx_a, mut rx_a) = oneshot::channel();
    let (tx_b, mut rx_b) = oneshot::channel();
    let (tx_c, mut rx_c) = oneshot::channel();
    let id = uuid::Uuid::from_u128(9);
    let names = HashMap::from([(id, "b".to_string())]);
    use kafka_protocol::messages::produce_response::TopicProduceResponse;
    let resp = kafka_protocol::messages::ProduceResponse::default().with_responses(vec![
        TopicProduceResponse::default()
            .with_name(TopicName(StrBytes::from_static_str("a")))
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(0)
                .with_base_offset(42)]),
        TopicProduceResponse::default()
            .with_topic_id(id)
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(3)
                .with_error_code(6)]),
    ]);
    let waiting = vec![
        (Arc::<str>::from("a"), 0, tx_a),
        (Arc::<str>::from("b"), 3, tx_b),
        (Arc::<str>::from("c"), 0, tx_c),
    ];
    let failed = dispatch("broker 1", waiting, Ok(resp), &names);
    assert_eq!(
        failed,
        vec![(Arc::<str>::from("b"), 3), (Arc::<str>::from("c"), 0)],
        "the partitions without a plain acknowledgement"
    );
    assert_eq!(rx_a.try_recv().unwrap().unwrap().base_offset, 42);
    assert_eq!(rx_b.try_recv().unwrap().unwrap().error_code, 6);
    assert!(
        rx_c.try_recv().unwrap().is_err(),
        "a partition left out of the answer fails"
    );
}

#[test]
fn a_failed_request_fails_each_partition_retriably() {
    let (tx_a, mut rx_a) = oneshot::channel();
    let (tx_b, mut rx_b) = oneshot::channel();
    let waiting = vec![
        (Arc::<str>::from("a"), 0, tx_a),
        (Arc::<str>::from("b"), 0, tx_b),
    ];
    let e = KafkaError::Disconnected {
        broker: "broker 1".into(),
    };
    assert_eq!(
        dispatch("broker 1", waiting, Err(e), &HashMap::new()).len(),
        2
    );
    for rx in [&mut rx_a, &mut rx_b] {
        let err = rx.try_recv().unwrap().unwrap_err();
        assert!(err.is_retriable(), "{err}");
    }
}

/// A request that failed as a whole reaches every partition it carried as the same kind of
/// error: a leader that left the metadata is stale metadata each lane refreshes and retries,
/// never a protocol error that stops the partition.
#[test]
fn a_failed_request_gives_each_partition_the_error_with_its_kind() {
    let mut rxs = Vec::new();
    let mut entries = Vec::new();
    for (t, p) in [("a", 0), ("a", 1), ("b", 0)] {
        let (e, rx) = entry(t, p, 10);
        entries.push(e);
        rxs.push(rx);
    }
    let failed = dispatch(
        "1@127.0.0.1:9092",
        waiting(entries),
        Err(KafkaError::UnknownBroker { id: 1 }),
        &HashMap::new(),
    );
    assert_eq!(failed.len(), 3);
    for mut rx in rxs {
        let e = rx.try_recv().expect("an answer").expect_err("an error");
        assert!(e.is_stale_metadata(), "{e:?}");
    }
}
