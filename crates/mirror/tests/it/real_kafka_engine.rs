//! The engine against two real clusters: topics appear on B under the policy's names with the
//! source's partition counts and configs; every record arrives byte-identical per partition and
//! in order; batch mode is used for forwardable batches and record mode for LogAppendTime ones;
//! heartbeats are written; topics and partitions added while running are picked up; positions
//! are stored in MM2's format; a restart resumes from them without re-copying.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_mirror::wire::internal::Heartbeat;
use kmirror_mirror::wire::positions::SourcePosition;
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn produce(c: &Cluster, topic: &str, codec: &str, lines: &[String]) {
    let cfg = c.client_config(None);
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = c
        .tool_output(
            "console-producer",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--producer.config",
                cfg.to_str().unwrap(),
                "--topic",
                topic,
                "--compression-codec",
                codec,
                "--property",
                "parse.key=true",
                "--property",
                "key.separator=:",
                "--producer-property",
                "linger.ms=20",
            ],
            Some(input.as_bytes()),
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running engine (stopped on drop by the test's end).
struct Running {
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<Result<(), engine::EngineError>>,
}

fn start(config: &MirrorConfig) -> Running {
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (config, shutdown, metrics) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, metrics).await })
    };
    Running {
        shutdown,
        metrics,
        task,
    }
}

impl Running {
    async fn stop(self) -> Arc<Metrics> {
        self.shutdown.trigger();
        self.task.await.unwrap().unwrap();
        self.metrics
    }
}

/// Waits until every remote partition's end offset reached its source's.
async fn wait_copied(a: &KafkaCluster, b: &KafkaCluster, pairs: &[(&str, &str, i32)]) {
    let t0 = Instant::now();
    'wait: loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "replication did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = b.refresh_metadata(None).await;
        for (src, dst, parts) in pairs {
            for p in 0..*parts {
                let want = a
                    .list_offset(src, p, LATEST, IsolationLevel::ReadCommitted)
                    .await
                    .unwrap();
                let got = match b
                    .list_offset(dst, p, LATEST, IsolationLevel::ReadCommitted)
                    .await
                {
                    Ok(o) => o,
                    Err(_) => continue 'wait,
                };
                if got < want {
                    continue 'wait;
                }
            }
        }
        break;
    }
}

async fn run_until_copied(
    config: &MirrorConfig,
    a: &KafkaCluster,
    b: &KafkaCluster,
    pairs: &[(&str, &str, i32)],
) -> Arc<Metrics> {
    let running = start(config);
    wait_copied(a, b, pairs).await;
    running.stop().await
}

/// Same records (key, value, headers, timestamp) per partition, in order.
async fn assert_same(a: &KafkaCluster, b: &KafkaCluster, src: &str, dst: &str, parts: i32) {
    for p in 0..parts {
        let s = read_partition(a, src, p).await;
        let d = read_partition(b, dst, p).await;
        assert_eq!(s.len(), d.len(), "{src}-{p}");
        for ((_, sr), (_, dr)) in s.iter().zip(&d) {
            assert_eq!(
                (&sr.key, &sr.value, &sr.headers, sr.timestamp),
                (&dr.key, &dr.value, &dr.headers, dr.timestamp),
                "{src}-{p}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_topics_configs_new_partitions_and_resumes_from_mm2_positions() {
    // Engine logs on failure (RUST_LOG=kmirror_mirror=debug for more).
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("eng-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("eng-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = orders.*, payments.*, stamped\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let a = KafkaCluster::connect(config.flows[0].clients.source_admin.clone())
        .await
        .unwrap();
    let b = KafkaCluster::connect(config.flows[0].clients.target_admin.clone())
        .await
        .unwrap();
    let topic = |name: &str, partitions: i32, configs: &[(&str, &str)]| NewTopic {
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs: configs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    for (_, e) in a
        .create_topics(
            &[
                topic(
                    "orders",
                    3,
                    &[
                        ("retention.ms", "3600000"),
                        ("max.message.bytes", "2000000"),
                        ("segment.bytes", "2097152"),
                        ("min.insync.replicas", "1"),
                    ],
                ),
                topic("payments.eu", 2, &[]),
                topic("ignored", 1, &[]),
                // LogAppendTime batches go through record mode so each record keeps its time.
                topic("stamped", 1, &[("message.timestamp.type", "LogAppendTime")]),
            ],
            false,
        )
        .await
        .unwrap()
    {
        assert!(e.is_none(), "{e:?}");
    }
    let orders: Vec<String> = (0..3000)
        .map(|i| format!("k{}:order-{i}", i % 17))
        .collect();
    produce(&ca, "orders", "lz4", &orders);
    let payments: Vec<String> = (0..500).map(|i| format!("p{i}:payment-{i}")).collect();
    produce(&ca, "payments.eu", "none", &payments);
    let stamped: Vec<String> = (0..50).map(|i| format!("s{i}:stamped-{i}")).collect();
    produce(&ca, "stamped", "gzip", &stamped);

    let mut pairs = vec![
        ("orders", "A.orders", 3),
        ("payments.eu", "A.payments.eu", 2),
        ("stamped", "A.stamped", 1),
    ];
    let running = start(&config);
    wait_copied(&a, &b, &pairs).await;

    // Names, partition counts, and byte-identical records per partition, in order.
    let md = b.refresh_metadata(None).await.unwrap();
    assert_eq!(md.topics["A.orders"].partitions.len(), 3);
    assert_eq!(md.topics["A.payments.eu"].partitions.len(), 2);
    assert!(
        !md.topics.contains_key("A.ignored"),
        "excluded topics are not created"
    );
    for (src, dst, parts) in &pairs[..2] {
        for p in 0..*parts {
            let s = read_partition(&a, src, p).await;
            let d = read_partition(&b, dst, p).await;
            assert_eq!(s.len(), d.len(), "{src}-{p}");
            for ((sc, sr), (dc, dr)) in s.iter().zip(&d) {
                assert_eq!(
                    (&sr.key, &sr.value, &sr.headers, sr.timestamp),
                    (&dr.key, &dr.value, &dr.headers, dr.timestamp),
                    "{src}-{p}"
                );
                assert_eq!(
                    sr.offset, dr.offset,
                    "offsets line up one to one in batch mode"
                );
                assert_eq!(sc, dc, "batch mode keeps the codec");
            }
        }
    }
    assert_same(&a, &b, "stamped", "A.stamped", 1).await;
    let m = &running.metrics;
    assert!(
        m.sum("kmirror_batches_total", &[("mode", "merged")]) > 0.0,
        "the console producer's small batches, back to back in the backlog, are merged"
    );
    assert!(
        m.sum("kmirror_batches_total", &[("mode", "record")]) > 0.0,
        "LogAppendTime batches are re-encoded"
    );

    // Fetched per broker, not per partition: requests carried several partitions, and the
    // fetch session went incremental (the broker's one node leads all 6 partitions).
    kmirror_testkit::eventually(10, "fetch metrics exported", || async {
        m.sum("kmirror_fetch_requests_total", &[("kind", "incremental")]) > 0.0
            && m.sum("kmirror_fetch_max_partitions_per_request", &[]) >= 2.0
    })
    .await;
    let full = m.sum("kmirror_fetch_requests_total", &[("kind", "full")]);
    let incremental = m.sum("kmirror_fetch_requests_total", &[("kind", "incremental")]);
    eprintln!(
        "fetch requests: {full} full, {incremental} incremental, up to {} partitions each",
        m.sum("kmirror_fetch_max_partitions_per_request", &[])
    );
    // Produce goes through the per-connection senders, whose counters are exported.
    let requests = m.sum("kmirror_produce_requests_total", &[]);
    let batches = m.sum("kmirror_produce_batches_total", &[]);
    eprintln!(
        "produce requests: {requests} carrying {batches} batches, up to {} each",
        m.sum("kmirror_produce_max_batches_per_request", &[])
    );
    assert!(
        requests > 0.0 && batches >= requests,
        "produce counters exported: {requests} requests, {batches} batches"
    );

    // The source's topic configs, minus MM2's excluded keys, were set at creation.
    let configs = b.describe_topic_configs("A.orders").await.unwrap();
    // (value, set as a topic override: ConfigSource 1)
    let value = |k: &str| {
        let e = configs.iter().find(|e| e.name == k).unwrap();
        (e.value.clone().unwrap_or_default(), e.source == 1)
    };
    assert_eq!(value("retention.ms"), ("3600000".into(), true));
    assert_eq!(value("max.message.bytes"), ("2000000".into(), true));
    assert_eq!(value("segment.bytes"), ("2097152".into(), true));
    assert!(
        !value("min.insync.replicas").1,
        "min.insync.replicas is excluded by MM2's default config.properties.exclude"
    );

    // Heartbeats keyed (A, B) arrive in B's heartbeats topic (MM2's format).
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let beats: Vec<Heartbeat> = if b.metadata().topics.contains_key("heartbeats") {
            read_partition(&b, "heartbeats", 0)
                .await
                .iter()
                .filter_map(|(_, r)| Heartbeat::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
                .collect()
        } else {
            vec![]
        };
        if beats.len() >= 2 {
            assert!(beats
                .iter()
                .all(|h| h.source_cluster_alias == "A" && h.target_cluster_alias == "B"));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no heartbeats");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A topic created and partitions added while running are replicated within a refresh.
    ca.create_topic("orders.new", 2).unwrap();
    a.create_partitions("payments.eu", 3, false).await.unwrap();
    let fresh: Vec<String> = (0..300).map(|i| format!("n{i}:new-{i}")).collect();
    produce(&ca, "orders.new", "snappy", &fresh);
    let more_payments: Vec<String> = (500..800).map(|i| format!("p{i}:payment-{i}")).collect();
    produce(&ca, "payments.eu", "zstd", &more_payments);
    let _ = a.refresh_metadata(None).await;
    for p in 0..3 {
        assert!(
            a.list_offset("payments.eu", p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap()
                > 0,
            "keys spread over the added partition too"
        );
    }
    pairs[1].2 = 3;
    pairs.push(("orders.new", "A.orders.new", 2));
    wait_copied(&a, &b, &pairs).await;
    assert_same(&a, &b, "orders.new", "A.orders.new", 2).await;
    assert_same(&a, &b, "payments.eu", "A.payments.eu", 3).await;
    assert_eq!(
        b.metadata().topics["A.payments.eu"].partitions.len(),
        3,
        "the remote topic grew with its source"
    );
    let stats = running.stop().await;
    // These clusters have no authorizer: ACL sync turned itself off quietly, no error loop.
    assert_eq!(
        stats.sum("kmirror_errors_total", &[("kind", "acl_sync")]),
        0.0
    );
    assert!(stats.sum("kmirror_acls_created_total", &[]) == 0.0);
    assert!(stats.sum("kmirror_heartbeats_total", &[]) >= 2.0);
    // 3 + 3 + 1 + 2 data partitions, and A's heartbeats topic (written by the B->A herder that
    // MM2 dedicated mode runs for heartbeats only) copied to B as A.heartbeats.
    assert_eq!(stats.sum("kmirror_partitions", &[]), 10.0);
    assert!(b.metadata().topics.contains_key("A.heartbeats"));

    // Positions in MM2's format: the last copied offset of every partition.
    let positions: Vec<SourcePosition> = {
        let mut v = Vec::new();
        for p in 0..25 {
            for (_, r) in read_partition(&b, "mm2-offsets.A.internal", p).await {
                v.extend(SourcePosition::decode(
                    r.key.as_deref().unwrap(),
                    r.value.as_deref(),
                ));
            }
        }
        v
    };
    for (src, _, parts) in &pairs {
        for p in 0..*parts {
            let end = a
                .list_offset(src, p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap();
            if end == 0 {
                continue;
            }
            let last = positions
                .iter()
                .filter(|x| x.topic == *src && x.partition == p)
                .map(|x| x.offset)
                .max();
            assert_eq!(last, Some(end - 1), "{src}-{p}");
        }
    }

    // More data, and a restart: it resumes from the stored positions, copying nothing twice.
    let more: Vec<String> = (3000..3500)
        .map(|i| format!("k{}:order-{i}", i % 17))
        .collect();
    produce(&ca, "orders", "lz4", &more);
    let stats = run_until_copied(&config, &a, &b, &pairs).await;
    let copied = stats.sum("kmirror_record_count_total", &[]);
    let heartbeats = stats.sum("kmirror_record_count_total", &[("topic", "A.heartbeats")]);
    assert_eq!(
        copied - heartbeats,
        500.0,
        "only the new records are copied (besides fresh heartbeats)"
    );
    for p in 0..3 {
        let s = read_partition(&a, "orders", p).await;
        let d = read_partition(&b, "A.orders", p).await;
        let sv: Vec<&Option<Bytes>> = s.iter().map(|(_, r)| &r.value).collect();
        let dv: Vec<&Option<Bytes>> = d.iter().map(|(_, r)| &r.value).collect();
        assert_eq!(sv, dv, "orders-{p} after the restart");
    }
}

/// MM2 mode with Connect-style transforms: the flow copies in record mode, filtered records are
/// not written, headers are changed, and the stored position passes filtered records at the end
/// of the partition (a restart copies nothing again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transforms_filter_and_tag_records_and_positions_pass_filtered_ones() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("eng-tr-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("eng-tr-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = events\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
         A->B.transforms = noTest, tag\n\
         A->B.transforms.noTest.type = org.apache.kafka.connect.transforms.Filter\n\
         A->B.transforms.noTest.predicate = isTest\n\
         A->B.transforms.tag.type = org.apache.kafka.connect.transforms.InsertHeader\n\
         A->B.transforms.tag.header = via\n\
         A->B.transforms.tag.value.literal = kmirror\n\
         A->B.predicates = isTest\n\
         A->B.predicates.isTest.type = KeyMatches\n\
         A->B.predicates.isTest.pattern = test-.*\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let props = Properties::parse(&text, "mm2.properties").unwrap();
    let config = mm2::load(&props, &[], &SystemEnvironment).unwrap();
    assert!(config.ignored.is_empty(), "{:?}", config.ignored);
    ca.create_topic("events", 1).unwrap();
    // Every third record is a test record, and so are the last ones.
    let mut lines: Vec<String> = (0..300)
        .map(|i| {
            if i % 3 == 0 {
                format!("test-{i}:v{i}")
            } else {
                format!("k{i}:v{i}")
            }
        })
        .collect();
    lines.extend((300..310).map(|i| format!("test-{i}:v{i}")));
    produce(&ca, "events", "lz4", &lines);
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    let running = start(&config);
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(60), "not copied");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = b.refresh_metadata(None).await;
        if b.list_offset("A.events", 0, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap_or(0)
            >= 200
        {
            break;
        }
    }
    // The position reaches the filtered tail and is stored (the records after the last copied
    // one are all filtered out, so only the position shows kmirror passed them).
    let end = a
        .list_offset("events", 0, LATEST, IsolationLevel::ReadCommitted)
        .await
        .unwrap();
    let flow = config
        .flows
        .iter()
        .find(|f| f.id.to_string() == "A->B")
        .unwrap();
    // Metadata refreshed each time (the positions topic must be in it for the load to read
    // it), and what was loaded last is shown on failure: this wait timed out once under heavy
    // load in CI, with the cause unknown.
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let loaded = engine::load_positions(&b, &flow.internal.positions_topic, "A").await;
        let position = loaded
            .as_ref()
            .ok()
            .and_then(|p| p.positions.get(&("events".to_string(), 0)).copied());
        if position == Some(end - 1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the stored position did not pass the filtered tail (end {end}): loaded {loaded:?}; partitions of the positions topic in b's metadata: {:?}",
            b.metadata()
                .topics
                .get(&flow.internal.positions_topic)
                .map(|t| t.partitions.len())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let metrics = running.stop().await;
    assert_eq!(
        metrics.sum("kmirror_batches_total", &[("mode", "batch")]),
        0.0
    );
    let copied = read_partition(&b, "A.events", 0).await;
    assert_eq!(copied.len(), 200);
    for (_, r) in &copied {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap()).into_owned();
        assert!(!key.starts_with("test-"), "{key}");
        assert_eq!(
            r.headers.last().map(|(k, v)| (&k[..], v.as_deref())),
            Some((&b"via"[..], Some(&b"kmirror"[..])))
        );
    }
    let mut last = None;
    for p in 0..25 {
        for (_, r) in read_partition(&b, "mm2-offsets.A.internal", p).await {
            if let Some(pos) = SourcePosition::decode(r.key.as_deref().unwrap(), r.value.as_deref())
            {
                if pos.topic == "events" {
                    last = last.max(Some(pos.offset));
                }
            }
        }
    }
    assert_eq!(last, Some(end - 1), "the position passes the filtered tail");

    // A restart copies nothing again: a record written after the restart arrives, and the
    // partition keeps its order, so anything copied twice would have come before it.
    let running = start(&config);
    produce(&ca, "events", "lz4", &["after:restart".to_string()]);
    eventually(
        60,
        "the record written after the restart copied",
        || async {
            let _ = b.refresh_metadata(None).await;
            b.list_offset("A.events", 0, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap_or(0)
                > 200
        },
    )
    .await;
    running.stop().await;
    let copied = read_partition(&b, "A.events", 0).await;
    assert_eq!(copied.len(), 201, "nothing copied twice");
    assert_eq!(copied[200].1.value.as_deref(), Some(&b"restart"[..]));
}
