//! Three `kmirror run` processes with one configuration share a 24-partition flow
//! (docs/sharing.md) while records stream in. One is killed with SIGKILL: the other two take its
//! partitions over within the session timeout plus a few seconds (the time is printed). Another
//! is paused with SIGSTOP past the session timeout: the last one serves everything meanwhile, and
//! the paused one, continued, learns it lost its membership, stops, and rejoins. An auditor then
//! reads every remote partition: no record missing, in order; records copied twice (a killed or
//! paused process's last writes, at-least-once) are counted and printed.
//!
//! With static membership (`kmirror.sharing.instance.id`, KIP-345) a process killed with SIGKILL
//! and started again under its id gets its partitions back at once, without a rebalance of the
//! others, long before its session timeout; a second process started under a live one's id
//! takes its place, and the replaced one stops with an error naming the key.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::producer::IdempotentProducer;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{
    eventually, logged_metrics_address, read_partition, scrape_metrics, Cluster, KillOnDrop,
    Security,
};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 24;
const SESSION: Duration = Duration::from_secs(6);

/// A process's share, or None while it does not answer (paused, or gone).
fn share(address: &str) -> Option<i64> {
    scrape_metrics(address).map(|m| {
        kmirror_mirror::metrics::sum_samples(&m, "kmirror_assigned_partitions", &[]) as i64
    })
}

struct Process {
    child: KillOnDrop,
    address: String,
}

fn start(config: &Path, log: &Path) -> Process {
    start_as(config, log, None)
}

/// A process, with `KMIRROR_TEST_INSTANCE` set to `instance` (the configuration of the static
/// membership test reads its instance id from it).
fn start_as(config: &Path, log: &Path, instance: Option<&str>) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kmirror"));
    cmd.arg("run")
        .arg(config)
        .args(["--metrics-address", "127.0.0.1:0", "--log-format", "json"])
        // Where each partition starts copying, for the reader of a failure.
        .env("RUST_LOG", "info,kmirror_mirror::engine::partition=debug");
    if let Some(id) = instance {
        cmd.env("KMIRROR_TEST_INSTANCE", id);
    }
    let child = KillOnDrop::spawn(&mut cmd, log);
    Process {
        child,
        address: logged_metrics_address(log),
    }
}

/// The sum of a metric's samples in a process, or None while it does not answer.
fn metric(address: &str, name: &str) -> Option<f64> {
    scrape_metrics(address).map(|m| kmirror_mirror::metrics::sum_samples(&m, name, &[]))
}

fn signal(p: &Process, sig: &str) {
    let pid = p.child.0.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// Waits until the processes that answer hold every partition between them, in even shares.
async fn balanced(ps: &[&Process], what: &str) -> Duration {
    let t0 = Instant::now();
    let n = ps.len() as i64;
    let total = PARTITIONS as i64;
    eventually(90, what, || async {
        let shares: Vec<Option<i64>> = ps.iter().map(|p| share(&p.address)).collect();
        shares.iter().map(|s| s.unwrap_or(-100)).sum::<i64>() == total
            && shares
                .iter()
                .all(|s| matches!(s, Some(v) if *v == total / n || *v == total / n + 1))
    })
    .await;
    let elapsed = t0.elapsed();
    let shares: Vec<Option<i64>> = ps.iter().map(|p| share(&p.address)).collect();
    eprintln!(
        "{what}: shares {shares:?} after {:.1} s",
        elapsed.as_secs_f64()
    );
    elapsed
}

/// Waits until every record written to the source before the call is on the target.
async fn caught_up(a: &KafkaCluster, b: &KafkaCluster, what: &str) {
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let end = a
            .list_offset("spread", p, LATEST, IsolationLevel::ReadUncommitted)
            .await
            .unwrap();
        ends.push(end);
    }
    let t0 = Instant::now();
    eventually(60, what, || async {
        let _ = b.refresh_metadata(None).await;
        for (p, want) in ends.iter().enumerate() {
            match b
                .list_offset(
                    "A.spread",
                    p as i32,
                    LATEST,
                    IsolationLevel::ReadUncommitted,
                )
                .await
            {
                Ok(g) if g >= *want => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    eprintln!("{what} copied after {:.1} s", t0.elapsed().as_secs_f64());
}

/// Two clusters, the source with the 24-partition topic `spread`.
async fn clusters(name: &str) -> (Cluster, Cluster, Arc<KafkaCluster>, KafkaCluster) {
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
    (ca, cb, a, b)
}

fn write_config(path: &Path, ca: &Cluster, cb: &Cluster, session: Duration, extra: &str) {
    std::fs::write(
        path,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = spread\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             refresh.topics.interval.seconds = 1\nkmirror.sharing.session.timeout.ms = {}\n{extra}",
            ca.bootstrap(),
            cb.bootstrap(),
            session.as_millis()
        ),
    )
    .unwrap();
}

/// The stream: 20 records per partition every 100 ms, each record's value its partition and
/// sequence number. Returns how many each partition got once `stop` is set.
fn stream(a: Arc<KafkaCluster>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<i64> {
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
}

/// Waits until the target holds at least every record of the source.
async fn everything_copied(a: &KafkaCluster, b: &KafkaCluster) {
    eventually(120, "every record copied", || async {
        let _ = b.refresh_metadata(None).await;
        for p in 0..PARTITIONS {
            let want = a
                .list_offset("spread", p, LATEST, IsolationLevel::ReadUncommitted)
                .await;
            let got = b
                .list_offset("A.spread", p, LATEST, IsolationLevel::ReadUncommitted)
                .await;
            match (want, got) {
                (Ok(w), Ok(g)) if g >= w => {}
                _ => return false,
            }
        }
        true
    })
    .await;
}

/// Reads every remote partition: every record present, in order, no gap (asserted); returns
/// how many were copied twice, printing where.
async fn audit(b: &KafkaCluster, written: i64) -> i64 {
    let mut duplicates = 0;
    for p in 0..PARTITIONS {
        let values: Vec<i64> = read_partition(b, "A.spread", p)
            .await
            .iter()
            .map(|(_, r)| {
                let v = String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned();
                let (part, seq) = v.split_once(':').unwrap();
                assert_eq!(part, p.to_string(), "a record in the wrong partition: {v}");
                seq.parse().unwrap()
            })
            .collect();
        let mut next = 0;
        let mut replays = Vec::new();
        for v in values {
            if v == next {
                next += 1;
            } else if v < next {
                duplicates += 1;
                match replays.last_mut() {
                    Some((_, to, n)) if *to + 1 == v => {
                        *to = v;
                        *n += 1;
                    }
                    _ => replays.push((v, v, 1)),
                }
            } else {
                panic!("A.spread-{p}: records {next}..{v} missing");
            }
        }
        if !replays.is_empty() {
            eprintln!("A.spread-{p}: copied twice (from, to, count): {replays:?}");
        }
        assert_eq!(next, written, "A.spread-{p}: every record copied");
    }
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_share_a_flow_and_survive_kill_9_and_a_pause_without_loss() {
    let _alone = crate::ALONE.lock().await;
    let (ca, cb, a, b) = clusters("procs").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    write_config(&config, &ca, &cb, SESSION, "");
    let stop = Arc::new(AtomicBool::new(false));
    let producer = stream(a.clone(), stop.clone());

    let logs: Vec<_> = (1..=3)
        .map(|i| dir.path().join(format!("kmirror-{i}.log")))
        .collect();
    let mut p1 = start(&config, &logs[0]);
    balanced(&[&p1], "one process").await;
    let p2 = start(&config, &logs[1]);
    let p3 = start(&config, &logs[2]);
    balanced(&[&p1, &p2, &p3], "three processes").await;
    // Per-process figures are per process: the processes' partitions and topics add up to the
    // flow's, which each of them reports.
    let three = [&p1, &p2, &p3];
    eventually(
        30,
        "per-process partitions adding up to the flow's",
        || async {
            let each = |name: &str| -> Option<Vec<f64>> {
                three.iter().map(|p| metric(&p.address, name)).collect()
            };
            let (Some(mine), Some(flow), Some(topics)) = (
                each("kmirror_partitions"),
                each("kmirror_flow_partitions"),
                each("kmirror_flow_topics"),
            ) else {
                return false;
            };
            mine.iter().sum::<f64>() == f64::from(PARTITIONS)
                && flow.iter().all(|f| *f == f64::from(PARTITIONS))
                && topics.iter().all(|t| *t == 1.0)
                && mine.iter().all(|m| *m < f64::from(PARTITIONS))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kill -9: the others take its partitions once the coordinator notices (session timeout).
    p1.child.kill_9();
    let takeover = balanced(&[&p2, &p3], "two processes after kill -9").await;
    assert!(
        takeover < SESSION + Duration::from_secs(10),
        "partitions of the killed process taken over after {takeover:?}"
    );

    // The takeover copies the killed process's backlog (a session timeout of records) in one
    // burst; a process paused within a position-store interval of that (250 ms) makes its
    // successor copy the whole burst again (at-least-once: CI saw 1260 records per partition).
    // The pause below is meant to measure a process paused in steady state, so it waits until
    // the backlog is copied and stored.
    caught_up(&a, &b, "the killed process's backlog").await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A pause past the session timeout: the last process serves everything meanwhile.
    signal(&p2, "-STOP");
    let t0 = Instant::now();
    eventually(60, "the running process serves every partition", || async {
        share(&p3.address) == Some(PARTITIONS as i64)
    })
    .await;
    eprintln!(
        "paused process's partitions taken over after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&p2, "-CONT");
    balanced(&[&p2, &p3], "the paused process rejoined").await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::Relaxed);
    let written = producer.await.unwrap();
    everything_copied(&a, &b).await;
    for p in [p2, p3] {
        let status = p.child.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }

    let duplicates = audit(&b, written).await;
    let total = written * PARTITIONS as i64;
    eprintln!(
        "{total} records, none lost; {duplicates} copied twice ({:.2}%) across a kill -9 and a pause",
        duplicates as f64 * 100.0 / total as f64
    );
    // What a killed process wrote after its last stored position (a quarter of a second), and
    // what a paused one had in flight: a paused process that wrote what it had fetched when it
    // woke, before learning it was no longer a member, doubled about 15% of this stream.
    if duplicates * 50 >= total || std::env::var_os("KMIRROR_TEST_DUMP").is_some() {
        dump(&logs);
    }
    assert!(
        duplicates * 50 < total,
        "{duplicates} of {total} records copied twice: more than 2%"
    );
}

/// What each process did with its membership and partitions, for the failure's reader.
fn dump(logs: &[std::path::PathBuf]) {
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        eprintln!("--- {}", log.display());
        for line in text.lines().filter(|l| {
            l.contains("assign")
                || l.contains("\"WARN\"")
                || l.contains("\"ERROR\"")
                || l.contains("\"copying\"")
        }) {
            eprintln!("{line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_restarted_under_its_instance_id_gets_its_partitions_back_at_once() {
    let _alone = crate::ALONE.lock().await;
    // A session long enough that waiting it out could not pass for coming back at once.
    const STATIC_SESSION: Duration = Duration::from_secs(30);
    let (ca, cb, a, b) = clusters("static").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    // One file for every process, each with its own id from its environment, as a Kubernetes
    // pod would take its name.
    write_config(
        &config,
        &ca,
        &cb,
        STATIC_SESSION,
        "config.providers = env\n\
         config.providers.env.class = org.apache.kafka.common.config.provider.EnvVarConfigProvider\n\
         kmirror.sharing.instance.id = ${env:KMIRROR_TEST_INSTANCE}\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let producer = stream(a.clone(), stop.clone());
    let logs: Vec<_> = (1..=4)
        .map(|i| dir.path().join(format!("kmirror-{i}.log")))
        .collect();
    let mut one = start_as(&config, &logs[0], Some("one"));
    balanced(&[&one], "one process").await;
    let two = start_as(&config, &logs[1], Some("two"));
    let joined = balanced(&[&one, &two], "two processes").await;
    // Heartbeats at most 3 s apart whatever the session timeout: a member learns of the
    // rebalance at its next one, and a cooperative rebalance takes two.
    assert!(
        joined < Duration::from_secs(15),
        "a second process took {joined:?} to get its share"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rebalances = |p: &Process| metric(&p.address, "kmirror_rebalances_total").unwrap();
    let two_rebalances = rebalances(&two);

    // kill -9, and started again at once under the same id.
    one.child.kill_9();
    let t0 = Instant::now();
    let one = start_as(&config, &logs[2], Some("one"));
    eventually(
        60,
        "the restarted process serves its share again",
        || async { share(&one.address) == Some(PARTITIONS as i64 / 2) },
    )
    .await;
    let back = t0.elapsed();
    caught_up(&a, &b, "the restarted process's backlog").await;
    eprintln!(
        "restarted under its instance id: its {} partitions back after {:.1} s, the backlog copied after {:.1} s (session timeout {} s)",
        PARTITIONS / 2,
        back.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        STATIC_SESSION.as_secs()
    );
    assert!(
        back < Duration::from_secs(10),
        "partitions back after {back:?}, not at once"
    );
    assert_eq!(
        rebalances(&two),
        two_rebalances,
        "the other process saw a rebalance"
    );
    assert_eq!(share(&two.address), Some(PARTITIONS as i64 / 2));

    stop.store(true, Ordering::Relaxed);
    let written = producer.await.unwrap();
    everything_copied(&a, &b).await;

    // A second live process under `two`'s id takes its place; the replaced one stops with an
    // error naming the key (the two would otherwise take turns).
    let mut two = two;
    let usurper = start_as(&config, &logs[3], Some("two"));
    let t1 = Instant::now();
    let status = loop {
        if let Some(status) = two.child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            t1.elapsed() < STATIC_SESSION,
            "the replaced process still runs after {:?}",
            t1.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "the replaced process stopped after {:.1} s: {status}",
        t1.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "a replaced process exits with an error");
    let log = std::fs::read_to_string(&logs[1]).unwrap();
    assert!(
        log.contains("kmirror.sharing.instance.id must differ in every process"),
        "the replaced process says why"
    );
    eventually(
        30,
        "the new process serves the replaced one's share",
        || async { share(&usurper.address) == Some(PARTITIONS as i64 / 2) },
    )
    .await;
    two.child.kill_9();
    for p in [one, usurper] {
        let status = p.child.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }
    let duplicates = audit(&b, written).await;
    let total = written * PARTITIONS as i64;
    eprintln!(
        "{total} records, none lost; {duplicates} copied twice across a kill -9 and a restart under the same id"
    );
    if std::env::var_os("KMIRROR_TEST_DUMP").is_some() {
        dump(&logs);
    }
}
