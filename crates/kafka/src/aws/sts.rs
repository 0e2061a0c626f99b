//! STS's answers to `AssumeRole` and `AssumeRoleWithWebIdentity`, which share one XML shape:
//! a `<Credentials>` element on success, an `<Error>` with `Code` and `Message` on refusal.
//! The answer is read bounded (it is bytes from the network) and a refusal's text is shown
//! printable and short; it never holds credentials.

use super::credentials::{remaining, AwsCredentials};
use crate::error::{KafkaError, Result};
use crate::http::send;
use crate::Secret;
use std::time::Duration;

/// An STS answer is a few KiB.
const MAX_ANSWER: usize = 64 * 1024;

/// How long credentials hold when STS names no expiry (its own default for both actions).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(900);

/// Sends `req` to STS and reads its credentials and how long they hold. `what` names the call
/// in a refusal ("AssumeRole of arn:..."); `shown` is the endpoint as errors may show it.
pub(crate) async fn exchange(
    req: reqwest::RequestBuilder,
    what: &str,
    shown: &str,
) -> Result<(AwsCredentials, Duration)> {
    let (status, body) = send(req, shown, MAX_ANSWER).await?;
    let text = String::from_utf8_lossy(&body);
    let fail = |message: String, retriable: bool| KafkaError::Token {
        endpoint: shown.to_string(),
        message,
        retriable,
    };
    if !status.is_success() {
        let code = element(&text, "Code").unwrap_or_default();
        let message: String = element(&text, "Message")
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        return Err(fail(
            format!("{what}: HTTP {status}: {code} {message}"),
            status.is_server_error() || status.as_u16() == 429,
        ));
    }
    let (Some(id), Some(secret), Some(token)) = (
        element(&text, "AccessKeyId"),
        element(&text, "SecretAccessKey"),
        element(&text, "SessionToken"),
    ) else {
        return Err(fail("STS's answer has no credentials".into(), false));
    };
    let lifetime = element(&text, "Expiration")
        .and_then(|e| remaining(&e))
        .unwrap_or(DEFAULT_LIFETIME);
    let creds = AwsCredentials {
        access_key_id: id,
        secret_access_key: Secret::new(secret),
        session_token: Some(Secret::new(token)),
    };
    Ok((creds, lifetime))
}

/// The text of the first `<name>...</name>` in an STS answer (no entities in these values).
fn element(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&close)?;
    Some(xml[start..end].trim().to_string())
}
