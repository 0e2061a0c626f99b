//! A damaged source log: one byte flipped inside a batch of a segment file of a
//! cleanly stopped broker (so log recovery, which only runs after an unclean stop, does not cut
//! the batch off). The fetcher refuses the batch by its CRC-32C, naming topic, partition and
//! offset, after delivering the good batches before it; with `check.crcs=false` it delivers the
//! bytes as they are. The engine copies the partition up to the damaged batch, stops it, and
//! copies every other partition completely.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::fetcher::{FetchEvent, Fetcher, FetcherConfig};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::{IsolationLevel, KafkaError};
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{eventually, Cluster, Security};
use std::sync::Arc;
use std::time::Duration;

const BATCHES: i64 = 3;
const PER_BATCH: i64 = 10;

fn batch(first: i64) -> kmirror_kafka::batch::RawBatch {
    let records: Vec<Record> = (0..PER_BATCH)
        .map(|i| Record {
            offset: i,
            timestamp: 1_764_800_000_000 + first + i,
            key: Some(Bytes::from(format!("k{}", first + i))),
            value: Some(Bytes::from(format!("value-{}", first + i))),
            headers: vec![],
        })
        .collect();
    encode_batch(&records, &BatchOptions::default()).unwrap()
}

async fn end(k: &KafkaCluster, topic: &str, partition: i32) -> i64 {
    k.list_offset(topic, partition, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap_or(-1)
}

/// Every event of a subscription until it fails or `want` offsets arrived.
async fn drain(fetcher: &Fetcher, want: i64) -> (Vec<i64>, Option<KafkaError>) {
    let mut sub = fetcher.subscribe("orders", 1, 0).unwrap();
    let mut offsets = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while (offsets.len() as i64) < want {
        let event = tokio::time::timeout_at(deadline, sub.recv())
            .await
            .expect("the fetcher neither delivered nor failed within 30 s")
            .expect("the fetcher stopped");
        match event {
            FetchEvent::Data { data, .. } => {
                offsets.extend(data.batches.iter().map(|b| b.base_offset()));
            }
            FetchEvent::Failed(e) => return (offsets, Some(e)),
            other => panic!("unexpected {other:?}"),
        }
    }
    (offsets, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_source_batch_stops_its_partition_and_no_other() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("corrupt-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("corrupt-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let topic = NewTopic {
        name: "orders".into(),
        partitions: 3,
        replication_factor: 1,
        configs: vec![],
    };
    for (name, err) in a.create_topics(&[topic], false).await.unwrap() {
        assert!(err.is_none(), "{name}: {err:?}");
    }
    let mut sizes = Vec::new();
    for p in 0..3 {
        for n in 0..BATCHES {
            let b = batch(n * PER_BATCH);
            sizes.push(b.bytes().len());
            assert_eq!(a.produce("orders", p, &b).await.unwrap(), n * PER_BATCH);
        }
    }
    drop(a);

    // Stopped cleanly, one byte of the second batch of orders-1 flipped (its last byte: inside
    // the records, where only the CRC can notice), started again on the same data.
    ca.pause().unwrap();
    let segment = ca.dir().join("data/orders-1/00000000000000000000.log");
    let mut log = std::fs::read(&segment).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (where the harness keeps a node's data)",
            segment.display()
        )
    });
    let flip = sizes[0] + sizes[1] - 1;
    assert!(log.len() >= flip, "the segment holds {} bytes", log.len());
    log[flip] ^= 0x01;
    std::fs::write(&segment, &log).unwrap();
    ca.restart().unwrap();
    let a = Arc::new(
        KafkaCluster::connect(ca.client_settings(None))
            .await
            .unwrap(),
    );
    assert_eq!(
        end(&a, "orders", 1).await,
        BATCHES * PER_BATCH,
        "the broker kept the whole log"
    );

    // The fetcher: the first batch, then the damaged one refused by its offset.
    let fetcher = Fetcher::start(a.clone(), FetcherConfig::default());
    let (delivered, failed) = drain(&fetcher, BATCHES).await;
    assert_eq!(
        delivered,
        vec![0],
        "the good batch before the damaged one is delivered"
    );
    match failed {
        Some(KafkaError::CorruptBatch {
            topic,
            partition,
            offset,
            message,
        }) => {
            assert_eq!(
                (topic.as_str(), partition, offset),
                ("orders", 1, PER_BATCH)
            );
            assert!(message.contains("CRC-32C mismatch"), "{message}");
            assert!(message.contains("check.crcs=false"), "{message}");
        }
        other => panic!("expected a corrupt batch error, got {other:?}"),
    }
    drop(fetcher);
    // check.crcs=false: the bytes are delivered as the broker holds them.
    let unchecked = Fetcher::start(
        a.clone(),
        FetcherConfig {
            check_crcs: false,
            ..FetcherConfig::default()
        },
    );
    let (delivered, failed) = drain(&unchecked, BATCHES).await;
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(delivered, vec![0, PER_BATCH, 2 * PER_BATCH]);
    drop(unchecked);

    // The engine: orders-0 and orders-2 whole, orders-1 up to the damaged batch, then stopped.
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
         A->B.topics = orders\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
         emit.heartbeats.enabled = false\nemit.checkpoints.enabled = false\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    eventually(
        60,
        "orders-1 stopped, orders-0 and orders-2 copied",
        || async {
            let _ = b.refresh_metadata(None).await;
            metrics.sum(
                "kmirror_partition_stopped",
                &[("topic", "A.orders"), ("partition", "1")],
            ) == 1.0
                && end(&b, "A.orders", 0).await == BATCHES * PER_BATCH
                && end(&b, "A.orders", 2).await == BATCHES * PER_BATCH
        },
    )
    .await;
    assert_eq!(
        end(&b, "A.orders", 1).await,
        PER_BATCH,
        "copied up to the damaged batch, nothing of it or after it"
    );
    assert_eq!(
        metrics.sum(
            "kmirror_partition_stopped",
            &[("topic", "A.orders"), ("partition", "0")]
        ) + metrics.sum(
            "kmirror_partition_stopped",
            &[("topic", "A.orders"), ("partition", "2")]
        ),
        0.0
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
}
