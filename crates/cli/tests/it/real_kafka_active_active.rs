//! Identity names both ways (docs/topologies.md "Identity names both ways"): A->B and
//! B->A with IdentityReplicationPolicy and `kmirror.loop.prevention.enabled`, while producers
//! write `orders` on both clusters. Every record written on one side reaches the other once
//! (at least once across kill -9, duplicates counted) and no record ever comes back to the
//! cluster it was written on: each value carries its origin, partition and sequence number, and
//! the audit reads both clusters whole. Checkpoints are held back (a group's position on a topic
//! of both origins has no equivalent across), which the metrics show.
//!
//! In the two-process test the processes name the clusters differently (A, B and east, west):
//! registry entries carry cluster ids.
//!
//! `KMIRROR_ACTIVE_ACTIVE_SECS` sets how long the producers write (default 15; 120 for a long
//! run).

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_testkit::{
    eventually, logged_metrics_address, read_partition, scrape_metrics, Cluster, KillOnDrop,
    Security,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PARTITIONS: i32 = 3;

fn load_secs() -> u64 {
    std::env::var("KMIRROR_ACTIVE_ACTIVE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

async fn pair(name: &str) -> (Cluster, Cluster, Arc<KafkaCluster>, Arc<KafkaCluster>) {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start(&format!("{name}-a"), Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start(&format!("{name}-b"), Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut out = Vec::new();
    for c in [&ca, &cb] {
        let k = KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap();
        k.create_topics(
            &[NewTopic {
                name: "orders".into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: vec![],
            }],
            false,
        )
        .await
        .unwrap();
        out.push(Arc::new(k));
    }
    let b = out.pop().unwrap();
    let a = out.pop().unwrap();
    (ca, cb, a, b)
}

fn properties(ca: &Cluster, cb: &Cluster, flows: &[&str], extra: &str) -> String {
    properties_named(("A", "B"), ca, cb, flows, extra)
}

/// As [`properties`], with other aliases for A and B.
fn properties_named(
    (na, nb): (&str, &str),
    ca: &Cluster,
    cb: &Cluster,
    flows: &[&str],
    extra: &str,
) -> String {
    let enabled: String = flows
        .iter()
        .map(|f| format!("{f}.enabled = true\n"))
        .collect();
    format!(
        "clusters = {na}, {nb}\n{na}.bootstrap.servers = {}\n{nb}.bootstrap.servers = {}\n{enabled}topics = orders\n\
         replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\nsync.group.offsets.enabled = true\n\
         sync.group.offsets.interval.seconds = 1\n{extra}",
        ca.bootstrap(),
        cb.bootstrap()
    )
}

const LOOP_PREVENTION: &str = "kmirror.loop.prevention.enabled = true\n";

/// Writes `orders` on `k` until `stop`: 10 records per partition every 100 ms, valued
/// `origin:partition:seq`. Every 20 rounds the producer is replaced (a new producer id the
/// readers have not seen), and every third round goes without idempotence (no producer id).
/// Returns how many records each partition got.
fn stream(
    k: Arc<KafkaCluster>,
    origin: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let mut seq = 0i64;
        let mut round = 0u64;
        let mut producer: Option<Arc<IdempotentProducer>> = None;
        let mut lanes = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if round.is_multiple_of(20) {
                for lane in &mut lanes {
                    let lane: &mut kmirror_kafka::producer::PartitionLane = lane;
                    lane.flush().await.unwrap();
                }
                let p = IdempotentProducer::new(k.clone()).await.unwrap();
                lanes = (0..PARTITIONS).map(|i| p.lane("orders", i)).collect();
                producer = Some(p);
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            for (i, lane) in lanes.iter_mut().enumerate() {
                let records: Vec<Record> = (0..10)
                    .map(|j| Record {
                        offset: j,
                        timestamp: now,
                        key: Some(Bytes::from(format!("k{j}"))),
                        value: Some(Bytes::from(format!("{origin}:{i}:{}", seq + j))),
                        headers: vec![],
                    })
                    .collect();
                let batch = encode_batch(&records, &BatchOptions::default()).unwrap();
                if round % 3 == 2 {
                    // Order per partition: what the lane has in flight lands first.
                    lane.flush().await.unwrap();
                    k.produce("orders", i as i32, &batch).await.unwrap();
                } else {
                    lane.send(seq, batch).await.unwrap();
                }
            }
            seq += 10;
            round += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for lane in &mut lanes {
            lane.flush().await.unwrap();
        }
        drop(producer);
        seq
    })
}

/// What one cluster's `orders` holds of one origin: per partition, the sequence numbers in
/// log order.
async fn of_origin(k: &KafkaCluster, origin: &str) -> BTreeMap<i32, Vec<i64>> {
    let mut out = BTreeMap::new();
    for p in 0..PARTITIONS {
        let seqs = read_partition(k, "orders", p)
            .await
            .iter()
            .filter_map(|(_, r)| {
                let v = String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned();
                let mut parts = v.splitn(3, ':');
                let (o, part, seq) = (parts.next()?, parts.next()?, parts.next()?);
                assert_eq!(part, p.to_string(), "a record in the wrong partition: {v}");
                (o == origin).then(|| seq.parse().unwrap())
            })
            .collect();
        out.insert(p, seqs);
    }
    out
}

/// Checks one origin's records on one cluster: every one of `written` per partition, in
/// order; returns how many are there twice (a record copied again after a crash).
fn audit(what: &str, seqs: &BTreeMap<i32, Vec<i64>>, written: i64) -> i64 {
    let mut duplicates = 0;
    for (p, values) in seqs {
        let mut next = 0;
        for &v in values {
            if v == next {
                next += 1;
            } else if v < next {
                duplicates += 1;
            } else {
                panic!("{what}-{p}: records {next}..{v} missing");
            }
        }
        assert_eq!(next, written, "{what}-{p}: every record there");
    }
    duplicates
}

/// Waits until `k` holds every record of `origin` (`written` per partition).
async fn complete(k: &KafkaCluster, origin: &str, written: i64) {
    eventually(120, &format!("{origin}'s records complete"), || async {
        of_origin(k, origin)
            .await
            .values()
            .all(|s| s.iter().filter(|&&v| v == written - 1).count() >= 1)
    })
    .await;
}

/// Both clusters hold both origins' records; returns (duplicates on A, duplicates on B). A
/// record on its own origin's cluster twice would be one that came back: never allowed.
async fn audit_both(a: &KafkaCluster, b: &KafkaCluster, wa: i64, wb: i64) -> (i64, i64) {
    complete(b, "A", wa).await;
    complete(a, "B", wb).await;
    // Loops would show now: give any echo time to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        audit("A's own on A", &of_origin(a, "A").await, wa),
        0,
        "a record came back to A"
    );
    assert_eq!(
        audit("B's own on B", &of_origin(b, "B").await, wb),
        0,
        "a record came back to B"
    );
    let on_a = audit("B's on A", &of_origin(a, "B").await, wb);
    let on_b = audit("A's on B", &of_origin(b, "A").await, wa);
    // Nothing beyond both origins' records (e.g. a copy of a copy).
    for (k, twice) in [(a, on_a), (b, on_b)] {
        let mut total = 0;
        for p in 0..PARTITIONS {
            total += read_partition(k, "orders", p).await.len() as i64;
        }
        assert_eq!(
            total,
            (wa + wb) * PARTITIONS as i64 + twice,
            "records in total"
        );
    }
    (on_a, on_b)
}

fn run(config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "127.0.0.1:0", "--log-format", "json"])
            .stdin(Stdio::null()),
        log,
    )
}

fn metric(scrape: &str, name: &str, flow: &str) -> f64 {
    let (source, target) = flow.split_once("->").unwrap();
    let labels = format!("source=\"{source}\",target=\"{target}\"");
    scrape
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_both_ways_in_one_process_copies_each_record_once_and_none_back() {
    let (ca, cb, a, b) = pair("aa1").await;
    let dir = tempfile::tempdir().unwrap();

    // Without loop prevention, plan refuses identity both ways and says what to set.
    let refused = dir.path().join("refused.properties");
    std::fs::write(&refused, properties(&ca, &cb, &["A->B", "B->A"], "")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("plan")
        .arg(&refused)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "plan refuses:\n{text}");
    assert!(
        text.contains("set kmirror.loop.prevention.enabled = true"),
        "{text}"
    );

    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        properties(&ca, &cb, &["A->B", "B->A"], LOOP_PREVENTION),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("plan")
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "plan accepts:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("loop prevention on"),
        "plan explains:\n{text}"
    );
    assert!(
        text.contains("kmirror-producers.internal"),
        "plan lists the topic:\n{text}"
    );

    // Records on both sides before the flows start, and a group that read some of A's.
    let stop = Arc::new(AtomicBool::new(false));
    let streams = [
        stream(a.clone(), "A", stop.clone()),
        stream(b.clone(), "B", stop.clone()),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = dir.path().join("kmirror.log");
    let run = run(&config, &log);
    tokio::time::sleep(Duration::from_secs(load_secs())).await;
    stop.store(true, Ordering::Relaxed);
    let [sa, sb] = streams;
    let (wa, wb) = (sa.await.unwrap(), sb.await.unwrap());
    let (on_a, on_b) = audit_both(&a, &b, wa, wb).await;
    assert_eq!((on_a, on_b), (0, 0), "no crash, no record copied twice");
    eprintln!("written per partition: A {wa}, B {wb}; each on the other side once, none back");

    let scrape = scrape_metrics(&logged_metrics_address(&log)).unwrap();
    for flow in ["A->B", "B->A"] {
        let skipped = metric(&scrape, "kmirror_loop_records_skipped_total", flow);
        let want = if flow == "A->B" { wb } else { wa } * PARTITIONS as i64;
        // Each copy is left out when fetched (a batch fetched again counts again).
        assert!(
            skipped as i64 >= want,
            "{flow} left out the copies it found: {skipped} < {want}"
        );
        eventually(30, "checkpoints held back", || async {
            let scrape = scrape_metrics(&logged_metrics_address(&log)).unwrap();
            metric(&scrape, "kmirror_checkpoints_both_ways", flow) == 1.0
        })
        .await;
        assert!(metric(&scrape, "kmirror_producer_ids_registered_total", flow) >= 1.0);
    }
    let status = run.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_both_ways_in_two_processes_survives_kill_9_of_each() {
    let (ca, cb, a, b) = pair("aa2").await;
    let dir = tempfile::tempdir().unwrap();
    let (ab, ba) = (
        dir.path().join("a-b.properties"),
        dir.path().join("b-a.properties"),
    );
    std::fs::write(&ab, properties(&ca, &cb, &["A->B"], LOOP_PREVENTION)).unwrap();
    // The second process calls the clusters by other names: the registry's cluster ids match.
    std::fs::write(
        &ba,
        properties_named(("east", "west"), &ca, &cb, &["west->east"], LOOP_PREVENTION),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let streams = [
        stream(a.clone(), "A", stop.clone()),
        stream(b.clone(), "B", stop.clone()),
    ];
    let mut to_b = run(&ab, &dir.path().join("a-b.log"));
    let mut to_a = run(&ba, &dir.path().join("b-a.log"));
    let third = Duration::from_secs(load_secs().max(9) / 3);
    // Each process killed while copying, and started again.
    tokio::time::sleep(third).await;
    to_b.kill_9();
    to_b = run(&ab, &dir.path().join("a-b-2.log"));
    tokio::time::sleep(third).await;
    to_a.kill_9();
    to_a = run(&ba, &dir.path().join("b-a-2.log"));
    tokio::time::sleep(third).await;
    stop.store(true, Ordering::Relaxed);
    let [sa, sb] = streams;
    let (wa, wb) = (sa.await.unwrap(), sb.await.unwrap());
    let (on_a, on_b) = audit_both(&a, &b, wa, wb).await;
    eprintln!(
        "written per partition: A {wa}, B {wb}; copied twice after kill -9: on A {on_a}, on B {on_b}"
    );
    for p in [to_b, to_a] {
        let status = p.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }
    // The restarted processes walked their own copies on a target the other side's producers
    // also write: the walk never met a foreign record.
    for log in ["a-b-2.log", "b-a-2.log"] {
        let text = std::fs::read_to_string(dir.path().join(log)).unwrap();
        assert!(
            !text.contains("that is not the next source record"),
            "{log}: the resume walk met a record it did not copy:\n{text}"
        );
    }
}
