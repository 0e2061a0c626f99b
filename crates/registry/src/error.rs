//! What a registry call can end with. Every error names the registry (its URL without user
//! information or query) and the call; none carries a credential.

/// Confluent's error code for a subject the registry does not have.
pub const SUBJECT_NOT_FOUND: i64 = 40401;
/// Confluent's error code for a version the subject does not have.
pub const VERSION_NOT_FOUND: i64 = 40402;
/// Confluent's error code for a schema (by id, or by content under a subject) it does not have.
pub const SCHEMA_NOT_FOUND: i64 = 40403;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry answered with an error status.
    #[error("schema registry {url}: {what}: HTTP {status}{}: {message}", code.map(|c| format!(", error code {c}")).unwrap_or_default())]
    Refused {
        url: String,
        what: String,
        status: u16,
        /// The answer's `error_code`, when it had one.
        code: Option<i64>,
        message: String,
    },
    /// No answer: the registry is down, unreachable, or did not answer in time.
    #[error("schema registry {url}: {what}: {message}")]
    Unreachable {
        url: String,
        what: String,
        message: String,
    },
    /// An answer that is not what the API defines (not JSON, a missing field, too large).
    #[error("schema registry {url}: {what}: {message}")]
    BadAnswer {
        url: String,
        what: String,
        message: String,
    },
    /// Settings that cannot make a client (a bad URL, bad TLS material).
    #[error("schema registry settings: {0}")]
    Config(String),
}

impl RegistryError {
    /// Worth trying again later: no answer, a server error, or too many requests.
    pub fn is_retriable(&self) -> bool {
        match self {
            RegistryError::Unreachable { .. } => true,
            RegistryError::Refused { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// The registry says it does not have what was asked (HTTP 404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, RegistryError::Refused { status: 404, .. })
    }

    /// The answer's Confluent error code, if the registry refused with one.
    pub fn code(&self) -> Option<i64> {
        match self {
            RegistryError::Refused { code, .. } => *code,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, code: Option<i64>) -> RegistryError {
        RegistryError::Refused {
            url: "http://r".into(),
            what: "GET /subjects".into(),
            status,
            code,
            message: "m".into(),
        }
    }

    #[test]
    fn retriable_and_not_found_follow_the_status() {
        assert!(refused(503, None).is_retriable());
        assert!(refused(429, None).is_retriable());
        assert!(!refused(404, Some(SUBJECT_NOT_FOUND)).is_retriable());
        assert!(refused(404, Some(SCHEMA_NOT_FOUND)).is_not_found());
        assert!(!refused(422, Some(42201)).is_not_found());
        assert_eq!(refused(404, Some(VERSION_NOT_FOUND)).code(), Some(40402));
        let e = RegistryError::Unreachable {
            url: "http://r".into(),
            what: "GET /mode".into(),
            message: "timed out".into(),
        };
        assert!(e.is_retriable() && !e.is_not_found() && e.code().is_none());
        assert_eq!(
            refused(404, Some(40401)).to_string(),
            "schema registry http://r: GET /subjects: HTTP 404, error code 40401: m"
        );
    }
}
