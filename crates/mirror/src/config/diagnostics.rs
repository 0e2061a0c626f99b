//! Where a setting came from, and the errors and warnings found in a configuration.
//!
//! Every message names the file, line, key and value (secrets masked) and says what was
//! expected, so an operator can fix the file without guessing.

use kmirror_kafka::secret::MASK;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// The file, line and key (as written) of one setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub file: Arc<str>,
    /// 1-based; 0 for values that came from the command line.
    pub line: usize,
    pub key: String,
}

impl Origin {
    pub fn new(file: &Arc<str>, line: usize, key: &str) -> Self {
        Origin {
            file: file.clone(),
            line,
            key: key.to_string(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "{}:{}: {}", self.file, self.line, self.key)
        } else {
            write!(f, "{}: {}", self.file, self.key)
        }
    }
}

/// Keys whose values must never be printed.
pub fn is_sensitive_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("jaas")
        || k.contains("secret")
        || k.ends_with("ssl.keystore.key")
        || k.ends_with("ssl.keystore.certificate.chain")
        || k.ends_with("ssl.truststore.certificates")
        || k.contains("credentials")
        || k.ends_with(".token")
        // Schema Registry's `basic.auth.user.info` is `user:password`; key passphrases and
        // `*.pwd` keys of converters and plugins.
        || k.ends_with("basic.auth.user.info")
        || k.contains("passphrase")
        || k.contains("pwd")
}

/// A value as it may be shown for `key`: masked when sensitive, and with the credentials of any
/// URL in it (`https://user:password@host`) masked whatever the key.
pub fn display_value(key: &str, value: &str) -> String {
    if is_sensitive_key(key) || looks_secret(value) {
        MASK.to_string()
    } else {
        mask_url_credentials(value)
    }
}

/// A value that may hold a secret whatever its key: a line ending in `\` continues on the next
/// one (Java properties), so a typo can join a JAAS line or a password to an innocent key's
/// value (found by fuzzing). The same words as in sensitive keys, and JAAS login modules.
fn looks_secret(value: &str) -> bool {
    is_sensitive_key(value) || value.to_ascii_lowercase().contains("loginmodule")
}

/// `value` with the user-info part of every `scheme://user:password@host` in it replaced by the
/// mask; a value may hold a list of URLs.
pub fn mask_url_credentials(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | ',' | ';') || c.is_whitespace())
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(user_end) => {
                out.push_str(MASK);
                rest = &tail[user_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub origin: Option<Origin>,
    /// The offending value, already masked if sensitive.
    pub value: Option<String>,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: ")?;
        if let Some(o) = &self.origin {
            write!(f, "{o}")?;
            if let Some(v) = &self.value {
                write!(f, " = '{v}'")?;
            }
            write!(f, ": ")?;
        }
        f.write_str(&self.message)
    }
}

/// Collected findings. Building a configuration reports every problem it finds, not only the
/// first, and nothing runs while any error remains.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn error(
        &mut self,
        origin: Option<&Origin>,
        value: Option<&str>,
        message: impl Into<String>,
    ) {
        self.push(Severity::Error, origin, value, message.into());
    }

    pub fn warning(
        &mut self,
        origin: Option<&Origin>,
        value: Option<&str>,
        message: impl Into<String>,
    ) {
        self.push(Severity::Warning, origin, value, message.into());
    }

    fn push(
        &mut self,
        severity: Severity,
        origin: Option<&Origin>,
        value: Option<&str>,
        message: String,
    ) {
        let value = match (origin, value) {
            (Some(o), Some(v)) => Some(display_value(&o.key, v)),
            (None, Some(v)) => Some(v.to_string()),
            _ => None,
        };
        let d = Diagnostic {
            severity,
            origin: origin.cloned(),
            value,
            message,
        };
        // The same key is often read for several flows; say it once.
        if !self.items.contains(&d) {
            self.items.push(d);
        }
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| d.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items
            .iter()
            .filter(|d| d.severity == Severity::Warning)
    }

    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }

    pub fn extend(&mut self, other: Diagnostics) {
        for d in other.items {
            if !self.items.contains(&d) {
                self.items.push(d);
            }
        }
    }
}

/// The error returned when a configuration cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", render_errors(.0))]
pub struct ConfigError(pub Diagnostics);

fn render_errors(d: &Diagnostics) -> String {
    let lines: Vec<String> = d.errors().map(|e| e.to_string()).collect();
    let n = lines.len();
    format!(
        "{} configuration error{}:\n  {}",
        n,
        if n == 1 { "" } else { "s" },
        lines.join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(key: &str) -> Origin {
        Origin {
            file: Arc::from("mm2.properties"),
            line: 7,
            key: key.into(),
        }
    }

    #[test]
    fn messages_name_file_line_key_value() {
        let mut d = Diagnostics::default();
        d.error(
            Some(&origin("A->B.enabled")),
            Some("yes"),
            "expected true or false",
        );
        assert_eq!(
            d.items[0].to_string(),
            "error: mm2.properties:7: A->B.enabled = 'yes': expected true or false"
        );
    }

    #[test]
    fn sensitive_values_are_masked() {
        let mut d = Diagnostics::default();
        d.error(
            Some(&origin("A.sasl.jaas.config")),
            Some("x password=\"p\""),
            "malformed",
        );
        d.error(Some(&origin("B.ssl.truststore.password")), Some("p"), "bad");
        for item in &d.items {
            assert_eq!(item.value.as_deref(), Some(MASK));
            assert!(!item.to_string().contains("\"p\""));
        }
        assert!(!ConfigError(d).to_string().contains("password=\"p\""));
    }

    #[test]
    fn keys_that_hold_secrets_are_recognised() {
        for k in [
            "A.sasl.jaas.config",
            "ssl.key.password",
            "A.consumer.schema.registry.basic.auth.user.info",
            "ssl.keystore.passphrase",
            "target.producer.some.plugin.pwd",
            "B.sasl.oauthbearer.client.secret",
        ] {
            assert!(is_sensitive_key(k), "{k}");
        }
        for k in [
            "bootstrap.servers",
            "A.topics",
            "sasl.mechanism",
            "ssl.keystore.type",
        ] {
            assert!(!is_sensitive_key(k), "{k}");
        }
    }

    #[test]
    fn url_credentials_are_masked_whatever_the_key() {
        assert_eq!(
            display_value("A.schema.registry.url", "https://alice:s3cret@sr:8081/x"),
            format!("https://{MASK}@sr:8081/x")
        );
        assert_eq!(
            mask_url_credentials("http://u:p@a:1, http://b:2,https://t@c/p?q=x@y"),
            format!("http://{MASK}@a:1, http://b:2,https://{MASK}@c/p?q=x@y")
        );
        for plain in ["orders.*", "mailto:x@y", "http://host:8081", "", "://@"] {
            let masked = mask_url_credentials(plain);
            assert!(!masked.contains("s3cret"));
            if !plain.contains('@') || !plain.contains("://") {
                assert_eq!(masked, plain);
            }
        }
    }

    #[test]
    fn values_that_carry_a_secret_are_masked_whatever_the_key() {
        // A `\` at the end of `A->B.en = r(r\` joined the next line, a JAAS line, to its value
        // (found by fuzzing config_text).
        let joined = "r(rA.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";";
        assert_eq!(display_value("A->B.en", joined), MASK);
        assert_eq!(display_value("A->B.topics", "x ssl.key.password = p"), MASK);
        assert_eq!(
            display_value("A->B.topics", "orders.*, payments"),
            "orders.*, payments"
        );
    }

    #[test]
    fn repeated_findings_are_reported_once() {
        let mut d = Diagnostics::default();
        d.warning(Some(&origin("k")), None, "w");
        d.warning(Some(&origin("k")), None, "w");
        assert_eq!(d.items.len(), 1);
        assert!(!d.has_errors());
    }
}
