//! Java `.properties` files, read the way `java.util.Properties.load` reads them, keeping the
//! line number of every key for error messages.
//!
//! Hand-written rather than the `java-properties` crate: version 2.0.0 drops a last line that
//! ends in a continuation backslash at end of file, where Java keeps it; and we need the origin of
//! each key anyway. The rules below follow the JDK's `Properties.LineReader` and `loadConvert`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// One `key = value` with the (1-based) line it starts on. Its `Debug` masks sensitive values.
#[derive(Clone, PartialEq, Eq)]
pub struct Property {
    pub key: String,
    pub value: String,
    pub line: usize,
}

/// A parsed properties file. Later duplicates win, as in Java; earlier ones are remembered so a
/// warning can name both lines.
#[derive(Debug, Clone, Default)]
pub struct Properties {
    /// How the file is named in messages (usually its path).
    pub source: String,
    entries: Vec<Property>,
    index: HashMap<String, usize>,
    duplicates: Vec<(Property, usize)>,
}

/// The only failure Java's parser has: a malformed `\uXXXX` escape. Also an unreadable file.
#[derive(Debug, thiserror::Error)]
pub enum PropertiesError {
    #[error("{file}:{line}: malformed \\uXXXX escape: {detail}")]
    BadEscape {
        file: String,
        line: usize,
        detail: String,
    },
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
}

impl Properties {
    /// Parses properties text. `source` names the file in messages.
    pub fn parse(text: &str, source: impl Into<String>) -> Result<Self, PropertiesError> {
        let source = source.into();
        let mut props = Properties {
            source: source.clone(),
            ..Properties::default()
        };
        for (line, logical) in logical_lines(text) {
            let (raw_key, raw_value) = split_key_value(&logical);
            let key = unescape(raw_key).map_err(|detail| PropertiesError::BadEscape {
                file: source.clone(),
                line,
                detail,
            })?;
            let value = unescape(raw_value).map_err(|detail| PropertiesError::BadEscape {
                file: source.clone(),
                line,
                detail,
            })?;
            props.insert(Property { key, value, line });
        }
        Ok(props)
    }

    /// Reads a file. Java reads properties as ISO-8859-1; files written today are UTF-8, so a
    /// file that is valid UTF-8 is read as UTF-8 and anything else as ISO-8859-1 (the rule of
    /// Java 9's `PropertyResourceBundle`). ASCII files, the common case, read the same either way.
    pub fn load(path: &Path) -> Result<Self, PropertiesError> {
        let bytes = std::fs::read(path).map_err(|error| PropertiesError::Read {
            path: path.display().to_string(),
            error,
        })?;
        let text = match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => e.into_bytes().iter().map(|&b| b as char).collect(),
        };
        Self::parse(&text, path.display().to_string())
    }

    /// Builds properties from pairs (command-line values, tests); each gets line 0.
    pub fn from_pairs<'a>(
        source: impl Into<String>,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut props = Properties {
            source: source.into(),
            ..Properties::default()
        };
        for (k, v) in pairs {
            props.insert(Property {
                key: k.to_string(),
                value: v.to_string(),
                line: 0,
            });
        }
        props
    }

    fn insert(&mut self, p: Property) {
        if let Some(&i) = self.index.get(&p.key) {
            let old = std::mem::replace(&mut self.entries[i], p);
            let new_line = self.entries[i].line;
            self.duplicates.push((old, new_line));
        } else {
            self.index.insert(p.key.clone(), self.entries.len());
            self.entries.push(p);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Property> {
        self.index.get(key).map(|&i| &self.entries[i])
    }

    /// Entries in file order (for a repeated key, at its first position with its last value).
    pub fn iter(&self) -> impl Iterator<Item = &Property> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys set more than once: the overridden entry and the line of the winning one.
    pub fn duplicates(&self) -> &[(Property, usize)] {
        &self.duplicates
    }
}

impl fmt::Debug for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Property")
            .field("key", &self.key)
            .field(
                "value",
                &super::diagnostics::display_value(&self.key, &self.value),
            )
            .field("line", &self.line)
            .finish()
    }
}

/// Java's whitespace for properties: space, tab, form feed.
fn is_ws(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\x0c'
}

/// Joins natural lines into logical lines: skips blank and comment lines, removes the odd
/// trailing backslash of a continued line and the leading whitespace of its continuation.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    // Natural lines end at \n, \r or \r\n.
    let mut natural = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                natural.push(&text[start..i]);
                i += 1;
                start = i;
            }
            b'\r' => {
                natural.push(&text[start..i]);
                i += 1;
                if i < bytes.len() && bytes[i] == b'\n' {
                    i += 1;
                }
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < text.len() {
        natural.push(&text[start..]);
    }

    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, raw) in natural.iter().enumerate() {
        let trimmed = raw.trim_start_matches(is_ws);
        let continuing = current.is_some();
        if !continuing
            && (trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!'))
        {
            continue;
        }
        let (body, continues) = strip_continuation(trimmed);
        match current.as_mut() {
            Some((_, buf)) => buf.push_str(body),
            None => current = Some((n + 1, body.to_string())),
        }
        if !continues {
            out.extend(current.take());
        }
    }
    // A continuation backslash on the last line: Java keeps what was read.
    out.extend(current);
    out
}

fn strip_continuation(line: &str) -> (&str, bool) {
    let backslashes = line.chars().rev().take_while(|&c| c == '\\').count();
    if backslashes % 2 == 1 {
        (&line[..line.len() - 1], true)
    } else {
        (line, false)
    }
}

/// Splits a logical line into raw (still escaped) key and value, as `Properties.load0` does: the
/// key ends at the first unescaped `=`, `:` or whitespace; then whitespace and at most one `=` or
/// `:` are skipped.
fn split_key_value(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    let mut value_start = line.len();
    let mut has_separator = false;
    for (i, c) in line.char_indices() {
        if !escaped && (c == '=' || c == ':') {
            key_end = i;
            value_start = i + 1;
            has_separator = true;
            break;
        }
        if !escaped && is_ws(c) {
            key_end = i;
            value_start = i + c.len_utf8();
            break;
        }
        escaped = c == '\\' && !escaped;
    }
    let rest = &line[value_start..];
    let mut skip = 0;
    for c in rest.chars() {
        if is_ws(c) {
            skip += c.len_utf8();
        } else if !has_separator && (c == '=' || c == ':') {
            has_separator = true;
            skip += 1;
        } else {
            break;
        }
    }
    (&line[..key_end], &rest[skip..])
}

fn hex4(chars: &mut std::str::Chars<'_>) -> Result<u32, String> {
    let hex: String = chars.by_ref().take(4).collect();
    if hex.len() != 4 || !hex.chars().all(|h| h.is_ascii_hexdigit()) {
        return Err(format!("'\\u{hex}' needs four hex digits"));
    }
    u32::from_str_radix(&hex, 16).map_err(|e| e.to_string())
}

/// Java's `loadConvert`: `\t \n \r \f`, `\uXXXX`, and `\x` → `x` for any other character.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let unit = hex4(&mut chars)?;
                // Properties.store writes characters outside the BMP as a surrogate pair.
                let ch = if (0xD800..0xDC00).contains(&unit) {
                    let mut ahead = chars.clone();
                    if ahead.next() == Some('\\') && ahead.next() == Some('u') {
                        let low = hex4(&mut ahead)?;
                        if (0xDC00..0xE000).contains(&low) {
                            chars = ahead;
                            char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                        } else {
                            None
                        }
                    } else {
                        None
                    }
                } else {
                    char::from_u32(unit)
                };
                // A lone surrogate half cannot be a Rust char; Java would keep it as a broken
                // UTF-16 unit, which no valid config needs.
                match ch {
                    Some(ch) => out.push(ch),
                    None => return Err(format!("'\\u{unit:04X}' is a lone UTF-16 surrogate")),
                }
            }
            Some(other) => out.push(other),
            // Only reachable through an even run of backslashes ending the text; Java yields NUL.
            None => out.push('\0'),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str) -> Vec<(String, String)> {
        Properties::parse(text, "t.properties")
            .unwrap()
            .iter()
            .map(|p| (p.key.clone(), p.value.clone()))
            .collect()
    }

    fn one(text: &str) -> (String, String) {
        let mut v = kv(text);
        assert_eq!(v.len(), 1, "expected one entry from {text:?}, got {v:?}");
        v.remove(0)
    }

    #[test]
    fn separators_and_whitespace() {
        let cases: &[(&str, &str, &str)] = &[
            ("a=b", "a", "b"),
            ("a = b", "a", "b"),
            ("a:b", "a", "b"),
            ("a : b", "a", "b"),
            ("a b", "a", "b"),
            ("a\tb", "a", "b"),
            ("   a=b", "a", "b"),
            ("a\x0c=\x0cb", "a", "b"),
            ("a==b", "a", "=b"),
            ("a = = b", "a", "= b"),
            ("a  :  = b", "a", "= b"),
            ("a b = c", "a", "b = c"),
            ("a=", "a", ""),
            ("a", "a", ""),
            ("a   ", "a", ""),
            ("a=b   ", "a", "b   "),
            ("A->B.enabled true", "A->B.enabled", "true"),
            ("key\\ with\\ spaces = v", "key with spaces", "v"),
            ("k\\=x=v", "k=x", "v"),
            ("k\\:x:v", "k:x", "v"),
            ("url=http://h:80/p", "url", "http://h:80/p"),
        ];
        for (text, k, v) in cases {
            assert_eq!(one(text), (k.to_string(), v.to_string()), "input {text:?}");
        }
    }

    #[test]
    fn comments_and_blank_lines() {
        let text = "# c1\n! c2\n   # indented\n\n  \t\na=1\nb=2 # not a comment\n";
        assert_eq!(
            kv(text),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "2 # not a comment".into())
            ]
        );
    }

    #[test]
    fn continuation_lines() {
        assert_eq!(
            one("servers=a1:9092,\\\n    a2:9092,\\\n\ta3:9092"),
            ("servers".into(), "a1:9092,a2:9092,a3:9092".into())
        );
        // An even number of backslashes is an escaped backslash, not a continuation.
        assert_eq!(kv("a=b\\\\\nc=d").len(), 2);
        assert_eq!(kv("a=b\\\\\nc=d")[0].1, "b\\");
        // A comment line never continues; a continued line may look like a comment.
        assert_eq!(kv("#a\\\nb=c"), vec![("b".into(), "c".into())]);
        assert_eq!(one("a=x\\\n#b"), ("a".into(), "x#b".into()));
        // The last line ending in a backslash keeps what was read (Java does; java-properties
        // 2.0.0 drops it).
        assert_eq!(one("a=b\\"), ("a".into(), "b".into()));
        // A key split across lines.
        assert_eq!(one("ke\\\n  y=v"), ("key".into(), "v".into()));
    }

    #[test]
    fn line_endings() {
        assert_eq!(kv("a=1\r\nb=2\rc=3\n").len(), 3);
        let p = Properties::parse("a=1\r\n\r\nb=2\rc=\\\r\n 3", "f").unwrap();
        assert_eq!(p.get("b").unwrap().line, 3);
        assert_eq!(p.get("c").unwrap().line, 4);
        assert_eq!(p.get("c").unwrap().value, "3");
    }

    #[test]
    fn escapes() {
        assert_eq!(one("k=caf\\u00e9").1, "café");
        assert_eq!(one("k=\\t\\n\\r\\f").1, "\t\n\r\x0c");
        // Unknown escapes drop the backslash (so \b is 'b', not backspace).
        assert_eq!(one("k=\\b\\q\\\\").1, "bq\\");
        assert_eq!(one("\\u0041=v").0, "A");
        assert_eq!(one("k=\\uD83D\\uDE00!").1, "\u{1F600}!");
        assert!(Properties::parse("k=\\uD83Dx", "f").is_err());
        let err = Properties::parse("x=1\nk=\\u00g1", "f.properties").unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.properties:2: malformed \\uXXXX escape: '\\u00g1' needs four hex digits"
        );
        assert!(Properties::parse("k=\\u12", "f").is_err());
    }

    #[test]
    fn debug_output_masks_secrets() {
        let p =
            Properties::parse("a.sasl.jaas.config=x password=\"p4ss\";\nb=visible\n", "f").unwrap();
        let dbg = format!("{p:?}");
        assert!(!dbg.contains("p4ss") && dbg.contains("visible"), "{dbg}");
    }

    #[test]
    fn duplicates_keep_the_last_value_and_are_reported() {
        let p = Properties::parse("a=1\nb=2\na=3\n", "f").unwrap();
        assert_eq!(p.get("a").unwrap().value, "3");
        assert_eq!(p.get("a").unwrap().line, 3);
        assert_eq!(p.duplicates().len(), 1);
        assert_eq!(p.duplicates()[0].0.line, 1);
        assert_eq!(p.duplicates()[0].1, 3);
        // File order is kept.
        let keys: Vec<_> = p.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
    }

    #[test]
    fn latin1_files_are_read_when_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let utf8 = dir.path().join("u.properties");
        std::fs::write(&utf8, "k=caf\u{e9}\n").unwrap();
        assert_eq!(
            Properties::load(&utf8).unwrap().get("k").unwrap().value,
            "café"
        );
        let latin1 = dir.path().join("l.properties");
        std::fs::write(&latin1, b"k=caf\xe9\n").unwrap();
        assert_eq!(
            Properties::load(&latin1).unwrap().get("k").unwrap().value,
            "café"
        );
        let missing = dir.path().join("nope.properties");
        let err = Properties::load(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read ") && err.contains("nope.properties"),
            "{err}"
        );
    }

    mod roundtrip {
        use super::super::*;
        use proptest::prelude::*;

        /// Escapes a string the way `Properties.store` does.
        fn java_escape(s: &str, is_key: bool) -> String {
            let mut out = String::new();
            for (i, c) in s.chars().enumerate() {
                match c {
                    ' ' if is_key || i == 0 => out.push_str("\\ "),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\x0c' => out.push_str("\\f"),
                    '=' | ':' | '#' | '!' | '\\' => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        out.push_str(&format!("\\u{:04X}", c as u32));
                    }
                    c => out.push(c),
                }
            }
            out
        }

        proptest! {
            #[test]
            fn stored_pairs_read_back(
                pairs in proptest::collection::btree_map("[ -~\u{a0}-\u{ff}\t]{1,12}", "[ -~\u{e9}\t\n]{0,16}", 1..6)
            ) {
                let text: String = pairs
                    .iter()
                    .map(|(k, v)| format!("{}={}\n", java_escape(k, true), java_escape(v, false)))
                    .collect();
                let p = Properties::parse(&text, "gen").unwrap();
                prop_assert_eq!(p.len(), pairs.len());
                for (k, v) in &pairs {
                    prop_assert_eq!(&p.get(k).unwrap().value, v);
                }
            }
        }
    }
}
