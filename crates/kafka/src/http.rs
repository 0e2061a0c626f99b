//! HTTP to credentials endpoints (an OIDC token endpoint, AWS STS, the container and instance
//! metadata services): one client setup and one bounded read, since every answer is bytes
//! from the network and its URL may carry credentials.

use crate::error::{KafkaError, Result};
use std::time::Duration;

/// An HTTP client for a credentials endpoint (an OIDC token endpoint, AWS STS): TLS through our
/// own rustls configuration for `https` (`tls`, else the platform's roots), no redirects (the
/// endpoint named is the one asked: a redirect could carry the credentials elsewhere).
pub(crate) fn http_client(
    endpoint: &str,
    tls: Option<&crate::settings::TlsSettings>,
    connect_timeout: Option<Duration>,
    timeout: Duration,
) -> std::result::Result<reqwest::Client, String> {
    // reqwest asks for the process's default rustls provider even for http:// endpoints; ours is
    // ring, as for broker connections (a second install is refused, which is fine).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(c) = connect_timeout {
        builder = builder.connect_timeout(c);
    }
    if endpoint.starts_with("https:") {
        let system = crate::settings::TlsSettings {
            trust: crate::settings::TrustMaterial::SystemRoots,
            identity: None,
            verify_hostname: true,
        };
        let config =
            crate::tls::client_config(tls.unwrap_or(&system)).map_err(|e| format!("TLS: {e}"))?;
        builder = builder.use_preconfigured_tls((*config).clone());
    }
    builder.build().map_err(|e| format!("HTTP client: {e}"))
}

/// reqwest's errors name the URL; ours names the endpoint already, and a URL may carry
/// credentials in its query.
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "the endpoint");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Sends `req` and reads its answer, at most `max` bytes. `shown` is the endpoint as errors may
/// show it.
pub(crate) async fn send(
    req: reqwest::RequestBuilder,
    shown: &str,
    max: usize,
) -> Result<(reqwest::StatusCode, Vec<u8>)> {
    let resp = req
        .send()
        .await
        .map_err(|e| fail(shown, format!("request failed: {}", without_url(&e)), true))?;
    read(resp, shown, max).await
}

/// The status and body of an answer, at most `max` bytes.
pub(crate) async fn read(
    mut resp: reqwest::Response,
    shown: &str,
    max: usize,
) -> Result<(reqwest::StatusCode, Vec<u8>)> {
    let status = resp.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| {
        fail(
            shown,
            format!("reading the answer: {}", without_url(&e)),
            true,
        )
    })? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > max {
            return Err(fail(
                shown,
                format!("an answer larger than {max} bytes"),
                false,
            ));
        }
    }
    Ok((status, bytes))
}

fn fail(endpoint: &str, message: String, retriable: bool) -> KafkaError {
    KafkaError::Token {
        endpoint: endpoint.to_string(),
        message,
        retriable,
    }
}
