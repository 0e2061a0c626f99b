//! Consumer-group migration against real clusters: `kmirror run` writes offset syncs (MM2 format,
//! on the source) and checkpoints (on the target); a group at a batch boundary translates
//! exactly, and so does one inside a batch (from what this process copied); the group offset sync
//! leaves groups with active members on the target alone (and says so), and commits
//! translations into the target without rewinding an offset the target holds; `kmirror offsets
//! translate` prints them (as Java's RemoteClusterUtils.translateOffsets does), and `offsets apply` refuses while the group has active members on the
//! target and commits once they are gone; failback (B->A) moves groups that read `A.orders` on
//! B back to `orders` on A.

use bytes::Bytes;
use kmirror_kafka::admin::CommittedOffset;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::group::consumer_protocol::RangeAssignor;
use kmirror_kafka::group::{GroupConfig, GroupMember};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_mirror::wire::internal::{Checkpoint, OffsetSync};
use kmirror_testkit::{eventually, read_partition, Cluster, Security};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn offsets(parts: &[(&str, i32, i64)]) -> BTreeMap<String, BTreeMap<i32, CommittedOffset>> {
    let mut m: BTreeMap<String, BTreeMap<i32, CommittedOffset>> = BTreeMap::new();
    for (t, p, o) in parts {
        m.entry(t.to_string()).or_default().insert(
            *p,
            CommittedOffset {
                offset: *o,
                leader_epoch: -1,
                metadata: String::new(),
            },
        );
    }
    m
}

async fn committed(k: &KafkaCluster, group: &str, topic: &str, p: i32) -> Option<i64> {
    k.fetch_group_offsets(group)
        .await
        .ok()?
        .get(topic)?
        .get(&p)
        .map(|c| c.offset)
}

fn kmirror(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_group_sync_and_failover_commands() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("offs-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("offs-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = Arc::new(
        KafkaCluster::connect(ca.client_settings(None))
            .await
            .unwrap(),
    );
    let b = Arc::new(
        KafkaCluster::connect(cb.client_settings(None))
            .await
            .unwrap(),
    );
    a.create_topics(
        &[NewTopic {
            name: "orders".into(),
            partitions: 2,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let _ = a.refresh_metadata(None).await;
    // Ten batches of 100 records per partition: batch boundaries at multiples of 100.
    for p in 0..2 {
        for batch in 0..10i64 {
            let records: Vec<Record> = (0..100)
                .map(|i| Record {
                    offset: i,
                    timestamp: kmirror_testkit::recent_ms(),
                    key: None,
                    value: Some(Bytes::from(format!("{p}-{}", batch * 100 + i))),
                    headers: vec![],
                })
                .collect();
            a.produce(
                "orders",
                p,
                &encode_batch(&records, &BatchOptions::default()).unwrap(),
            )
            .await
            .unwrap();
        }
    }
    // Consumer groups on A: billing at a batch boundary (p0) and inside a batch (p1); the
    // target already holds a later offset for billing's p1; console-consumer-* is excluded by
    // MM2's default groups.exclude.
    a.commit_group_offsets(
        "billing",
        &offsets(&[("orders", 0, 300), ("orders", 1, 250)]),
    )
    .await
    .unwrap();
    a.commit_group_offsets("console-consumer-1", &offsets(&[("orders", 0, 100)]))
        .await
        .unwrap();
    b.create_topics(
        &[NewTopic {
            name: "A.orders".into(),
            partitions: 2,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let _ = b.refresh_metadata(None).await;
    b.commit_group_offsets("billing", &offsets(&[("A.orders", 1, 900)]))
        .await
        .unwrap();

    // A group that is consuming on B (an active member) while kmirror syncs: never touched.
    a.commit_group_offsets("watched", &offsets(&[("orders", 0, 100)]))
        .await
        .unwrap();
    let watcher = GroupMember::join(
        b.clone(),
        GroupConfig {
            group_id: "watched".into(),
            protocol_type: "consumer".into(),
            session_timeout: Duration::from_secs(45),
            rebalance_timeout: Duration::from_secs(45),
            instance_id: None,
        },
        Arc::new(RangeAssignor {
            topics: vec!["A.orders".into()],
            partition_counts: [("A.orders".to_string(), 2)].into(),
        }),
    )
    .await
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\n\
             emit.heartbeats.enabled = false\nemit.checkpoints.interval.seconds = 1\n\
             sync.group.offsets.enabled = true\nsync.group.offsets.interval.seconds = 1\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\n\
             checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("kmirror.log")).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["run", config.to_str().unwrap(), "--metrics-address", "off"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();

    // The group offset sync commits the translations into B.
    eventually(60, "billing synced on B", || async {
        committed(&b, "billing", "A.orders", 0).await == Some(300)
    })
    .await;
    // Exact at a batch boundary and inside a batch (this process copied the records around both
    // positions, so it knows them one for one).
    let checkpoints: Vec<Checkpoint> = read_partition(&b, "A.checkpoints.internal", 0)
        .await
        .iter()
        .filter_map(|(_, r)| Checkpoint::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
        .collect();
    let find = |p: i32| {
        checkpoints
            .iter()
            .rfind(|c| c.group == "billing" && c.topic == "A.orders" && c.partition == p)
            .map(|c| (c.upstream_offset, c.downstream_offset))
    };
    assert_eq!(find(0), Some((300, 300)));
    assert_eq!(find(1), Some((250, 250)));
    assert!(
        !checkpoints
            .iter()
            .any(|c| c.group.starts_with("console-consumer")),
        "excluded group"
    );
    assert_eq!(
        committed(&b, "billing", "A.orders", 1).await,
        Some(900),
        "an offset the target holds past the translation is never rewound"
    );
    assert!(
        checkpoints.iter().any(|c| c.group == "watched"),
        "the active group is checkpointed"
    );
    assert_eq!(
        committed(&b, "watched", "A.orders", 0).await,
        None,
        "a group with active members on the target is not touched"
    );
    let log_text = std::fs::read_to_string(dir.path().join("kmirror.log")).unwrap();
    assert!(
        log_text.contains("group=\"watched\"")
            && log_text.contains("1 active member(s) on the target"),
        "the skip is reported: {log_text}"
    );
    watcher.leave().await.unwrap();
    // Offset syncs in MM2's format on the source.
    let syncs: Vec<OffsetSync> = read_partition(&a, "mm2-offset-syncs.B.internal", 0)
        .await
        .iter()
        .filter_map(|(_, r)| OffsetSync::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
        .collect();
    for p in 0..2 {
        let ups: Vec<i64> = syncs
            .iter()
            .filter(|s| s.topic == "orders" && s.partition == p)
            .map(|s| s.upstream_offset)
            .collect();
        // The run's start, its end, and never more than offset.lag.max (100) records apart
        // (the ten small source batches may reach the target merged into one).
        assert!(ups.contains(&0) && ups.contains(&999), "{ups:?}");
        assert!(ups.windows(2).all(|w| w[1] - w[0] <= 100), "{ups:?}");
        assert!(syncs
            .iter()
            .all(|s| s.upstream_offset == s.downstream_offset));
    }

    // The group moves on upstream: the checkpoint follows.
    a.commit_group_offsets("billing", &offsets(&[("orders", 0, 700)]))
        .await
        .unwrap();
    eventually(30, "billing p0 at 700 on B", || async {
        committed(&b, "billing", "A.orders", 0).await == Some(700)
    })
    .await;
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(run.wait().unwrap().success());

    // The failover commands read the checkpoints (also written by MM2, in the same format).
    let cfg = config.to_str().unwrap();
    let out = kmirror(&[
        "offsets",
        "translate",
        cfg,
        "--source",
        "A",
        "--target",
        "B",
        "--group",
        "billing",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["topic"], "A.orders");
    assert_eq!(rows[0]["translated_offset"], 700);
    assert_eq!(rows[0]["action"], "same");
    assert_eq!(rows[1]["translated_offset"], 250);
    assert_eq!(rows[1]["target_offset"], 900);
    assert_eq!(rows[1]["action"], "keep");
    // Java's RemoteClusterUtils.translateOffsets reads kmirror's checkpoints the same way.
    let java =
        kmirror_testkit::mirror_interop(&["translate", cb.bootstrap(), "A", "billing"]).unwrap();
    assert_eq!(
        java.lines().collect::<Vec<_>>(),
        vec!["A.orders 0 700", "A.orders 1 250"],
        "RemoteClusterUtils.translateOffsets"
    );

    // A new group appears on A after the sync; with a member active on B, apply is refused.
    a.commit_group_offsets(
        "audit",
        &offsets(&[("orders", 0, 500), ("orders", 1, 1000)]),
    )
    .await
    .unwrap();
    let cfg_no_sync = dir.path().join("no-sync.properties");
    std::fs::write(
        &cfg_no_sync,
        std::fs::read_to_string(&config).unwrap().replace(
            "sync.group.offsets.enabled = true",
            "sync.group.offsets.enabled = false",
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("kmirror2.log")).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args([
            "run",
            cfg_no_sync.to_str().unwrap(),
            "--metrics-address",
            "off",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    eventually(30, "audit checkpointed", || async {
        read_partition(&b, "A.checkpoints.internal", 0)
            .await
            .iter()
            .filter_map(|(_, r)| Checkpoint::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
            .filter(|c| c.group == "audit")
            .count()
            == 2
    })
    .await;
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(run.wait().unwrap().success());
    let member = GroupMember::join(
        b.clone(),
        GroupConfig {
            group_id: "audit".into(),
            protocol_type: "consumer".into(),
            session_timeout: Duration::from_secs(30),
            rebalance_timeout: Duration::from_secs(30),
            instance_id: None,
        },
        Arc::new(RangeAssignor {
            topics: vec!["A.orders".into()],
            partition_counts: [("A.orders".to_string(), 2)].into(),
        }),
    )
    .await
    .unwrap();
    let apply = [
        "offsets", "apply", cfg, "--source", "A", "--target", "B", "--group", "audit",
    ];
    let out = kmirror(&apply);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 active member(s)"), "{err}");
    assert_eq!(committed(&b, "audit", "A.orders", 0).await, None);
    // Many groups at once (a failover): named and by pattern, one read of the checkpoints.
    let out = kmirror(&[
        "offsets",
        "translate",
        cfg,
        "--source",
        "A",
        "--target",
        "B",
        "--group",
        "billing",
        "--groups",
        "aud.*,nothing-.*",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups: Vec<(&str, i64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["group"].as_str().unwrap(),
                r["translated_offset"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            ("audit", 500),
            ("audit", 1000),
            ("billing", 700),
            ("billing", 250)
        ]
    );
    // One active group refuses the whole apply, naming it; a named group without checkpoints
    // is an error naming it.
    let out = kmirror(&[
        "offsets",
        "apply",
        cfg,
        "--source",
        "A",
        "--target",
        "B",
        "--groups",
        "billing,audit",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("group 'audit' has 1 active member(s)")
            && err.contains("nothing was committed, for any group"),
        "{err}"
    );
    assert_eq!(committed(&b, "audit", "A.orders", 0).await, None);
    let out = kmirror(&[
        "offsets",
        "translate",
        cfg,
        "--source",
        "A",
        "--target",
        "B",
        "--group",
        "billing",
        "--group",
        "ghost",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no checkpoints for group(s) 'ghost'"), "{err}");
    // --dry-run shows the plan and commits nothing; after the member leaves, apply commits.
    member.leave().await.unwrap();
    let out = kmirror(&[
        "offsets",
        "apply",
        cfg,
        "--source",
        "A",
        "--target",
        "B",
        "--group",
        "audit",
        "--dry-run",
    ]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("A.orders") && table.contains("set"),
        "{table}"
    );
    assert_eq!(committed(&b, "audit", "A.orders", 0).await, None);
    let out = kmirror(&apply);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(committed(&b, "audit", "A.orders", 0).await, Some(500));
    assert_eq!(
        committed(&b, "audit", "A.orders", 1).await,
        Some(1000),
        "a group at the end translates to the end"
    );

    // Failback: consumers that moved to B read A.orders there and committed; with B->A enabled
    // their offsets go back to A's `orders`, translated with A->B's syncs inverted (MM2 cannot:
    // no flow copies A.orders back, so it has no syncs for it).
    b.commit_group_offsets(
        "returning",
        &offsets(&[("A.orders", 0, 450), ("A.orders", 1, 600)]),
    )
    .await
    .unwrap();
    let both = dir.path().join("both.properties");
    std::fs::write(
        &both,
        std::fs::read_to_string(&config).unwrap().replace(
            "A->B.enabled = true",
            "A->B.enabled = true\nB->A.enabled = true",
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("kmirror3.log")).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["run", both.to_str().unwrap(), "--metrics-address", "off"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // 450 on B goes back to just past the newest A->B sync at or below it (MM2's +1 rule, never
    // ahead): 400 after a sync at 399 (a batch end), 401 after one at 400 (offset.lag.max),
    // depending on whether the small source batches reached B merged.
    while !(matches!(
        committed(&a, "returning", "orders", 0).await,
        Some(400..=401)
    ) && committed(&a, "returning", "orders", 1).await == Some(600))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "returning group not back on A: {:?} {:?}; log:\n{}",
            committed(&a, "returning", "orders", 0).await,
            committed(&a, "returning", "orders", 1).await,
            std::fs::read_to_string(dir.path().join("kmirror3.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(run.wait().unwrap().success());
    let back: Vec<Checkpoint> = read_partition(&a, "B.checkpoints.internal", 0)
        .await
        .iter()
        .filter_map(|(_, r)| Checkpoint::decode(r.key.as_deref()?, r.value.as_deref()?).ok())
        .filter(|c| c.group == "returning")
        .collect();
    assert!(
        back.iter().any(|c| c.topic == "orders"
            && c.upstream_offset == 450
            && (400..=401).contains(&c.downstream_offset)),
        "{back:?}"
    );
}
