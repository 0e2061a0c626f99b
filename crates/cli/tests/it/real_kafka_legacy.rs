//! MM1 mode (`kmirror legacy`) against real clusters:
//! - MM1's own command line, with SASL/PLAIN in both files, copies keyed records to the partition
//!   the Java producer picks (checked against the same keys written by the Java console
//!   producer into a control topic), from 100 source partitions into 50 target partitions,
//!   creates a missing target topic with the source's partition count, and loses nothing across
//!   `kill -9` and a restart;
//! - two processes with the same files split the partitions; a Java console consumer in the same
//!   group gets a consistent share; killing one process hands its partitions to the other
//!   within the session timeout; transforms filter, rename and change headers;
//! - `--abort.on.send.failure`: true stops the process on a refused record without committing
//!   past it; false logs, counts and skips it, and copies the records after it.
//! - `--rate.limit.bytes.per.second` and a 1 MiB `buffer.memory` bound the copy; SIGTERM with
//!   the target down exits within the request timeout, a restart with the target still down
//!   waits for it and copies what was left, a source restart loses nothing, and a start with
//!   the source down waits for it;
//! - `--loop.prevention`: two processes copying both ways under the same names leave out each
//!   other's copies.
//!
//! Why one file of this size: MM1 mode's real-cluster tests share the Java-tool and
//! config-file helpers at the top, and two of them the process's shared pair of clusters.

use kmirror_kafka::cluster::KafkaCluster;
use kmirror_testkit::{eventually, produce_keyed, read_partition, Cluster, KillOnDrop, Security};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The Prometheus text a running kmirror serves at `address`.
fn metrics_text(address: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(address).expect("the metrics endpoint answers");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

fn legacy(args: &[&str], log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("legacy")
            .args(args)
            .env("RUST_LOG", "info"),
        log,
    )
}

/// A Java client file for `user` plus `extra` lines (bootstrap, group...).
fn client_file(c: &Cluster, user: Option<&str>, extra: &str, path: &Path) -> PathBuf {
    let base = std::fs::read_to_string(c.client_config(user)).unwrap();
    std::fs::write(
        path,
        format!("bootstrap.servers={}\n{base}\n{extra}", c.bootstrap()),
    )
    .unwrap();
    path.to_path_buf()
}

/// key → partition, and every value, of a topic.
async fn layout(k: &KafkaCluster, topic: &str) -> (BTreeMap<String, BTreeSet<i32>>, Vec<String>) {
    k.refresh_metadata(Some(&[topic])).await.unwrap();
    let n = k.metadata().topics[topic].partitions.len() as i32;
    let mut keys: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let mut values = Vec::new();
    for p in 0..n {
        for (_, r) in read_partition(k, topic, p).await {
            if let Some(key) = &r.key {
                keys.entry(String::from_utf8_lossy(key).into_owned())
                    .or_default()
                    .insert(p);
            }
            values
                .push(String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned());
        }
    }
    (keys, values)
}

async fn total(k: &KafkaCluster, topic: &str) -> i64 {
    use kmirror_kafka::cluster::LATEST;
    if k.refresh_metadata(Some(&[topic])).await.is_err() {
        return 0;
    }
    let Some(t) = k.metadata().topics.get(topic).cloned() else {
        return 0;
    };
    let mut sum = 0;
    for p in &t.partitions {
        sum += k
            .list_offset(
                topic,
                p.partition,
                LATEST,
                kmirror_kafka::IsolationLevel::ReadUncommitted,
            )
            .await
            .unwrap_or(0);
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm1_command_line_with_sasl_keeps_javas_partitioning_and_survives_kill_9() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("mm1-a", Security::SaslPlain).unwrap());
        let b = s.spawn(|| Cluster::start("mm1-b", Security::SaslPlain).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("projects.alpha", 100).unwrap();
    ca.create_topic("projects.beta", 3).unwrap();
    ca.create_topic("other", 1).unwrap();
    cb.create_topic("projects.alpha", 50).unwrap();
    cb.create_topic("control", 50).unwrap();
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let consumer = client_file(
        &ca,
        Some("mm2"),
        "group.id=mm1-group\nauto.offset.reset=earliest\n",
        &dir.path().join("consumer.properties"),
    );
    let producer = client_file(
        &cb,
        Some("mm2"),
        "acks=all\ncompression.type=lz4\nbatch.size=65536\nlinger.ms=10\nretries=2147483647\n",
        &dir.path().join("producer.properties"),
    );
    let log = dir.path().join("kmirror.log");
    // The command line of a typical MM1 deployment, unchanged.
    let args = [
        "--consumer.config",
        consumer.to_str().unwrap(),
        "--producer.config",
        producer.to_str().unwrap(),
        "--whitelist",
        "projects.*",
        "--num.streams",
        "2",
        "--offset.commit.interval.ms",
        "5000",
    ];

    let first: Vec<String> = (0..3000).map(|i| format!("key-{}:v{i}", i % 700)).collect();
    produce_keyed(&ca, "projects.alpha", &first);
    produce_keyed(&ca, "projects.beta", &first[..300]);
    produce_keyed(&ca, "other", &first[..10]);

    let mut p = legacy(&args, &log);
    eventually(60, "some records copied", || async {
        total(&b, "projects.alpha").await >= 500
    })
    .await;
    p.kill_9();
    let second: Vec<String> = (3000..5000)
        .map(|i| format!("key-{}:v{i}", i % 700))
        .collect();
    produce_keyed(&ca, "projects.alpha", &second);
    let p = legacy(&args, &log);
    eventually(90, "every record copied after the restart", || async {
        let (_, values) = layout(&b, "projects.alpha").await;
        let have: BTreeSet<&String> = values.iter().collect();
        (0..5000).all(|i| have.contains(&format!("v{i}")))
    })
    .await;
    eventually(60, "projects.beta created and copied", || async {
        total(&b, "projects.beta").await >= 300
    })
    .await;
    let status = p.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status}:\n{text}");
    assert!(!text.contains("mm2-secret"), "a password reached the log");

    // Java's partitioner: the same keys, produced by the Java console producer into a control
    // topic with the target's partition count, land on the same partitions.
    produce_keyed(&cb, "control", &first[..700]);
    let (control, _) = layout(&b, "control").await;
    let (mirrored, values) = layout(&b, "projects.alpha").await;
    assert_eq!(control.len(), 700);
    for (key, parts) in &mirrored {
        assert_eq!(parts.len(), 1, "{key} is on several partitions: {parts:?}");
        assert_eq!(
            Some(parts),
            control.get(key),
            "{key}: kmirror and the Java producer disagree"
        );
    }
    let used: BTreeSet<i32> = mirrored.values().flatten().copied().collect();
    assert!(
        used.len() > 40,
        "keys spread over {} of 50 partitions",
        used.len()
    );
    let distinct: BTreeSet<&String> = values.iter().collect();
    println!(
        "MM1 mode: 5000 records from 100 into 50 partitions; {} copied, {} twice after kill -9",
        values.len(),
        values.len() - distinct.len()
    );

    // The producer file's compression.type is used for the target's batches.
    for p in 0..50 {
        for (codec, _) in read_partition(&b, "projects.alpha", p).await {
            assert_eq!(codec, kmirror_kafka::batch::Codec::Lz4, "partition {p}");
        }
    }

    // Missing target topics are created with the source's partition count; others not copied.
    b.refresh_metadata(None).await.unwrap();
    let md = b.metadata();
    assert_eq!(md.topics["projects.beta"].partitions.len(), 3);
    assert!(!md.topics.contains_key("other"));
    // Offsets were committed to the source group, up to the end.
    let committed = a.fetch_group_offsets("mm1-group").await.unwrap();
    let sum: i64 = committed["projects.alpha"].values().map(|c| c.offset).sum();
    assert_eq!(sum, 5000, "committed offsets reach the end after SIGTERM");
}

/// Rows of `kafka-consumer-groups --describe --members --verbose`: member → partitions.
fn members(c: &Cluster, group: &str) -> Vec<(String, BTreeSet<(String, i32)>)> {
    let cfg = c.client_config(None);
    let out = c
        .tool_output(
            "consumer-groups",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--command-config",
                cfg.to_str().unwrap(),
                "--describe",
                "--group",
                group,
                "--members",
                "--verbose",
            ],
            None,
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Fixed-width columns under a header; CLIENT-ID may be empty, so cut at the header's
    // positions. The assignment reads `topic:0,1,2` (Kafka 4.x) or `topic(0,1,2)` (3.x).
    let mut lines = text.lines().skip_while(|l| !l.starts_with("GROUP"));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || bytes[i - 1] == b' '))
        .collect();
    let names: Vec<&str> = header.split_whitespace().collect();
    let cell = |line: &str, name: &str| -> String {
        let Some(i) = names.iter().position(|n| *n == name) else {
            return String::new();
        };
        let end = starts
            .get(i + 1)
            .copied()
            .unwrap_or(line.len())
            .min(line.len());
        line.get(starts[i].min(end)..end)
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let assignment_col = if header.contains("CURRENT-ASSIGNMENT") {
        "CURRENT-ASSIGNMENT"
    } else {
        "ASSIGNMENT"
    };
    let mut rows = Vec::new();
    for line in lines.filter(|l| l.starts_with(group)) {
        let assignment = cell(line, assignment_col);
        let mut parts = BTreeSet::new();
        if assignment != "-" && !assignment.is_empty() {
            let (topic, list) = assignment
                .trim_end_matches(')')
                .split_once([':', '('])
                .unwrap();
            for p in list.split(',').filter(|p| !p.is_empty()) {
                parts.insert((topic.to_string(), p.parse().unwrap()));
            }
        }
        rows.push((cell(line, "CONSUMER-ID"), parts));
    }
    rows
}

fn consistent(rows: &[(String, BTreeSet<(String, i32)>)], all: usize) -> bool {
    let mut seen = BTreeSet::new();
    for (_, parts) in rows {
        if parts.is_empty() {
            return false;
        }
        for p in parts {
            if !seen.insert(p.clone()) {
                return false;
            }
        }
    }
    seen.len() == all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_group_with_a_java_consumer_and_hand_over_with_transforms() {
    let (ca, cb) = kmirror_testkit::shared_pair();
    ca.create_topic("shared", 6).unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let consumer = client_file(
        ca,
        None,
        "group.id=shared-group\nsession.timeout.ms=6000\nheartbeat.interval.ms=1000\n",
        &dir.path().join("consumer.properties"),
    );
    let producer = client_file(cb, None, "", &dir.path().join("producer.properties"));
    let transforms = dir.path().join("transforms.properties");
    std::fs::write(
        &transforms,
        "transforms = dropTest, strip, tag, rename\n\
         transforms.dropTest.type = Filter\n\
         transforms.dropTest.predicate = testKey\n\
         transforms.strip.type = DropHeaders\n\
         transforms.strip.headers = secret\n\
         transforms.tag.type = InsertHeader\n\
         transforms.tag.header = via\n\
         transforms.tag.value.literal = kmirror\n\
         transforms.rename.type = org.apache.kafka.connect.transforms.RegexRouter\n\
         transforms.rename.regex = (.*)\n\
         transforms.rename.replacement = $1.mirror\n\
         predicates = testKey\n\
         predicates.testKey.type = KeyMatches\n\
         predicates.testKey.pattern = test-.*\n",
    )
    .unwrap();
    let args = [
        "--consumer.config",
        consumer.to_str().unwrap(),
        "--producer.config",
        producer.to_str().unwrap(),
        "--include",
        "shared",
        "--transforms",
        transforms.to_str().unwrap(),
        "--metrics-address",
        "127.0.0.1:0",
    ];
    let lines: Vec<String> = (0..600)
        .map(|i| {
            if i % 10 == 0 {
                format!("test-{i}:v{i}")
            } else {
                format!("k{i}:v{i}")
            }
        })
        .collect();
    produce_keyed(ca, "shared", &lines);
    // One record with headers, from kmirror's own client (the console producer cannot).
    {
        use bytes::Bytes;
        use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
        let a = KafkaCluster::connect(ca.client_settings(None))
            .await
            .unwrap();
        let batch = encode_batch(
            &[Record {
                offset: 0,
                timestamp: kmirror_testkit::recent_ms(),
                key: Some(Bytes::from_static(b"with-headers")),
                value: Some(Bytes::from_static(b"h")),
                headers: vec![
                    (
                        Bytes::from_static(b"secret"),
                        Some(Bytes::from_static(b"s")),
                    ),
                    (Bytes::from_static(b"keep"), Some(Bytes::from_static(b"k"))),
                ],
            }],
            &BatchOptions::default(),
        )
        .unwrap();
        a.produce("shared", 0, &batch).await.unwrap();
    }

    let log1 = dir.path().join("kmirror-1.log");
    let log2 = dir.path().join("kmirror-2.log");
    let mut p1 = legacy(&args, &log1);
    let p2 = legacy(&args, &log2);
    eventually(60, "two kmirror members share the 6 partitions", || async {
        let rows = members(ca, "shared-group");
        rows.len() == 2 && consistent(&rows, 6)
    })
    .await;

    // A Java consumer joins the same group: three members, a consistent split.
    let mut java = ca
        .spawn_tool(
            "console-consumer",
            &[
                "--bootstrap-server",
                ca.bootstrap(),
                "--topic",
                "shared",
                "--group",
                "shared-group",
                "--timeout-ms",
                "120000",
                // It is killed below: the group notices after its session timeout (45 s by
                // default), which this only shortens.
                "--consumer-property",
                "session.timeout.ms=6000",
                "--consumer-property",
                "heartbeat.interval.ms=1000",
            ],
        )
        .unwrap();
    eventually(
        60,
        "kmirror and a Java consumer share the group",
        || async {
            let rows = members(ca, "shared-group");
            rows.len() == 3 && consistent(&rows, 6)
        },
    )
    .await;
    let _ = java.kill();
    let _ = java.wait();
    eventually(
        60,
        "the Java consumer's partitions return to kmirror",
        || async {
            let rows = members(ca, "shared-group");
            rows.len() == 2 && consistent(&rows, 6)
        },
    )
    .await;

    // kill -9 one process: the other owns every partition after the session timeout.
    p1.kill_9();
    let t0 = Instant::now();
    eventually(40, "the survivor owns all 6 partitions", || async {
        let rows = members(ca, "shared-group");
        rows.len() == 1 && consistent(&rows, 6)
    })
    .await;
    let handover = t0.elapsed();
    println!("handover after kill -9: {handover:?} (session.timeout.ms=6000)");
    // The session timeout plus a few of the Java tool's looks (1-2 s each, more on a loaded
    // machine); well below the 30 s metadata refresh or the 300 s max.poll.interval.ms that a
    // survivor waiting for the wrong event would show.
    assert!(
        handover < Duration::from_secs(6 + 14),
        "handover took {handover:?}"
    );

    let more: Vec<String> = (600..700).map(|i| format!("k{i}:v{i}")).collect();
    produce_keyed(ca, "shared", &more);
    let expected: BTreeSet<String> = (0..700)
        .filter(|i| i >= &600 || i % 10 != 0)
        .map(|i| format!("v{i}"))
        .chain(["h".to_string()])
        .collect();
    eventually(60, "every kept record on shared.mirror", || async {
        let (_, values) = layout(&b, "shared.mirror").await;
        let have: BTreeSet<String> = values.into_iter().collect();
        expected.is_subset(&have)
    })
    .await;
    let status = p2.terminate();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log2).unwrap()
    );

    // Transforms: test-* keys dropped, `secret` header removed, `via` added, topic renamed.
    b.refresh_metadata(None).await.unwrap();
    assert!(!b.metadata().topics.contains_key("shared"));
    assert_eq!(b.metadata().topics["shared.mirror"].partitions.len(), 6);
    let mut seen = 0;
    for p in 0..6 {
        for (_, r) in read_partition(&b, "shared.mirror", p).await {
            let key = String::from_utf8_lossy(r.key.as_deref().unwrap()).into_owned();
            assert!(!key.starts_with("test-"), "{key} should have been filtered");
            let names: Vec<&[u8]> = r.headers.iter().map(|(k, _)| &k[..]).collect();
            assert!(!names.contains(&&b"secret"[..]), "{key}: {names:?}");
            assert_eq!(names.last(), Some(&&b"via"[..]), "{key}: {names:?}");
            if key == "with-headers" {
                assert_eq!(names, [&b"keep"[..], b"via"]);
            }
            seen += 1;
        }
    }
    assert!(seen >= expected.len(), "{seen} records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_stops_or_is_skipped_as_abort_on_send_failure_says() {
    let (ca, cb) = kmirror_testkit::shared_pair();
    ca.create_topic("big", 1).unwrap();
    let cfg = cb.client_config(None);
    cb.tool(
        "topics",
        &[
            "--bootstrap-server",
            cb.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--create",
            "--topic",
            "big",
            "--partitions",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
        None,
    )
    .unwrap();
    let small =
        |from: usize| -> Vec<String> { (from..from + 5).map(|i| format!("k{i}:v{i}")).collect() };
    produce_keyed(ca, "big", &small(0));
    produce_keyed(ca, "big", &[format!("huge:{}", "x".repeat(5000))]);
    produce_keyed(ca, "big", &small(6));
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let consumer = client_file(
        ca,
        None,
        "group.id=big-group\n",
        &dir.path().join("c.properties"),
    );
    // One record per batch, so that only the refused record's batch fails.
    let producer = client_file(cb, None, "batch.size=1\n", &dir.path().join("p.properties"));
    let base = [
        "--consumer.config",
        consumer.to_str().unwrap(),
        "--producer.config",
        producer.to_str().unwrap(),
        "--whitelist",
        "big",
        "--offset.commit.interval.ms",
        "500",
        "--metrics-address",
        "127.0.0.1:0",
    ];

    // Default (true): the process stops, naming the partition; nothing past the record is
    // committed.
    let log = dir.path().join("abort.log");
    let mut p = legacy(&base, &log);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "kmirror did not stop"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("sending to big-0 failed"), "{text}");
    let committed = a.fetch_group_offsets("big-group").await.unwrap();
    let at = committed
        .get("big")
        .and_then(|m| m.get(&0))
        .map_or(0, |c| c.offset);
    assert!(at <= 5, "committed {at}, past the refused record at 5");

    // false: logged, counted, skipped; the records after it are copied; SIGTERM exits 0.
    let mut args = base.to_vec();
    args.extend(["--abort.on.send.failure", "false"]);
    let log = dir.path().join("continue.log");
    let p = legacy(&args, &log);
    eventually(60, "the records after the refused one copied", || async {
        let (_, values) = layout(&b, "big").await;
        (6..11).all(|i| values.contains(&format!("v{i}")))
    })
    .await;
    eventually(30, "offsets committed past the skipped record", || async {
        a.fetch_group_offsets("big-group")
            .await
            .ok()
            .and_then(|c| c.get("big").and_then(|m| m.get(&0)).map(|c| c.offset))
            == Some(11)
    })
    .await;
    let status = p.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{text}");
    assert!(
        text.contains("records skipped (--abort.on.send.failure false)"),
        "{text}"
    );
    let (_, values) = layout(&b, "big").await;
    assert!(
        values.iter().all(|v| v.len() < 100),
        "the huge record was not written"
    );
    assert!((0..5).all(|i| values.contains(&format!("v{i}"))));
}

/// MM1 mode on the shared fetcher: with a 1 MiB `buffer.memory` every record is copied; with
/// the target down, SIGTERM ends the process within the request timeout instead of the
/// delivery timeout, and after a restart nothing it had not committed is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_and_a_small_buffer_bound_the_copy_and_sigterm_with_the_target_down_exits_in_time(
) {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("mm1-stop-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("mm1-stop-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("load", 20).unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let consumer = client_file(
        &ca,
        None,
        "group.id=mm1-stop\nauto.offset.reset=earliest\n",
        &dir.path().join("consumer.properties"),
    );
    // A small memory bound, and a short request timeout to wait for at exit.
    let producer = client_file(
        &cb,
        None,
        "buffer.memory=1048576\nrequest.timeout.ms=5000\n",
        &dir.path().join("producer.properties"),
    );
    let log = dir.path().join("kmirror.log");
    let args = [
        "--consumer.config",
        consumer.to_str().unwrap(),
        "--producer.config",
        producer.to_str().unwrap(),
        "--whitelist",
        "load",
        "--offset.commit.interval.ms",
        "1000",
        "--rate.limit.bytes.per.second",
        "1000000",
        // Tests run in parallel: no fixed metrics port (the JSON log says which it got).
        "--metrics-address",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ];
    let pad = "x".repeat(200);
    let first: Vec<String> = (0..20_000)
        .map(|i| format!("key-{}:v{i}-{pad}", i % 997))
        .collect();
    produce_keyed(&ca, "load", &first);
    let t0 = Instant::now();
    let p = legacy(&args, &log);
    eventually(120, "every record copied under a 1 MiB buffer", || async {
        total(&b, "load").await >= 20_000
    })
    .await;
    // About 4.5 MB at 1 MB/s with one second of burst: at least 3.5 s, whatever the machine.
    let took = t0.elapsed();
    let metrics = metrics_text(&kmirror_testkit::logged_metrics_address(&log));
    let throttled =
        kmirror_mirror::metrics::sum_samples(&metrics, "kmirror_throttled_ms_total", &[]);
    let limit =
        kmirror_mirror::metrics::sum_samples(&metrics, "kmirror_rate_limit_bytes_per_second", &[]);
    eprintln!("20,000 records under a 1 MB/s limit and a 1 MiB buffer: {took:?}, {throttled} ms throttled");
    assert!(
        took > Duration::from_secs(3),
        "the rate limit held the copy back: {took:?}"
    );
    // Waiting is counted; a copy that a loaded machine slows below the limit waits less on it
    // (seen in CI: 38 ms of waiting in a copy of 20 s), so the bound scales with the speed.
    let expected_wait_ms = (4_500.0 - took.as_secs_f64() * 1_000.0 / 2.0).max(0.0);
    assert!(
        throttled > expected_wait_ms.min(1000.0) || took > Duration::from_secs(9),
        "time spent waiting for the limit is counted: {throttled} ms in {took:?}"
    );
    assert_eq!(limit, 1_000_000.0);

    // The target goes down; more records arrive; kmirror cannot deliver them.
    cb.pause().unwrap();
    let second: Vec<String> = (20_000..22_000)
        .map(|i| format!("key-{}:v{i}-{pad}", i % 997))
        .collect();
    produce_keyed(&ca, "load", &second);
    std::thread::sleep(Duration::from_secs(3));
    let t0 = Instant::now();
    let status = p.terminate();
    let took = t0.elapsed();
    let text = std::fs::read_to_string(&log).unwrap();
    eprintln!("SIGTERM with the target down: exited in {took:?}");
    assert!(status.success(), "exit {status}:\n{text}");
    assert!(
        took < Duration::from_secs(5 + 10),
        "SIGTERM with the target down took {took:?} (request timeout 5 s):\n{text}"
    );

    // Started again while the target is still down, kmirror waits for it (backing off, as MM2
    // mode does) instead of giving up; once the target is back it copies what the stopped
    // process had not committed.
    let log = dir.path().join("kmirror-again.log");
    let mut p = legacy(&args, &log);
    eventually(
        60,
        "the target reported unreachable and retried",
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains("cannot reach cluster; retrying"))
                .any(|l| l.contains(r#""cluster":"target""#))
        },
    )
    .await;
    assert!(
        matches!(p.0.try_wait(), Ok(None)),
        "MM1 mode gave up on a target down at start:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    cb.restart().unwrap();
    eventually(120, "every record copied after the restart", || async {
        let (_, values) = layout(&b, "load").await;
        let have: BTreeSet<String> = values
            .iter()
            .map(|v| v.split('-').next().unwrap_or_default().to_string())
            .collect();
        (0..22_000).all(|i| have.contains(&format!("v{i}")))
    })
    .await;

    // The source restarts while more records arrive: nothing is lost (records after the last
    // commit may come twice, at-least-once).
    let third: Vec<String> = (22_000..24_000)
        .map(|i| format!("key-{}:v{i}-{pad}", i % 997))
        .collect();
    produce_keyed(&ca, "load", &third[..1_000]);
    ca.restart().unwrap();
    produce_keyed(&ca, "load", &third[1_000..]);
    eventually(
        120,
        "every record copied across a source restart",
        || async {
            let (_, values) = layout(&b, "load").await;
            let have: BTreeSet<String> = values
                .iter()
                .map(|v| v.split('-').next().unwrap_or_default().to_string())
                .collect();
            (0..24_000).all(|i| have.contains(&format!("v{i}")))
        },
    )
    .await;
    assert!(
        matches!(p.0.try_wait(), Ok(None)),
        "MM1 mode stopped on a source restart:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Started while the source is down for a minute, kmirror waits (MM1 mode once gave up
    // after 30 s) and copies once the source is back.
    assert!(p.terminate().success());
    ca.pause().unwrap();
    let log = dir.path().join("kmirror-source-down.log");
    let t0 = Instant::now();
    let mut p = legacy(&args, &log);
    eventually(
        60,
        "the source reported unreachable and retried",
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains("cannot reach cluster; retrying"))
                .any(|l| l.contains(r#""cluster":"source""#))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(t0.elapsed())).await;
    assert!(
        matches!(p.0.try_wait(), Ok(None)),
        "MM1 mode gave up on a source down at start after {:?}:\n{}",
        t0.elapsed(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    ca.restart().unwrap();
    let fourth: Vec<String> = (24_000..25_000)
        .map(|i| format!("key-{}:v{i}-{pad}", i % 997))
        .collect();
    produce_keyed(&ca, "load", &fourth);
    eventually(
        120,
        "every record copied after the source came up",
        || async {
            let (_, values) = layout(&b, "load").await;
            let have: BTreeSet<String> = values
                .iter()
                .map(|v| v.split('-').next().unwrap_or_default().to_string())
                .collect();
            (0..25_000).all(|i| have.contains(&format!("v{i}")))
        },
    )
    .await;
    drop(p);
}

/// Two MM1 processes copying both ways under the same topic names: with `--loop.prevention`
/// each leaves out what the other copied into its source, so every record is on both sides
/// once and nothing circulates (without it, each record would go back and forth for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_copying_both_ways_under_the_same_names_leave_out_each_others_copies() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("mm1-loop-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("mm1-loop-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("both", 3).unwrap();
    cb.create_topic("both", 3).unwrap();
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file =
        |c: &Cluster, extra: &str, name: &str| client_file(c, None, extra, &dir.path().join(name));
    let start = |consumer: &Path, producer: &Path, log: &Path| {
        legacy(
            &[
                "--consumer.config",
                consumer.to_str().unwrap(),
                "--producer.config",
                producer.to_str().unwrap(),
                "--whitelist",
                "both",
                "--offset.commit.interval.ms",
                "1000",
                "--loop.prevention",
                "true",
                "--metrics-address",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ],
            log,
        )
    };
    let group = "auto.offset.reset=earliest\ngroup.id=";
    let (log_ab, log_ba) = (dir.path().join("ab.log"), dir.path().join("ba.log"));
    let _ab = start(
        &file(&ca, &format!("{group}mm1-ab\n"), "ab-consumer.properties"),
        &file(&cb, "", "ab-producer.properties"),
        &log_ab,
    );
    let _ba = start(
        &file(&cb, &format!("{group}mm1-ba\n"), "ba-consumer.properties"),
        &file(&ca, "", "ba-producer.properties"),
        &log_ba,
    );
    let on_a: Vec<String> = (0..200)
        .map(|i| format!("a{}:from-a-{i}", i % 17))
        .collect();
    let on_b: Vec<String> = (0..100)
        .map(|i| format!("b{}:from-b-{i}", i % 13))
        .collect();
    produce_keyed(&ca, "both", &on_a);
    produce_keyed(&cb, "both", &on_b);
    eventually(120, "each side holds both sides' records", || async {
        total(&a, "both").await >= 300 && total(&b, "both").await >= 300
    })
    .await;
    // Nothing circulates: well after both copies are done, each side still holds 300.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(total(&a, "both").await, 300, "records copied back into A");
    assert_eq!(total(&b, "both").await, 300, "records copied back into B");
    let skipped = |log: &Path| {
        let text = metrics_text(&kmirror_testkit::logged_metrics_address(log));
        kmirror_mirror::metrics::sum_samples(&text, "kmirror_loop_records_skipped_total", &[])
    };
    // Each process left out exactly what the other copied into its source.
    assert_eq!(
        skipped(&log_ab),
        100.0,
        "A->B leaves out B's records copied into A"
    );
    assert_eq!(
        skipped(&log_ba),
        200.0,
        "B->A leaves out A's records copied into B"
    );
}
