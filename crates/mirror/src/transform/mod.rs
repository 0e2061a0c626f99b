//! Built-in record transforms, configured with Kafka Connect's SMT syntax (`transforms`,
//! `transforms.<alias>.type`, `predicates`, ...) so that an MM2 file or a Connect habit carries
//! over: Connect's own `Filter`, `DropHeaders`, `InsertHeader` and `RegexRouter` with the
//! predicates `TopicNameMatches`, `HasHeaderKey` and `RecordIsTombstone`, plus kmirror's
//! `KeyMatches` and `HeaderValueMatches` predicates (Connect has no key or header-value test).
//! Java plug-in classes cannot run here; naming one is an error that lists what can.
//!
//! Transforms see every record, so a flow with any transform copies in record mode (records are
//! decoded, changed and re-encoded) instead of forwarding whole batches.
//!
//! Pure: the engine hands each decoded record and its topic to [`Chain::apply`]. Reading a chain
//! from the SMT keys is `config::transforms`.

pub(crate) mod replacement;

use kmirror_kafka::records::Record;
use regex::bytes::Regex as BytesRegex;
use regex::Regex;
use replacement::Replacement;
use serde::Serialize;
use std::borrow::Cow;

/// The transforms of a flow (or of MM1 mode), applied in order. Empty: records pass unchanged.
#[derive(Clone, Default)]
pub struct Chain {
    pub(crate) steps: Vec<Step>,
}

#[derive(Clone)]
pub(crate) struct Step {
    pub(crate) alias: String,
    /// What `plan` shows (also the basis of equality).
    pub(crate) description: String,
    pub(crate) kind: Kind,
    pub(crate) condition: Option<Condition>,
}

#[derive(Clone)]
pub(crate) enum Kind {
    /// Drops the record (when its condition holds; always without one, as Connect's Filter).
    Filter,
    DropHeaders(Vec<Vec<u8>>),
    InsertHeader {
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// Connect's RegexRouter: when the whole topic name matches, it becomes the replacement.
    RegexRouter {
        regex: Regex,
        replacement: Replacement,
    },
}

#[derive(Clone)]
pub(crate) struct Condition {
    pub(crate) predicate: Predicate,
    pub(crate) negate: bool,
}

#[derive(Clone)]
pub(crate) enum Predicate {
    TopicNameMatches(Regex),
    HasHeaderKey(Vec<u8>),
    RecordIsTombstone,
    KeyMatches(BytesRegex),
    HeaderValueMatches { name: Vec<u8>, value: BytesRegex },
}

impl Predicate {
    fn test(&self, topic: &str, r: &Record) -> bool {
        match self {
            Predicate::TopicNameMatches(re) => re.is_match(topic),
            Predicate::HasHeaderKey(name) => r.headers.iter().any(|(k, _)| k[..] == name[..]),
            Predicate::RecordIsTombstone => r.value.is_none(),
            Predicate::KeyMatches(re) => r.key.as_ref().is_some_and(|k| re.is_match(k)),
            Predicate::HeaderValueMatches { name, value } => r
                .headers
                .iter()
                .any(|(k, v)| k[..] == name[..] && v.as_ref().is_some_and(|v| value.is_match(v))),
        }
    }
}

impl Chain {
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Whether any step can change a record's topic.
    pub fn renames(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.kind, Kind::RegexRouter { .. }))
    }

    /// The aliases of the steps that rename topics (for errors where renaming is refused).
    pub fn renaming_aliases(&self) -> Vec<&str> {
        self.steps
            .iter()
            .filter(|s| matches!(s.kind, Kind::RegexRouter { .. }))
            .map(|s| s.alias.as_str())
            .collect()
    }

    /// One line per step, for `plan`.
    pub fn describe(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.description.clone()).collect()
    }

    /// Runs the record through every step: `None` when a filter dropped it, else its (possibly
    /// new) topic and the record.
    pub fn apply<'t>(&self, topic: &'t str, mut record: Record) -> Option<(Cow<'t, str>, Record)> {
        let mut topic = Cow::Borrowed(topic);
        for step in &self.steps {
            if let Some(c) = &step.condition {
                if c.predicate.test(&topic, &record) == c.negate {
                    continue;
                }
            }
            match &step.kind {
                Kind::Filter => return None,
                Kind::DropHeaders(names) => record
                    .headers
                    .retain(|(k, _)| !names.iter().any(|n| n[..] == k[..])),
                Kind::InsertHeader { name, value } => record.headers.push((
                    bytes::Bytes::copy_from_slice(name),
                    Some(bytes::Bytes::copy_from_slice(value)),
                )),
                Kind::RegexRouter { regex, replacement } => {
                    if let Some(caps) = regex.captures(&topic) {
                        topic = Cow::Owned(replacement.expand(&caps));
                    }
                }
            }
        }
        Some((topic, record))
    }

    /// The topic a record of `topic` goes to when the renaming steps depend on the topic only
    /// (no record-level condition): known before any record is read, e.g. to create it.
    pub fn route_topic<'t>(&self, topic: &'t str) -> Option<Cow<'t, str>> {
        let mut out = Cow::Borrowed(topic);
        for step in &self.steps {
            let Kind::RegexRouter { regex, replacement } = &step.kind else {
                continue;
            };
            match &step.condition {
                None => {}
                Some(Condition {
                    predicate: Predicate::TopicNameMatches(re),
                    negate,
                }) if re.is_match(&out) == *negate => continue,
                Some(Condition {
                    predicate: Predicate::TopicNameMatches(_),
                    ..
                }) => {}
                Some(_) => return None,
            }
            if let Some(caps) = regex.captures(&out) {
                out = Cow::Owned(replacement.expand(&caps));
            }
        }
        Some(out)
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.describe()).finish()
    }
}

impl PartialEq for Chain {
    fn eq(&self, other: &Self) -> bool {
        self.describe() == other.describe()
    }
}

impl Serialize for Chain {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.describe().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::diagnostics::Diagnostics;
    use crate::config::properties::Properties;
    use crate::config::values::{settings_of, SettingMap};
    use bytes::Bytes;

    pub(super) fn settings(text: &str) -> SettingMap {
        settings_of(&Properties::parse(text, "t.properties").unwrap())
    }

    pub(super) fn chain(text: &str) -> Chain {
        let mut d = Diagnostics::default();
        let c = crate::config::transforms::parse(&settings(text), &mut d);
        assert!(!d.has_errors(), "{d:?}");
        c
    }

    fn rec(key: Option<&str>, value: Option<&str>, headers: &[(&str, &str)]) -> Record {
        Record {
            offset: 0,
            timestamp: 1,
            key: key.map(|k| Bytes::from(k.to_string())),
            value: value.map(|v| Bytes::from(v.to_string())),
            headers: headers
                .iter()
                .map(|(k, v)| (Bytes::from(k.to_string()), Some(Bytes::from(v.to_string()))))
                .collect(),
        }
    }

    #[test]
    fn empty_chain_passes_records_unchanged() {
        let c = chain("");
        assert!(c.is_empty());
        let r = rec(Some("k"), Some("v"), &[("h", "1")]);
        let (t, out) = c.apply("orders", r.clone()).unwrap();
        assert_eq!((t.as_ref(), out), ("orders", r));
    }

    #[test]
    fn filter_with_topic_key_header_and_tombstone_predicates() {
        let c = chain(
            "transforms = noDebug, noTest, noTrace, noTomb\n\
             transforms.noDebug.type = org.apache.kafka.connect.transforms.Filter\n\
             transforms.noDebug.predicate = isDebug\n\
             transforms.noTest.type = Filter\n\
             transforms.noTest.predicate = testKey\n\
             transforms.noTrace.type = Filter\n\
             transforms.noTrace.predicate = traced\n\
             transforms.noTomb.type = Filter\n\
             transforms.noTomb.predicate = tomb\n\
             predicates = isDebug, testKey, traced, tomb\n\
             predicates.isDebug.type = org.apache.kafka.connect.transforms.predicates.TopicNameMatches\n\
             predicates.isDebug.pattern = debug\\\\..*\n\
             predicates.testKey.type = KeyMatches\n\
             predicates.testKey.pattern = test-\\\\d+\n\
             predicates.traced.type = HeaderValueMatches\n\
             predicates.traced.name = env\n\
             predicates.traced.pattern = (?i)staging\n\
             predicates.tomb.type = RecordIsTombstone\n",
        );
        let keep = rec(Some("user-1"), Some("v"), &[("env", "prod")]);
        assert!(c.apply("orders", keep.clone()).is_some());
        assert!(c.apply("debug.orders", keep.clone()).is_none());
        // Full match, as Java's Matcher.matches(): "xdebug.orders" is kept.
        assert!(c.apply("xdebug.orders", keep).is_some());
        assert!(c
            .apply("orders", rec(Some("test-42"), Some("v"), &[]))
            .is_none());
        assert!(c
            .apply("orders", rec(Some("test-42x"), Some("v"), &[]))
            .is_some());
        assert!(c
            .apply("orders", rec(None, Some("v"), &[("env", "STAGING")]))
            .is_none());
        assert!(c.apply("orders", rec(Some("k"), None, &[])).is_none());
    }

    #[test]
    fn negate_keeps_only_matching_records_and_filter_without_predicate_drops_all() {
        let c = chain(
            "transforms = onlyEu\n\
             transforms.onlyEu.type = Filter\n\
             transforms.onlyEu.predicate = eu\n\
             transforms.onlyEu.negate = true\n\
             predicates = eu\n\
             predicates.eu.type = HasHeaderKey\n\
             predicates.eu.name = region-eu\n",
        );
        assert!(c
            .apply("t", rec(None, Some("v"), &[("region-eu", "")]))
            .is_some());
        assert!(c
            .apply("t", rec(None, Some("v"), &[("other", "")]))
            .is_none());
        let all = chain("transforms = f\ntransforms.f.type = Filter\n");
        assert!(all.apply("t", rec(None, Some("v"), &[])).is_none());
    }

    #[test]
    fn drop_and_insert_headers_keep_order_and_duplicates() {
        let c = chain(
            "transforms = drop, add\n\
             transforms.drop.type = DropHeaders\n\
             transforms.drop.headers = trace-id, span\n\
             transforms.add.type = org.apache.kafka.connect.transforms.InsertHeader\n\
             transforms.add.header = mirrored-from\n\
             transforms.add.value.literal = dc1\n",
        );
        let r = rec(
            Some("k"),
            Some("v"),
            &[("a", "1"), ("trace-id", "x"), ("a", "2"), ("span", "y")],
        );
        let (_, out) = c.apply("t", r).unwrap();
        let names: Vec<(String, String)> = out
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v.as_ref().unwrap()).into_owned(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("a".into(), "1".into()),
                ("a".into(), "2".into()),
                ("mirrored-from".into(), "dc1".into())
            ]
        );
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out.value.as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn regex_router_renames_whole_matches_with_java_group_references() {
        let c = chain(
            "transforms = route\n\
             transforms.route.type = org.apache.kafka.connect.transforms.RegexRouter\n\
             transforms.route.regex = (prod)\\\\.(.*)\n\
             transforms.route.replacement = dr.$2.from-$1\n",
        );
        assert!(c.renames());
        let r = rec(None, Some("v"), &[]);
        assert_eq!(
            c.apply("prod.orders", r.clone()).unwrap().0,
            "dr.orders.from-prod"
        );
        // No whole match: the name stays.
        assert_eq!(
            c.apply("test.prod.orders", r).unwrap().0,
            "test.prod.orders"
        );
        assert_eq!(c.route_topic("prod.x").unwrap(), "dr.x.from-prod");
    }

    #[test]
    fn a_conditional_router_routes_per_record_and_has_no_static_route() {
        let c = chain(
            "transforms = r\n\
             transforms.r.type = RegexRouter\n\
             transforms.r.regex = .*\n\
             transforms.r.replacement = tombstones\n\
             transforms.r.predicate = tomb\n\
             predicates = tomb\n\
             predicates.tomb.type = RecordIsTombstone\n",
        );
        assert_eq!(c.apply("t", rec(None, None, &[])).unwrap().0, "tombstones");
        assert_eq!(c.apply("t", rec(None, Some("v"), &[])).unwrap().0, "t");
        assert!(c.route_topic("t").is_none());
        let by_topic = chain(
            "transforms = r\n\
             transforms.r.type = RegexRouter\n\
             transforms.r.regex = (.*)\n\
             transforms.r.replacement = eu.$1\n\
             transforms.r.predicate = p\n\
             predicates = p\n\
             predicates.p.type = TopicNameMatches\n\
             predicates.p.pattern = orders.*\n",
        );
        assert_eq!(by_topic.route_topic("orders1").unwrap(), "eu.orders1");
        assert_eq!(by_topic.route_topic("users").unwrap(), "users");
    }
}
