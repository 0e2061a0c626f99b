//! Admin operations against a real SASL+ACL broker, each checked by reading back and through the
//! Java tools (kafka-configs, kafka-topics, kafka-acls, kafka-consumer-groups).

use kmirror_kafka::admin::{acl, AclBinding, CommittedOffset, ConfigOp};
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_testkit::{eventually, Cluster, Security};
use std::collections::BTreeMap;

fn java(c: &Cluster, tool: &str, args: &[&str]) -> String {
    let cfg = c.client_config(None);
    let mut all = vec![
        "--bootstrap-server",
        c.bootstrap(),
        "--command-config",
        cfg.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    c.tool(tool, &all, None).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_operations_do_what_they_say() {
    let c = Cluster::start("admin", Security::SaslAcl).unwrap();
    let k = KafkaCluster::connect(c.client_settings(None))
        .await
        .unwrap();
    let (cluster_id, _controller, brokers) = k.describe_cluster().await.unwrap();
    assert_eq!(cluster_id.as_deref(), c.env("CLUSTER_ID"));
    assert_eq!(brokers, 1);

    // Topics and configs.
    let topic = NewTopic {
        name: "orders".into(),
        partitions: 2,
        replication_factor: 1,
        configs: vec![("segment.bytes".into(), "10485760".into())],
    };
    let res = k
        .create_topics(std::slice::from_ref(&topic), false)
        .await
        .unwrap();
    assert!(res[0].1.is_none(), "{res:?}");
    let again = k.create_topics(&[topic], false).await.unwrap();
    assert!(
        again[0]
            .1
            .as_ref()
            .unwrap()
            .to_string()
            .contains("TopicAlreadyExists"),
        "{again:?}"
    );
    let get = |cfg: &[kmirror_kafka::admin::ConfigEntry], name: &str| {
        cfg.iter().find(|e| e.name == name).cloned().unwrap()
    };
    // Topic and config changes reach the broker through the metadata log after the controller
    // accepted them: a describe right after may still show the old state, so wait for it.
    eventually(30, "orders described with its segment.bytes", || async {
        k.describe_topic_configs("orders").await.is_ok_and(|cfg| {
            cfg.iter()
                .any(|e| e.name == "segment.bytes" && e.value.as_deref() == Some("10485760"))
        })
    })
    .await;
    let cfg = k.describe_topic_configs("orders").await.unwrap();
    assert!(get(&cfg, "retention.ms").is_default());
    assert_eq!(
        get(&cfg, "segment.bytes").value.as_deref(),
        Some("10485760")
    );
    assert!(!get(&cfg, "segment.bytes").is_default());
    k.alter_topic_configs(
        "orders",
        &[
            ConfigOp::Set("retention.ms".into(), "3600000".into()),
            ConfigOp::Set("cleanup.policy".into(), "compact".into()),
            ConfigOp::Delete("segment.bytes".into()),
        ],
        false,
    )
    .await
    .unwrap();
    eventually(30, "the altered configs described", || async {
        k.describe_topic_configs("orders").await.is_ok_and(|cfg| {
            cfg.iter()
                .any(|e| e.name == "retention.ms" && e.value.as_deref() == Some("3600000"))
        })
    })
    .await;
    let cfg = k.describe_topic_configs("orders").await.unwrap();
    assert_eq!(get(&cfg, "retention.ms").value.as_deref(), Some("3600000"));
    assert_eq!(
        get(&cfg, "cleanup.policy").value.as_deref(),
        Some("compact")
    );
    assert!(get(&cfg, "segment.bytes").is_default());
    let described = java(
        &c,
        "configs",
        &[
            "--describe",
            "--entity-type",
            "topics",
            "--entity-name",
            "orders",
        ],
    );
    assert!(
        described.contains("retention.ms=3600000") && described.contains("cleanup.policy=compact"),
        "{described}"
    );
    let bad = k
        .alter_topic_configs(
            "orders",
            &[ConfigOp::Set("no.such.key".into(), "1".into())],
            false,
        )
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("InvalidConfig") || bad.to_string().contains("no.such.key"),
        "{bad}"
    );

    // Partitions.
    k.create_partitions("orders", 4, false).await.unwrap();
    eventually(30, "orders has 4 partitions in the metadata", || async {
        k.refresh_metadata(Some(&["orders"]))
            .await
            .is_ok_and(|md| md.topics["orders"].partitions.len() == 4)
    })
    .await;
    let topics = java(&c, "topics", &["--describe", "--topic", "orders"]);
    assert!(topics.contains("PartitionCount: 4"), "{topics}");

    // ACLs.
    let read = AclBinding {
        resource_type: acl::RESOURCE_TOPIC,
        resource_name: Some("orders".into()),
        pattern_type: acl::PATTERN_LITERAL,
        principal: Some("User:alice".into()),
        host: Some("*".into()),
        operation: acl::OP_READ,
        permission: acl::PERMISSION_ALLOW,
    };
    let group_read = AclBinding {
        resource_type: acl::RESOURCE_GROUP,
        resource_name: Some("billing".into()),
        ..read.clone()
    };
    k.create_acls(&[read.clone(), group_read.clone()])
        .await
        .unwrap();
    // ACL changes propagate through the metadata log.
    eventually(30, "both ACLs described", || async {
        k.describe_acls(&AclBinding::any())
            .await
            .is_ok_and(|found| found.contains(&read) && found.contains(&group_read))
    })
    .await;
    let listed = java(&c, "acls", &["--list", "--topic", "orders"]);
    assert!(
        listed.contains("User:alice") && listed.contains("READ"),
        "{listed}"
    );
    let deleted = k
        .delete_acls(&[AclBinding {
            principal: Some("User:alice".into()),
            ..AclBinding::any()
        }])
        .await
        .unwrap();
    assert_eq!(deleted.len(), 2, "{deleted:?}");

    // Group offsets committed for a group with no members, seen by kafka-consumer-groups.
    let mut offsets = BTreeMap::new();
    offsets.insert(
        "orders".to_string(),
        BTreeMap::from([(
            0,
            CommittedOffset {
                offset: 0,
                leader_epoch: -1,
                metadata: "kmirror".into(),
            },
        )]),
    );
    k.commit_group_offsets("billing", &offsets).await.unwrap();
    let back = k.fetch_group_offsets("billing").await.unwrap();
    assert_eq!(back["orders"][&0].offset, 0);
    assert_eq!(back["orders"][&0].metadata, "kmirror");
    let groups = k.list_groups().await.unwrap();
    assert!(groups.iter().any(|(g, _)| g == "billing"), "{groups:?}");
    assert_eq!(k.describe_group("billing").await.unwrap().state, "Empty");
    let described = java(&c, "consumer-groups", &["--describe", "--group", "billing"]);
    let row = described
        .lines()
        .find(|l| l.contains("orders") && l.split_whitespace().nth(2) == Some("0"))
        .unwrap_or_else(|| panic!("{described}"));
    assert_eq!(row.split_whitespace().nth(3), Some("0"), "{described}");
}
