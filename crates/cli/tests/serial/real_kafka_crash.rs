//! `kmirror run` killed with SIGKILL at random points five times while 200,000 records stream into
//! the source, and the target's broker and then the source's restarted once each mid-stream:
//! every record arrives on the target once, in order per partition with no gap. At-least-once
//! without transactions: each restart finds the records written after its stored position on
//! the target already and does not copy them again (docs/engine.md, "Resuming from
//! what the target holds"), which the processes' logs must show happened. Run with MM2's
//! default naming policy and with the identity policy. A final SIGTERM drains and exits 0.

use bytes::Bytes;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{read_partition, Cluster, Security};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const ROUNDS: i64 = 100;
const PER_BATCH: i64 = 500;
const TOTAL: i64 = PARTITIONS as i64 * ROUNDS * PER_BATCH;

/// Killed when dropped: a failing assertion must not leave a kmirror running that retries its
/// (stopped) clusters' ports, which later tests' brokers may reuse.
fn kmirror(config: &std::path::Path, log: &std::path::Path) -> kmirror_testkit::KillOnDrop {
    kmirror_testkit::KillOnDrop(spawn(config, log))
}

fn spawn(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("run")
        .arg(config)
        .args(["--metrics-address", "127.0.0.1:0"])
        // RUST_LOG of the test run reaches kmirror (e.g. kmirror_kafka=debug to see retries).
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// What the metrics endpoint of the newest process in `log` serves (it logs its address).
fn scrape(log: &std::path::Path) -> String {
    use std::io::{Read, Write};
    let text = std::fs::read_to_string(log).unwrap();
    let address = text
        .lines()
        .filter_map(|l| l.split("address=").nth(1))
        .next_back()
        .and_then(|a| a.split_whitespace().next())
        .expect("metrics address logged")
        .to_string();
    let mut s = std::net::TcpStream::connect(&address).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// SIGTERM, and the exit within 30 s (the process drains and stores its positions).
fn terminate(child: &mut kmirror_testkit::KillOnDrop) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "SIGTERM drain hung");
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn ends(k: &KafkaCluster, topic: &str) -> Vec<i64> {
    let mut v = Vec::new();
    for p in 0..PARTITIONS {
        v.push(
            k.list_offset(topic, p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap_or(-1),
        );
    }
    v
}

/// Records in the positions topic on B (`mm2-offsets.A.internal`, 25 partitions).
async fn stored_positions(b: &KafkaCluster) -> i64 {
    let _ = b.refresh_metadata(None).await;
    let mut n = 0;
    for p in 0..25 {
        n += b
            .list_offset(
                "mm2-offsets.A.internal",
                p,
                LATEST,
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap_or(0)
            .max(0);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_kill_9_and_a_target_broker_restart_without_loss_or_duplicates() {
    let _alone = crate::ALONE.lock().await;
    crash_run(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_identity_policy_too() {
    let _alone = crate::ALONE.lock().await;
    crash_run(true).await;
}

/// The sum of `already_copied=N` over the resume lines of the processes' log, and the count
/// of fallback lines.
fn resumes_logged(log: &str) -> (u64, usize) {
    let mut recognised = 0;
    for line in log
        .lines()
        .filter(|l| l.contains("are on the target already"))
    {
        let n = line
            .split("already_copied=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no already_copied in: {line}"));
        recognised += n;
    }
    let fallbacks = log
        .lines()
        .filter(|l| {
            l.contains("copying from the stored position, which may copy some records again")
        })
        .count();
    (recognised, fallbacks)
}

async fn crash_run(identity: bool) {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("crash-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("crash-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let (ca, cb) = (Arc::new(ca), Arc::new(cb));
    let a = Arc::new(
        KafkaCluster::connect(ca.client_settings(None))
            .await
            .unwrap(),
    );
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    a.create_topics(
        &[NewTopic {
            name: "stream".into(),
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
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = stream\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             offset-syncs.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             kmirror.sharing.enabled = false\nkmirror.positions.interval.ms = 2000\n{}",
            ca.bootstrap(),
            cb.bootstrap(),
            if identity {
                "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n"
            } else {
                ""
            }
        ),
    )
    .unwrap();
    // One process at a time, without the flow's group: with it, a restarted process waits for
    // the killed member's session to expire (10 s) before it is given partitions, and kills
    // 1–3.5 s apart would all land while nothing is copied. Offset syncs on (their topic on
    // this one-broker source): the restarts find their anchors there. Positions stored every
    // 2 s rather than 250 ms, so that nearly every kill leaves records on the target that no
    // stored position covers (some kills land before a process stored any position).
    let log = dir.path().join("kmirror.log");
    let remote = if identity { "stream" } else { "A.stream" };

    // The stream: every record's value is its partition and sequence number; mixed codecs.
    let producer = {
        let a = a.clone();
        tokio::spawn(async move {
            let p = IdempotentProducer::new(a).await.unwrap();
            // Current timestamps: records from years ago make the broker roll a segment per
            // batch (segment.ms counts from the records' time) and its first retention check
            // (30 s after start) delete them before a slow first run had copied them.
            let base_ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let mut lanes: Vec<_> = (0..PARTITIONS).map(|i| p.lane("stream", i)).collect();
            for round in 0..ROUNDS {
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let records: Vec<Record> = (0..PER_BATCH)
                        .map(|j| Record {
                            offset: j,
                            timestamp: base_ts + round,
                            key: Some(Bytes::from(format!("k{j}"))),
                            value: Some(Bytes::from(format!("{i}:{}", round * PER_BATCH + j))),
                            headers: vec![],
                        })
                        .collect();
                    let codec = [Codec::None, Codec::Lz4, Codec::Zstd, Codec::Gzip][i];
                    let batch = encode_batch(
                        &records,
                        &BatchOptions {
                            codec,
                            ..BatchOptions::default()
                        },
                    )
                    .unwrap();
                    lane.send(round, batch).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            for lane in &mut lanes {
                lane.flush().await.unwrap();
            }
        })
    };

    // Five SIGKILLs at random points, and one restart of the target broker in between.
    let mut child = kmirror(&config, &log);
    for kill in 0..5 {
        // The first run is killed only after it stored positions: a partition that has neither
        // a stored position nor an offset sync at or before where it starts has no anchor, and
        // what the killed run copied is copied again (docs/engine.md, "Resuming from what the
        // target holds"). Later kills land anywhere, stored position or not.
        let wait = if kill == 0 {
            let t0 = Instant::now();
            while stored_positions(&b).await < PARTITIONS as i64 {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "the first run stored no positions in 60 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            rand::random::<u64>() % 1000
        } else {
            1000 + rand::random::<u64>() % 2500
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        child.0.kill().unwrap(); // SIGKILL: no drain, no final position
        child.0.wait().unwrap();
        eprintln!(
            "kill -9 #{} after {wait} ms; target ends {:?}",
            kill + 1,
            ends(&b, remote).await
        );
        if kill == 2 {
            let cb = cb.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                cb.restart().unwrap();
            });
        }
        if kill == 3 {
            // The source goes away under a running kmirror: its fetches fail and retry
            // (letting go of their memory budget meanwhile) until the broker is back.
            let ca = ca.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                ca.restart().unwrap();
            });
        }
        child = kmirror(&config, &log);
    }
    producer.await.unwrap();

    // Let the last run catch up, then stop it with SIGTERM: it drains and exits 0.
    let want = ends(&a, "stream").await;
    assert_eq!(want.iter().sum::<i64>(), TOTAL);
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        if ends(&b, remote)
            .await
            .iter()
            .zip(&want)
            .all(|(g, w)| g >= w)
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "did not catch up; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // SIGTERM once this run's signal handler is installed (it logs the metrics address after).
    let t0 = Instant::now();
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches("serving Prometheus metrics")
        .count()
        < 6
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "last run did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The metrics endpoint of the running process reports what it copied.
    let metrics = scrape(&log);
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("kmirror_partitions{source=\"A\",target=\"B\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("kmirror_replication_lag_records{{source=\"A\",target=\"B\",topic=\"{remote}\",partition=\"0\"}} 0")),
        "{metrics}"
    );
    let exit = terminate(&mut child);
    assert!(exit.success(), "exit after SIGTERM: {exit}");

    // Every record present, in order per partition, no gap; duplicates only as replays.
    let mut duplicates = 0;
    for p in 0..PARTITIONS {
        let values: Vec<i64> = read_partition(&b, remote, p)
            .await
            .iter()
            .map(|(_, r)| {
                let v = String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned();
                let (part, seq) = v.split_once(':').unwrap();
                assert_eq!(part, p.to_string(), "partition {p} holds {v}");
                seq.parse().unwrap()
            })
            .collect();
        let mut max = -1i64;
        for (i, &v) in values.iter().enumerate() {
            assert!(
                v <= max + 1,
                "gap in {remote}-{p} at target offset {i}: {v} after {max}"
            );
            max = max.max(v);
        }
        let expected = ROUNDS * PER_BATCH;
        assert_eq!(max + 1, expected, "{remote}-{p} complete");
        duplicates += values.len() as i64 - expected;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    if let Ok(keep) = std::env::var("KMIRROR_TEST_KEEP_LOG") {
        std::fs::write(format!("{keep}.{remote}"), &text).unwrap();
    }
    let (recognised, fallbacks) = resumes_logged(&text);
    eprintln!(
        "kill -9 x5 + target and source broker restarts ({} policy): {TOTAL} records, {duplicates} copied twice ({:.2}%); {recognised} records found on the target already by restarts, {fallbacks} fallbacks to the stored position",
        if identity { "identity" } else { "default" },
        duplicates as f64 * 100.0 / TOTAL as f64
    );
    assert!(
        recognised > 0,
        "no restart found records after its stored position on the target: the 0 duplicates below would be luck"
    );
    assert_eq!(
        duplicates, 0,
        "records copied twice; fallbacks in the log: {fallbacks}"
    );
}

/// Records `from..from + n` of partition `p` of `topic`, one batch, values `p:i`.
fn numbered(p: i32, from: i64, n: i64) -> kmirror_kafka::batch::RawBatch {
    numbered_with_key(p, from, n, 0)
}

/// [`numbered`] with a key of `key_len` bytes (values unchanged).
fn numbered_with_key(p: i32, from: i64, n: i64, key_len: usize) -> kmirror_kafka::batch::RawBatch {
    let key = (key_len > 0).then(|| Bytes::from(vec![b'k'; key_len]));
    let records: Vec<Record> = (0..n)
        .map(|j| Record {
            offset: j,
            timestamp: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64,
            key: key.clone(),
            value: Some(Bytes::from(format!("{p}:{}", from + j))),
            headers: vec![],
        })
        .collect();
    encode_batch(&records, &BatchOptions::default()).unwrap()
}

async fn values(b: &KafkaCluster, topic: &str, p: i32) -> Vec<String> {
    read_partition(b, topic, p)
        .await
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

/// Waits until partitions 0 and 1 of `topic` end at `want` or later.
async fn wait_for(b: &KafkaCluster, topic: &str, want: i64, log: &std::path::Path) {
    let t0 = Instant::now();
    loop {
        let mut done = true;
        for p in 0..2 {
            done &= b
                .list_offset(topic, p, LATEST, IsolationLevel::ReadUncommitted)
                .await
                .unwrap_or(-1)
                >= want;
        }
        if done {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{topic} did not reach {want}; log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        let _ = b.refresh_metadata(None).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A record written to the remote topic by someone else, after what the flow copied past its
/// stored position: that partition cannot tell what it copied, so it copies again from the
/// stored position (duplicates, never a gap), counts the fallback and logs why; the other
/// partition resumes after what it finds, though its tail (records with 20 KB keys) is more
/// than a walk reads on its first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_record_on_the_target_falls_back_to_the_stored_position() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("foreign-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("foreign-b", Security::Plaintext).unwrap());
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
            name: "stream".into(),
            partitions: 2,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Positions stored once a minute: within the test only at a graceful stop.
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = stream\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             offset-syncs.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             kmirror.sharing.enabled = false\nkmirror.positions.interval.ms = 60000\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("kmirror.log");
    for p in 0..2 {
        a.produce("stream", p, &numbered(p, 0, 100)).await.unwrap();
    }
    // First run: copies 100 per partition and stores position 99 at SIGTERM.
    let child = kmirror(&config, &log);
    wait_for(&b, "A.stream", 100, &log).await;
    let mut child = child;
    terminate(&mut child);
    // Second run: copies 50 more per partition, killed before it stores a position.
    a.produce("stream", 0, &numbered(0, 100, 50)).await.unwrap();
    // Partition 1's as 50 batches of one record with a 20 KB key: forwarded as they are (not
    // merged), a megabyte the walk reads in several fetches.
    for i in 0..50 {
        a.produce("stream", 1, &numbered_with_key(1, 100 + i, 1, 20_000))
            .await
            .unwrap();
    }
    let mut child = kmirror(&config, &log);
    wait_for(&b, "A.stream", 150, &log).await;
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // Someone else writes to A.stream-0; the source grows by 20 per partition.
    b.produce("A.stream", 0, &numbered(9, 0, 1)).await.unwrap();
    for p in 0..2 {
        a.produce("stream", p, &numbered(p, 150, 20)).await.unwrap();
    }
    // Third run.
    let child = kmirror(&config, &log);
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let v0 = values(&b, "A.stream", 0).await;
        let v1 = values(&b, "A.stream", 1).await;
        if v0.last().is_some_and(|v| v == "0:169") && v1.last().is_some_and(|v| v == "1:169") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not caught up; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let metrics = scrape(&log);
    drop(child);
    // Partition 1: resumed after the 50 the killed run wrote, nothing twice.
    let want = |p: i32, n: i64| -> Vec<String> { (0..n).map(|i| format!("{p}:{i}")).collect() };
    assert_eq!(values(&b, "A.stream", 1).await, want(1, 170));
    // Partition 0: the 150, the foreign record, then 100..170 copied again from the stored
    // position: 50 duplicates, no gap.
    let mut expected = want(0, 150);
    expected.push("9:0".into());
    expected.extend((100..170).map(|i| format!("0:{i}")));
    assert_eq!(values(&b, "A.stream", 0).await, expected);
    assert!(
        metrics.contains(
            "kmirror_resume_fallbacks_total{source=\"A\",target=\"B\",reason=\"mismatch\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("kmirror_records_already_on_target_total{source=\"A\",target=\"B\"} 50"),
        "{metrics}"
    );
    let fallback = text
        .lines()
        .find(|l| l.contains("not the next source record"))
        .expect("the fallback is logged");
    assert!(
        fallback.contains("partition=0") && fallback.contains("target_offset=150"),
        "{fallback}"
    );
}
