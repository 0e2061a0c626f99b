//! Settings with their origin, and typed reads of them with Kafka's value syntax. A bad value is
//! recorded as an error (naming file, line, key, value and what was expected) and the default is
//! used so that every other problem can still be reported in the same run.

use super::diagnostics::{Diagnostics, Origin};
use crate::filter::PatternList;
use std::collections::BTreeMap;
use std::time::Duration;

/// One value after config-provider resolution, with where it was written. Its `Debug` masks
/// sensitive values (provider-resolved secrets included).
#[derive(Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: String,
    pub origin: Origin,
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setting")
            .field(
                "value",
                &super::diagnostics::display_value(&self.origin.key, &self.value),
            )
            .field("origin", &self.origin)
            .finish()
    }
}

/// Effective settings of one scope (a flow's connector settings, or one client's settings).
pub type SettingMap = BTreeMap<String, Setting>;

/// A file's entries as settings, without provider resolution (for files that hold no secrets,
/// such as `--transforms`).
pub fn settings_of(props: &super::properties::Properties) -> SettingMap {
    let file: std::sync::Arc<str> = std::sync::Arc::from(props.source.as_str());
    props
        .iter()
        .map(|p| {
            (
                p.key.clone(),
                Setting {
                    value: p.value.clone(),
                    origin: Origin {
                        file: file.clone(),
                        line: p.line,
                        key: p.key.clone(),
                    },
                },
            )
        })
        .collect()
}

/// Typed reads from a [`SettingMap`].
pub struct Reader<'a> {
    pub map: &'a SettingMap,
    pub diags: &'a mut Diagnostics,
}

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("keys", &self.map.len())
            .finish()
    }
}

impl<'a> Reader<'a> {
    pub fn new(map: &'a SettingMap, diags: &'a mut Diagnostics) -> Self {
        Reader { map, diags }
    }

    pub fn get(&self, key: &str) -> Option<&'a Setting> {
        self.map.get(key)
    }

    /// Reports `key`'s value as invalid, saying what was expected.
    pub fn error(&mut self, key: &str, expected: &str) {
        if let Some(s) = self.get(key) {
            self.diags
                .error(Some(&s.origin), Some(&s.value), expected.to_string());
        }
    }

    pub fn string(&self, key: &str, default: &str) -> String {
        self.get(key)
            .map_or_else(|| default.to_string(), |s| s.value.trim().to_string())
    }

    /// Kafka BOOLEAN: `true`/`false`, case-insensitive, surrounding whitespace ignored.
    pub fn bool(&mut self, key: &str, default: bool) -> bool {
        let Some(s) = self.get(key) else {
            return default;
        };
        match s.value.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => {
                self.diags
                    .error(Some(&s.origin), Some(&s.value), "expected true or false");
                default
            }
        }
    }

    /// An integer in `[min, max]`.
    pub fn int(&mut self, key: &str, default: i64, min: i64, max: i64) -> i64 {
        let Some(s) = self.get(key) else {
            return default;
        };
        match s.value.trim().parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => v,
            Ok(_) => {
                self.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("expected a whole number between {min} and {max}"),
                );
                default
            }
            Err(_) => {
                self.diags
                    .error(Some(&s.origin), Some(&s.value), "expected a whole number");
                default
            }
        }
    }

    /// A duration written in milliseconds (`*.ms`).
    pub fn millis(&mut self, key: &str, default_ms: i64) -> Duration {
        Duration::from_millis(self.int(key, default_ms, 0, i32::MAX as i64) as u64)
    }

    /// A replication factor: -1 (the broker's default) or 1..=32767.
    pub fn replication_factor(&mut self, key: &str, default: i16) -> i16 {
        let v = self.int(key, default as i64, -1, i16::MAX as i64);
        if v == 0 {
            if let Some(s) = self.get(key) {
                self.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    "expected -1 (the broker's default.replication.factor) or a replication factor of at least 1",
                );
            }
            return default;
        }
        v as i16
    }

    /// One of `choices` (compared case-insensitively); returns the canonical spelling.
    pub fn choice(
        &mut self,
        key: &str,
        default: &'static str,
        choices: &[&'static str],
    ) -> &'static str {
        let Some(s) = self.get(key) else {
            return default;
        };
        let v = s.value.trim();
        match choices.iter().find(|c| c.eq_ignore_ascii_case(v)) {
            Some(c) => c,
            None => {
                self.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("expected one of: {}", choices.join(", ")),
                );
                default
            }
        }
    }

    /// A pattern list (`topics`, `groups`, ...), with its MM2 default.
    pub fn patterns(&mut self, key: &str, default: &str) -> PatternList {
        let fallback = PatternList::parse(default).expect("built-in default pattern");
        let Some(s) = self.get(key) else {
            return fallback;
        };
        match PatternList::parse(&s.value) {
            Ok(p) => {
                if p.notes().ascii_case_insensitive {
                    self.diags.warning(
                        Some(&s.origin),
                        Some(&s.value),
                        "(?i) folds non-ASCII letters too in kmirror (Java folds only ASCII unless (?iu)): names with non-ASCII letters may match differently than in MM2",
                    );
                }
                p
            }
            Err(e) => {
                self.diags.error(
                    Some(&s.origin),
                    Some(&s.value),
                    format!("invalid regex: {e}"),
                );
                fallback
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn map(pairs: &[(&str, &str)]) -> SettingMap {
        pairs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| {
                (
                    k.to_string(),
                    Setting {
                        value: v.to_string(),
                        origin: Origin {
                            file: Arc::from("f.properties"),
                            line: i + 1,
                            key: format!("A->B.{k}"),
                        },
                    },
                )
            })
            .collect()
    }

    #[test]
    fn typed_reads_and_their_errors() {
        let m = map(&[
            ("b1", " TRUE "),
            ("b2", "yes"),
            ("n1", "42"),
            ("n2", "4x"),
            ("n3", "-5"),
            ("rf", "0"),
            ("c", "Target"),
            ("c2", "both"),
            ("p", "a(?=b)"),
        ]);
        let mut d = Diagnostics::default();
        let mut r = Reader::new(&m, &mut d);
        assert!(r.bool("b1", false));
        assert!(!r.bool("b2", false));
        assert_eq!(r.int("n1", 0, 0, 100), 42);
        assert_eq!(r.int("n2", 7, 0, 100), 7);
        assert_eq!(r.int("n3", 7, 0, 100), 7);
        assert_eq!(r.replication_factor("rf", 2), 2);
        assert_eq!(r.replication_factor("missing", 3), 3);
        assert_eq!(r.choice("c", "source", &["source", "target"]), "target");
        assert_eq!(r.choice("c2", "source", &["source", "target"]), "source");
        assert!(r.patterns("p", ".*").matches("anything"));
        let msgs: Vec<String> = d.items.iter().map(|x| x.to_string()).collect();
        assert_eq!(
            msgs,
            [
                "error: f.properties:2: A->B.b2 = 'yes': expected true or false",
                "error: f.properties:4: A->B.n2 = '4x': expected a whole number",
                "error: f.properties:5: A->B.n3 = '-5': expected a whole number between 0 and 100",
                "error: f.properties:6: A->B.rf = '0': expected -1 (the broker's default.replication.factor) or a replication factor of at least 1",
                "error: f.properties:8: A->B.c2 = 'both': expected one of: source, target",
                "error: f.properties:9: A->B.p = 'a(?=b)': invalid regex: pattern 'a(?=b)' at position 1: look-around ('(?=', '(?!', '(?<=', '(?<!') is not supported by kmirror's regex engine",
            ]
        );
    }
}
