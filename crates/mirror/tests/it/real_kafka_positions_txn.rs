//! Positions written in transactions (MirrorMaker 2 with `exactly.once.source.support`, KIP-618,
//! writes its source offsets inside each task's transaction): the positions loader keeps what a
//! read_committed reader keeps, in offset order, with markers written by a real transaction
//! coordinator. An aborted transaction's positions are ignored (resuming from them would skip
//! the records the abort removed); a transaction still open at the end is left out without
//! hiding what was written after it; a committed transaction's position written before a
//! tombstone stays removed although its commit marker comes after the tombstone.

use bytes::Bytes;
use kmirror_kafka::batch::RawBatch;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::txn::TransactionalProducer;
use kmirror_mirror::engine::load_positions;
use kmirror_mirror::wire::positions::{source_key, SourcePosition};
use kmirror_testkit::{Cluster, Security};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const TOPIC: &str = "mm2-offsets.A.internal";

fn position(partition: i32, offset: i64) -> RawBatch {
    let p = SourcePosition {
        cluster: "A".into(),
        topic: "spread".into(),
        partition,
        offset,
    };
    batch(p.key(), Some(p.value()))
}

fn batch(key: Vec<u8>, value: Option<Vec<u8>>) -> RawBatch {
    let record = Record {
        offset: 0,
        timestamp: kmirror_testkit::recent_ms(),
        key: Some(Bytes::from(key)),
        value: value.map(Bytes::from),
        headers: vec![],
    };
    encode_batch(&[record], &BatchOptions::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_of_aborted_and_open_transactions_are_ignored_in_offset_order() {
    let c = Cluster::start("positions-txn", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    k.create_topics(
        &[NewTopic {
            name: TOPIC.into(),
            partitions: 1,
            replication_factor: 1,
            configs: vec![("cleanup.policy".into(), "compact".into())],
        }],
        false,
    )
    .await
    .unwrap();
    let timeout = Duration::from_secs(60);
    let mut task0 = TransactionalProducer::init(k.clone(), "A->B-task-0", timeout)
        .await
        .unwrap();
    let mut task1 = TransactionalProducer::init(k.clone(), "A->B-task-1", timeout)
        .await
        .unwrap();
    let plain = IdempotentProducer::new(k.clone()).await.unwrap();
    let mut lane = plain.lane(TOPIC, 0);

    // Partition 0: committed at 100, then a transaction moving it to 999 is aborted.
    task0.send(TOPIC, 0, &position(0, 100)).await.unwrap();
    task0.commit().await.unwrap();
    task0.send(TOPIC, 0, &position(0, 999)).await.unwrap();
    task0.abort().await.unwrap();
    // Partition 1: stored without a transaction (kmirror's own writer).
    lane.send(1, position(1, 50)).await.unwrap();
    lane.flush().await.unwrap();
    // Partition 3: a transaction writes 30, a tombstone follows, then the transaction commits:
    // in offset order the tombstone is last.
    task1.send(TOPIC, 0, &position(3, 30)).await.unwrap();
    lane.send(2, batch(source_key("A", "spread", 3), None))
        .await
        .unwrap();
    lane.flush().await.unwrap();
    task1.commit().await.unwrap();
    // A transaction left open (a task killed in the middle of it) moving partition 1 to 777,
    // and a position stored after it.
    task0.send(TOPIC, 0, &position(1, 777)).await.unwrap();
    lane.send(3, position(2, 5)).await.unwrap();
    lane.flush().await.unwrap();

    let stored = load_positions(&k, TOPIC, "A").await.unwrap();
    let want: HashMap<(String, i32), i64> = [(0, 100), (1, 50), (2, 5)]
        .into_iter()
        .map(|(p, o)| (("spread".to_string(), p), o))
        .collect();
    assert_eq!(stored.positions, want);

    // Once the open transaction commits, its position counts: the coordinator answers EndTxn
    // before it writes the markers (KIP-98), so the reader sees it once the marker is in.
    task0.commit().await.unwrap();
    kmirror_testkit::eventually(
        30,
        "the committed transaction's position is read",
        || async {
            let stored = load_positions(&k, TOPIC, "A").await.unwrap();
            let one = stored.positions.get(&("spread".to_string(), 1)).copied();
            assert!(
                one == Some(50) || one == Some(777),
                "{one:?}: neither the stored nor the committed position"
            );
            one == Some(777)
        },
    )
    .await;
}
