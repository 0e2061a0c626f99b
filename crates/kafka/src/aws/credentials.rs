//! One set of AWS credentials, as every source of the chain gives it (`super::iam`), and what
//! the sources share: SigV4's query encoding, the signing crate's form, and how long an
//! answer's `Expiration` leaves.

use crate::Secret;
use aws_credential_types::Credentials;
use std::time::Duration;

/// One set of AWS credentials; the secret parts never print.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// SigV4's URI encoding (RFC 3986 unreserved characters kept).
pub(crate) fn query_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `creds` as the signing crate takes them (the secrets leave their [`Secret`] wrappers only
/// here, for the signature).
pub(crate) fn signing_credentials(creds: &AwsCredentials) -> Credentials {
    Credentials::new(
        creds.access_key_id.clone(),
        creds.secret_access_key.expose().to_string(),
        creds.session_token.as_ref().map(|t| t.expose().to_string()),
        None,
        "kmirror",
    )
}

/// How long from now until `expiration` (RFC 3339, as STS and the metadata services write it);
/// zero when past, None when it does not parse.
pub(crate) fn remaining(expiration: &str) -> Option<Duration> {
    let at =
        time::OffsetDateTime::parse(expiration, &time::format_description::well_known::Rfc3339)
            .ok()?;
    let seconds = (at - time::OffsetDateTime::now_utc())
        .whole_seconds()
        .max(0);
    Some(Duration::from_secs(seconds as u64))
}
