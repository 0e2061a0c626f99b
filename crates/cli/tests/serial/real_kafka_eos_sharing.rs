//! Exactly-once processes sharing a flow (docs/sharing.md,
//! "Exactly-once"): three `kmirror run` processes with one exactly-once configuration divide the
//! flow's 12 slots (transactional ids, each with its partitions of a 24-partition topic) while
//! records stream in. One is killed with SIGKILL: the others take its slots within the session
//! timeout plus a few seconds (printed). Another is paused with SIGSTOP past the session timeout
//! and continued: a zombie, fenced by the slots' new holders. A fourth joins: only the slots it is
//! given move (asserted from the revocations counted). Then a read_committed reader of the target
//! sees every record exactly once and in order, while the target's log holds the aborted copies.
//! A second test kills random members of a three-process flow with SIGKILL five times (each
//! started again at once) and restarts the target broker; read_committed, in Kafka's own reader
//! and in Java's console consumer, still sees every record once.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_mirror::metrics::sum_samples;
use kmirror_testkit::{
    eventually, logged_metrics_address, read_committed, read_partition, scrape_metrics, Cluster,
    KillOnDrop, Security,
};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 24;
const SLOTS: i64 = 12;
const SESSION: Duration = Duration::from_secs(6);

struct Process {
    child: KillOnDrop,
    address: String,
    log: std::path::PathBuf,
}

fn start(config: &Path, log: &Path) -> Process {
    let child = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "127.0.0.1:0", "--log-format", "json"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        log,
    );
    Process {
        child,
        address: logged_metrics_address(log),
        log: log.to_path_buf(),
    }
}

fn metric(p: &Process, name: &str) -> Option<i64> {
    scrape_metrics(&p.address).map(|m| sum_samples(&m, name, &[]) as i64)
}

fn signal(p: &Process, sig: &str) {
    let pid = p.child.0.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// Waits until the processes that answer hold every slot between them, in even shares; fails
/// with the shares seen and the end of each process's log.
async fn balanced(ps: &[&Process], what: &str) -> Duration {
    let t0 = Instant::now();
    let n = ps.len() as i64;
    loop {
        let shares: Vec<Option<i64>> = ps
            .iter()
            .map(|p| metric(p, "kmirror_exactly_once_slots"))
            .collect();
        if shares.iter().map(|s| s.unwrap_or(-100)).sum::<i64>() == SLOTS
            && shares
                .iter()
                .all(|s| matches!(s, Some(v) if *v == SLOTS / n || *v == SLOTS / n + 1))
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(90) {
            for p in ps {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "--- {} (last 40 lines)\n{}",
                    p.log.display(),
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
            panic!("{what}: not balanced after 90 s; slots held: {shares:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let elapsed = t0.elapsed();
    eprintln!("{what}: balanced after {:.1} s", elapsed.as_secs_f64());
    elapsed
}

/// Two clusters, the source topic, an exactly-once configuration, and a stream of records whose
/// values are their partition and sequence number (the task returns how many each partition got).
struct Setup {
    _ca: Cluster,
    cb: Cluster,
    b: KafkaCluster,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    producer: tokio::task::JoinHandle<i64>,
}

async fn setup(name: &str) -> Setup {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start(&format!("{name}-a"), Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start(&format!("{name}-b"), Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
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
            name: "spread".into(),
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
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = spread\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             B.exactly.once.source.support = enabled\n\
             refresh.topics.interval.seconds = 1\nkmirror.sharing.session.timeout.ms = {}\n",
            ca.bootstrap(),
            cb.bootstrap(),
            SESSION.as_millis()
        ),
    )
    .unwrap();

    // The stream: every record's value is its partition and sequence number.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (a, stop) = (a.clone(), stop.clone());
        tokio::spawn(async move {
            let p = IdempotentProducer::new(a).await.unwrap();
            let mut lanes: Vec<_> = (0..PARTITIONS).map(|i| p.lane("spread", i)).collect();
            let mut seq = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let records: Vec<Record> = (0..20)
                        .map(|j| Record {
                            offset: j,
                            timestamp: now,
                            key: Some(Bytes::from(format!("k{j}"))),
                            value: Some(Bytes::from(format!("{i}:{}", seq + j))),
                            headers: vec![],
                        })
                        .collect();
                    let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
                    lane.send(seq, batch).await.unwrap();
                }
                seq += 20;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for lane in &mut lanes {
                lane.flush().await.unwrap();
            }
            seq
        })
    };

    Setup {
        _ca: ca,
        cb,
        b,
        dir,
        config,
        stop,
        producer,
    }
}

/// Every record once, in order, for a read_committed reader of the target: returns the records
/// read_committed sees and the records in the target's log (with aborted copies).
async fn audit(b: &KafkaCluster, written: i64) -> (usize, usize) {
    let (mut committed, mut raw) = (0, 0);
    for p in 0..PARTITIONS {
        let values: Vec<i64> = read_committed(b, "A.spread", p)
            .await
            .iter()
            .map(|r| {
                let v = String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned();
                let (part, seq) = v.split_once(':').unwrap();
                assert_eq!(part, p.to_string(), "a record in the wrong partition: {v}");
                seq.parse().unwrap()
            })
            .collect();
        let expected: Vec<i64> = (0..written).collect();
        if values != expected {
            let seen: std::collections::HashSet<i64> = values.iter().copied().collect();
            let missing = expected.iter().filter(|v| !seen.contains(v)).count();
            panic!(
                "A.spread-{p}: read_committed sees {} records for {written} written: {missing} missing, {} duplicates, or out of order",
                values.len(),
                values.len() - seen.len()
            );
        }
        committed += values.len();
        raw += read_partition(b, "A.spread", p).await.len();
    }
    eprintln!(
        "{committed} records, each seen once by read_committed; {} records of aborted transactions in the target's log",
        raw - committed
    );
    (committed, raw)
}

/// Waits until read_committed sees `written` records in every partition.
async fn caught_up(b: &KafkaCluster, written: i64) {
    let t0 = Instant::now();
    eventually(120, "every record visible to read_committed", || async {
        let _ = b.refresh_metadata(None).await;
        for p in 0..PARTITIONS {
            if (read_committed(b, "A.spread", p).await.len() as i64) < written {
                return false;
            }
        }
        true
    })
    .await;
    eprintln!(
        "caught up {:.1} s after the stream ended",
        t0.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_processes_share_slots_through_kill_9_a_zombie_and_a_join() {
    let _alone = crate::ALONE.lock().await;
    let Setup {
        _ca,
        cb: _cb,
        b,
        dir,
        config,
        stop,
        producer,
    } = setup("eos-procs").await;
    let logs: Vec<_> = (1..=4)
        .map(|i| dir.path().join(format!("kmirror-{i}.log")))
        .collect();
    let mut p1 = start(&config, &logs[0]);
    balanced(&[&p1], "one process").await;
    let p2 = start(&config, &logs[1]);
    let p3 = start(&config, &logs[2]);
    balanced(&[&p1, &p2, &p3], "three processes").await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kill -9 with transactions open: the others fence its ids (aborting what it left open).
    p1.child.kill_9();
    let takeover = balanced(&[&p2, &p3], "two processes after kill -9").await;
    assert!(
        takeover < SESSION + Duration::from_secs(10),
        "slots of the killed process taken over after {takeover:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A zombie: paused past the session, its slots are fenced by their new holder; continued,
    // it must not get a record of its own in front of a read_committed reader.
    signal(&p2, "-STOP");
    let t0 = Instant::now();
    eventually(60, "the running process holds every slot", || async {
        metric(&p3, "kmirror_exactly_once_slots") == Some(SLOTS)
    })
    .await;
    eprintln!(
        "paused process's slots taken over after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&p2, "-CONT");
    balanced(&[&p2, &p3], "the paused process rejoined").await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A fourth process: only the slots it is given move.
    let revoked = |ps: &[&Process]| -> i64 {
        ps.iter()
            .map(|p| metric(p, "kmirror_partitions_revoked_total").unwrap_or(0))
            .sum()
    };
    let before = revoked(&[&p2, &p3]);
    let p4 = start(&config, &logs[3]);
    balanced(&[&p2, &p3, &p4], "a fourth process joined").await;
    let moved = revoked(&[&p2, &p3]) - before;
    assert_eq!(
        moved,
        SLOTS / 3,
        "slots handed over when a third member joined two: only those it was given"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::Relaxed);
    let written = producer.await.unwrap();
    caught_up(&b, written).await;
    for p in [p2, p3, p4] {
        let status = p.child.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }

    let (committed, raw) = audit(&b, written).await;
    assert!(
        raw > committed,
        "no aborted transaction in the target's log: the kill -9 and the pause tested nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_shared_flow_survives_five_random_kill_9_and_a_target_restart() {
    let _alone = crate::ALONE.lock().await;
    let Setup {
        _ca,
        cb,
        b,
        dir,
        config,
        stop,
        producer,
    } = setup("eos-chaos").await;
    let mut logs = 0;
    let mut next_log = || {
        logs += 1;
        dir.path().join(format!("kmirror-{logs}.log"))
    };
    let mut ps: Vec<Process> = (0..3).map(|_| start(&config, &next_log())).collect();
    balanced(&ps.iter().collect::<Vec<_>>(), "three processes").await;

    // Which process dies, and when, changes from run to run (printed, to replay a failure).
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut done = Vec::new();
    for _ in 0..5 {
        // Sometimes within the previous rebalance, sometimes after it settled.
        tokio::time::sleep(Duration::from_millis(1500 + 500 * random(8))).await;
        let victim = random(3) as usize;
        ps[victim].child.kill_9();
        ps[victim] = start(&config, &next_log());
        done.push(victim);
    }
    eprintln!("killed with SIGKILL and started again, in turn: processes {done:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cb = tokio::task::spawn_blocking(move || {
        cb.restart().unwrap();
        cb
    })
    .await
    .unwrap();
    balanced(
        &ps.iter().collect::<Vec<_>>(),
        "three processes after the faults",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::Relaxed);
    let written = producer.await.unwrap();
    caught_up(&b, written).await;
    let aborted: i64 = ps
        .iter()
        .map(|p| metric(p, "kmirror_transactions_aborted_total").unwrap_or(0))
        .sum();
    for p in ps {
        let status = p.child.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }
    let (committed, raw) = audit(&b, written).await;
    assert!(
        raw > committed,
        "no aborted transaction in the target's log: the kill -9s tested nothing ({aborted} aborts counted by the survivors)"
    );

    // Java's read_committed consumer sees the same records, each once.
    let java: Vec<String> = cb
        .read_committed_lines("A.spread", committed + 1)
        .unwrap()
        .into_iter()
        .filter(|l| l.contains(':'))
        .collect();
    let distinct: std::collections::HashSet<&str> = java.iter().map(String::as_str).collect();
    let expected: std::collections::HashSet<String> = (0..PARTITIONS)
        .flat_map(|p| (0..written).map(move |s| format!("{p}:{s}")))
        .collect();
    assert_eq!(
        (java.len(), distinct.len()),
        (committed, committed),
        "Java's read_committed console consumer: records and distinct records"
    );
    assert!(
        expected.iter().all(|v| distinct.contains(v.as_str())),
        "Java's read_committed console consumer misses records the auditor saw"
    );
}
