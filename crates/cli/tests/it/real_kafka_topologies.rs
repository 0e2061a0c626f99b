//! Topologies beyond one pair, with MM2's default replication policy, in one
//! `kmirror run` process: many clusters into one (A->C and B->C) and a chain (A->B->C, so A's
//! `orders` reaches C as `B.A.orders`). Every record reaches C under its path's name, in order; a
//! consumer group's position on A is checkpointed and synced at each hop and lands on B and on C
//! (both ways in) at the same offset, since each remote topic was copied whole; `kmirror verify`
//! passes for every flow. Then the fan-in again with each flow in a process of its own, each
//! with its own file: neither disturbs the other on the shared target.

use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::KafkaCluster;
use kmirror_testkit::{eventually, produce_keyed, read_partition, Cluster, KillOnDrop, Security};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

const PARTITIONS: i32 = 3;

async fn connect(c: &Cluster) -> KafkaCluster {
    KafkaCluster::connect(c.client_settings(None))
        .await
        .unwrap()
}

/// The values of a topic, per partition, in order.
async fn values(k: &KafkaCluster, topic: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        out.push(
            read_partition(k, topic, p)
                .await
                .iter()
                .map(|(_, r)| {
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
                })
                .collect(),
        );
    }
    out
}

async fn committed(k: &KafkaCluster, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    k.fetch_group_offsets(group)
        .await
        .unwrap_or_default()
        .get(topic)
        .map(|m| m.iter().map(|(p, o)| (*p, o.offset)).collect())
        .unwrap_or_default()
}

/// Waits until `topic` on `k` holds exactly `want`, per partition, in order.
async fn arrives(k: &KafkaCluster, topic: &str, want: &[Vec<String>]) {
    eventually(90, &format!("{topic} complete"), || async {
        let _ = k.refresh_metadata(None).await;
        values(k, topic).await == want
    })
    .await;
}

/// Waits until `group` is committed on `k` for `topic` at exactly `want`.
async fn lands(k: &KafkaCluster, group: &str, topic: &str, want: &BTreeMap<i32, i64>) {
    eventually(90, &format!("{group}'s position on {topic}"), || async {
        committed(k, group, topic).await == *want
    })
    .await;
}

/// `kmirror plan` of a configuration: what it prints, warnings included.
fn plan(config: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("plan")
        .arg(config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "plan:\n{text}");
    text
}

/// An MM2 file for clusters A, B and C with these flows, every interval short.
fn properties(ca: &Cluster, cb: &Cluster, cc: &Cluster, flows: &[&str]) -> String {
    let enabled: String = flows
        .iter()
        .map(|f| format!("{f}.enabled = true\n"))
        .collect();
    format!(
        "clusters = A, B, C\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nC.bootstrap.servers = {}\n\
         {enabled}topics = .*orders\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\nsync.group.offsets.enabled = true\n\
         sync.group.offsets.interval.seconds = 1\n",
        ca.bootstrap(),
        cb.bootstrap(),
        cc.bootstrap()
    )
}

/// Three clusters; `orders` (3 partitions) on A with 900 records and on B with 600.
async fn three_clusters(
    name: &str,
) -> (
    Cluster,
    Cluster,
    Cluster,
    KafkaCluster,
    KafkaCluster,
    KafkaCluster,
) {
    let (ca, cb, cc) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start(&format!("{name}-a"), Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start(&format!("{name}-b"), Security::Plaintext).unwrap());
        let c = s.spawn(|| Cluster::start(&format!("{name}-c"), Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    let (a, b, c) = (connect(&ca).await, connect(&cb).await, connect(&cc).await);
    for (cluster, n, name) in [(&ca, 900, "a"), (&cb, 600, "b")] {
        cluster.create_topic("orders", PARTITIONS as u32).unwrap();
        let lines: Vec<String> = (0..n).map(|i| format!("k{i}:{name}-{i}")).collect();
        produce_keyed(cluster, "orders", &lines);
    }
    (ca, cb, cc, a, b, c)
}

/// Commits `group` on `k` at half of each partition of `orders`; returns the offsets.
async fn half_read(k: &KafkaCluster, group: &str) -> BTreeMap<i32, i64> {
    let mut position = BTreeMap::new();
    for p in 0..PARTITIONS {
        let end = k
            .list_offset(
                "orders",
                p,
                kmirror_kafka::cluster::LATEST,
                kmirror_kafka::IsolationLevel::ReadUncommitted,
            )
            .await
            .unwrap();
        position.insert(
            p,
            CommittedOffset {
                offset: end / 2,
                leader_epoch: -1,
                metadata: String::new(),
            },
        );
    }
    k.commit_group_offsets(
        group,
        &BTreeMap::from([("orders".to_string(), position.clone())]),
    )
    .await
    .unwrap();
    position.iter().map(|(p, o)| (*p, o.offset)).collect()
}

fn run(config: &std::path::Path, log: &std::path::Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "off"])
            .stdin(Stdio::null()),
        log,
    )
}

/// `kmirror verify` of a configuration passes; returns the (flow, source topic) pairs checked.
fn verified(config: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("verify")
        .arg(config)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "verify passes: {report:#}");
    let mut checked: Vec<(String, String)> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["check"] == "topic")
        .map(|r| {
            (
                r["flow"].as_str().unwrap().to_string(),
                r["subject"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    checked.sort();
    checked.dedup();
    checked
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clusters_into_one_and_a_chain_in_one_process() {
    let (ca, cb, cc, a, b, c) = three_clusters("topo").await;
    // A group that read part of A's orders: its position must reach B and C.
    let want = half_read(&a, "billing").await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        properties(&ca, &cb, &cc, &["A->B", "B->C", "A->C"]),
    )
    .unwrap();
    let text = plan(&config);
    for flow in ["Flow A->B", "Flow B->C", "Flow A->C"] {
        assert!(text.contains(flow), "plan shows {flow}:\n{text}");
    }
    let run = run(&config, &dir.path().join("kmirror.log"));

    // Every record under its path's name on C, in order: A's directly and through B.
    let from_a = values(&a, "orders").await;
    let from_b = values(&b, "orders").await;
    for (k, topic, want) in [
        (&b, "A.orders", &from_a),
        (&c, "A.orders", &from_a),
        (&c, "B.orders", &from_b),
        (&c, "B.A.orders", &from_a),
    ] {
        arrives(k, topic, want).await;
    }
    // The group's position, hop by hop: A->B syncs it to B (A.orders); B->C checkpoints and
    // syncs B's position to C (B.A.orders); A->C syncs it to C directly (A.orders).
    for (k, topic) in [(&b, "A.orders"), (&c, "A.orders"), (&c, "B.A.orders")] {
        lands(k, "billing", topic, &want).await;
    }
    assert!(
        committed(&c, "billing", "B.orders").await.is_empty(),
        "billing never read B's own orders"
    );
    let status = run.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");

    assert_eq!(
        verified(&config),
        pairs(&[
            ("A->B", "orders"),
            ("A->C", "orders"),
            ("B->C", "A.orders"),
            ("B->C", "orders"),
        ]),
        "verify checked every topic of every flow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clusters_into_one_from_separate_processes() {
    let (ca, cb, cc, a, b, c) = three_clusters("fanin").await;
    let billing = half_read(&a, "billing").await;
    let shipping = half_read(&b, "shipping").await;
    let dir = tempfile::tempdir().unwrap();
    let (from_a, from_b) = (
        dir.path().join("a-c.properties"),
        dir.path().join("b-c.properties"),
    );
    std::fs::write(&from_a, properties(&ca, &cb, &cc, &["A->C"])).unwrap();
    std::fs::write(&from_b, properties(&ca, &cb, &cc, &["B->C"])).unwrap();
    let runs = [
        run(&from_a, &dir.path().join("a-c.log")),
        run(&from_b, &dir.path().join("b-c.log")),
    ];
    let (va, vb) = (values(&a, "orders").await, values(&b, "orders").await);
    for (topic, want) in [("A.orders", &va), ("B.orders", &vb)] {
        arrives(&c, topic, want).await;
    }
    for (group, topic, want) in [
        ("billing", "A.orders", &billing),
        ("shipping", "B.orders", &shipping),
    ] {
        lands(&c, group, topic, want).await;
    }
    for r in runs {
        let status = r.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
    }
    assert_eq!(verified(&from_a), pairs(&[("A->C", "orders")]));
    assert_eq!(verified(&from_b), pairs(&[("B->C", "orders")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_fan_in_never_mixes_two_sources_in_one_topic() {
    let (ca, cb, cc, a, b, c) = three_clusters("idfan").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        properties(&ca, &cb, &cc, &["A->C", "B->C"])
            + "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n",
    )
    .unwrap();
    let text = plan(&config);
    assert!(
        text.contains("flows A->C and B->C both copy into C with IdentityReplicationPolicy"),
        "plan warns:\n{text}"
    );
    let log = dir.path().join("kmirror.log");
    let run = run(&config, &log);
    // Both sources have `orders`: one flow copies it into C's `orders`, the other refuses.
    let (va, vb) = (values(&a, "orders").await, values(&b, "orders").await);
    eventually(90, "one source's orders complete on C", || async {
        let _ = c.refresh_metadata(None).await;
        let vc = values(&c, "orders").await;
        vc == va || vc == vb
    })
    .await;
    eventually(30, "the other flow says why it skips orders", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("remote topic orders on C is written by flow")
    })
    .await;
    // A few refreshes later C still holds one source's records only.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let vc = values(&c, "orders").await;
    assert!(vc == va || vc == vb, "C's orders mixes both sources");
    let status = run.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_fan_in_with_a_rename_takes_both_sources_in() {
    let (ca, cb, cc, a, b, c) = three_clusters("idren").await;
    let billing = half_read(&a, "billing").await;
    let shipping = half_read(&b, "shipping").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        properties(&ca, &cb, &cc, &["A->C", "B->C"])
            + "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n\
               B->C.kmirror.topics.rename = orders:orders-from-b\n",
    )
    .unwrap();
    let text = plan(&config);
    assert!(
        text.contains("renamed (kmirror.topics.rename): 'orders' becomes 'orders-from-b'"),
        "plan shows the rename:\n{text}"
    );
    let run = run(&config, &dir.path().join("kmirror.log"));
    let (va, vb) = (values(&a, "orders").await, values(&b, "orders").await);
    for (topic, want) in [("orders", &va), ("orders-from-b", &vb)] {
        arrives(&c, topic, want).await;
    }
    // Checkpoints and the group offset sync follow the rename.
    for (group, topic, want) in [
        ("billing", "orders", &billing),
        ("shipping", "orders-from-b", &shipping),
    ] {
        lands(&c, group, topic, want).await;
    }
    let status = run.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert_eq!(
        verified(&config),
        pairs(&[("A->C", "orders"), ("B->C", "orders")]),
        "verify compares B's orders with C's orders-from-b"
    );
}
