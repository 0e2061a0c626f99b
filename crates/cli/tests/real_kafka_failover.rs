//! Consumer failover with real Java consumers, kmirror next to MirrorMaker 2 on the same kind of
//! data: a group consumes part of a topic on A and commits; the replicator syncs the group's
//! translated offsets into B; a Java consumer started on B with that group continues from there.
//! Asserted: no record skipped (every offset from the group's position to the end is delivered,
//! none below the translation), and with kmirror none read again. Reported: how many records each
//! replicator makes the group read again.

use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::{Cluster, Mm2, Security};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 3;
const RECORDS: usize = 6000;
const CONSUMED: usize = 2500;

fn produce(c: &Cluster, topic: &str) {
    let input: String = (0..RECORDS)
        .map(|i| format!("k{}:v{i}\n", i % 97))
        .collect();
    let cfg = c.client_config(None);
    c.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            c.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--topic",
            topic,
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=:",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
}

/// A Java console consumer in `group` reading up to `max` records; (partition, offset) of each.
fn consume(c: &Cluster, topic: &str, group: &str, max: usize) -> Vec<(i32, i64)> {
    let cfg = c.client_config(None);
    let max = max.to_string();
    let out = c
        .tool_output(
            "console-consumer",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--command-config",
                cfg.to_str().unwrap(),
                "--topic",
                topic,
                "--group",
                group,
                "--from-beginning",
                "--max-messages",
                &max,
                "--timeout-ms",
                "15000",
                "--formatter-property",
                "print.partition=true",
                "--formatter-property",
                "print.offset=true",
            ],
            None,
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = None;
            let mut o = None;
            for field in l.split('\t') {
                if let Some(v) = field.strip_prefix("Partition:") {
                    p = v.parse().ok();
                }
                if let Some(v) = field.strip_prefix("Offset:") {
                    o = v.parse().ok();
                }
            }
            Some((p?, o?))
        })
        .collect()
}

async fn committed(k: &KafkaCluster, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    k.fetch_group_offsets(group)
        .await
        .unwrap_or_default()
        .get(topic)
        .map(|m| m.iter().map(|(p, c)| (*p, c.offset)).collect())
        .unwrap_or_default()
}

/// Waits for the group's offsets on B, starts a Java consumer there and checks what it reads.
/// Returns the number of records read again.
async fn fail_over(
    a: &KafkaCluster,
    b: &KafkaCluster,
    cb: &Cluster,
    topic: &str,
    group: &str,
    who: &str,
    log: impl Fn() -> String,
) -> i64 {
    let on_a = committed(a, group, topic).await;
    assert_eq!(on_a.len(), PARTITIONS as usize, "{group} on A: {on_a:?}");
    let remote = format!("A.{topic}");
    let t0 = Instant::now();
    let on_b = loop {
        let on_b = committed(b, group, &remote).await;
        if on_b.len() == on_a.len() {
            break on_b;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{who}: {group} not synced to B ({on_b:?}):\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        ends.insert(
            p,
            b.list_offset(&remote, p, LATEST, IsolationLevel::ReadCommitted)
                .await
                .unwrap(),
        );
    }
    let remaining: i64 = ends.iter().map(|(p, e)| e - on_b[p]).sum();
    let read = consume(cb, &remote, group, remaining as usize);
    let mut redelivered = 0;
    for p in 0..PARTITIONS {
        // A's offsets and B's coincide here (B's topic was created empty and copied whole).
        assert!(
            on_b[&p] <= on_a[&p],
            "{who}: {group}-{p} would skip records: B {} > A {}",
            on_b[&p],
            on_a[&p]
        );
        let got: Vec<i64> = read
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| *o)
            .collect();
        let want: Vec<i64> = (on_b[&p]..ends[&p]).collect();
        assert_eq!(
            got, want,
            "{who}: {remote}-{p} from the synced offset to the end"
        );
        redelivered += on_a[&p] - on_b[&p];
    }
    redelivered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_consumers_fail_over_without_skipping_kmirror_and_mm2() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("fo-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("fo-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    for t in ["pay", "pay2"] {
        ca.create_topic(t, PARTITIONS as u32).unwrap();
        produce(&ca, t);
        let read = consume(&ca, t, &format!("ledger-{t}"), CONSUMED);
        assert_eq!(read.len(), CONSUMED);
    }
    let dir = tempfile::tempdir().unwrap();
    let config = |topic: &str| {
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             A->B.topics = {topic}\nA->B.groups = ledger-{topic}\nB->A.enabled = false\n\
             emit.heartbeats.enabled = false\nsync.topic.acls.enabled = false\n\
             emit.checkpoints.interval.seconds = 1\nsync.group.offsets.enabled = true\n\
             sync.group.offsets.interval.seconds = 1\nreplication.factor = 1\n\
             offset.storage.replication.factor = 1\nconfig.storage.replication.factor = 1\n\
             status.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             heartbeats.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n\
             offset.flush.interval.ms = 1000\n",
            ca.bootstrap(),
            cb.bootstrap()
        )
    };

    // kmirror
    let path = dir.path().join("kmirror.properties");
    std::fs::write(&path, config("pay")).unwrap();
    let log_path = dir.path().join("kmirror.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["run", path.to_str().unwrap(), "--metrics-address", "off"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let kmirror_again = fail_over(&a, &b, &cb, "pay", "ledger-pay", "kmirror", || {
        std::fs::read_to_string(&log_path).unwrap_or_default()
    })
    .await;
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(run.wait().unwrap().success());

    // MirrorMaker 2
    let path = dir.path().join("mm2.properties");
    std::fs::write(&path, config("pay2")).unwrap();
    let mm2 = Mm2::start("mm2-failover", &path).unwrap();
    let mm2_again = fail_over(&a, &b, &cb, "pay2", "ledger-pay2", "MM2", || mm2.log()).await;
    mm2.stop();

    // kmirror copied the records around the group's position itself, so it knows where each
    // landed: the consumer on B resumes exactly at its next record.
    assert_eq!(kmirror_again, 0, "kmirror translates exactly");
    eprintln!(
        "failover of a group that read {CONSUMED} of {RECORDS} records ({PARTITIONS} partitions): \
         records read again on B: kmirror {kmirror_again}, MM2 {mm2_again}"
    );
}
