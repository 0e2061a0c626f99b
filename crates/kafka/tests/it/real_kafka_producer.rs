//! Produce per broker connection on a real broker: the batches of many partitions share
//! requests, several requests are in flight at once, and a partition the broker refuses gets
//! its own error while the others in the same requests are acknowledged.

use bytes::Bytes;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_testkit::{Cluster, Security};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PARTITIONS: i32 = 100;
const ROUNDS: i64 = 5;
const PER_BATCH: i64 = 10;

fn batch(first: i64) -> RawBatch {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<Record> = (0..PER_BATCH)
        .map(|i| Record {
            offset: i,
            timestamp: now,
            key: None,
            value: Some(Bytes::from(format!("value-{}", first + i))),
            headers: vec![],
        })
        .collect();
    encode_batch(
        &records,
        &BatchOptions {
            codec: Codec::Lz4,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_share_requests_and_a_refused_one_waits_alone() {
    let c = Cluster::start("produce", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    k.create_topics(
        &[
            NewTopic {
                name: "many".into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: vec![],
            },
            // Every batch is larger than this: the broker refuses each with MESSAGE_TOO_LARGE.
            // (A retriable refusal such as NOT_ENOUGH_REPLICAS cannot be had on one broker:
            // Kafka 4 caps min.insync.replicas at the replication factor, KIP-966.)
            NewTopic {
                name: "refused".into(),
                partitions: 1,
                replication_factor: 1,
                configs: vec![("max.message.bytes".into(), "64".into())],
            },
        ],
        false,
    )
    .await
    .unwrap();
    let producer = IdempotentProducer::new(k.clone()).await.unwrap();

    let mut refused = producer.lane("refused", 0);
    for round in 0..3 {
        let acked = refused.send(round, batch(round * PER_BATCH)).await.unwrap();
        assert!(acked.is_empty(), "nothing of the refused topic is written");
    }
    let refused_flush = tokio::spawn(async move {
        let acked = refused.flush().await;
        (refused, acked)
    });

    let mut lanes: Vec<_> = (0..PARTITIONS).map(|p| producer.lane("many", p)).collect();
    let mut acked: Vec<Vec<_>> = vec![Vec::new(); PARTITIONS as usize];
    // Every lane gets its batch before the next round: the sends queue together, as many
    // partition tasks' sends do.
    for round in 0..ROUNDS {
        for (p, lane) in lanes.iter_mut().enumerate() {
            acked[p].extend(lane.send(round, batch(round * PER_BATCH)).await.unwrap());
        }
    }
    for (p, lane) in lanes.iter_mut().enumerate() {
        acked[p].extend(
            tokio::time::timeout(Duration::from_secs(30), lane.flush())
                .await
                .expect("the other partitions are acknowledged while one is refused")
                .unwrap(),
        );
    }
    for (p, acks) in acked.iter().enumerate() {
        let tags: Vec<i64> = acks.iter().map(|a| a.tag).collect();
        assert_eq!(
            tags,
            (0..ROUNDS).collect::<Vec<_>>(),
            "partition {p} in order"
        );
        let offsets: Vec<i64> = acks.iter().map(|a| a.base_offset).collect();
        let want: Vec<i64> = (0..ROUNDS).map(|r| r * PER_BATCH).collect();
        assert_eq!(offsets, want, "partition {p}: contiguous, nothing twice");
    }

    let stats = producer.stats();
    eprintln!("{stats:?}");
    let batches = (PARTITIONS as u64) * (ROUNDS as u64);
    assert!(
        stats.max_batches_per_request > 1,
        "requests carry several partitions: {stats:?}"
    );
    assert!(
        stats.requests < batches,
        "fewer requests than batches: {stats:?}"
    );
    assert!(
        stats.max_in_flight > 1,
        "several requests in flight on a connection: {stats:?}"
    );

    // The refused partition's own answer is an error naming what the broker said.
    let (_lane, refused_acked) = tokio::time::timeout(Duration::from_secs(60), refused_flush)
        .await
        .expect("the refused partition is answered")
        .unwrap();
    let err = refused_acked.expect_err("the broker refuses its batches");
    assert!(
        err.to_string().to_lowercase().contains("large"),
        "MESSAGE_TOO_LARGE: {err}"
    );
}
