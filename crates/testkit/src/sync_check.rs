//! What the login tests (OAuth, Kerberos) set on the source and then expect on the target:
//! topic-config, ACL and group-offset sync, which read through the source's login and write
//! through the target's.

use kmirror_kafka::admin::{acl, AclBinding, CommittedOffset};
use kmirror_kafka::cluster::KafkaCluster;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The group whose offset is synced.
const GROUP: &str = "billing";
/// Its committed offset on partition 0 of the source topic.
const OFFSET: i64 = 100;
/// How long each sync may take once the records are copied.
const WITHIN: Duration = Duration::from_secs(60);

/// `User:alice` may read `topic`.
fn alice_reads(topic: &str) -> AclBinding {
    AclBinding {
        resource_type: acl::RESOURCE_TOPIC,
        resource_name: Some(topic.into()),
        pattern_type: acl::PATTERN_LITERAL,
        principal: Some("User:alice".into()),
        host: Some("*".into()),
        operation: acl::OP_READ,
        permission: acl::PERMISSION_ALLOW,
    }
}

/// On the source: group `billing` committed at offset 100 of `topic` partition 0, and alice
/// allowed to read `topic`.
pub async fn seed_syncables(a: &KafkaCluster, topic: &str) {
    let committed = CommittedOffset {
        offset: OFFSET,
        leader_epoch: -1,
        metadata: String::new(),
    };
    let group = BTreeMap::from([(topic.to_string(), BTreeMap::from([(0, committed)]))]);
    a.commit_group_offsets(GROUP, &group).await.unwrap();
    a.create_acls(&[alice_reads(topic)]).await.unwrap();
}

/// On the target, within a minute each: `remote` carries the config `(name, value)`, alice may
/// read it, and group `billing` sits at offset 100 of its partition 0 (what
/// [`seed_syncables`] set). A failure shows kmirror's log.
pub async fn assert_synced(b: &KafkaCluster, remote: &str, config: (&str, &str), log: &Path) {
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    let configs = b.describe_topic_configs(remote).await.unwrap();
    assert!(
        configs
            .iter()
            .any(|c| c.name == config.0 && c.value.as_deref() == Some(config.1)),
        "topic config {config:?} not synced to {remote}: {configs:?}"
    );
    let t0 = Instant::now();
    while b
        .describe_acls(&alice_reads(remote))
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            t0.elapsed() < WITHIN,
            "alice's ACL not synced to {remote} on the target:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    loop {
        let synced = b
            .fetch_group_offsets(GROUP)
            .await
            .ok()
            .and_then(|g| g.get(remote)?.get(&0).map(|c| c.offset));
        if synced == Some(OFFSET) {
            return;
        }
        assert!(
            t0.elapsed() < WITHIN,
            "group offset not synced to the target: {synced:?}\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
