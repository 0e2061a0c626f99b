//! Topic and group filters: MM2's comma-separated lists of Java regexes, matched against the
//! whole name (mm2-compatibility §1.6).

pub mod java_regex;

use regex::Regex;
use serde::Serialize;
use std::fmt;

/// A parsed list such as `topics = orders.*, payments`.
///
/// MM2 joins the items with `|` into one Java pattern and requires a full match; joining (rather
/// than matching each item) matters for inline flags, which then reach into later items.
#[derive(Clone)]
pub struct PatternList {
    items: Vec<String>,
    /// `None` for an empty list, which matches nothing (MM2 compiles it to a never-matching
    /// pattern, not to one that matches the empty name).
    regex: Option<Regex>,
    notes: java_regex::Notes,
}

/// A pattern list that cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pattern '{item}' {detail}")]
pub struct PatternError {
    /// The list item that holds the problem.
    pub item: String,
    pub detail: String,
}

impl PatternList {
    /// Splits a Kafka LIST value (commas with surrounding whitespace; an empty value is an empty
    /// list) and compiles the joined pattern.
    pub fn parse(value: &str) -> Result<Self, PatternError> {
        Self::from_items(split_list(value))
    }

    pub fn from_items(items: Vec<String>) -> Result<Self, PatternError> {
        if items.is_empty() {
            return Ok(PatternList {
                items,
                regex: None,
                notes: java_regex::Notes::default(),
            });
        }
        let joined = items.join("|");
        let (rust, notes) = java_regex::translate_with_notes(&joined).map_err(|e| {
            let (item, offset) = item_at(&items, e.position);
            PatternError {
                item,
                detail: format!(
                    "at position {}: {}",
                    e.position.saturating_sub(offset),
                    e.message
                ),
            }
        })?;
        let regex = Regex::new(&format!("^(?:{rust})$")).map_err(|e| PatternError {
            item: joined.clone(),
            detail: format!("is not a valid regex: {}", first_line(&e.to_string())),
        })?;
        Ok(PatternList {
            items,
            regex: Some(regex),
            notes,
        })
    }

    /// Java `Matcher.matches()`: the whole name.
    pub fn matches(&self, name: &str) -> bool {
        self.regex.as_ref().is_some_and(|r| r.is_match(name))
    }

    /// Differences from Java that a user should be told about.
    pub fn notes(&self) -> java_regex::Notes {
        self.notes
    }

    pub fn items(&self) -> &[String] {
        &self.items
    }
}

impl Default for PatternList {
    /// The empty list: matches nothing.
    fn default() -> Self {
        PatternList {
            items: Vec::new(),
            regex: None,
            notes: java_regex::Notes::default(),
        }
    }
}

impl fmt::Debug for PatternList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.items).finish()
    }
}

impl PartialEq for PatternList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl Serialize for PatternList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.items.serialize(s)
    }
}

/// Include and exclude lists; exclusion wins (MM2's DefaultTopicFilter / DefaultGroupFilter).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NameFilter {
    pub include: PatternList,
    pub exclude: PatternList,
}

impl NameFilter {
    pub fn accepts(&self, name: &str) -> bool {
        self.include.matches(name) && !self.exclude.matches(name)
    }
}

/// Kafka's `ConfigDef.Type.LIST` parsing: trim, empty → no items, split on `\s*,\s*` keeping
/// empty items (Java `split(.., -1)`).
pub fn split_list(value: &str) -> Vec<String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Vec::new();
    }
    trimmed.split(',').map(|s| s.trim().to_string()).collect()
}

fn item_at(items: &[String], position: usize) -> (String, usize) {
    let mut start = 0;
    for item in items {
        let end = start + item.chars().count();
        if position <= end {
            return (item.clone(), start);
        }
        start = end + 1;
    }
    (items.join("|"), 0)
}

fn first_line(s: &str) -> String {
    s.lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or(s)
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_like_kafka() {
        assert_eq!(split_list(""), Vec::<String>::new());
        assert_eq!(split_list("   "), Vec::<String>::new());
        assert_eq!(split_list("a"), ["a"]);
        assert_eq!(split_list(" a , b ,c "), ["a", "b", "c"]);
        assert_eq!(split_list("a,"), ["a", ""]);
    }

    #[test]
    fn mm2_default_topic_filter() {
        let f = NameFilter {
            include: PatternList::parse(".*").unwrap(),
            exclude: PatternList::parse(r".*[\-\.]internal, .*\.replica, __.*").unwrap(),
        };
        for (name, ok) in [
            ("orders", true),
            ("A.orders", true),
            ("mm2-offsets.A.internal", false),
            ("connect-configs-internal", false),
            ("x.replica", false),
            ("__consumer_offsets", false),
            ("_schemas", true),
        ] {
            assert_eq!(f.accepts(name), ok, "{name}");
        }
    }

    #[test]
    fn an_empty_list_matches_nothing_not_even_the_empty_name() {
        let p = PatternList::parse("").unwrap();
        assert!(!p.matches("orders"));
        assert!(!p.matches(""));
    }

    #[test]
    fn ascii_case_folding_is_noted() {
        assert!(
            PatternList::parse("(?i)orders")
                .unwrap()
                .notes()
                .ascii_case_insensitive
        );
        assert!(
            !PatternList::parse("(?iu)orders")
                .unwrap()
                .notes()
                .ascii_case_insensitive
        );
        assert!(
            !PatternList::parse("orders")
                .unwrap()
                .notes()
                .ascii_case_insensitive
        );
    }

    #[test]
    fn joined_items_share_inline_flags_as_in_java() {
        // Java compiles "a|(?i)b|c" as one pattern: (?i) also applies to "c".
        let p = PatternList::parse("a, (?i)b, c").unwrap();
        assert!(p.matches("C"));
        assert!(!p.matches("A"));
    }

    #[test]
    fn errors_name_the_item_and_position_within_it() {
        let e = PatternList::parse("orders, pay(?=ments)").unwrap_err();
        assert_eq!(e.item, "pay(?=ments)");
        assert!(e.detail.starts_with("at position 3: look-around"), "{e}");
        let e = PatternList::parse("orders, [z-a]").unwrap_err();
        assert_eq!(e.item, "[z-a]");
        assert!(
            e.detail
                .starts_with("at position 3: illegal character range"),
            "{e}"
        );
    }
}
