//! Flows between two real clusters: active-active A<->B with the default
//! policy copies each side's topics and heartbeats once and never loops (no `A.B.`/`B.A.`
//! topics); a source truncated past kmirror's position is reported with the exact number of lost
//! offsets and the partition stops; the same cluster behind two addresses is refused; a compacted
//! source topic with offset gaps is copied in record mode; a topic that cannot be created on
//! the target and a record too large for it are reported while everything else replicates; the
//! identity policy keeps topic names.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, EngineError, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::sync::Arc;
use std::time::Duration;

fn load(text: &str) -> MirrorConfig {
    mm2::load(
        &Properties::parse(text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap()
}

fn produce(c: &Cluster, topic: &str, n: usize) {
    let input: String = (0..n).map(|i| format!("{topic}-{i}\n")).collect();
    let cfg = c.client_config(None);
    c.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            c.bootstrap(),
            "--producer.config",
            cfg.to_str().unwrap(),
            "--topic",
            topic,
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
}

async fn end(k: &KafkaCluster, topic: &str) -> i64 {
    k.list_offset(topic, 0, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_active_truncation_and_same_cluster() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        // The log cleaner runs every half second, so a compacted topic gets gaps quickly.
        let a = s.spawn(|| {
            Cluster::start_with(
                "topo-a",
                Security::Plaintext,
                &["log.cleaner.backoff.ms=500"],
            )
            .unwrap()
        });
        let b = s.spawn(|| Cluster::start("topo-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("clicks", 1).unwrap();
    cb.create_topic("views", 1).unwrap();
    produce(&ca, "clicks", 200);
    produce(&cb, "views", 100);
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nB->A.enabled = true\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = load(&text);
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    // A compacted topic whose one batch loses every other record to the cleaner: its offsets
    // have gaps, so it must be copied in record mode.
    a.create_topics(
        &[NewTopic {
            name: "profiles".into(),
            partitions: 1,
            replication_factor: 1,
            configs: [
                ("cleanup.policy", "compact"),
                ("segment.ms", "100"),
                ("min.cleanable.dirty.ratio", "0.001"),
                ("min.compaction.lag.ms", "0"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        }],
        false,
    )
    .await
    .unwrap();
    let _ = a.refresh_metadata(None).await;
    let record = |i: i64, key: String, value: String| Record {
        offset: i,
        // Real time: brokers roll segments on record timestamps (segment.ms).
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: vec![],
    };
    let twice: Vec<Record> = (0..100)
        .map(|i| record(i, format!("user-{}", i / 2), format!("v{i}")))
        .collect();
    a.produce(
        "profiles",
        0,
        &encode_batch(&twice, &BatchOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Rolls the segment so the cleaner may compact the first one.
    let roll = vec![record(0, "roll".into(), "roll".into())];
    a.produce(
        "profiles",
        0,
        &encode_batch(&roll, &BatchOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    // A topic whose remote name would be too long for Kafka (249 characters at most): its
    // creation fails on B, it is reported, and every other topic replicates.
    let long_name = "l".repeat(248);
    ca.create_topic(&long_name, 1).unwrap();

    // A record larger than the target producer's max.request.size (1 MiB by default) between
    // two small ones: that partition stops with an error naming it; the rest continues.
    a.create_topics(
        &[NewTopic {
            name: "big".into(),
            partitions: 1,
            replication_factor: 1,
            configs: vec![("max.message.bytes".into(), "3000000".into())],
        }],
        false,
    )
    .await
    .unwrap();
    let _ = a.refresh_metadata(None).await;
    for (i, size) in [10usize, 1_500_000, 10].into_iter().enumerate() {
        let r = vec![record(0, format!("big-{i}"), "x".repeat(size))];
        a.produce(
            "big",
            0,
            &encode_batch(&r, &BatchOptions::default()).unwrap(),
        )
        .await
        .unwrap();
    }
    eventually(60, "the log cleaner compacted profiles", || async {
        read_partition(&a, "profiles", 0).await.len() == 51
    })
    .await;

    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    // Each side's topic and heartbeats arrive on the other side once.
    eventually(60, "both directions copied", || async {
        let _ = a.refresh_metadata(None).await;
        let _ = b.refresh_metadata(None).await;
        end(&b, "A.clicks").await == 200
            && end(&b, "A.profiles").await == 51
            && end(&a, "B.views").await == 100
            && end(&b, "A.heartbeats").await > 0
            && end(&a, "B.heartbeats").await > 0
    })
    .await;
    // Several refresh rounds later, nothing was copied back.
    let refreshes = || metrics.sum("kmirror_rounds_total", &[("kind", "topic_refresh")]);
    let r0 = refreshes();
    eventually(
        60,
        "three more topic refresh rounds in each direction",
        || async { refreshes() >= r0 + 6.0 },
    )
    .await;
    for k in [&a, &b] {
        let md = k.refresh_metadata(None).await.unwrap();
        let looped: Vec<&String> = md
            .topics
            .keys()
            .filter(|t| {
                t.starts_with("A.B.")
                    || t.starts_with("B.A.")
                    || t.starts_with("A.A.")
                    || t.starts_with("B.B.")
            })
            .collect();
        assert!(looped.is_empty(), "cycle: {looped:?}");
    }
    eventually(10, "A.big-0 stopped", || async {
        metrics.sum("kmirror_partition_stopped", &[("topic", "A.big")]) == 1.0
    })
    .await;
    assert_eq!(
        end(&b, "A.big").await,
        1,
        "copied up to the oversized record"
    );
    assert!(metrics.sum("kmirror_errors_total", &[("kind", "topic_create")]) >= 1.0);
    assert!(!b.metadata().topics.keys().any(|t| t.ends_with(&long_name)));
    let copied = read_partition(&b, "A.clicks", 0).await;
    assert_eq!(copied.len(), 200);
    let kv = |v: Vec<(kmirror_kafka::batch::Codec, Record)>| -> Vec<_> {
        v.into_iter()
            .map(|(_, r)| (r.key, r.value, r.timestamp))
            .collect()
    };
    let compacted = kv(read_partition(&a, "profiles", 0).await);
    assert_eq!(
        compacted[0].1.as_deref(),
        Some(&b"v1"[..]),
        "kept the second of each pair"
    );
    assert_eq!(kv(read_partition(&b, "A.profiles", 0).await), compacted);
    assert!(
        metrics.sum(
            "kmirror_batches_total",
            &[("source", "A"), ("mode", "record")]
        ) >= 1.0,
        "the batch with gaps went through record mode"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // Retention outran replication: 100 more records, then the source deletes up to 250 while
    // kmirror is stopped (its position is 199). Offsets 200..250 are lost: 50.
    produce(&ca, "clicks", 100);
    let offsets = r#"{"partitions":[{"topic":"clicks","partition":0,"offset":250}],"version":1}"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), offsets).unwrap();
    let cfg = ca.client_config(None);
    ca.tool(
        "delete-records",
        &[
            "--bootstrap-server",
            ca.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--offset-json-file",
            file.path().to_str().unwrap(),
        ],
        None,
    )
    .unwrap();
    let a_to_b = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = clicks\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (load(&a_to_b), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    eventually(30, "truncation reported", || async {
        metrics.sum("kmirror_partition_stopped", &[("topic", "A.clicks")]) == 1.0
    })
    .await;
    assert_eq!(
        metrics.sum(
            "kmirror_source_truncated_offsets_total",
            &[("topic", "A.clicks")]
        ),
        50.0
    );
    assert_eq!(
        end(&b, "A.clicks").await,
        200,
        "nothing copied past the gap"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // With kmirror.source.truncation=continue it reports the loss and goes on from the log start.
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let c = load(&format!("{a_to_b}kmirror.source.truncation = continue\n"));
        let (s, m) = (shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    eventually(30, "copied from the log start", || async {
        end(&b, "A.clicks").await == 250
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_source_truncated_offsets_total", &[]),
        50.0
    );
    let values: Vec<String> = read_partition(&b, "A.clicks", 0)
        .await
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned())
        .collect();
    assert_eq!(values[199], "clicks-199");
    assert_eq!(
        values[200], "clicks-50",
        "second batch of 100 minus the 50 deleted"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // The identity policy keeps topic names (replication.policy.class, as MM2 spells it).
    ca.create_topic("ledger.eu", 2).unwrap();
    produce(&ca, "ledger.eu", 120);
    let identity = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = ledger.*\n\
         replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let shutdown = Shutdown::default();
    let task = {
        let (c, s) = (load(&identity), shutdown.clone());
        tokio::spawn(async move { engine::run(&c, s, Arc::new(Metrics::new())).await })
    };
    eventually(30, "identity copy", || async {
        let _ = b.refresh_metadata(None).await;
        let mut n = 0;
        for p in 0..2 {
            n += b
                .list_offset("ledger.eu", p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap_or(0);
        }
        n == 120
    })
    .await;
    shutdown.trigger();
    task.await.unwrap().unwrap();
    for p in 0..2 {
        let kv = |v: Vec<(kmirror_kafka::batch::Codec, Record)>| -> Vec<_> {
            v.into_iter()
                .map(|(_, r)| (r.key, r.value, r.timestamp))
                .collect()
        };
        assert_eq!(
            kv(read_partition(&b, "ledger.eu", p).await),
            kv(read_partition(&a, "ledger.eu", p).await),
            "ledger.eu-{p} under its own name"
        );
    }
    assert!(!b.metadata().topics.contains_key("A.ledger.eu"));

    // A source topic deleted and re-created while running: its new records are copied from
    // the start of the new log, after the old ones.
    ca.create_topic("recycled", 1).unwrap();
    produce(&ca, "recycled", 100);
    let recycle = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = recycled\n\
         refresh.topics.interval.seconds = 1\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
         emit.heartbeats.enabled = false\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (load(&recycle), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    eventually(30, "recycled copied", || async {
        let _ = b.refresh_metadata(None).await;
        end(&b, "A.recycled").await == 100
    })
    .await;
    a.delete_topics(&["recycled"]).await.unwrap();
    eventually(30, "recycled deleted", || async {
        let md = a.refresh_metadata(None).await.unwrap();
        !md.topics.contains_key("recycled")
    })
    .await;
    // Whether or not a refresh saw it gone, the new topic id tells the new log from the old.
    ca.create_topic("recycled", 1).unwrap();
    let input: String = (0..30).map(|i| format!("new-{i}\n")).collect();
    let cfg = ca.client_config(None);
    ca.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            ca.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--topic",
            "recycled",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
    eventually(60, "the re-created topic copied", || async {
        end(&b, "A.recycled").await == 130
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[("kind", "topic_recreated")]),
        1.0,
        "the re-creation is reported once"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
    let values: Vec<String> = read_partition(&b, "A.recycled", 0)
        .await
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned())
        .collect();
    assert_eq!(values[99], "recycled-99");
    assert_eq!(values[100], "new-0");
    assert_eq!(values[129], "new-29");

    // The same cluster under two aliases (two spellings of its address) is refused at start.
    let port = ca.bootstrap().rsplit(':').next().unwrap();
    let same = load(&format!(
        "clusters = X, Y\nX.bootstrap.servers = 127.0.0.1:{port}\nY.bootstrap.servers = localhost:{port}\nX->Y.enabled = true\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n"
    ));
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        engine::run(&same, Shutdown::default(), Arc::new(Metrics::new())),
    )
    .await
    .expect("refused promptly")
    .unwrap_err();
    assert!(matches!(err, EngineError::SameCluster { .. }), "{err}");
    assert!(err.to_string().contains("same cluster"), "{err}");
}
