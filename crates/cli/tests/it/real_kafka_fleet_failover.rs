//! A fleet failover (docs/failover.md "Many groups at once"): 200 consumer groups on A,
//! each at its own position in `payments`; kmirror copies A->B with checkpoints; two of the
//! groups already have consumers running on B. `kmirror offsets apply --groups 'fleet-.*'`
//! refuses and commits nothing; with `--skip-active` it moves the other 198 exactly (each group
//! lands on B at the offsets it had on A: the remote topic was copied whole) and lists the two,
//! with exit code 3. The commands' output and times are printed for the docs.

use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_testkit::{eventually, produce_keyed, Cluster, KillOnDrop, Security};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Instant;

const GROUPS: usize = 200;
const PARTITIONS: i32 = 3;

fn group(i: usize) -> String {
    format!("fleet-{i:03}")
}

/// Group i's position on A: partition p at (i * 7 + p * 13) % 900.
fn position(i: usize, p: i32) -> i64 {
    ((i as i64) * 7 + (p as i64) * 13) % 900
}

fn offsets(cfg: &std::path::Path, extra: &[&str]) -> (i32, String, String, f64) {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("offsets")
        .args(extra)
        .arg(cfg)
        .args(["--source", "A", "--target", "B", "--groups", "fleet-.*"])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed().as_secs_f64(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_groups_fail_over_at_once_and_active_ones_are_listed() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("fleet-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("fleet-b", Security::Plaintext).unwrap());
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
            name: "payments".into(),
            partitions: PARTITIONS,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let lines: Vec<String> = (0..3000).map(|i| format!("k{i}:v{i}")).collect();
    produce_keyed(&ca, "payments", &lines);
    for i in 0..GROUPS {
        let mut parts = BTreeMap::new();
        for p in 0..PARTITIONS {
            parts.insert(
                p,
                CommittedOffset {
                    offset: position(i, p),
                    leader_epoch: -1,
                    metadata: String::new(),
                },
            );
        }
        a.commit_group_offsets(
            &group(i),
            &BTreeMap::from([("payments".to_string(), parts)]),
        )
        .await
        .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mm2.properties");
    std::fs::write(
        &cfg,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = payments\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
             refresh.topics.interval.seconds = 1\nrefresh.groups.interval.seconds = 1\nemit.checkpoints.interval.seconds = 1\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let run = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(&cfg)
            .args(["--metrics-address", "off"])
            .stdin(Stdio::null()),
        &dir.path().join("kmirror.log"),
    );
    // Every group checkpointed on B.
    eventually(120, "checkpoints for all 200 groups", || async {
        let (code, stdout, _, _) = offsets(&cfg, &["translate", "--format", "json"]);
        code == 0
            && serde_json::from_str::<Vec<serde_json::Value>>(&stdout)
                .map(|rows| rows.len() == GROUPS * PARTITIONS as usize)
                .unwrap_or(false)
    })
    .await;
    let status = run.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");

    // Two groups whose consumers already run on B.
    let cfg_b = cb.client_config(None);
    let mut members = Vec::new();
    for g in ["fleet-007", "fleet-042"] {
        members.push(KillGuard(
            cb.spawn_tool(
                "console-consumer",
                &[
                    "--bootstrap-server",
                    cb.bootstrap(),
                    "--command-config",
                    cfg_b.to_str().unwrap(),
                    "--topic",
                    "A.payments",
                    "--group",
                    g,
                ],
            )
            .unwrap(),
        ));
    }
    eventually(60, "the two groups active on B", || async {
        let mut n = 0;
        for g in ["fleet-007", "fleet-042"] {
            if b.describe_group(g).await.map(|d| d.members).unwrap_or(0) > 0 {
                n += 1;
            }
        }
        n == 2
    })
    .await;

    let (code, _, stderr, _) = offsets(&cfg, &["apply"]);
    assert_ne!(code, 0, "one active group refuses them all:\n{stderr}");
    assert!(
        stderr.contains("group 'fleet-007' has 1 active member(s)")
            && stderr.contains("group 'fleet-042' has 1 active member(s)")
            && stderr.contains("nothing was committed"),
        "{stderr}"
    );
    assert!(b.fetch_group_offsets("fleet-001").await.unwrap().is_empty());

    let (code, stdout, stderr, secs) = offsets(&cfg, &["apply", "--skip-active"]);
    assert_eq!(code, 7, "some groups refused:\n{stderr}");
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_default();
    assert!(
        summary.starts_with("summary: 200 group(s) with checkpoints; 198 moved (594 partition offsets), 0 already there, 2 refused (active members on B): fleet-007 (1 members, Stable), fleet-042 (1 members, Stable)"),
        "{stderr}"
    );
    for i in (0..GROUPS).filter(|i| *i != 7 && *i != 42) {
        let committed = b.fetch_group_offsets(&group(i)).await.unwrap();
        let got: BTreeMap<i32, i64> = committed["A.payments"]
            .iter()
            .map(|(p, o)| (*p, o.offset))
            .collect();
        let want: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, position(i, p))).collect();
        assert_eq!(got, want, "{} lands where it was on A", group(i));
    }
    let table_lines = stdout.lines().count();
    eprintln!(
        "fleet failover: {table_lines} table lines, {secs:.1} s for apply --skip-active\n{}\n...\n{summary}",
        stdout.lines().take(8).collect::<Vec<_>>().join("\n")
    );
}

struct KillGuard(std::process::Child);

impl Drop for KillGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
