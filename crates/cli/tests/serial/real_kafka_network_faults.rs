//! Network faults between kmirror and the brokers, injected by the testkit's proxies
//! (`Cluster::start_proxied`: the brokers advertise a proxy to clients and replicate on a
//! listener of their own). A 1-broker source and a 3-broker target (replication factor 3,
//! `min.insync.replicas=2`), the `kmirror` binary with default client settings:
//!
//! 1. latency on every link and connections reset every 1.5 s while records flow: everything
//!    arrives, once, in order;
//! 2. the target leader black-holed for clients (it stays leader: only clients are cut off),
//!    then leadership moved away: replication resumes within a bound;
//! 3. SIGTERM while that broker is still black-holed: the process exits within its shutdown
//!    deadline; after the fault is lifted, a new process copies what was missing, and still
//!    nothing is lost or doubled.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::netfault::Fault;
use kmirror_testkit::{eventually, read_partition, Cluster, KillOnDrop};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 3;
const PER_ROUND: i64 = 200;

async fn produce_round(a: &KafkaCluster, round: i64) {
    // Timestamps of now: older ones would have retention (7 days) delete the source's segments
    // while the test reads them.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for p in 0..PARTITIONS {
        let records: Vec<Record> = (0..PER_ROUND)
            .map(|i| Record {
                offset: i,
                timestamp: now + i,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!(
                    "round {round} partition {p} record {i}"
                ))),
                headers: vec![],
            })
            .collect();
        let b = encode_batch(&records, &BatchOptions::default()).unwrap();
        a.produce("t", p, &b).await.unwrap();
    }
}

async fn copied(b: &KafkaCluster) -> i64 {
    let _ = b.refresh_metadata(None).await;
    let mut n = 0;
    for p in 0..PARTITIONS {
        n += b
            .list_offset("A.t", p, LATEST, IsolationLevel::ReadCommitted)
            .await
            .unwrap_or(0);
    }
    n
}

/// Every source record is on the target, in order; returns how many the target holds twice
/// (a range sent again after a restart: each value is unique, so a repeat is a duplicate).
async fn assert_nothing_lost(a: &KafkaCluster, b: &KafkaCluster, what: &str) -> usize {
    let mut doubled = 0;
    for p in 0..PARTITIONS {
        let s: Vec<_> = read_partition(a, "t", p)
            .await
            .into_iter()
            .map(|(_, r)| r.value)
            .collect();
        let d: Vec<_> = read_partition(b, "A.t", p)
            .await
            .into_iter()
            .map(|(_, r)| r.value)
            .collect();
        let mut seen = std::collections::HashSet::new();
        let firsts: Vec<_> = d.iter().filter(|v| seen.insert(*v)).cloned().collect();
        doubled += d.len() - firsts.len();
        let text = |v: Option<&Option<Bytes>>| {
            v.and_then(|v| v.as_ref())
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        assert_eq!(
            firsts.len(),
            s.len(),
            "{what}: partition {p} record count (target {} records from {:?} to {:?}; source from {:?} to {:?})",
            d.len(),
            text(d.first()),
            text(d.last()),
            text(s.first()),
            text(s.last())
        );
        assert!(firsts == s, "{what}: partition {p} differs from the source");
    }
    doubled
}

fn start(config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "off"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        log,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_on_the_network_lose_nothing_and_bound_recovery_and_shutdown() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start_proxied("netfault-a", 1, &[]).unwrap());
        let b = s.spawn(|| Cluster::start_proxied("netfault-b", 3, &[]).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    // The test's own clients go around the proxies.
    let a = KafkaCluster::connect(ca.direct_client_settings())
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.direct_client_settings())
        .await
        .unwrap();
    a.create_topics(
        &[NewTopic {
            name: "t".into(),
            partitions: PARTITIONS,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             A->B.topics = t\nreplication.factor = 3\noffset.storage.replication.factor = 3\n\
             offset-syncs.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             emit.checkpoints.enabled = false\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("kmirror.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut kmirror = start(&config, &log);
    let mut rounds = 0;
    let round = PARTITIONS as i64 * PER_ROUND;

    // 1. Latency everywhere, connections reset every 1.5 s, while 6 rounds are written.
    let proxies = || {
        std::iter::once(ca.proxy(1))
            .chain((1..=3).map(|k| cb.proxy(k)))
            .collect::<Vec<_>>()
    };
    for p in proxies() {
        p.set(Fault::Latency(Duration::from_millis(40)));
    }
    let before: u64 = proxies().iter().map(|p| p.connections()).sum();
    for _ in 0..6 {
        produce_round(&a, rounds).await;
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for p in proxies() {
            p.reset();
        }
    }
    for p in proxies() {
        p.set(Fault::None);
    }
    eventually(120, "six rounds copied through resets", || async {
        copied(&b).await >= rounds * round
    })
    .await;
    let reconnects = proxies().iter().map(|p| p.connections()).sum::<u64>() - before;
    assert!(
        reconnects >= 6,
        "the resets forced new connections: {reconnects}"
    );
    assert_eq!(
        assert_nothing_lost(&a, &b, "after resets").await,
        0,
        "an idempotent producer's retries are not duplicated"
    );
    println!("6 connection resets of every link under 40 ms latency: {reconnects} reconnections, nothing lost or doubled");

    // 2. The leader of A.t-0 is black-holed for clients; it stays leader.
    let (leader, replicas) = cb.describe_partition("A.t", 0).unwrap();
    let hole = u16::try_from(leader).unwrap();
    cb.proxy(hole).set(Fault::BlackHole);
    produce_round(&a, rounds).await;
    rounds += 1;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        copied(&b).await < rounds * round,
        "nothing reaches the silent leader"
    );
    // Leadership moves away from it (every partition of A.t it leads).
    let to = *replicas.iter().find(|r| **r != leader).unwrap();
    let moved_at = Instant::now();
    for p in 0..PARTITIONS {
        if cb.describe_partition("A.t", p).unwrap().0 == leader {
            cb.move_leader("A.t", p, to).unwrap();
        }
    }
    let moved_in = moved_at.elapsed();
    eventually(120, "replication resumes at the new leader", || async {
        copied(&b).await >= rounds * round
    })
    .await;
    let resumed = moved_at.elapsed();
    println!(
        "black-holed target leader {leader}: leadership moved to {to} in {moved_in:.1?}; replication resumed {resumed:.1?} after the move began"
    );
    // A produce sent into the silence is abandoned after request.timeout.ms (30 s), and the
    // next metadata answer comes from a broker that answers.
    assert!(
        resumed < Duration::from_secs(60),
        "resumed {resumed:?} after the move; log:\n{}",
        log_text()
    );

    // 3. SIGTERM with the broker still black-holed (it may lead positions partitions, whose
    // writes hang): the default shutdown deadline (25 s) bounds the exit.
    produce_round(&a, rounds).await;
    rounds += 1;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    let pid = kmirror.0.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let status = loop {
        if let Ok(Some(s)) = kmirror.0.try_wait() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "still running 40 s after SIGTERM; log:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = t0.elapsed();
    println!("SIGTERM with broker {leader} black-holed: exited in {took:.1?} with {status}");
    assert!(took < Duration::from_secs(25 + 5), "exited after {took:?}");

    // The fault is lifted; a new process copies what was missing, and nothing is doubled.
    cb.proxy(hole).set(Fault::None);
    let kmirror = start(&config, &log);
    eventually(120, "every round copied by the new process", || async {
        copied(&b).await >= rounds * round
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let doubled = assert_nothing_lost(&a, &b, "after the restart").await;
    println!(
        "after the restart: all {} records on the target, {doubled} copied twice",
        rounds * round
    );
    // Copies made after the last stored position are sent again after a restart; the stop
    // above stored what was acknowledged, so at most what was in flight comes twice.
    assert!(doubled as i64 <= round, "{doubled} records copied twice");
    let status = kmirror.terminate();
    assert!(status.success(), "{status}; log:\n{}", log_text());
}
