//! The permissions of docs/permissions.md, and nothing more, are enough: two clusters
//! with the StandardAuthorizer, the principal `User:mm2` given exactly the example's ACLs, and a
//! flow with every feature on (data, positions, offset syncs, checkpoints, heartbeats, group
//! offset sync, topic config and ACL sync). Every record arrives, the group's offset is
//! translated and committed on the target, and no error of any kind is counted.

use kmirror_kafka::cluster::{KafkaCluster, LATEST};
use kmirror_kafka::IsolationLevel;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{Cluster, Security};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn admin_tool(c: &Cluster, tool: &str, args: &[&str]) -> String {
    let cfg = c.client_config(None);
    let mut all = vec!["--bootstrap-server", c.bootstrap(), "--command-config"];
    all.push(cfg.to_str().unwrap());
    all.extend(args);
    c.tool(tool, &all, None).unwrap()
}

/// `kafka-acls --add --allow-principal User:mm2` with the rest of the line.
fn allow(c: &Cluster, args: &[&str]) {
    let mut all = vec!["--add", "--allow-principal", "User:mm2"];
    all.extend(args);
    admin_tool(c, "acls", &all);
}

fn jaas(c: &Cluster) -> String {
    let _ = c;
    "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"mm2\" password=\"mm2-secret\";".to_string()
}

/// The tests here run one at a time (each starts two clusters).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acls_are_enough() {
    let _serial = SERIAL.lock().await;
    documented_acls_are_enough(false).await;
}

/// Exactly-once adds the TransactionalId prefix of docs/permissions.md, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acls_are_enough_exactly_once() {
    let _serial = SERIAL.lock().await;
    documented_acls_are_enough(true).await;
}

async fn documented_acls_are_enough(exactly_once: bool) {
    kmirror_testkit::init_logging();
    let (na, nb) = match exactly_once {
        false => ("acls-a", "acls-b"),
        true => ("acls-eos-a", "acls-eos-b"),
    };
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start(na, Security::SaslAcl).unwrap());
        let b = s.spawn(|| Cluster::start(nb, Security::SaslAcl).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("orders", 2).unwrap();
    // The example of docs/permissions.md, line by line.
    let op = |ops: &[&'static str]| -> Vec<&'static str> {
        ops.iter().flat_map(|o| ["--operation", *o]).collect()
    };
    let with = |mut a: Vec<&'static str>, b: &[&'static str]| {
        a.extend_from_slice(b);
        a
    };
    // Each cluster's grants (a Java tool each) in a thread of its own.
    std::thread::scope(|s| {
        s.spawn(|| {
            allow(
                &ca,
                &with(
                    op(&["Describe", "Read", "DescribeConfigs"]),
                    &["--topic", "orders", "--resource-pattern-type", "literal"],
                ),
            );
            allow(
                &ca,
                &with(
                    op(&["Create", "Describe", "Write", "Read"]),
                    &["--topic", "mm2-offset-syncs.B.internal"],
                ),
            );
            allow(&ca, &with(op(&["Describe"]), &["--group", "*"]));
            allow(&ca, &with(op(&["Describe"]), &["--cluster"]));
            allow(
                &ca,
                &with(
                    op(&["Create", "Describe", "Write", "Read", "DescribeConfigs"]),
                    &["--topic", "heartbeats"],
                ),
            );
            // Data, and a group that has read part of it (as the admin: the group is the source's).
            let lines: Vec<String> = (0..200).map(|i| format!("k{i}:order {i}")).collect();
            kmirror_testkit::produce_keyed(&ca, "orders", &lines);
            let cfg = ca.client_config(None);
            ca.tool(
                "console-consumer",
                &[
                    "--bootstrap-server",
                    ca.bootstrap(),
                    "--consumer.config",
                    cfg.to_str().unwrap(),
                    "--topic",
                    "orders",
                    "--group",
                    "billing",
                    "--from-beginning",
                    "--max-messages",
                    "120",
                    "--timeout-ms",
                    "20000",
                ],
                None,
            )
            .unwrap();
        });
        s.spawn(|| {
            allow(
                &cb,
                &with(
                    op(&[
                        "Create",
                        "Describe",
                        "Write",
                        "Alter",
                        "Read",
                        "DescribeConfigs",
                        "AlterConfigs",
                    ]),
                    &["--topic", "A.", "--resource-pattern-type", "prefixed"],
                ),
            );
            allow(
                &cb,
                &with(
                    op(&["Create", "Describe", "Write", "Read"]),
                    &[
                        "--topic",
                        "mm2-offsets.A.internal",
                        "--topic",
                        "A.checkpoints.internal",
                        "--topic",
                        "heartbeats",
                    ],
                ),
            );
            allow(&cb, &with(op(&["Describe", "Read"]), &["--group", "*"]));
            allow(
                &cb,
                &with(
                    op(&["Describe", "Alter", "IdempotentWrite"]),
                    &["--cluster"],
                ),
            );

            if exactly_once {
                allow(
                    &cb,
                    &with(
                        op(&["Write", "Describe"]),
                        &[
                            "--transactional-id",
                            "A-mm2-MirrorSourceConnector-",
                            "--resource-pattern-type",
                            "prefixed",
                        ],
                    ),
                );
            }
        });
    });

    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         A.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = PLAIN\nA.sasl.jaas.config = {}\n\
         B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\nB.sasl.jaas.config = {}\n\
         A->B.enabled = true\nA->B.topics = orders\nA->B.groups = billing\n\
         sync.group.offsets.enabled = true\nsync.group.offsets.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\nsync.topic.configs.interval.seconds = 1\n\
         sync.topic.acls.interval.seconds = 1\nrefresh.topics.interval.seconds = 1\n\
         refresh.groups.interval.seconds = 1\nemit.heartbeats.interval.seconds = 1\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         checkpoints.topic.replication.factor = 1\n{}",
        ca.bootstrap(),
        cb.bootstrap(),
        jaas(&ca),
        jaas(&cb),
        if exactly_once {
            "B.exactly.once.source.support = enabled\ntasks.max = 2\n"
        } else {
            ""
        }
    );
    let config = mm2::load(
        &Properties::parse(&text, "mm2.properties").unwrap(),
        &[],
        &SystemEnvironment,
    )
    .unwrap();
    let shutdown = Shutdown::default();
    let metrics = Arc::new(Metrics::new());
    let task = {
        let (c, s, m) = (config.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move { engine::run(&c, s, m).await })
    };

    // Every record copied, and billing's position (120 of 200) translated and committed on B,
    // read as B's admin through kmirror's client (a Java tool per check costs seconds).
    let kb = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    let t0 = Instant::now();
    loop {
        let mut copied = 0;
        for p in 0..2 {
            copied += kb
                .list_offset("A.orders", p, LATEST, IsolationLevel::ReadUncommitted)
                .await
                .unwrap_or(0);
        }
        let committed: i64 = kb
            .fetch_group_offsets("billing")
            .await
            .ok()
            .and_then(|g| {
                g.get("A.orders")
                    .map(|ps| ps.values().map(|c| c.offset).sum())
            })
            .unwrap_or(0);
        let done = if exactly_once {
            // Offsets count transaction markers too: records are counted by kmirror, and the
            // group's translated offsets lie past its 120 records.
            metrics.sum("kmirror_record_count_total", &[]) >= 200.0 && committed >= 120
        } else {
            copied == 200 && committed == 120
        };
        if done {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "timed out: records copied and billing's offsets synced to B ({copied} records, \
             {committed} committed)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(metrics.sum("kmirror_checkpoints_total", &[]) >= 1.0);
    if exactly_once {
        assert!(metrics.sum("kmirror_transactions_committed_total", &[]) >= 1.0);
    }
    assert!(metrics.sum("kmirror_heartbeats_total", &[]) >= 1.0);
    // Nothing was refused anywhere: no error of any kind.
    let text = metrics.render();
    let errors = metrics.sum("kmirror_errors_total", &[]);
    assert_eq!(
        errors,
        0.0,
        "errors: {}",
        text.lines()
            .filter(|l| l.starts_with("kmirror_errors_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
}
