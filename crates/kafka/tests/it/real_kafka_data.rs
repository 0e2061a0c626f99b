//! Produce and fetch against a real broker: records come back identical with every codec, and
//! fetched batches forwarded raw keep their records, timestamps and compression codec.

use bytes::Bytes;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, EARLIEST, LATEST};
use kmirror_kafka::records::{decode_batch, encode_batch, BatchOptions, Record};
use kmirror_kafka::{IsolationLevel, KafkaError};
use kmirror_testkit::{Cluster, Security};
use std::time::{Duration, Instant};

const CODECS: [Codec; 5] = [
    Codec::None,
    Codec::Gzip,
    Codec::Snappy,
    Codec::Lz4,
    Codec::Zstd,
];

fn records(n: usize, seed: &str) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            offset: i as i64,
            timestamp: kmirror_testkit::recent_ms() + (i as i64) * 7,
            key: match i % 3 {
                0 => None,
                1 => Some(Bytes::new()),
                _ => Some(Bytes::from(format!("{seed}-key-{i}"))),
            },
            value: match i % 4 {
                0 => None,
                1 => Some(Bytes::new()),
                _ => Some(Bytes::from(format!("{seed}-value-{i}-").repeat(20))),
            },
            headers: if i % 2 == 0 {
                vec![]
            } else {
                vec![
                    (Bytes::from("h"), None),
                    (Bytes::from("h"), Some(Bytes::from(format!("{i}")))),
                ]
            },
        })
        .collect()
}

async fn fetch_all(k: &KafkaCluster, topic: &str) -> Vec<(Codec, Vec<Record>)> {
    let end = k
        .list_offset(topic, 0, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap();
    let mut offset = k
        .list_offset(topic, 0, EARLIEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap();
    let mut out = Vec::new();
    while offset < end {
        let f = k
            .fetch(
                topic,
                0,
                offset,
                1 << 20,
                Duration::from_millis(200),
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
        for b in f.batches {
            offset = b.last_offset() + 1;
            out.push((b.codec().unwrap(), decode_batch(&b).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_fetch_and_raw_forward_with_every_codec() {
    let c = Cluster::start("data", Security::Plaintext).unwrap();
    let k = KafkaCluster::connect(c.client_settings(None))
        .await
        .unwrap();
    assert_eq!(k.metadata().cluster_id.as_deref(), c.env("CLUSTER_ID"));
    let topics: Vec<NewTopic> = ["src", "dst", "java", "java-copy"]
        .iter()
        .map(|t| NewTopic {
            name: t.to_string(),
            partitions: 1,
            replication_factor: -1,
            configs: vec![("compression.type".into(), "producer".into())],
        })
        .collect();
    for (name, err) in k.create_topics(&topics, false).await.unwrap() {
        assert!(err.is_none(), "{name}: {err:?}");
    }

    // 1. Records produced with each codec come back identical.
    let mut expected = Vec::new();
    for (i, codec) in CODECS.iter().enumerate() {
        let recs = records(50, &format!("{codec:?}"));
        let batch = encode_batch(
            &recs,
            &BatchOptions {
                codec: *codec,
                ..BatchOptions::default()
            },
        )
        .unwrap();
        let base = k.produce("src", 0, &batch).await.unwrap();
        assert_eq!(base, (i * 50) as i64);
        expected.push((
            *codec,
            recs.into_iter()
                .map(|mut r| {
                    r.offset += base;
                    r
                })
                .collect::<Vec<_>>(),
        ));
    }
    let got = fetch_all(&k, "src").await;
    assert_eq!(got, expected);

    // 2. Raw forwarding: the same bytes, a new producer identity, the codec kept by the broker.
    let mut offset = 0;
    while offset < 250 {
        let f = k
            .fetch(
                "src",
                0,
                offset,
                1 << 20,
                Duration::from_millis(200),
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
        for b in f.batches {
            offset = b.last_offset() + 1;
            let base = k
                .produce("dst", 0, &b.rewrite_for_produce(-1, -1, -1, false))
                .await
                .unwrap();
            assert_eq!(base, b.base_offset(), "offsets line up one to one");
        }
    }
    assert_eq!(
        fetch_all(&k, "dst").await,
        expected,
        "forwarded batches hold the same records and codecs"
    );

    // 3. Batches written by Java's idempotent producer (lz4) forward the same way.
    let lines: Vec<String> = (0..200).map(|i| format!("java-line-{i}")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let cfg = c.client_config(None);
    let input = refs.iter().map(|l| format!("{l}\n")).collect::<String>();
    let out = c
        .tool_output(
            "console-producer",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--producer.config",
                cfg.to_str().unwrap(),
                "--topic",
                "java",
                "--compression-codec",
                "lz4",
                "--producer-property",
                "enable.idempotence=true",
                "--producer-property",
                "linger.ms=50",
            ],
            Some(input.as_bytes()),
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = k
        .fetch(
            "java",
            0,
            0,
            1 << 20,
            Duration::from_millis(200),
            IsolationLevel::ReadCommitted,
        )
        .await
        .unwrap();
    assert!(
        f.batches.iter().all(|b| b.producer_id() >= 0),
        "Java's producer is idempotent"
    );
    for b in &f.batches {
        k.produce("java-copy", 0, &b.rewrite_for_produce(-1, -1, -1, false))
            .await
            .unwrap();
    }
    let src = fetch_all(&k, "java").await;
    let copy = fetch_all(&k, "java-copy").await;
    assert_eq!(copy, src);
    let values: Vec<String> = copy
        .iter()
        .flat_map(|(_, r)| {
            r.iter()
                .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned())
        })
        .collect();
    assert_eq!(values, lines);
    assert!(
        src.iter().all(|(codec, _)| *codec == Codec::Lz4),
        "{:?}",
        src.iter().map(|b| b.0).collect::<Vec<_>>()
    );
    assert!(
        copy.iter().all(|(codec, _)| *codec == Codec::Lz4),
        "the broker kept the source codec"
    );
    // Out-of-range positions say where the log is.
    let err = k
        .fetch(
            "src",
            0,
            1_000_000,
            1 << 20,
            Duration::from_millis(100),
            IsolationLevel::ReadCommitted,
        )
        .await
        .unwrap_err();
    match err {
        KafkaError::OffsetOutOfRange {
            requested,
            log_start,
            log_end,
            ..
        } => assert_eq!((requested, log_start, log_end), (1_000_000, 0, 250)),
        other => panic!("{other}"),
    }
    let md = k.refresh_if_older(Duration::from_secs(0)).await.unwrap();
    assert!(md.topics.contains_key("dst"));

    // 4. Batches written by Java's transactional producer (gzip): read committed, forwarded
    //    without the transactional bit, records and codec unchanged.
    let more: Vec<NewTopic> = ["java-tx", "java-tx-copy"]
        .iter()
        .map(|t| NewTopic {
            name: t.to_string(),
            partitions: 1,
            replication_factor: -1,
            configs: vec![],
        })
        .collect();
    k.create_topics(&more, false).await.unwrap();
    let perf = c
        .tool(
            "producer-perf-test",
            &[
                "--topic",
                "java-tx",
                "--num-records",
                "2000",
                "--record-size",
                "200",
                "--throughput",
                "-1",
                "--transactional-id",
                "perf-tx",
                "--transaction-duration-ms",
                "50",
                "--producer-props",
                &format!("bootstrap.servers={}", c.bootstrap()),
                "compression.type=gzip",
            ],
            None,
        )
        .unwrap();
    assert!(perf.contains("2000 records sent"), "{perf}");
    let mut offset = 0;
    let mut src_records = Vec::new();
    let mut forwarded = 0;
    for _ in 0..1000 {
        let f = k
            .fetch(
                "java-tx",
                0,
                offset,
                1 << 20,
                Duration::from_millis(200),
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
        for b in f.committed_batches() {
            assert!(b.is_transactional() && b.producer_id() >= 0);
            assert_eq!(b.codec(), Some(Codec::Gzip));
            src_records.extend(decode_batch(b).unwrap());
            k.produce("java-tx-copy", 0, &b.rewrite_for_produce(-1, -1, -1, false))
                .await
                .unwrap();
            forwarded += 1;
        }
        if let Some(last) = f.batches.last() {
            offset = last.last_offset() + 1;
        }
        if offset >= f.last_stable_offset && f.last_stable_offset == f.high_watermark {
            break;
        }
    }
    assert_eq!(src_records.len(), 2000);
    let copy = fetch_all(&k, "java-tx-copy").await;
    assert_eq!(copy.len(), forwarded);
    assert!(
        copy.iter().all(|(codec, _)| *codec == Codec::Gzip),
        "the broker kept gzip"
    );
    let copied: Vec<(Option<Bytes>, i64)> = copy
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| (r.value.clone(), r.timestamp)))
        .collect();
    let original: Vec<(Option<Bytes>, i64)> = src_records
        .iter()
        .map(|r| (r.value.clone(), r.timestamp))
        .collect();
    assert_eq!(copied, original, "same values and timestamps, in order");
    let f = k
        .fetch(
            "java-tx-copy",
            0,
            0,
            1 << 20,
            Duration::from_millis(200),
            IsolationLevel::ReadUncommitted,
        )
        .await
        .unwrap();
    assert!(f
        .batches
        .iter()
        .all(|b| !b.is_transactional() && !b.is_control()));

    // 5. Lookups asked together before their topic exists are answered together once it has
    //    leaders (the shared retry rounds), well within the request timeout (15 s here).
    let shared = std::sync::Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );
    let asked = Instant::now();
    let lookups: Vec<_> = (0..4)
        .flat_map(|p| [(p, EARLIEST), (p, LATEST)])
        .map(|(p, at)| {
            let k = shared.clone();
            tokio::spawn(async move {
                k.list_offset_batched("late", p, at, IsolationLevel::ReadUncommitted)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = NewTopic {
        name: "late".into(),
        partitions: 4,
        replication_factor: -1,
        configs: vec![],
    };
    for (name, err) in k.create_topics(&[late], false).await.unwrap() {
        assert!(err.is_none(), "{name}: {err:?}");
    }
    for l in lookups {
        let offset = tokio::time::timeout(Duration::from_secs(20), l)
            .await
            .expect("a lookup waiting for its topic was not answered")
            .unwrap()
            .expect("a lookup waiting for its topic failed");
        assert_eq!(offset, 0, "an empty new partition starts and ends at 0");
    }
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "the waiting lookups took {:?}",
        asked.elapsed()
    );

    k.delete_topics(&[
        "src",
        "dst",
        "java",
        "java-copy",
        "java-tx",
        "java-tx-copy",
        "late",
    ])
    .await
    .unwrap();
    // The controller has committed the deletion when DeleteTopics answers; a
    // broker's metadata cache learns of it a moment later (KRaft propagates
    // records asynchronously), so the client's view is polled, with a bound.
    let gone_by = Instant::now() + Duration::from_secs(15);
    while k.metadata().topics.contains_key("src") {
        assert!(
            Instant::now() < gone_by,
            "a deleted topic was still listed in metadata after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        k.refresh_metadata(None).await.unwrap();
    }
}
