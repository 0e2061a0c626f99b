//! What topic config sync and ACL sync change on the target (mm2-compatibility §5.4, §5.5). Pure: the
//! engine passes in what it described on both clusters.

use crate::config::model::{FlowConfig, Side};
use crate::discovery;
use crate::policy::PolicyKind;
use kmirror_kafka::admin::{acl, AclBinding, ConfigEntry, ConfigOp};
use std::collections::{BTreeSet, HashMap};

/// Kafka's ConfigSource for a topic-level override, and for a static broker setting.
const TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;

/// The IncrementalAlterConfigs operations that make `target` (a remote topic's configs) follow
/// `source`: every replicable non-default source entry is set; an entry that is back to its
/// default on the source is deleted on the target (back to the target's default) unless
/// `use.defaults.from=source`. Unlike MM2, operations that would change nothing are left out,
/// and so are `rejected` (name, value) pairs the target refused before.
pub fn config_ops(
    flow: &FlowConfig,
    source: &[ConfigEntry],
    target: &[ConfigEntry],
    rejected: &BTreeSet<(String, String)>,
) -> Vec<ConfigOp> {
    let on_target: HashMap<&str, &ConfigEntry> =
        target.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut ops = Vec::new();
    for e in source {
        if e.read_only
            || e.sensitive
            || e.source == STATIC_BROKER_CONFIG
            || flow.config_properties_exclude.matches(&e.name)
        {
            continue;
        }
        let Some(value) = &e.value else { continue };
        let there = on_target.get(e.name.as_str());
        if e.is_default() && flow.use_defaults_from == Side::Target {
            if there.is_some_and(|t| t.source == TOPIC_CONFIG) {
                ops.push(ConfigOp::Delete(e.name.clone()));
            }
            continue;
        }
        let same = there.is_some_and(|t| t.value.as_deref() == Some(value.as_str()));
        if !same && !rejected.contains(&(e.name.clone(), value.clone())) {
            ops.push(ConfigOp::Set(e.name.clone(), value.clone()));
        }
    }
    ops
}

/// The topic ACL bindings of the source to create on the target (mm2-compatibility §5.5): literal topic
/// bindings of replicated topics, renamed to the remote topic; ALLOW WRITE dropped (only the
/// replicator writes remote topics); ALLOW ALL downgraded to ALLOW READ; DENY kept as is.
///
/// A literal `*` (every topic) becomes a prefixed binding on the remote prefix (`A.`) with the
/// default policy, so it covers exactly the topics that came from A; MM2 creates a literal topic
/// named `A.*`, which matches nothing. With the identity policy it is skipped, since `*` on the
/// target would also cover the target's own topics.
pub fn topic_acls(flow: &FlowConfig, source: &[AclBinding]) -> Vec<AclBinding> {
    let mut out = BTreeSet::new();
    for b in source {
        if b.resource_type != acl::RESOURCE_TOPIC || b.pattern_type != acl::PATTERN_LITERAL {
            continue;
        }
        if b.permission == acl::PERMISSION_ALLOW && b.operation == acl::OP_WRITE {
            continue;
        }
        let Some(name) = &b.resource_name else {
            continue;
        };
        let (resource_name, pattern_type) = if name == "*" {
            match flow.policy.kind {
                PolicyKind::Default => (
                    flow.policy.format_remote_topic(&flow.id.source, ""),
                    acl::PATTERN_PREFIXED,
                ),
                PolicyKind::Identity => continue,
            }
        } else {
            let Some(remote) = discovery::decide(flow, [name.as_str()])
                .pop()
                .and_then(|d| d.remote)
            else {
                continue;
            };
            (remote, acl::PATTERN_LITERAL)
        };
        let operation = if b.permission == acl::PERMISSION_ALLOW && b.operation == acl::OP_ALL {
            acl::OP_READ
        } else {
            b.operation
        };
        out.insert(AclBinding {
            resource_type: acl::RESOURCE_TOPIC,
            resource_name: Some(resource_name),
            pattern_type,
            principal: b.principal.clone(),
            host: b.host.clone(),
            operation,
            permission: b.permission,
        });
    }
    out.into_iter().collect()
}

/// kmirror's `kmirror.sync.group.acls.enabled`: consumer groups' ALLOW READ (or ALL, as READ)
/// bindings for literal groups matching `groups`, copied as they are, so consumers that fail over
/// may use their group on the target. MM2 copies no group ACLs.
pub fn group_acls(flow: &FlowConfig, source: &[AclBinding]) -> Vec<AclBinding> {
    let mut out = BTreeSet::new();
    for b in source {
        if b.resource_type != acl::RESOURCE_GROUP
            || b.pattern_type != acl::PATTERN_LITERAL
            || b.permission != acl::PERMISSION_ALLOW
            || !(b.operation == acl::OP_READ || b.operation == acl::OP_ALL)
        {
            continue;
        }
        let Some(group) = &b.resource_name else {
            continue;
        };
        if !flow.groups.accepts(group) {
            continue;
        }
        out.insert(AclBinding {
            operation: acl::OP_READ,
            ..b.clone()
        });
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::entry;

    fn flow(extra: &str) -> FlowConfig {
        crate::test_support::flow(&format!(
            "A->B.topics = orders, pay.*
{extra}"
        ))
    }

    #[test]
    fn config_ops_set_changes_delete_returned_defaults_and_skip_the_rest() {
        let source = vec![
            entry("retention.ms", "1000", 1),
            entry("segment.bytes", "2097152", 1),
            entry("cleanup.policy", "delete", 5), // back to default on A
            entry("max.message.bytes", "1048588", 5), // default on both
            entry("min.insync.replicas", "2", 1), // excluded
            entry("log.retention.hours", "168", STATIC_BROKER_CONFIG),
            entry("flush.ms", "5", 1), // rejected by the target before
        ];
        let target = vec![
            entry("retention.ms", "9999", 1),
            entry("segment.bytes", "2097152", 1), // already equal
            entry("cleanup.policy", "compact", 1), // an override to reset
            entry("max.message.bytes", "1048588", 5),
        ];
        let rejected: BTreeSet<(String, String)> = [("flush.ms".into(), "5".into())].into();
        assert_eq!(
            config_ops(&flow(""), &source, &target, &rejected),
            vec![
                ConfigOp::Set("retention.ms".into(), "1000".into()),
                ConfigOp::Delete("cleanup.policy".into()),
            ]
        );
        // use.defaults.from=source writes the source's defaults instead.
        assert_eq!(
            config_ops(
                &flow("use.defaults.from = source\n"),
                &source,
                &target,
                &rejected
            ),
            vec![
                ConfigOp::Set("retention.ms".into(), "1000".into()),
                ConfigOp::Set("cleanup.policy".into(), "delete".into()),
            ]
        );
    }

    fn binding(rt: i8, name: &str, pt: i8, who: &str, op: i8, perm: i8) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: Some(name.into()),
            pattern_type: pt,
            principal: Some(format!("User:{who}")),
            host: Some("*".into()),
            operation: op,
            permission: perm,
        }
    }

    #[test]
    fn topic_acls_follow_mm2_rules() {
        use acl::*;
        let t =
            |name: &str, pt, who: &str, op, perm| binding(RESOURCE_TOPIC, name, pt, who, op, perm);
        let source = vec![
            t(
                "orders",
                PATTERN_LITERAL,
                "alice",
                OP_READ,
                PERMISSION_ALLOW,
            ),
            t("orders", PATTERN_LITERAL, "bob", OP_WRITE, PERMISSION_ALLOW), // dropped
            t("orders", PATTERN_LITERAL, "carol", OP_ALL, PERMISSION_ALLOW), // -> READ
            t(
                "orders",
                PATTERN_LITERAL,
                "mallory",
                OP_WRITE,
                PERMISSION_DENY,
            ), // kept
            t("pay", PATTERN_PREFIXED, "dave", OP_READ, PERMISSION_ALLOW),   // prefixed: skipped
            t("secret", PATTERN_LITERAL, "eve", OP_READ, PERMISSION_ALLOW),  // not replicated
            t("*", PATTERN_LITERAL, "ops", OP_DESCRIBE, PERMISSION_ALLOW),   // -> prefixed A.
            binding(
                RESOURCE_GROUP,
                "g",
                PATTERN_LITERAL,
                "alice",
                OP_READ,
                PERMISSION_ALLOW,
            ),
        ];
        let got = topic_acls(&flow(""), &source);
        let want = vec![
            t("A.", PATTERN_PREFIXED, "ops", OP_DESCRIBE, PERMISSION_ALLOW),
            t(
                "A.orders",
                PATTERN_LITERAL,
                "alice",
                OP_READ,
                PERMISSION_ALLOW,
            ),
            t(
                "A.orders",
                PATTERN_LITERAL,
                "carol",
                OP_READ,
                PERMISSION_ALLOW,
            ),
            t(
                "A.orders",
                PATTERN_LITERAL,
                "mallory",
                OP_WRITE,
                PERMISSION_DENY,
            ),
        ];
        let mut want = want;
        want.sort();
        assert_eq!(got, want);
        // Identity naming keeps names and skips the `*` binding.
        let id = flow("replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n");
        let got = topic_acls(&id, &source);
        assert!(
            got.iter()
                .all(|b| b.resource_name.as_deref() == Some("orders")),
            "{got:?}"
        );
        // Group READ/ALL ALLOW bindings of matching groups, as READ.
        let groups = group_acls(
            &flow("A->B.groups = g, h\n"),
            &[
                binding(
                    RESOURCE_GROUP,
                    "g",
                    PATTERN_LITERAL,
                    "alice",
                    OP_ALL,
                    PERMISSION_ALLOW,
                ),
                binding(
                    RESOURCE_GROUP,
                    "x",
                    PATTERN_LITERAL,
                    "alice",
                    OP_READ,
                    PERMISSION_ALLOW,
                ),
                binding(
                    RESOURCE_GROUP,
                    "h",
                    PATTERN_LITERAL,
                    "bob",
                    OP_READ,
                    PERMISSION_DENY,
                ),
            ],
        );
        assert_eq!(
            groups,
            vec![binding(
                RESOURCE_GROUP,
                "g",
                PATTERN_LITERAL,
                "alice",
                OP_READ,
                PERMISSION_ALLOW
            )]
        );
    }
}
