//! Replication policies: how remote topics are named and how a name is traced back to its
//! source cluster (mm2-compatibility §4). Pure functions, byte-for-byte MM2's naming.

use crate::names::ClusterAlias;
use serde::Serialize;

/// The heartbeats topic; its name never takes the separator.
pub const HEARTBEATS_TOPIC: &str = "heartbeats";

/// MM2's class names, in the forms users write them.
pub const DEFAULT_POLICY_CLASS: &str = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy";
pub const IDENTITY_POLICY_CLASS: &str = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy";

/// Which naming rule: `A.orders` (default) or `orders` (identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Default,
    Identity,
}

impl PolicyKind {
    /// Maps `replication.policy.class` to a built-in. MM2's `LegacyReplicationPolicy` (KIP-382)
    /// keeps topic names, so it is the identity policy.
    pub fn from_class(class: &str) -> Option<Self> {
        let simple = class.trim().rsplit('.').next().unwrap_or("");
        match simple {
            "DefaultReplicationPolicy" => Some(Self::Default),
            "IdentityReplicationPolicy" | "LegacyReplicationPolicy" => Some(Self::Identity),
            _ => None,
        }
    }
}

/// A configured replication policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicationPolicy {
    pub kind: PolicyKind,
    /// `replication.policy.separator` (default `.`).
    pub separator: String,
    /// `replication.policy.internal.topic.separator.enabled` (default true): whether the checkpoints
    /// and offset-syncs topic names use the separator too, or `.` (KIP-949).
    pub internal_separator_enabled: bool,
    /// The flow's source alias: what the identity policy answers for `topic_source`.
    pub source_alias: Option<ClusterAlias>,
}

impl Default for ReplicationPolicy {
    fn default() -> Self {
        ReplicationPolicy {
            kind: PolicyKind::Default,
            separator: ".".into(),
            internal_separator_enabled: true,
            source_alias: None,
        }
    }
}

impl ReplicationPolicy {
    fn internal_separator(&self) -> &str {
        if self.internal_separator_enabled {
            &self.separator
        } else {
            "."
        }
    }

    fn internal_suffix(&self) -> String {
        format!("{}internal", self.internal_separator())
    }

    fn checkpoints_suffix(&self) -> String {
        format!(
            "{}checkpoints{}",
            self.internal_separator(),
            self.internal_suffix()
        )
    }

    /// The identity policy treats anything ending in `heartbeats` (a plain suffix test, as in
    /// MM2) like the default policy, so heartbeat chains keep working.
    fn looks_like_heartbeat(&self, topic: &str) -> bool {
        topic.ends_with(HEARTBEATS_TOPIC)
    }

    fn identity_applies(&self, topic: &str) -> bool {
        self.kind == PolicyKind::Identity && !self.looks_like_heartbeat(topic)
    }

    /// The name of `topic` from cluster `source` on the target.
    pub fn format_remote_topic(&self, source: &ClusterAlias, topic: &str) -> String {
        if self.identity_applies(topic) {
            topic.to_string()
        } else {
            format!("{}{}{}", source, self.separator, topic)
        }
    }

    /// The cluster a topic came from, or `None` for a topic that is not remote.
    pub fn topic_source(&self, topic: &str) -> Option<String> {
        if self.identity_applies(topic) {
            return self.source_alias.as_ref().map(|a| a.to_string());
        }
        let parts = java_split(topic, &self.separator);
        if parts.len() < 2 {
            None
        } else {
            Some(parts[0].to_string())
        }
    }

    /// The topic's name one hop upstream: `B.t` for `A.B.t`.
    pub fn upstream_topic(&self, topic: &str) -> Option<String> {
        if self.identity_applies(topic) {
            return Some(topic.to_string());
        }
        let source = self.topic_source(topic)?;
        Some(topic[source.len() + self.separator.len()..].to_string())
    }

    /// Follows `upstream_topic` to the first name.
    pub fn original_topic(&self, topic: &str) -> String {
        let mut current = topic.to_string();
        loop {
            match self.upstream_topic(&current) {
                Some(up) if up != current => current = up,
                _ => return current,
            }
        }
    }

    pub fn heartbeats_topic(&self) -> &'static str {
        HEARTBEATS_TOPIC
    }

    /// `mm2-offset-syncs.<alias>.internal` (with the internal separator).
    pub fn offset_syncs_topic(&self, alias: &ClusterAlias) -> String {
        format!(
            "mm2-offset-syncs{}{}{}",
            self.internal_separator(),
            alias,
            self.internal_suffix()
        )
    }

    /// `<alias>.checkpoints.internal` (with the internal separator).
    pub fn checkpoints_topic(&self, alias: &ClusterAlias) -> String {
        format!("{}{}", alias, self.checkpoints_suffix())
    }

    pub fn is_heartbeats_topic(&self, topic: &str) -> bool {
        self.original_topic(topic) == HEARTBEATS_TOPIC
    }

    pub fn is_checkpoints_topic(&self, topic: &str) -> bool {
        topic.ends_with(&self.checkpoints_suffix())
    }

    pub fn is_mm2_internal_topic(&self, topic: &str) -> bool {
        topic.ends_with(&self.internal_suffix())
    }

    /// Kafka's own (`__x`, `.x`), Connect's (`-internal`, `.internal`) and MM2's internal topics.
    pub fn is_internal_topic(&self, topic: &str) -> bool {
        self.is_mm2_internal_topic(topic)
            || topic.starts_with("__")
            || topic.starts_with('.')
            || topic.ends_with("-internal")
            || topic.ends_with(".internal")
    }

    /// MM2's cycle test for flow `source -> target`: whether `topic` on the source came from the
    /// target (directly or further upstream), so copying it back would loop.
    pub fn is_cycle(&self, topic: &str, target: &ClusterAlias) -> bool {
        let mut current = topic.to_string();
        loop {
            match self.topic_source(&current) {
                None => return false,
                Some(src) if src == target.as_str() => return true,
                Some(_) => {}
            }
            match self.upstream_topic(&current) {
                Some(up) if up != current => current = up,
                _ => return false,
            }
        }
    }
}

/// Java's `Pattern.split(input)` with a literal separator: trailing empty pieces are dropped; an
/// empty input gives one empty piece.
fn java_split<'a>(input: &'a str, sep: &str) -> Vec<&'a str> {
    if input.is_empty() {
        return vec![""];
    }
    let mut parts: Vec<&str> = input.split(sep).collect();
    while parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    if parts.len() == 1 && parts[0].is_empty() {
        // Input made only of separators: Java returns an empty array.
        parts.clear();
    }
    parts
}

/// A ring of three or more clusters in `edges` (source, target), as the aliases along it with
/// the first repeated at the end; pairs (A->B->A) are not rings here. A few aliases at most, so
/// every simple path is tried.
pub fn ring_of_three_or_more(edges: &[(&str, &str)]) -> Option<Vec<String>> {
    fn walk<'a>(edges: &[(&'a str, &'a str)], path: &mut Vec<&'a str>) -> Option<Vec<String>> {
        let last = *path.last()?;
        for &(s, t) in edges {
            if s != last {
                continue;
            }
            if t == path[0] && path.len() >= 3 {
                let mut ring: Vec<String> = path.iter().map(|a| a.to_string()).collect();
                ring.push(t.to_string());
                return Some(ring);
            }
            if !path.contains(&t) {
                path.push(t);
                if let Some(r) = walk(edges, path) {
                    return Some(r);
                }
                path.pop();
            }
        }
        None
    }
    let mut starts: Vec<&str> = edges.iter().map(|e| e.0).collect();
    starts.sort();
    starts.dedup();
    starts.into_iter().find_map(|s| walk(edges, &mut vec![s]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> ClusterAlias {
        ClusterAlias::new(s)
    }

    fn default_with(sep: &str) -> ReplicationPolicy {
        ReplicationPolicy {
            separator: sep.into(),
            ..ReplicationPolicy::default()
        }
    }

    fn identity(source: &str) -> ReplicationPolicy {
        ReplicationPolicy {
            kind: PolicyKind::Identity,
            source_alias: Some(a(source)),
            ..ReplicationPolicy::default()
        }
    }

    #[test]
    fn class_names_map_to_builtins() {
        assert_eq!(
            PolicyKind::from_class(DEFAULT_POLICY_CLASS),
            Some(PolicyKind::Default)
        );
        assert_eq!(
            PolicyKind::from_class(IDENTITY_POLICY_CLASS),
            Some(PolicyKind::Identity)
        );
        assert_eq!(
            PolicyKind::from_class("org.apache.kafka.connect.mirror.LegacyReplicationPolicy"),
            Some(PolicyKind::Identity)
        );
        assert_eq!(
            PolicyKind::from_class("DefaultReplicationPolicy"),
            Some(PolicyKind::Default)
        );
        assert_eq!(
            PolicyKind::from_class("com.acme.CustomReplicationPolicy"),
            None
        );
    }

    #[test]
    fn topic_source_follows_java_split() {
        let p = ReplicationPolicy::default();
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("a.b.c", Some("a"), Some("b.c")),
            ("a.", None, None),
            ("a..", None, None),
            (".b", Some(""), Some("b")),
            ("a..b", Some("a"), Some(".b")),
            ("orders", None, None),
            ("", None, None),
            ("...", None, None),
        ];
        for (topic, source, upstream) in cases {
            assert_eq!(
                p.topic_source(topic).as_deref(),
                *source,
                "source of {topic:?}"
            );
            assert_eq!(
                p.upstream_topic(topic).as_deref(),
                *upstream,
                "upstream of {topic:?}"
            );
        }
        assert_eq!(p.original_topic("B.A.orders"), "orders");
    }

    #[test]
    fn internal_topic_names() {
        let p = ReplicationPolicy::default();
        assert_eq!(p.offset_syncs_topic(&a("B")), "mm2-offset-syncs.B.internal");
        assert_eq!(p.checkpoints_topic(&a("A")), "A.checkpoints.internal");
        let u = default_with("_");
        assert_eq!(u.format_remote_topic(&a("A"), "orders"), "A_orders");
        assert_eq!(u.offset_syncs_topic(&a("B")), "mm2-offset-syncs_B_internal");
        assert_eq!(u.checkpoints_topic(&a("A")), "A_checkpoints_internal");
        assert!(u.is_checkpoints_topic("A_checkpoints_internal"));
        let legacy = ReplicationPolicy {
            internal_separator_enabled: false,
            ..default_with("_")
        };
        assert_eq!(legacy.format_remote_topic(&a("A"), "orders"), "A_orders");
        assert_eq!(
            legacy.offset_syncs_topic(&a("B")),
            "mm2-offset-syncs.B.internal"
        );
        assert_eq!(legacy.checkpoints_topic(&a("A")), "A.checkpoints.internal");
        assert_eq!(p.heartbeats_topic(), "heartbeats");
        assert_eq!(u.heartbeats_topic(), "heartbeats");
    }

    #[test]
    fn internal_topic_tests() {
        let p = ReplicationPolicy::default();
        for (t, internal) in [
            ("__consumer_offsets", true),
            (".hidden", true),
            ("connect-offsets-internal", true),
            ("mm2-offsets.A.internal", true),
            ("A.checkpoints.internal", true),
            ("orders", false),
            ("internal", false),
        ] {
            assert_eq!(p.is_internal_topic(t), internal, "{t}");
        }
        assert!(p.is_heartbeats_topic("heartbeats"));
        assert!(p.is_heartbeats_topic("A.heartbeats"));
        assert!(p.is_heartbeats_topic("B.A.heartbeats"));
        assert!(!p.is_heartbeats_topic("myheartbeats"));
        assert!(p.is_checkpoints_topic("A.checkpoints.internal"));
    }

    #[test]
    fn identity_policy_keeps_names_except_heartbeats() {
        let p = identity("A");
        assert_eq!(p.format_remote_topic(&a("A"), "orders"), "orders");
        assert_eq!(p.format_remote_topic(&a("A"), "heartbeats"), "A.heartbeats");
        // Plain suffix test, as MM2: "myheartbeats" is handled like a heartbeat topic.
        assert_eq!(
            p.format_remote_topic(&a("A"), "myheartbeats"),
            "A.myheartbeats"
        );
        assert_eq!(p.topic_source("orders").as_deref(), Some("A"));
        assert_eq!(p.topic_source("B.heartbeats").as_deref(), Some("B"));
        assert_eq!(p.upstream_topic("x.y").as_deref(), Some("x.y"));
        assert_eq!(p.original_topic("x.y"), "x.y");
        let without_alias = ReplicationPolicy {
            source_alias: None,
            ..p
        };
        assert_eq!(without_alias.topic_source("orders"), None);
    }

    #[test]
    fn rings_of_three_are_found_and_pairs_are_not() {
        assert_eq!(ring_of_three_or_more(&[("A", "B"), ("B", "A")]), None);
        assert_eq!(
            ring_of_three_or_more(&[("A", "B"), ("B", "A"), ("A", "C"), ("C", "A")]),
            None
        );
        assert_eq!(
            ring_of_three_or_more(&[("B", "C"), ("A", "B"), ("C", "A"), ("B", "A")]),
            Some(vec!["A".into(), "B".into(), "C".into(), "A".into()])
        );
        assert_eq!(
            ring_of_three_or_more(&[("A", "B"), ("B", "C"), ("A", "C")]),
            None
        );
    }

    #[test]
    fn cycle_detection() {
        let p = ReplicationPolicy::default();
        // Flow A->B sees these topics on A.
        assert!(p.is_cycle("B.orders", &a("B")));
        assert!(p.is_cycle("C.B.orders", &a("B")));
        assert!(!p.is_cycle("C.orders", &a("B")));
        assert!(!p.is_cycle("orders", &a("B")));
        assert!(p.is_cycle("B.heartbeats", &a("B")));
        // Identity cannot tell: topic_source is always the flow's source.
        let i = identity("A");
        assert!(!i.is_cycle("orders", &a("B")));
        assert!(i.is_cycle("B.heartbeats", &a("B")));
    }

    mod roundtrip {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// format → parse gives back the source and the topic, for any separator that does not
            /// occur in the alias (nor across its end).
            #[test]
            fn remote_names_round_trip(
                alias in "[A-Za-z0-9-]{1,8}",
                topic in "[A-Za-z0-9._-]{1,20}",
                sep in proptest::sample::select(vec![".", "_", "__", "-x-", "::"]),
            ) {
                // The separator must first occur right after the alias: alias "-x" with
                // separator "-x-" gives "-x-x-A", which Java's split (and so MM2) reads as
                // source "" too.
                prop_assume!(format!("{alias}{sep}").find(sep) == Some(alias.len()));
                let p = default_with(sep);
                let remote = p.format_remote_topic(&a(&alias), &topic);
                // Java split drops trailing empty pieces: a topic made only of separators is
                // not recognised as remote, exactly as in MM2.
                prop_assume!(topic.split(sep).any(|s| !s.is_empty()));
                prop_assert_eq!(p.topic_source(&remote), Some(alias.clone()));
                let up = p.upstream_topic(&remote).unwrap();
                prop_assert_eq!(up, topic.clone());
            }
        }
    }
}
