//! The chaos soak: 3-broker clusters on both sides, each broker behind a fault proxy
//! (`Cluster::start_proxied`), a producer writing per-key sequence numbers to the source, the
//! `kmirror` binary copying them, and faults injected at random one after another: broker
//! kill -9 and restart (either side), leader moves, a broker black-holed for clients for 30 s,
//! every connection reset, kmirror kill -9 and restart, kmirror SIGSTOP for 10 s. Then the
//! faults stop, kmirror catches up, and an auditor compares the target with the source record
//! by record: every gap fails the test; duplicates are counted and printed.
//!
//! `KMIRROR_SOAK_SECONDS` bounds the fault phase (default 90 s, the CI variant);
//! `scripts/soak.sh` runs it for 20 minutes. `KMIRROR_SOAK_SEED` picks the fault sequence
//! (printed, so a failing run can be repeated).

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::netfault::Fault;
use kmirror_testkit::{read_partition, Cluster, KillOnDrop};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOPIC: &str = "soak";
const PARTITIONS: i32 = 6;
/// Keys per partition; each record carries its key's next sequence number.
const KEYS_PER_PARTITION: u64 = 10;

/// A small deterministic generator (xorshift64*): the fault sequence follows from the seed.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn start_kmirror(config: &Path, log: &Path) -> KillOnDrop {
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

fn signal(k: &KillOnDrop, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &k.0.id().to_string()])
        .status();
}

/// Writes rounds of one record per key to every partition until `stop`, each value
/// `key:sequence:attempt` (a retried send gets a new attempt number, so every value in the
/// source log is unique even when a send that "failed" was in fact written).
async fn produce(
    a: Arc<KafkaCluster>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) {
    let mut seq = 0u64;
    let mut attempt = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for p in 0..PARTITIONS {
            loop {
                attempt += 1;
                let records: Vec<Record> = (0..KEYS_PER_PARTITION)
                    .map(|k| Record {
                        offset: k as i64,
                        timestamp: now_ms(),
                        key: Some(Bytes::from(format!("p{p}k{k}"))),
                        value: Some(Bytes::from(format!("p{p}k{k}:{seq}:{attempt}"))),
                        headers: vec![],
                    })
                    .collect();
                let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
                match tokio::time::timeout(Duration::from_secs(20), a.produce(TOPIC, p, &batch))
                    .await
                {
                    Ok(Ok(_)) => {
                        written.fetch_add(KEYS_PER_PARTITION, Ordering::Relaxed);
                        break;
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        let _ = a.refresh_metadata(None).await;
                    }
                }
            }
        }
        seq += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs faults one after another until `until`; returns how many of each kind were injected.
fn inject_faults(
    ca: &Cluster,
    cb: &Cluster,
    kmirror: &mut KillOnDrop,
    config: &Path,
    log: &Path,
    dice: &mut Dice,
    until: Instant,
) -> BTreeMap<&'static str, u32> {
    let mut done: BTreeMap<&'static str, u32> = BTreeMap::new();
    let pick_cluster = |dice: &mut Dice| {
        if dice.below(2) == 0 {
            (ca, "source", TOPIC.to_string())
        } else {
            (cb, "target", format!("A.{TOPIC}"))
        }
    };
    while Instant::now() < until {
        let pause = Duration::from_secs(3 + dice.below(6));
        std::thread::sleep(pause);
        if Instant::now() >= until {
            break;
        }
        let node = 1 + dice.below(3) as u16;
        let kind = match dice.below(7) {
            0 => {
                let (c, side, _) = pick_cluster(dice);
                println!("soak: kill -9 {side} broker {node}, restart after 5 s");
                c.kill_node(node).unwrap();
                std::thread::sleep(Duration::from_secs(5));
                c.start_node(node).unwrap();
                "broker kill -9 and restart"
            }
            1 | 2 => {
                let (c, side, topic) = pick_cluster(dice);
                let p = dice.below(PARTITIONS as u64) as i32;
                let (leader, replicas) = c.describe_partition(&topic, p).unwrap();
                let others: Vec<i32> = replicas.into_iter().filter(|r| *r != leader).collect();
                let to = others[dice.below(others.len() as u64) as usize];
                println!("soak: move the leader of {side} {topic}-{p} from {leader} to {to}");
                c.move_leader(&topic, p, to).unwrap();
                "leader move"
            }
            3 => {
                let (c, side, _) = pick_cluster(dice);
                println!("soak: black-hole {side} broker {node} for clients for 30 s");
                c.proxy(node).set(Fault::BlackHole);
                std::thread::sleep(Duration::from_secs(30));
                c.proxy(node).set(Fault::None);
                "broker black-holed 30 s"
            }
            4 => {
                println!("soak: reset every connection to every broker");
                for k in 1..=3 {
                    ca.proxy(k).reset();
                    cb.proxy(k).reset();
                }
                "connections reset"
            }
            5 => {
                println!("soak: kill -9 kmirror, restart");
                kmirror.kill_9();
                *kmirror = start_kmirror(config, log);
                "kmirror kill -9 and restart"
            }
            _ => {
                println!("soak: SIGSTOP kmirror for 10 s");
                signal(kmirror, "-STOP");
                std::thread::sleep(Duration::from_secs(10));
                signal(kmirror, "-CONT");
                "kmirror SIGSTOP 10 s"
            }
        };
        *done.entry(kind).or_default() += 1;
    }
    done
}

/// Per partition: source values missing on the target, and target records beyond the first
/// copy of each value.
async fn audit(a: &KafkaCluster, b: &KafkaCluster) -> (u64, u64, u64, u64) {
    let (mut source_total, mut target_total, mut lost, mut doubled) = (0, 0, 0, 0);
    for p in 0..PARTITIONS {
        let s: Vec<Option<Bytes>> = read_partition(a, TOPIC, p)
            .await
            .into_iter()
            .map(|(_, r)| r.value)
            .collect();
        let d: Vec<Option<Bytes>> = read_partition(b, &format!("A.{TOPIC}"), p)
            .await
            .into_iter()
            .map(|(_, r)| r.value)
            .collect();
        let on_target: HashSet<&Option<Bytes>> = d.iter().collect();
        let missing = s.iter().filter(|v| !on_target.contains(v)).count() as u64;
        if missing > 0 {
            let first = s.iter().find(|v| !on_target.contains(v));
            println!(
                "soak: partition {p}: {missing} records missing on the target, the first {:?}",
                first
                    .and_then(|v| v.as_ref())
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            );
        }
        source_total += s.len() as u64;
        target_total += d.len() as u64;
        lost += missing;
        doubled += (d.len() - on_target.len()) as u64;
    }
    (source_total, target_total, lost, doubled)
}

async fn end_offsets(k: &KafkaCluster, topic: &str) -> Vec<i64> {
    let _ = k.refresh_metadata(None).await;
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        out.push(
            k.list_offset(topic, p, LATEST, IsolationLevel::ReadUncommitted)
                .await
                .unwrap_or(-1),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_loses_nothing() {
    let _alone = crate::ALONE.lock().await;
    let seconds: u64 = std::env::var("KMIRROR_SOAK_SECONDS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("KMIRROR_SOAK_SECONDS: a number of seconds")
        })
        .unwrap_or(90);
    let seed: u64 = std::env::var("KMIRROR_SOAK_SEED")
        .ok()
        .map(|s| s.parse().expect("KMIRROR_SOAK_SEED: a number"))
        .unwrap_or_else(|| now_ms() as u64);
    println!("soak: {seconds} s of faults, seed {seed} (KMIRROR_SOAK_SEED={seed} repeats them)");
    let mut dice = Dice(seed | 1);
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start_proxied("soak-a", 3, &[]).unwrap());
        let b = s.spawn(|| Cluster::start_proxied("soak-b", 3, &[]).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = Arc::new(
        KafkaCluster::connect(ca.direct_client_settings())
            .await
            .unwrap(),
    );
    let b = KafkaCluster::connect(cb.direct_client_settings())
        .await
        .unwrap();
    a.create_topics(
        &[NewTopic {
            name: TOPIC.into(),
            partitions: PARTITIONS,
            replication_factor: 3,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let _ = a.refresh_metadata(None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             A->B.topics = {TOPIC}\nreplication.factor = 3\nrefresh.topics.interval.seconds = 10\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log: PathBuf = dir.path().join("kmirror.log");
    let mut kmirror = start_kmirror(&config, &log);

    let stop = Arc::new(AtomicBool::new(false));
    let (written, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let producer = tokio::spawn(produce(
        a.clone(),
        stop.clone(),
        written.clone(),
        failed.clone(),
    ));
    let until = Instant::now() + Duration::from_secs(seconds);
    let (faults, kmirror, _ca, _cb) = {
        let (config, log) = (config.clone(), log.clone());
        tokio::task::spawn_blocking(move || {
            let faults = inject_faults(&ca, &cb, &mut kmirror, &config, &log, &mut dice, until);
            (faults, kmirror, ca, cb)
        })
    }
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();

    // Faults over: kmirror catches up (bounded), then the audit.
    let source_end = end_offsets(&a, TOPIC).await;
    let t = Instant::now();
    loop {
        let target_end = end_offsets(&b, &format!("A.{TOPIC}")).await;
        if target_end.iter().zip(&source_end).all(|(t, s)| t >= s) {
            break;
        }
        if t.elapsed() > Duration::from_secs(180) {
            println!(
                "soak: not caught up after 180 s: target {target_end:?}, source {source_end:?}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (source_total, target_total, lost, doubled) = audit(&a, &b).await;
    println!("soak: faults injected:");
    for (kind, n) in &faults {
        println!("soak:   {n:>3}  {kind}");
    }
    println!(
        "soak: {source_total} records in the source ({} produced, {} sends retried), {target_total} on the target; lost {lost}; copied twice {doubled} ({:.2}%); caught up {:.1?} after the faults stopped",
        written.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        doubled as f64 * 100.0 / source_total.max(1) as f64,
        t.elapsed()
    );
    let status = kmirror.terminate();
    if lost > 0 || !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!(
            "soak: the last 200 lines of kmirror's log:\n{}",
            lines[lines.len().saturating_sub(200)..].join("\n")
        );
    }
    assert_eq!(lost, 0, "records lost");
    assert!(source_total > 0, "the producer wrote nothing");
    assert!(status.success(), "kmirror exited with {status}");
}
