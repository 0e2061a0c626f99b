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
            timestamp: 1_700_000_000_000,
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
