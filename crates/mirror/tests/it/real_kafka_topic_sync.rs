//! Topic config and ACL sync between two SASL clusters with an authorizer, checked with the Java
//! kafka-configs and kafka-acls tools: the source's topic configs (minus excluded keys) arrive on
//! the target and follow changes; topic ACLs follow MM2's rules (WRITE dropped, ALL as READ);
//! with kmirror.sync.group.acls.enabled the group's READ ACL too, so a SCRAM user allowed to
//! read `orders` on A consumes `A.orders` on B with the same group. Then kmirror runs as an
//! ordinary user holding only the ACLs docs/permissions.md lists, and everything works; without
//! some of them, each missing permission is reported once and replication goes on.
//!
//! Why one file of this size: one long test, a sequence of steps on the same two secured
//! clusters (each step starts from the state the last one left), with its Java-tool helpers.

use kmirror_kafka::cluster::KafkaCluster;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;
use kmirror_mirror::engine::{self, Shutdown};
use kmirror_mirror::metrics::Metrics;
use kmirror_testkit::{eventually as wait_until, Cluster, Security};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn admin_tool(c: &Cluster, tool: &str, args: &[&str]) -> String {
    let cfg = c.client_config(None);
    let mut all = vec!["--bootstrap-server", c.bootstrap(), "--command-config"];
    all.push(cfg.to_str().unwrap());
    all.extend(args);
    c.tool(tool, &all, None).unwrap()
}

fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !check() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn jaas(c: &Cluster) -> String {
    format!(
        "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"{}\";",
        c.env("ADMIN_PASSWORD").unwrap_or("admin-secret")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_and_acls_follow_the_source() {
    kmirror_testkit::init_logging();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("sync-a", Security::ScramAcl).unwrap());
        let b = s.spawn(|| Cluster::start("sync-b", Security::ScramAcl).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    admin_tool(
        &ca,
        "topics",
        &[
            "--create",
            "--topic",
            "orders",
            "--partitions",
            "2",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=3600000",
            "--config",
            "segment.bytes=2097152",
            "--config",
            "max.message.bytes=2000000",
            "--config",
            "cleanup.policy=delete",
            "--config",
            "min.insync.replicas=1",
        ],
    );
    let acl = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["--add"];
        all.extend(args);
        admin_tool(c, "acls", &all);
    };
    acl(
        &ca,
        &[
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "orders",
        ],
    );
    acl(
        &ca,
        &[
            "--allow-principal",
            "User:bob",
            "--operation",
            "Write",
            "--topic",
            "orders",
        ],
    );
    acl(
        &ca,
        &[
            "--allow-principal",
            "User:mm2",
            "--operation",
            "All",
            "--topic",
            "orders",
        ],
    );
    acl(
        &ca,
        &[
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--group",
            "billing",
        ],
    );
    let input: String = (0..100).map(|i| format!("order-{i}\n")).collect();
    let cfg = ca.client_config(None);
    ca.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            ca.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--topic",
            "orders",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();

    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         A.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = PLAIN\nA.sasl.jaas.config = {}\n\
         B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\nB.sasl.jaas.config = {}\n\
         A->B.enabled = true\nA->B.topics = orders\nA->B.groups = billing\n\
         kmirror.sync.group.acls.enabled = true\n\
         sync.topic.configs.interval.seconds = 1\nsync.topic.acls.interval.seconds = 1\n\
         refresh.topics.interval.seconds = 1\nemit.heartbeats.enabled = false\n\
         emit.checkpoints.enabled = false\nemit.offset-syncs.enabled = false\n\
         replication.factor = 1\noffset.storage.replication.factor = 1\n",
        ca.bootstrap(),
        cb.bootstrap(),
        jaas(&ca),
        jaas(&cb)
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

    let describe = |c: &Cluster, topic: &str| {
        admin_tool(
            c,
            "configs",
            &[
                "--describe",
                "--entity-type",
                "topics",
                "--entity-name",
                topic,
            ],
        )
    };
    let acls_b = || admin_tool(&cb, "acls", &["--list"]);
    // The engine runs on the runtime's worker threads; these blocking checks run on the test's
    // own thread.
    {
        // Configs set at creation, minus the excluded min.insync.replicas.
        eventually(60, "A.orders configs on B", || {
            let d = describe(&cb, "A.orders");
            d.contains("retention.ms=3600000") && d.contains("segment.bytes=2097152")
        });
        let d = describe(&cb, "A.orders");
        assert!(d.contains("max.message.bytes=2000000"), "{d}");
        assert!(d.contains("cleanup.policy=delete"), "{d}");
        assert!(!d.contains("min.insync.replicas"), "excluded: {d}");

        // Topic ACLs per MM2's rules, and the group's READ ACL.
        eventually(30, "ACLs on B", || {
            let l = acls_b();
            l.contains("User:alice") && l.contains("User:mm2") && l.contains("name=billing")
        });
        let l = acls_b();
        let block = |name: &str| {
            l.split("Current ACLs for resource")
                .find(|b| b.contains(&format!("name={name},")))
                .unwrap_or_default()
                .to_string()
        };
        let orders = block("A.orders");
        assert!(
            orders.contains("principal=User:alice") && orders.contains("operation=READ"),
            "{l}"
        );
        assert!(orders.contains("principal=User:mm2"), "{l}");
        assert!(!orders.contains("operation=ALL"), "ALL becomes READ: {l}");
        assert!(!orders.contains("User:bob"), "WRITE is not copied: {l}");
        assert!(block("billing").contains("principal=User:alice"), "{l}");

        // Changes on A follow within the interval; a key back to its default is reset on B.
        admin_tool(
            &ca,
            "configs",
            &[
                "--alter",
                "--entity-type",
                "topics",
                "--entity-name",
                "orders",
                "--add-config",
                "retention.ms=7200000",
            ],
        );
        admin_tool(
            &ca,
            "configs",
            &[
                "--alter",
                "--entity-type",
                "topics",
                "--entity-name",
                "orders",
                "--delete-config",
                "segment.bytes",
            ],
        );
        eventually(30, "config change followed", || {
            let d = describe(&cb, "A.orders");
            d.contains("retention.ms=7200000") && !d.contains("segment.bytes")
        });
    }

    // alice, a SCRAM user with the same password on both clusters, reads A.orders on B in
    // group billing.
    let alice = cb.client_config(Some("alice-scram512"));
    let out = cb
        .tool_output(
            "console-consumer",
            &[
                "--bootstrap-server",
                cb.bootstrap(),
                "--command-config",
                alice.to_str().unwrap(),
                "--topic",
                "A.orders",
                "--group",
                "billing",
                "--from-beginning",
                "--max-messages",
                "100",
                "--timeout-ms",
                "20000",
            ],
            None,
        )
        .unwrap();
    let read = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        read.lines().filter(|l| l.starts_with("order-")).count(),
        100,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
    assert!(metrics.sum("kmirror_acls_created_total", &[]) >= 3.0);
    assert!(metrics.sum("kmirror_topic_configs_synced_total", &[]) >= 2.0);
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    assert!(b.metadata().topics.contains_key("A.orders"));

    // kmirror as alice, with exactly the ACLs docs/permissions.md lists (principal User:alice).
    let grant = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["--add", "--allow-principal", "User:alice"];
        all.extend(args);
        admin_tool(c, "acls", &all);
    };
    let ops = |list: &[&'static str]| -> Vec<&'static str> {
        list.iter().flat_map(|o| ["--operation", *o]).collect()
    };
    admin_tool(
        &ca,
        "topics",
        &[
            "--create",
            "--topic",
            "invoices",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
        ],
    );
    grant(
        &ca,
        &[
            ops(&["Describe", "Read", "DescribeConfigs"]),
            vec!["--topic", "invoices"],
        ]
        .concat(),
    );
    grant(
        &ca,
        &[
            ops(&["Create", "Describe", "Write", "Read"]),
            vec!["--topic", "mm2-offset-syncs.B.internal"],
        ]
        .concat(),
    );
    grant(&ca, &[ops(&["Describe"]), vec!["--group", "*"]].concat());
    grant(&ca, &[ops(&["Describe"]), vec!["--cluster"]].concat());
    grant(
        &cb,
        &[
            ops(&[
                "Create",
                "Describe",
                "Write",
                "Alter",
                "Read",
                "DescribeConfigs",
                "AlterConfigs",
            ]),
            vec!["--topic", "A.", "--resource-pattern-type", "prefixed"],
        ]
        .concat(),
    );
    grant(
        &cb,
        &[
            ops(&["Create", "Describe", "Write", "Read"]),
            vec![
                "--topic",
                "mm2-offsets.A.internal",
                "--topic",
                "A.checkpoints.internal",
                "--topic",
                "heartbeats",
            ],
        ]
        .concat(),
    );
    grant(
        &cb,
        &[ops(&["Describe", "Read"]), vec!["--group", "*"]].concat(),
    );
    grant(
        &cb,
        &[
            ops(&["Describe", "Alter", "IdempotentWrite"]),
            vec!["--cluster"],
        ]
        .concat(),
    );
    let input: String = (0..50).map(|i| format!("invoice-{i}\n")).collect();
    ca.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            ca.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--topic",
            "invoices",
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
    let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"alice\" password=\"alice-secret\";";
    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         security.protocol = SASL_PLAINTEXT\nsasl.mechanism = SCRAM-SHA-512\nsasl.jaas.config = {scram}\n\
         A->B.enabled = true\nA->B.topics = invoices\nA->B.groups = billing\nB->A.emit.heartbeats.enabled = false\n\
         sync.topic.configs.interval.seconds = 1\nsync.topic.acls.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\nreplication.factor = 1\noffset.storage.replication.factor = 1\n\
         heartbeats.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\n",
        ca.bootstrap(),
        cb.bootstrap()
    );
    let config = mm2::load(
        &Properties::parse(&text, "alice.properties").unwrap(),
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
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let copied = b
            .list_offset(
                "A.invoices",
                0,
                kmirror_kafka::cluster::LATEST,
                kmirror_kafka::IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap_or(0);
        if copied == 50 && metrics.sum("kmirror_heartbeats_total", &[]) >= 2.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "as alice: {copied} copied\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A few whole sync rounds after that, still no permission missing.
    let rounds = |kind| metrics.sum("kmirror_rounds_total", &[("kind", kind)]);
    let (c0, a0) = (rounds("config_sync"), rounds("acl_sync"));
    wait_until(60, "three more config and ACL sync rounds", || async {
        rounds("config_sync") >= c0 + 3.0 && rounds("acl_sync") >= a0 + 3.0
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[]),
        0.0,
        "no permission is missing:\n{}",
        metrics.render()
    );
    assert!(
        admin_tool(&cb, "acls", &["--list", "--topic", "A.invoices"]).contains("User:alice"),
        "ACL sync worked as alice"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // bob holds the data permissions but neither ALTER_CONFIGS on the remote topics nor ALTER on
    // B's cluster: each missing permission is reported once, and replication goes on.
    let grant = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["--add", "--allow-principal", "User:bob"];
        all.extend(args);
        admin_tool(c, "acls", &all);
    };
    admin_tool(
        &ca,
        "topics",
        &[
            "--create",
            "--topic",
            "receipts",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=1000000",
        ],
    );
    grant(
        &ca,
        &[
            ops(&["Describe", "Read", "DescribeConfigs"]),
            vec!["--topic", "receipts"],
        ]
        .concat(),
    );
    grant(
        &ca,
        &[
            ops(&["Create", "Describe", "Write", "Read"]),
            vec!["--topic", "mm2-offset-syncs.B.internal"],
        ]
        .concat(),
    );
    grant(&ca, &[ops(&["Describe"]), vec!["--group", "*"]].concat());
    grant(&ca, &[ops(&["Describe"]), vec!["--cluster"]].concat());
    grant(
        &cb,
        &[
            ops(&[
                "Create",
                "Describe",
                "Write",
                "Alter",
                "Read",
                "DescribeConfigs",
            ]),
            vec!["--topic", "A.", "--resource-pattern-type", "prefixed"],
        ]
        .concat(),
    );
    grant(
        &cb,
        &[
            ops(&["Create", "Describe", "Write", "Read"]),
            vec![
                "--topic",
                "mm2-offsets.A.internal",
                "--topic",
                "A.checkpoints.internal",
                "--topic",
                "heartbeats",
            ],
        ]
        .concat(),
    );
    grant(
        &cb,
        &[ops(&["Describe", "Read"]), vec!["--group", "*"]].concat(),
    );
    grant(
        &cb,
        &[ops(&["Describe", "IdempotentWrite"]), vec!["--cluster"]].concat(),
    );
    acl(
        &ca,
        &[
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "receipts",
        ],
    );
    let bob = text
        .replace(
            "username=\"alice\" password=\"alice-secret\"",
            "username=\"bob\" password=\"bob-secret\"",
        )
        .replace("A->B.topics = invoices", "A->B.topics = receipts");
    let config = mm2::load(
        &Properties::parse(&bob, "bob.properties").unwrap(),
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
    ca.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            ca.bootstrap(),
            "--command-config",
            cfg.to_str().unwrap(),
            "--topic",
            "receipts",
        ],
        Some(b"r-1\nr-2\nr-3\n"),
    )
    .unwrap();
    // The remote topic exists and has the data; then a config change on A it cannot apply.
    let t0 = Instant::now();
    while b
        .list_offset(
            "A.receipts",
            0,
            kmirror_kafka::cluster::LATEST,
            kmirror_kafka::IsolationLevel::ReadCommitted,
        )
        .await
        .unwrap_or(0)
        < 3
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "as bob: not copied\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    admin_tool(
        &ca,
        "configs",
        &[
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "receipts",
            "--add-config",
            "retention.ms=2000000",
        ],
    );
    let t0 = Instant::now();
    loop {
        let copied = b
            .list_offset(
                "A.receipts",
                0,
                kmirror_kafka::cluster::LATEST,
                kmirror_kafka::IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap_or(0);
        let reported = metrics.sum("kmirror_errors_total", &[("kind", "acl_sync")]) >= 1.0
            && metrics.sum("kmirror_errors_total", &[("kind", "config_sync")]) >= 1.0;
        if copied == 3 && reported {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "as bob: {copied} copied\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rounds = |kind| metrics.sum("kmirror_rounds_total", &[("kind", kind)]);
    let (c0, a0) = (rounds("config_sync"), rounds("acl_sync"));
    wait_until(60, "three more config and ACL sync rounds", || async {
        rounds("config_sync") >= c0 + 3.0 && rounds("acl_sync") >= a0 + 3.0
    })
    .await;
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[("kind", "acl_sync")]),
        1.0,
        "reported once"
    );
    assert_eq!(
        metrics.sum("kmirror_errors_total", &[("kind", "config_sync")]),
        1.0,
        "reported once"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
}
