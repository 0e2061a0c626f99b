//! The engine against two real clusters: topics appear on B under the policy's names with the
//! source's partition counts; every record arrives byte-identical per partition and in order;
//! batch mode is used for forwardable batches; positions are stored in MM2's format; a restart
//! resumes from them without re-copying.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::model::MirrorConfig;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown, Stats};
use kmirror_mirror::wire::positions::SourcePosition;
use kmirror_testkit::{read_partition, Cluster, Security};
use std::sync::atomic::Ordering;
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

async fn run_until_copied(
    config: &MirrorConfig,
    a: &KafkaCluster,
    b: &KafkaCluster,
    pairs: &[(&str, &str, i32)],
) -> Arc<Stats> {
    let shutdown = Shutdown::default();
    let stats = Arc::new(Stats::default());
    let engine = {
        let (config, shutdown, stats) = (config.clone(), shutdown.clone(), stats.clone());
        tokio::spawn(async move { engine::run(&config, shutdown, stats).await })
    };
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
    shutdown.trigger();
    engine.await.unwrap().unwrap();
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_topics_and_resumes_from_mm2_positions() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("eng-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("eng-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("orders", 3).unwrap();
    ca.create_topic("payments.eu", 2).unwrap();
    ca.create_topic("ignored", 1).unwrap();
    let orders: Vec<String> = (0..3000)
        .map(|i| format!("k{}:order-{i}", i % 17))
        .collect();
    produce(&ca, "orders", "lz4", &orders);
    let payments: Vec<String> = (0..500).map(|i| format!("p{i}:payment-{i}")).collect();
    produce(&ca, "payments.eu", "none", &payments);

    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = orders, payments.*\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n",
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
    let pairs = [
        ("orders", "A.orders", 3),
        ("payments.eu", "A.payments.eu", 2),
    ];
    let stats = run_until_copied(&config, &a, &b, &pairs).await;

    // Names, partition counts, and byte-identical records per partition, in order.
    let md = b.refresh_metadata(None).await.unwrap();
    assert_eq!(md.topics["A.orders"].partitions.len(), 3);
    assert_eq!(md.topics["A.payments.eu"].partitions.len(), 2);
    assert!(
        !md.topics.contains_key("A.ignored"),
        "excluded topics are not created"
    );
    for (src, dst, parts) in pairs {
        for p in 0..parts {
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
    assert!(stats.batches_forwarded.load(Ordering::Relaxed) > 0);
    assert_eq!(
        stats.batches_reencoded.load(Ordering::Relaxed),
        0,
        "nothing needed record mode"
    );

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
    for (src, _, parts) in pairs {
        for p in 0..parts {
            let end = a
                .list_offset(src, p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap();
            if end == 0 {
                continue;
            }
            let last = positions
                .iter()
                .filter(|x| x.topic == src && x.partition == p)
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
    assert_eq!(
        stats.records.load(Ordering::Relaxed),
        500,
        "only the new records are copied"
    );
    for p in 0..3 {
        let s = read_partition(&a, "orders", p).await;
        let d = read_partition(&b, "A.orders", p).await;
        let sv: Vec<&Option<Bytes>> = s.iter().map(|(_, r)| &r.value).collect();
        let dv: Vec<&Option<Bytes>> = d.iter().map(|(_, r)| &r.value).collect();
        assert_eq!(sv, dv, "orders-{p} after the restart");
    }
}
