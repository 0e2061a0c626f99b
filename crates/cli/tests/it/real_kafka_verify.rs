//! `kmirror verify` against real clusters with authorizers: after `kmirror run` copied topics,
//! configs, ACLs and a group's checkpoints, verify exits 0 (with `--deep`); then each kind of
//! difference is introduced on its own topic (a topic not copied, a record missing on the target,
//! partitions added on the source, a config changed, an ACL added, a group that committed after
//! kmirror stopped) and verify names every one and exits 5; new data on the source alone is
//! "pending" (exit 6).

use kmirror_testkit::{Cluster, KillOnDrop, Security};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn jaas(c: &Cluster) -> String {
    format!(
        "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"{}\";",
        c.env("ADMIN_PASSWORD").unwrap_or("admin-secret")
    )
}

fn tool(c: &Cluster, name: &str, args: &[&str], input: Option<&str>) -> String {
    let cfg = c.client_config(None);
    let mut all = vec!["--bootstrap-server", c.bootstrap(), "--command-config"];
    all.push(cfg.to_str().unwrap());
    all.extend(args);
    c.tool(name, &all, input.map(str::as_bytes)).unwrap()
}

fn produce(c: &Cluster, topic: &str, n: usize) {
    let input: String = (0..n).map(|i| format!("{topic}-{i}\n")).collect();
    tool(c, "console-producer", &["--topic", topic], Some(&input));
}

fn consume(c: &Cluster, topic: &str, group: &str, n: usize) {
    let cfg = c.client_config(None);
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
                &n.to_string(),
                "--timeout-ms",
                "20000",
            ],
            None,
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn verify(config: &Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("verify")
        .arg(config)
        .args(["--format", "json"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// The failed rows as (check, subject, detail).
fn failed(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["rows"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|r| r["status"] == "failed")
                .map(|r| {
                    (
                        r["check"].as_str().unwrap_or_default().to_string(),
                        r["subject"].as_str().unwrap_or_default().to_string(),
                        r["detail"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_a_copy_and_names_each_difference() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("verify-a", Security::SaslAcl).unwrap());
        let b = s.spawn(|| Cluster::start("verify-b", Security::SaslAcl).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let topics = [
        "t-ok",
        "t-records",
        "t-parts",
        "t-config",
        "t-acl",
        "t-group",
    ];
    for t in topics {
        ca.create_topic(t, 2).unwrap();
        produce(&ca, t, 100);
    }
    tool(
        &ca,
        "acls",
        &[
            "--add",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "t-acl",
        ],
        None,
    );
    consume(&ca, "t-group", "g-trans", 100);
    // A topic written in transactions (as Kafka Streams with exactly-once writes): 50 records
    // committed, 30 aborted, 20 committed. Its 103 offsets hold 70 records a reader sees.
    ca.create_topic("t-txn", 1).unwrap();
    {
        use kmirror_kafka::txn::TransactionalProducer;
        let a = std::sync::Arc::new(
            kmirror_kafka::cluster::KafkaCluster::connect(ca.client_settings(None))
                .await
                .unwrap(),
        );
        let mut p = TransactionalProducer::init(a, "verify-txn", Duration::from_secs(60))
            .await
            .unwrap();
        // Current timestamps: older ones would fall to retention (7 days) on both sides.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for (from, n, commit) in [(0, 50, true), (50, 30, false), (80, 20, true)] {
            let records: Vec<_> = (0..n)
                .map(|i| kmirror_kafka::records::Record {
                    offset: i,
                    timestamp: now + from + i,
                    key: None,
                    value: Some(bytes::Bytes::from(format!("t-txn-{}", from + i))),
                    headers: vec![],
                })
                .collect();
            let batch = kmirror_kafka::records::encode_batch(
                &records,
                &kmirror_kafka::records::BatchOptions::default(),
            )
            .unwrap();
            p.send("t-txn", 0, &batch).await.unwrap();
            if commit {
                p.commit().await.unwrap();
            } else {
                p.abort().await.unwrap();
            }
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
             A.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = PLAIN\nA.sasl.jaas.config = {}\n\
             B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\nB.sasl.jaas.config = {}\n\
             A->B.enabled = true\nA->B.topics = t-.*\nA->B.groups = g-.*\n\
             refresh.topics.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\n\
             sync.topic.configs.interval.seconds = 1\nsync.topic.acls.interval.seconds = 1\n\
             emit.checkpoints.interval.seconds = 1\nemit.heartbeats.enabled = false\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\n\
             checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n",
            ca.bootstrap(),
            cb.bootstrap(),
            jaas(&ca),
            jaas(&cb)
        ),
    )
    .unwrap();
    let run = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(&config)
            .args(["--metrics-address", "127.0.0.1:0"]),
        &dir.path().join("kmirror.log"),
    );
    // verify itself tells when the copy is complete.
    let mut last = String::new();
    let t0 = Instant::now();
    loop {
        let (code, _, text) = verify(&config, &["--deep", "5"]);
        if code == 0 {
            last = text;
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "verify never passed; last output:\n{text}\n{last}"
        );
        last = text;
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(run);
    let (code, v, text) = verify(&config, &["--deep", "5"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(v["topics"], 7, "{last}");
    assert_eq!(v["partitions"], 13);

    let rows = v["rows"].as_array().unwrap();
    // The transactional topic passes by its records (70 on both sides), not its offsets.
    let txn = rows
        .iter()
        .find(|r| r["check"] == "records" && r["subject"] == "t-txn")
        .expect("a records row for t-txn");
    assert_eq!(txn["status"], "ok", "{txn}");
    let detail = txn["detail"].as_str().unwrap();
    assert!(
        detail.contains("source 70, target 70 (counted record by record)")
            && detail.contains("include 33 that are not records"),
        "{detail}"
    );
    let checks: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r["check"].as_str()).collect();
    for c in [
        "topic",
        "partitions",
        "records",
        "freshness",
        "configs",
        "acls",
        "group",
        "deep",
    ] {
        assert!(checks.contains(c), "no {c} row:\n{text}");
    }

    // Only new data on the source: pending, not a difference.
    produce(&ca, "t-ok", 10);
    let (code, _, text) = verify(&config, &["--topics", "t-ok"]);
    assert_eq!(code, 6, "{text}");

    // Every kind of difference, one per topic.
    ca.create_topic("t-missing", 1).unwrap();
    // The console producer's sticky partitioner may have put every record in one partition:
    // delete the first record of a partition that has some.
    let b = kmirror_kafka::cluster::KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let mut with_data = None;
    for p in 0..2 {
        let end = b
            .list_offset(
                "A.t-records",
                p,
                kmirror_kafka::cluster::LATEST,
                kmirror_kafka::IsolationLevel::ReadUncommitted,
            )
            .await
            .unwrap();
        if end >= 2 {
            with_data = Some(p);
        }
    }
    let p = with_data.expect("A.t-records has records");
    let offsets = dir.path().join("delete.json");
    std::fs::write(
        &offsets,
        format!(
            r#"{{"version":1,"partitions":[{{"topic":"A.t-records","partition":{p},"offset":1}}]}}"#
        ),
    )
    .unwrap();
    tool(
        &cb,
        "org.apache.kafka.tools.DeleteRecordsCommand",
        &["--offset-json-file", offsets.to_str().unwrap()],
        None,
    );
    tool(
        &ca,
        "topics",
        &["--alter", "--topic", "t-parts", "--partitions", "3"],
        None,
    );
    tool(
        &ca,
        "configs",
        &[
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "t-config",
            "--add-config",
            "retention.ms=123456",
        ],
        None,
    );
    tool(
        &ca,
        "acls",
        &[
            "--add",
            "--allow-principal",
            "User:bob",
            "--operation",
            "Read",
            "--topic",
            "t-acl",
        ],
        None,
    );
    consume(&ca, "t-group", "g-new", 50);

    let t0 = Instant::now();
    let found = loop {
        let (code, v, text) = verify(&config, &[]);
        let found = failed(&v);
        let ok = code == 5
            && [
                ("topic", "t-missing", "does not exist"),
                ("records", "t-records", "1 record(s) missing"),
                ("partitions", "t-parts", "3 on the source, 2 on A.t-parts"),
                ("configs", "t-config", "retention.ms: source 123456"),
                ("acls", "A topic ACLs", "User:bob on topic A.t-acl"),
                ("group", "g-new", "not translated"),
            ]
            .iter()
            .all(|(c, s, d)| {
                found
                    .iter()
                    .any(|(fc, fs, fd)| fc == c && fs == s && fd.contains(d))
            });
        if ok {
            break found;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "verify did not name every difference; failed rows: {found:#?}\n{text}"
        );
        last = text;
        std::thread::sleep(Duration::from_secs(1));
    };
    // Nothing else is reported as failed.
    assert_eq!(found.len(), 6, "{found:#?}\n{last}");
}
