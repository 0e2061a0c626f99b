//! Transactions against a real broker: committed data is visible to read_committed, aborted data
//! is not; offsets sent in a transaction commit with it; a second producer with the same
//! transactional id fences the first.

use bytes::Bytes;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::records::{decode_batch, encode_batch, BatchOptions, Record};
use kmirror_kafka::txn::TransactionalProducer;
use kmirror_kafka::{IsolationLevel, KafkaError};
use kmirror_testkit::{Cluster, Security};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn batch(prefix: &str, n: i64) -> kmirror_kafka::batch::RawBatch {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            offset: i,
            timestamp: kmirror_testkit::recent_ms(),
            key: None,
            value: Some(Bytes::from(format!("{prefix}-{i}"))),
            headers: vec![],
        })
        .collect();
    encode_batch(
        &records,
        &BatchOptions {
            codec: Codec::Zstd,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_visible_aborted_not_and_fencing() {
    let c = Cluster::start("txn", Security::Plaintext).unwrap();
    let settings = c.client_settings(None);
    let k = Arc::new(KafkaCluster::connect(settings).await.unwrap());
    k.create_topics(
        &[NewTopic {
            name: "t".into(),
            partitions: 1,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();

    let mut p = TransactionalProducer::init(k.clone(), "kmirror-test-txn", Duration::from_secs(60))
        .await
        .unwrap();
    p.send("t", 0, &batch("committed-a", 10)).await.unwrap();
    let mut offsets = BTreeMap::new();
    offsets.insert(
        "t".to_string(),
        BTreeMap::from([(
            0,
            CommittedOffset {
                offset: 10,
                leader_epoch: -1,
                metadata: "txn".into(),
            },
        )]),
    );
    p.send_offsets("txn-group", &offsets).await.unwrap();
    p.commit().await.unwrap();
    p.send("t", 0, &batch("aborted", 10)).await.unwrap();
    p.abort().await.unwrap();
    p.send("t", 0, &batch("committed-b", 10)).await.unwrap();
    p.commit().await.unwrap();

    // Read as a read_committed consumer does: fetch from the next offset until the last stable
    // offset (a response may hold only part of the log), filtering each response.
    let mut values = Vec::new();
    let mut aborted_seen = false;
    let mut offset = 0;
    for _ in 0..200 {
        let f = k
            .fetch(
                "t",
                0,
                offset,
                1 << 20,
                Duration::from_millis(100),
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
        aborted_seen |= !f.aborted.is_empty();
        for b in f.committed_batches() {
            values.extend(
                decode_batch(b)
                    .unwrap()
                    .into_iter()
                    .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap()),
            );
        }
        if let Some(last) = f.batches.last() {
            offset = last.last_offset() + 1;
        }
        if offset >= f.high_watermark && f.last_stable_offset == f.high_watermark {
            break;
        }
    }
    let expected: Vec<String> = (0..10)
        .map(|i| format!("committed-a-{i}"))
        .chain((0..10).map(|i| format!("committed-b-{i}")))
        .collect();
    assert_eq!(values, expected);
    assert!(aborted_seen, "the broker reports the aborted transaction");
    // The aborted records are in the log, visible to read_uncommitted.
    let mut raw = Vec::new();
    let mut offset = 0;
    while offset < 33 {
        let f = k
            .fetch(
                "t",
                0,
                offset,
                1 << 20,
                Duration::from_millis(100),
                IsolationLevel::ReadUncommitted,
            )
            .await
            .unwrap();
        for b in &f.batches {
            offset = b.last_offset() + 1;
            if !b.is_control() {
                assert!(b.is_transactional());
                raw.extend(
                    decode_batch(b)
                        .unwrap()
                        .into_iter()
                        .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap()),
                );
            }
        }
    }
    assert!(
        raw.contains(&"aborted-0".to_string()),
        "aborted records are in the log: {raw:?}"
    );
    assert_eq!(raw.len(), 30);
    assert_eq!(
        k.fetch_group_offsets("txn-group").await.unwrap()["t"][&0].offset,
        10
    );

    // A newer instance fences the old one.
    let mut newer =
        TransactionalProducer::init(k.clone(), "kmirror-test-txn", Duration::from_secs(60))
            .await
            .unwrap();
    assert!(newer.identity().1 > p.identity().1 || newer.identity().0 != p.identity().0);
    let err = p
        .send("t", 0, &batch("zombie", 1))
        .await
        .expect_err("fenced producer wrote");
    assert!(matches!(err, KafkaError::Fenced { .. }), "{err}");
    newer.send("t", 0, &batch("newer", 1)).await.unwrap();
    newer.commit().await.unwrap();
}

/// Every value a read_committed (or read_uncommitted) consumer sees in one partition, in order.
async fn read_all(
    k: &KafkaCluster,
    topic: &str,
    partition: i32,
    isolation: IsolationLevel,
) -> Vec<String> {
    let mut values = Vec::new();
    let mut offset = 0;
    let mut out_of_range = 0;
    for _ in 0..500 {
        let f = match k
            .fetch(
                topic,
                partition,
                offset,
                1 << 20,
                Duration::from_millis(50),
                isolation,
            )
            .await
        {
            Ok(f) => f,
            // A leader that just took over may not know the log start yet; asked again with
            // fresh metadata. A log really trimmed fails below (its records are missing from
            // what is read) or here after the retries.
            Err(e @ KafkaError::OffsetOutOfRange { .. }) if out_of_range < 30 => {
                out_of_range += 1;
                eprintln!("{topic}-{partition}: {e}; reading again with fresh metadata");
                k.refresh_metadata(Some(&[topic])).await.unwrap();
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => panic!("{topic}-{partition} at {offset}: {e}"),
        };
        for b in f.visible(isolation) {
            values.extend(
                decode_batch(b)
                    .unwrap()
                    .into_iter()
                    .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap()),
            );
        }
        if let Some(last) = f.batches.last() {
            offset = last.last_offset() + 1;
        }
        let end = match isolation {
            IsolationLevel::ReadCommitted => f.last_stable_offset,
            IsolationLevel::ReadUncommitted => f.high_watermark,
        };
        if offset >= end {
            break;
        }
    }
    values
}

fn values(prefix: &str, partition: i32, batches: i64, per_batch: i64) -> Vec<String> {
    (0..batches)
        .flat_map(|b| (0..per_batch).map(move |r| format!("{prefix}-{partition}-{b}-{r}")))
        .collect()
}

/// Sends `batches` batches on every lane at once (pipelined, several partitions per request)
/// and waits for every acknowledgement.
async fn send_all(
    lanes: &mut [kmirror_kafka::producer::PartitionLane],
    prefix: &str,
    batches: i64,
) -> Result<(), KafkaError> {
    let work = lanes.iter_mut().enumerate().map(|(p, lane)| async move {
        for b in 0..batches {
            let records: Vec<Record> = (0..5)
                .map(|r| Record {
                    offset: r,
                    timestamp: kmirror_testkit::recent_ms(),
                    key: None,
                    value: Some(Bytes::from(format!("{prefix}-{p}-{b}-{r}"))),
                    headers: vec![],
                })
                .collect();
            let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
            lane.send(b, batch).await?;
        }
        lane.flush().await.map(|_| ())
    });
    for r in futures_util::future::join_all(work).await {
        r?;
    }
    Ok(())
}

/// The pipelined lanes of a transactional producer (the engine's exactly-once path): one
/// transaction over partitions led by three brokers, partitions added in batches, commit
/// visible and abort invisible to read_committed, sequences continuing across transactions, the
/// coordinator stopped mid-transaction, and a newer instance fencing lanes with batches on
/// their way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_write_in_transactions_across_brokers() {
    use kmirror_kafka::producer::IdempotentProducer;
    const PARTITIONS: i32 = 6;
    let c = Cluster::start_nodes("txn-lanes", Security::Plaintext, 3, &[]).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    k.create_topics(
        &[NewTopic {
            name: "lanes".into(),
            partitions: PARTITIONS,
            replication_factor: 3,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    // The broker that answers the metadata may not know a topic created a moment ago (three
    // brokers apply the controller's records each in its own time): asked until every
    // partition has a leader.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let leaders: std::collections::BTreeSet<i32> = loop {
        k.refresh_metadata(Some(&["lanes"])).await.unwrap();
        let led: Result<std::collections::BTreeSet<i32>, _> = (0..PARTITIONS)
            .map(|p| k.leader_of("lanes", p).map(|l| l.0))
            .collect();
        match led {
            Ok(l) => break l,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not every partition led yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("partitions without a leader after 30 s: {e}"),
        }
    };
    assert!(
        leaders.len() > 1,
        "partitions led by one broker: {leaders:?}"
    );

    let id = "kmirror-test-lanes";
    let p = IdempotentProducer::transactional(k.clone(), id, Duration::from_secs(60))
        .await
        .unwrap();
    let txn = p.transaction().unwrap().clone();
    let mut lanes: Vec<_> = (0..PARTITIONS).map(|i| p.lane("lanes", i)).collect();
    for lane in lanes.iter_mut() {
        lane.prepare().await.unwrap();
    }

    // 1. Committed: invisible until the commit, then all of it, in order.
    send_all(&mut lanes, "c1", 20).await.unwrap();
    assert_eq!(txn.partitions(), PARTITIONS as usize);
    let adds = txn.add_requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        adds < PARTITIONS as u64,
        "{adds} AddPartitionsToTxn requests for {PARTITIONS} partitions asking at once"
    );
    for part in 0..PARTITIONS {
        assert!(
            read_all(&k, "lanes", part, IsolationLevel::ReadCommitted)
                .await
                .is_empty(),
            "partition {part}: data visible before the commit"
        );
    }
    txn.commit().await.unwrap();

    // 2. Aborted, with the same lanes (sequences go on within the epoch). Every partition
    // added first in one request (as a commit adds its positions): the sends add nothing.
    let before = txn.add_requests.load(std::sync::atomic::Ordering::Relaxed);
    let topic: Arc<str> = Arc::from("lanes");
    txn.add_all(
        (0..PARTITIONS).map(|i| (topic.clone(), i)).collect(),
        txn.identity(),
    )
    .await
    .unwrap();
    assert_eq!(txn.partitions(), PARTITIONS as usize);
    send_all(&mut lanes, "a2", 5).await.unwrap();
    assert_eq!(
        txn.add_requests.load(std::sync::atomic::Ordering::Relaxed),
        before + 1,
        "one AddPartitionsToTxn for every partition, none for the sends"
    );
    txn.abort().await.unwrap();

    // 3. Committed, with the transaction coordinator stopped half-way.
    send_all(&mut lanes, "c3", 5).await.unwrap();
    let coordinator = kmirror_kafka::txn::find_coordinator_node(&k, id, 1)
        .await
        .unwrap();
    c.stop_node(coordinator as u16).unwrap();
    send_all(&mut lanes, "c3b", 5).await.unwrap();
    txn.commit().await.unwrap();
    c.start_node(coordinator as u16).unwrap();

    // 4. Fenced: a newer instance takes the id while this one has a transaction open.
    send_all(&mut lanes, "zombie", 2).await.unwrap();
    let newer = IdempotentProducer::transactional(k.clone(), id, Duration::from_secs(60))
        .await
        .unwrap();
    let err = send_all(&mut lanes[..1], "zombie-late", 1)
        .await
        .expect_err("a fenced lane wrote");
    assert!(matches!(err, KafkaError::Fenced { .. }), "{err}");
    let err = txn.commit().await.expect_err("a fenced producer committed");
    assert!(matches!(err, KafkaError::Fenced { .. }), "{err}");
    let mut newer_lanes: Vec<_> = (0..PARTITIONS).map(|i| newer.lane("lanes", i)).collect();
    send_all(&mut newer_lanes, "n4", 3).await.unwrap();
    newer.transaction().unwrap().commit().await.unwrap();

    for part in 0..PARTITIONS {
        let expected: Vec<String> = [("c1", 20), ("c3", 5), ("c3b", 5), ("n4", 3)]
            .iter()
            .flat_map(|(prefix, n)| values(prefix, part, *n, 5))
            .collect();
        // EndTxn answers once the commit is decided; the coordinator writes the markers after
        // it, so the last transaction becomes visible to read_committed a moment later.
        let t0 = std::time::Instant::now();
        let seen = loop {
            let seen = read_all(&k, "lanes", part, IsolationLevel::ReadCommitted).await;
            if seen == expected || t0.elapsed() > Duration::from_secs(15) {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(seen, expected, "partition {part}, read_committed");
        let raw = read_all(&k, "lanes", part, IsolationLevel::ReadUncommitted).await;
        assert!(
            raw.contains(&format!("a2-{part}-0-0")) && raw.contains(&format!("zombie-{part}-0-0")),
            "partition {part}: the aborted records are in the log"
        );
    }
    assert_eq!(txn.commits.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(txn.aborts.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// How many times the brokers' logs say the coordinator skipped a marker to `topic`'s
/// partitions: the "likely deleted already and hence can be skipped" line (KAFKA-20734).
fn skipped_markers(c: &Cluster, topic: &str) -> usize {
    (1..=c.brokers())
        .map(|n| {
            let log = c.dir().join(format!("node-{n}/logs/server.log"));
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("hence can be skipped") && l.contains(topic))
                .count()
        })
        .sum()
}

/// A transaction's marker dropped for a partition without a leader at EndTxn, on a 3-broker
/// cluster where the partition has one replica and the coordinator lives on another broker:
/// the check after the commit cannot ask the leaderless partition, so the partition stays
/// suspect; the next transaction's first add to it finds the range left open and settles it
/// with the commit's own result before anything joins it. Whether the broker dropped the marker
/// is read from its log (Kafka versions without KAFKA-20734 do not): with a skip, the settle is
/// reported; without one, nothing is. Either way, every committed record is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_dropped_for_a_leaderless_partition_is_settled_with_its_result() {
    use kmirror_kafka::producer::IdempotentProducer;
    let c = Cluster::start_nodes("txn-drop", Security::Plaintext, 3, &[]).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    let topic = "single";
    k.create_topics(
        &[NewTopic {
            name: topic.into(),
            partitions: 6,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    k.refresh_metadata(Some(&[topic])).await.unwrap();
    let id = "kmirror-test-dropped-marker";
    let p = IdempotentProducer::transactional(k.clone(), id, Duration::from_secs(60))
        .await
        .unwrap();
    let txn = p.transaction().unwrap().clone();
    let coordinator = kmirror_kafka::txn::find_coordinator_node(&k, id, 1)
        .await
        .unwrap();
    let leader = |part: i32| k.leader_of(topic, part).unwrap().0;
    let lost = (0..6).find(|&q| leader(q) != coordinator).unwrap();
    let lost_leader = leader(lost);
    let kept = (0..6).find(|&q| leader(q) != lost_leader).unwrap();
    let mut lanes = [p.lane(topic, lost), p.lane(topic, kept)];
    send_each(&mut lanes, "c1").await;
    // The partition's only broker stops between the produce and EndTxn: its leader is -1
    // while the coordinator writes the markers.
    c.stop_node(lost_leader as u16).unwrap();
    k.refresh_metadata(Some(&[topic])).await.unwrap();
    txn.commit().await.unwrap();
    c.start_node(lost_leader as u16).unwrap();
    let skipped = skipped_markers(&c, topic);
    eprintln!("markers skipped by the coordinator: {skipped}");

    // The next transaction writes to the partition again: its first add settles what the
    // dropped marker left open.
    send_each(&mut lanes, "c2").await;
    txn.commit().await.unwrap();
    let reports = txn.take_reports();
    if skipped > 0 {
        let on_lost: Vec<_> = reports.iter().filter(|h| h.partition == lost).collect();
        assert_eq!(on_lost.len(), 2, "found then settled: {reports:?}");
        assert!(!on_lost[0].settled && on_lost[1].settled, "{reports:?}");
        assert!(
            on_lost.iter().all(|h| h.committed && h.open_since == 0),
            "{reports:?}"
        );
    } else {
        assert!(reports.is_empty(), "no marker was skipped: {reports:?}");
    }
    assert!(
        reports.iter().all(|h| h.partition == lost),
        "only the partition whose leader was lost: {reports:?}"
    );

    // Again, and this time the producer goes away before its next transaction (a process that
    // died): a new one takes the id, reads the last result from the coordinator before
    // InitProducerId forgets it, and settles the range at its first add, at its own epoch.
    // Where c3 will start: the end once the last commit's marker is written (the stable offset
    // has reached it).
    let c3_at = loop {
        let end = k
            .list_offset(topic, lost, -1, IsolationLevel::ReadUncommitted)
            .await
            .unwrap();
        let stable = k
            .list_offset(topic, lost, -1, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        if stable == end {
            break end;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    send_each(&mut lanes, "c3").await;
    c.stop_node(lost_leader as u16).unwrap();
    k.refresh_metadata(Some(&[topic])).await.unwrap();
    txn.commit().await.unwrap();
    drop((lanes, p));
    c.start_node(lost_leader as u16).unwrap();
    let skipped_again = skipped_markers(&c, topic) - skipped;
    eprintln!("markers skipped by the coordinator the second time: {skipped_again}");
    let newer = IdempotentProducer::transactional(k.clone(), id, Duration::from_secs(60))
        .await
        .unwrap();
    let mut lanes = [newer.lane(topic, lost), newer.lane(topic, kept)];
    send_each(&mut lanes, "c4").await;
    newer.transaction().unwrap().commit().await.unwrap();
    let reports = newer.transaction().unwrap().take_reports();
    if skipped_again > 0 {
        assert_eq!(reports.len(), 2, "found then settled: {reports:?}");
        assert!(!reports[0].settled && reports[1].settled, "{reports:?}");
        assert!(
            reports
                .iter()
                .all(|h| h.committed && h.partition == lost && h.open_since == c3_at),
            "{reports:?}"
        );
    } else {
        assert!(reports.is_empty(), "no marker was skipped: {reports:?}");
    }

    let expected: Vec<String> = ["c1", "c2", "c3", "c4"]
        .iter()
        .flat_map(|prefix| (0..5).map(move |r| format!("{prefix}-{r}")))
        .collect();
    for part in [lost, kept] {
        let t0 = std::time::Instant::now();
        let seen = loop {
            let seen = read_all(&k, topic, part, IsolationLevel::ReadCommitted).await;
            if seen == expected || t0.elapsed() > Duration::from_secs(15) {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(seen, expected, "partition {part}, read_committed");
        let stable = k
            .list_offset(topic, part, -1, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        let end = k
            .list_offset(topic, part, -1, IsolationLevel::ReadUncommitted)
            .await
            .unwrap();
        assert_eq!(stable, end, "partition {part}: a transaction is still open");
    }
}

/// Five records to each lane, one lane after the other (the first lane's add comes first).
async fn send_each(lanes: &mut [kmirror_kafka::producer::PartitionLane], prefix: &str) {
    for lane in lanes.iter_mut() {
        let records: Vec<Record> = (0..5)
            .map(|r| Record {
                offset: r,
                timestamp: kmirror_testkit::recent_ms(),
                key: None,
                value: Some(Bytes::from(format!("{prefix}-{r}"))),
                headers: vec![],
            })
            .collect();
        let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
        // A partition whose leader just came back is retried, as the engine does.
        let mut attempts = 0;
        while let Err(e) = lane.send(0, batch.clone()).await {
            attempts += 1;
            assert!(attempts < 50 && e.is_stale_metadata(), "{e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        lane.flush().await.unwrap();
    }
}
