//! Switching between MirrorMaker 2 and kmirror without re-copying: real MM2 (the harness's jars)
//! replicates part of a topic and is stopped; kmirror continues from the position MM2 stored in
//! `mm2-offsets.A.internal` with no gap and no record copied twice; then MM2 continues after
//! kmirror the same way. Both read the same mm2.properties. kmirror's failover tooling reads the
//! checkpoints MM2 wrote.

use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::failover;
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{read_partition, Cluster, Mm2, Security};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 2;

fn produce(c: &Cluster, from: usize, to: usize) {
    let input: String = (from..to).map(|i| format!("k{i}:ledger-{i}\n")).collect();
    let cfg = c.client_config(None);
    c.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            c.bootstrap(),
            "--producer.config",
            cfg.to_str().unwrap(),
            "--topic",
            "ledger",
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
}

/// Every partition of A.ledger on B holds exactly ledger's records on A: same values, same
/// order, none missing, none twice.
async fn assert_exact_copy(a: &KafkaCluster, b: &KafkaCluster, step: &str) {
    for p in 0..PARTITIONS {
        let src: Vec<_> = read_partition(a, "ledger", p)
            .await
            .into_iter()
            .map(|(_, r)| (r.key, r.value))
            .collect();
        let dst: Vec<_> = read_partition(b, "A.ledger", p)
            .await
            .into_iter()
            .map(|(_, r)| (r.key, r.value))
            .collect();
        assert_eq!(src.len(), dst.len(), "{step}: ledger-{p} record count");
        assert!(src == dst, "{step}: ledger-{p} records differ");
    }
}

async fn wait_copied(a: &KafkaCluster, b: &KafkaCluster, what: &str, log: impl Fn() -> String) {
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let mut done = true;
        for p in 0..PARTITIONS {
            let want = a
                .list_offset("ledger", p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap();
            let got = b
                .list_offset("A.ledger", p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap_or(-1);
            done &= got >= want;
        }
        if done {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{what} did not catch up:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm2_and_kmirror_take_over_from_each_other() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("take-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("take-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("ledger", PARTITIONS as u32).unwrap();
    produce(&ca, 0, 1000);
    // One file for both. The storage and flush keys are Connect worker settings MM2 needs here
    // (single-broker clusters, offsets flushed every second); kmirror ignores them.
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = ledger\n\
         B->A.enabled = false\nemit.heartbeats.enabled = false\nemit.checkpoints.interval.seconds = 1\n\
         sync.topic.acls.enabled = false\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\nconfig.storage.replication.factor = 1\n\
         status.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         heartbeats.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
         offset.flush.interval.ms = 1000\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mm2.properties");
    std::fs::write(&path, &text).unwrap();
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    // A consumer group on A that read everything so far.
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let end = a
            .list_offset("ledger", p, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        ends.insert(
            p,
            CommittedOffset {
                offset: end,
                leader_epoch: -1,
                metadata: String::new(),
            },
        );
    }
    a.commit_group_offsets("ledger-app", &[("ledger".to_string(), ends.clone())].into())
        .await
        .unwrap();

    // 1. MM2 copies the first 1000 records, checkpoints the group, and stops (committing its
    // positions).
    let mm2 = Mm2::start("mm2-first", &path).unwrap();
    wait_copied(&a, &b, "MM2", || mm2.log()).await;
    let t0 = Instant::now();
    let flow = config
        .flows
        .iter()
        .find(|f| f.id.to_string() == "A->B")
        .unwrap();
    let rows = loop {
        if let Ok(rows) = failover::translate(flow, &b, "ledger-app").await {
            if rows.len() == PARTITIONS as usize {
                break rows;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "MM2 wrote no checkpoints:\n{}",
            mm2.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await; // a few offset flushes
    mm2.stop();
    assert_exact_copy(&a, &b, "MM2 alone").await;
    // kmirror's failover tooling reads MM2's checkpoints (never ahead of the group).
    let mm2_redelivered: i64 = rows
        .iter()
        .map(|r| {
            assert_eq!(r.topic, "A.ledger");
            assert_eq!(r.upstream_offset, ends[&r.partition].offset, "{r:?}");
            assert!(r.translated_offset <= r.upstream_offset, "{r:?}");
            r.upstream_offset - r.translated_offset
        })
        .sum();

    // 2. kmirror continues from MM2's positions: the next 500 arrive, nothing twice.
    produce(&ca, 1000, 1500);
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };
    wait_copied(&a, &b, "kmirror", String::new).await;
    shutdown.trigger();
    task.await.unwrap().unwrap();
    assert_eq!(
        metrics.sum("kmirror_record_count_total", &[]),
        500.0,
        "kmirror copied only what MM2 had not"
    );
    assert_exact_copy(&a, &b, "kmirror after MM2").await;
    // kmirror continued the checkpoints MM2 started: with its exact syncs the group now
    // resumes exactly where it stopped on A.
    let rows = failover::translate(flow, &b, "ledger-app").await.unwrap();
    for r in &rows {
        assert_eq!(r.translated_offset, ends[&r.partition].offset, "{r:?}");
    }
    eprintln!(
        "group at the end of ledger: MM2's checkpoints re-deliver {mm2_redelivered} records, kmirror's 0"
    );

    // 3. MM2 continues after kmirror from kmirror's positions.
    produce(&ca, 1500, 1800);
    let mm2 = Mm2::start("mm2-second", &path).unwrap();
    wait_copied(&a, &b, "MM2 after kmirror", || mm2.log()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    mm2.stop();
    assert_exact_copy(&a, &b, "MM2 after kmirror").await;
}
