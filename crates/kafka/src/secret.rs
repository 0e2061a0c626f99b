//! A string that never prints: passwords, JAAS strings, key passwords.
//!
//! `Debug`, `Display` and `Serialize` all render a fixed mask, so a secret cannot leak through
//! logs, error messages, `plan` output or a derived `Debug` of a containing struct.

use std::fmt;

/// The text every secret renders as.
pub const MASK: &str = "[hidden]";

/// A secret value. Read it only where it is used on the wire, with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The real value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(MASK)
    }
}

/// A URL without user information or query, which may carry credentials.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let rest = match rest.split_once('/') {
        Some((authority, path)) => {
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{host}/{path}")
        }
        None => rest.rsplit_once('@').map_or(rest, |(_, h)| h).to_string(),
    };
    if scheme.is_empty() {
        rest
    } else {
        format!("{scheme}://{rest}")
    }
}

/// [`redact_url`] for serde: a URL in a serialized configuration.
pub(crate) fn serialize_redacted_url<S: serde::Serializer>(
    url: &str,
    to: S,
) -> std::result::Result<S::Ok, S::Error> {
    to.serialize_str(&redact_url(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints_its_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s}"), MASK);
        assert_eq!(format!("{s:?}"), MASK);
        assert_eq!(format!("{:?}", Some(&s)), format!("Some({MASK})"));
        assert_eq!(s.expose(), "hunter2");
    }
}
