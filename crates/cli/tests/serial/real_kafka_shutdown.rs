//! The shutdown deadline: with the target broker frozen (SIGSTOP: connections stay
//! open, nothing answers), `kmirror run --shutdown-timeout 5` exits within the deadline after
//! SIGTERM, with status 1, instead of waiting for each in-flight produce's delivery timeout (two
//! minutes, beyond Kubernetes' and systemd's grace periods). Nothing is lost: once the broker is
//! back, a new process copies every record, and a healthy shutdown exits 0.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{eventually, Cluster, KillOnDrop, Security};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 2;
const PER_ROUND: i64 = 500;

async fn produce_round(a: &KafkaCluster, round: i64) {
    for p in 0..PARTITIONS {
        let records: Vec<Record> = (0..PER_ROUND)
            .map(|i| Record {
                offset: i,
                timestamp: 1_764_800_000_000 + i,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!("round {round} record {i}"))),
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

fn start(config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "off", "--shutdown-timeout", "5"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        log,
    )
}

/// SIGTERM, then the exit status and how long it took (None: still running after `bound`).
fn terminate(k: &mut KillOnDrop, bound: Duration) -> (Option<std::process::ExitStatus>, Duration) {
    let t0 = Instant::now();
    let pid = k.0.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    while t0.elapsed() < bound {
        if let Ok(Some(s)) = k.0.try_wait() {
            return (Some(s), t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (None, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_silent_target_exits_within_the_deadline_and_loses_nothing() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("shutdown-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("shutdown-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
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
    produce_round(&a, 0).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             A->B.topics = t\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             emit.checkpoints.enabled = false\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("kmirror.log");
    let mut kmirror = start(&config, &log);
    let one_round = PARTITIONS as i64 * PER_ROUND;
    eventually(60, "the first round copied", || async {
        copied(&b).await == one_round
    })
    .await;

    // The target goes silent; new source records are fetched and sent into the silence.
    cb.freeze_node(1).unwrap();
    produce_round(&a, 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, took) = terminate(&mut kmirror, Duration::from_secs(30));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("still running {took:?} after SIGTERM with a 5 s deadline; log:\n{text}")
    });
    println!("SIGTERM with a frozen target broker: exited in {took:.1?} with {status}");
    assert!(
        took < Duration::from_secs(5 + 5),
        "exited after {took:?}, deadline 5 s"
    );
    assert_eq!(status.code(), Some(1), "a missed deadline is a failure");
    assert!(text.contains("shutdown deadline passed"), "{text}");

    // The broker is back: a new process copies what was in flight, and stops cleanly.
    cb.thaw_node(1);
    let mut kmirror = start(&config, &log);
    // (The frozen broker may also have appended what it had received before the first
    // process exited: the kernel held those requests.)
    eventually(
        90,
        "both rounds copied, the new process running",
        || async {
            let started = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("flow started")
                .count();
            started == 2 && copied(&b).await >= 2 * one_round
        },
    )
    .await;
    let (status, took) = terminate(&mut kmirror, Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "a healthy shutdown exits 0 (took {took:?}); the second process's log:\n{}",
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .rsplit("flow started")
            .next()
            .unwrap_or_default()
    );
    drop(kmirror);
}
