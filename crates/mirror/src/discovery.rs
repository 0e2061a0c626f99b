//! Which source topics a flow replicates, and under which remote name (mm2-compatibility §5.2): a topic
//! is kept if the topic filter accepts it (or it is a heartbeats topic and
//! `heartbeats.replication.enabled`), it is not internal (nor the registry's `_schemas` while
//! schemas are synced), and it did not come from the flow's target (cycle detection). Pure: the engine passes in the topic names it listed.

use crate::config::model::FlowConfig;
use serde::Serialize;

/// Why a source topic is not replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Skip {
    /// `topics` / `topics.exclude` reject it.
    Filtered,
    /// Kafka's, Connect's or MM2's own topic.
    Internal,
    /// It came from this flow's target; copying it back would loop.
    Cycle,
}

/// The outcome for one source topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicDecision {
    pub source: String,
    /// The remote name on the target, when replicated.
    pub remote: Option<String>,
    pub skip: Option<Skip>,
}

/// Decides every listed source topic, in name order.
pub fn decide<'a>(
    flow: &FlowConfig,
    source_topics: impl IntoIterator<Item = &'a str>,
) -> Vec<TopicDecision> {
    let mut names: Vec<&str> = source_topics.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|t| {
            let policy = &flow.policy;
            let heartbeat = flow.heartbeats_replication && policy.is_heartbeats_topic(t);
            let skip = if !(flow.topics.accepts(t) || heartbeat) {
                Some(Skip::Filtered)
            } else if policy.is_internal_topic(t) || registry_topic(flow, t) {
                Some(Skip::Internal)
            } else if policy.is_cycle(t, &flow.id.target) {
                Some(Skip::Cycle)
            } else {
                None
            };
            TopicDecision {
                source: t.to_string(),
                remote: skip.is_none().then(|| match flow.renames.get(t) {
                    Some(name) => name.clone(),
                    None => policy.format_remote_topic(&flow.id.source, t),
                }),
                skip,
            }
        })
        .collect()
}

/// With schema sync on, the source registry's own topic stays behind: its records name the
/// source's ids, and the target registry gets the schemas through its API (docs/schemas.md).
fn registry_topic(flow: &FlowConfig, topic: &str) -> bool {
    flow.schemas.is_some() && topic == crate::config::model::SchemaSync::REGISTRY_TOPIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::flow;

    fn table(f: &FlowConfig, topics: &[&str]) -> Vec<(String, Option<String>, Option<Skip>)> {
        decide(f, topics.iter().copied())
            .into_iter()
            .map(|d| (d.source, d.remote, d.skip))
            .collect()
    }

    #[test]
    fn default_policy_decisions() {
        let f = flow("A->B.topics = orders.*, heartbeats, C\\..*, B\\..*\n");
        let got = table(
            &f,
            &[
                "orders",
                "orders.eu",
                "payments",
                "B.orders",
                "C.orders",
                "heartbeats",
                "B.heartbeats",
                "__consumer_offsets",
                "mm2-offsets.B.internal",
                "A.checkpoints.internal",
                "orders",
            ],
        );
        let want: Vec<(String, Option<String>, Option<Skip>)> = vec![
            ("A.checkpoints.internal".into(), None, Some(Skip::Filtered)),
            ("B.heartbeats".into(), None, Some(Skip::Cycle)),
            ("B.orders".into(), None, Some(Skip::Cycle)),
            ("C.orders".into(), Some("A.C.orders".into()), None),
            ("__consumer_offsets".into(), None, Some(Skip::Filtered)),
            ("heartbeats".into(), Some("A.heartbeats".into()), None),
            ("mm2-offsets.B.internal".into(), None, Some(Skip::Filtered)),
            ("orders".into(), Some("A.orders".into()), None),
            ("orders.eu".into(), Some("A.orders.eu".into()), None),
            ("payments".into(), None, Some(Skip::Filtered)),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_rename_names_a_replicated_topic_and_nothing_else() {
        let f = flow(
            "A->B.topics = orders, payments\nA->B.kmirror.topics.rename = orders:orders-from-a, audit:audit-a\n",
        );
        let got = table(&f, &["orders", "payments", "audit"]);
        assert_eq!(
            got,
            vec![
                ("audit".into(), None, Some(Skip::Filtered)),
                ("orders".into(), Some("orders-from-a".into()), None),
                ("payments".into(), Some("A.payments".into()), None),
            ]
        );
    }

    #[test]
    fn heartbeats_are_replicated_even_when_the_filter_rejects_them() {
        let f = flow("A->B.topics = orders\n");
        assert_eq!(
            table(&f, &["heartbeats"])[0].1.as_deref(),
            Some("A.heartbeats")
        );
        let f = flow("A->B.topics = orders\nA->B.heartbeats.replication.enabled = false\n");
        assert_eq!(table(&f, &["heartbeats"])[0].2, Some(Skip::Filtered));
    }

    #[test]
    fn internal_topics_are_skipped_even_when_the_filter_accepts_them() {
        let f = flow("A->B.topics.exclude =\n");
        let got = table(
            &f,
            &[
                "__consumer_offsets",
                "connect-configs-internal",
                "x.internal",
                "orders",
            ],
        );
        assert_eq!(
            got.iter().filter(|d| d.2 == Some(Skip::Internal)).count(),
            3
        );
        let orders = got.iter().find(|d| d.0 == "orders").unwrap();
        assert_eq!(orders.1.as_deref(), Some("A.orders"));
    }

    #[test]
    fn the_registry_topic_stays_behind_only_while_schemas_are_synced() {
        let plain = flow("");
        assert_eq!(table(&plain, &["_schemas"])[0].2, None);
        let synced = flow(
            "A.schema.registry.url = http://127.0.0.1:1\nB.schema.registry.url = http://127.0.0.1:2\n",
        );
        assert!(synced.schemas.is_some());
        let got = table(&synced, &["_schemas", "orders"]);
        assert_eq!(got[0].2, Some(Skip::Internal));
        assert_eq!(got[1].2, None);
    }

    #[test]
    fn identity_policy_keeps_names() {
        let f = flow("replication.policy.class = IdentityReplicationPolicy\n");
        let got = table(&f, &["orders", "heartbeats"]);
        assert_eq!(got[0].1.as_deref(), Some("A.heartbeats"));
        assert_eq!(got[1].1.as_deref(), Some("orders"));
    }
}
