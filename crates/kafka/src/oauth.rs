//! OAUTHBEARER tokens (KIP-255, KIP-768): an unsecured JWS for test setups, or OIDC client
//! credentials from a token endpoint; each kept until its refresh time (Java's rule, see
//! [`refresh_after`]) and shared by every connection made from the same settings. A renewed
//! token does not touch open connections: each takes it when it next re-authenticates (KIP-368,
//! `conn`).

use crate::error::{KafkaError, Result};
use crate::http::{http_client, send};
use crate::secret::redact_url as redact;
use crate::settings::{ClientCredentials, OAuthBearer, TokenRefresh, TokenSource};
use crate::token_cache::Held;
use crate::Secret;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// After a failed renewal while the held token is still good, ask again after this long.
const RETRY_RENEWAL: Duration = Duration::from_secs(10);

/// The longest lifetime believed of a token (a hostile or broken endpoint may claim any).
const MAX_LIFETIME_MS: i64 = 366 * 24 * 3600 * 1000;

impl OAuthBearer {
    /// The token to authenticate with: the one held, or a new one once it is due. While one
    /// caller renews it, the others take the held token if it has not expired.
    pub async fn token(&self) -> Result<Secret> {
        let cache = &self.cache;
        if let Some(t) = cache.fresh() {
            return Ok(t);
        }
        let _renewing = match cache.renewal().try_lock() {
            Ok(g) => g,
            Err(_) => {
                if let Some(t) = cache.unexpired() {
                    return Ok(t);
                }
                cache.renewal().lock().await
            }
        };
        // Renewed while this caller waited for its turn.
        if let Some(t) = cache.fresh() {
            return Ok(t);
        }
        let fetched = match &self.source {
            TokenSource::Unsecured { .. } => Ok(unsecured(&self.source, now_ms())),
            TokenSource::ClientCredentials(c) => client_credentials(c).await,
            TokenSource::AwsMskIam { aws } => {
                crate::aws::iam::oauth_token(aws, SystemTime::now()).await
            }
        };
        let now = now_ms();
        let mut held = cache.held();
        let (value, expires_ms) = match fetched {
            Ok(t) => t,
            // As Java's client: the token held serves until it expires, while renewal is
            // retried.
            Err(e) => match held.as_mut().filter(|h| now < h.expires_ms) {
                Some(h) => {
                    tracing::warn!(source = self.source.describe(), error = %e, expires_in_s = (h.expires_ms - now) / 1000, "OAuth token renewal failed; the current token serves until it expires");
                    h.renew_at = Instant::now() + RETRY_RENEWAL;
                    return Ok(h.value.clone());
                }
                None => return Err(e),
            },
        };
        let expires_ms = expires_ms.clamp(now, now + MAX_LIFETIME_MS);
        let after = refresh_after(now, expires_ms, &self.refresh, rand::random::<f64>());
        tracing::info!(
            source = self.source.describe(),
            expires_in_s = (expires_ms - now) / 1000,
            renew_in_s = after.as_secs(),
            "OAuth token obtained"
        );
        *held = Some(Held {
            value: value.clone(),
            renew_at: Instant::now() + after,
            expires_ms,
        });
        Ok(value)
    }
}

impl TokenSource {
    /// For logs: where tokens come from, no secret.
    pub fn describe(&self) -> String {
        match self {
            TokenSource::Unsecured { principal, .. } => format!("unsecured JWS for '{principal}'"),
            TokenSource::ClientCredentials(c) => {
                format!("{} as client '{}'", redact(&c.endpoint), c.client_id)
            }
            TokenSource::AwsMskIam { aws } => format!(
                "AWS MSK IAM ({})",
                aws.profile.as_deref().unwrap_or("default credentials")
            ),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// When to renew a token had at `now_ms` that expires at `expires_ms`, as Java's
/// `ExpiringCredentialRefreshingLogin` decides: at `factor + jitter * random` of the lifetime,
/// but no later than `buffer` before expiry and no sooner than `min_period`, unless the
/// lifetime is too short for both, when the fraction alone decides.
pub fn refresh_after(now_ms: i64, expires_ms: i64, r: &TokenRefresh, random: f64) -> Duration {
    let life = (expires_ms - now_ms).max(0);
    let pct = (r.window_factor_permille as f64 + r.window_jitter_permille as f64 * random) / 1000.0;
    let proposed = (life as f64 * pct) as i64;
    let (min, buffer) = (r.min_period.as_millis() as i64, r.buffer.as_millis() as i64);
    let at = if min + buffer > life {
        proposed
    } else {
        proposed.min(life - buffer).max(min)
    };
    Duration::from_millis(at.max(0) as u64)
}

/// Kafka's unsecured JWS (`OAuthBearerUnsecuredLoginCallbackHandler`): header `{"alg":"none"}`,
/// claims `iat`, `exp` (seconds), the principal claim and an optional scope list, no signature.
fn unsecured(source: &TokenSource, now_ms: i64) -> (Secret, i64) {
    let TokenSource::Unsecured {
        principal_claim,
        principal,
        lifetime_secs,
        scope_claim,
        scope,
    } = source
    else {
        return (Secret::default(), now_ms);
    };
    let iat = now_ms / 1000;
    let exp = iat + *lifetime_secs as i64;
    let mut claims = serde_json::Map::new();
    claims.insert("iat".into(), iat.into());
    claims.insert("exp".into(), exp.into());
    claims.insert(principal_claim.clone(), principal.clone().into());
    if !scope.is_empty() {
        claims.insert(scope_claim.clone(), scope.clone().into());
    }
    let token = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
        URL_SAFE_NO_PAD.encode(serde_json::Value::Object(claims).to_string())
    );
    (Secret::new(token), exp * 1000)
}

/// The `exp` claim (ms) of a JWT, if it has one: bytes from the token endpoint, checked.
pub fn jwt_expiry(token: &str) -> Option<i64> {
    let mut parts = token.split('.');
    let (_, payload) = (parts.next()?, parts.next()?);
    parts.next()?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    (exp.is_finite() && exp > 0.0).then_some((exp * 1000.0) as i64)
}

/// KIP-768's client credentials grant: POST `grant_type=client_credentials` (and the scope)
/// with HTTP Basic authentication, retried with backoff while the endpoint cannot be reached
/// or answers 5xx/429, within `sasl.login.retry.backoff.max.ms`.
async fn client_credentials(c: &ClientCredentials) -> Result<(Secret, i64)> {
    let started = Instant::now();
    let mut wait = c.retry_backoff;
    loop {
        match request_token(c).await {
            Ok(t) => return Ok(t),
            Err(e) if e.is_retriable() && started.elapsed() + wait <= c.retry_backoff_max => {
                tracing::debug!(endpoint = %redact(&c.endpoint), error = %e, retry_in = ?wait, "OAuth token request failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(c.retry_backoff_max);
            }
            Err(e) => return Err(e),
        }
    }
}

async fn request_token(c: &ClientCredentials) -> Result<(Secret, i64)> {
    let ClientCredentials {
        endpoint,
        client_id,
        client_secret,
        scope,
        tls,
        connect_timeout,
        read_timeout,
        ..
    } = c;
    let fail = |message: String, retriable: bool| KafkaError::Token {
        endpoint: redact(endpoint),
        message,
        retriable,
    };
    let client = http_client(
        endpoint,
        tls.as_ref(),
        Some(*connect_timeout),
        *connect_timeout + *read_timeout,
    )
    .map_err(|e| fail(e, false))?;
    let mut body = String::from("grant_type=client_credentials");
    if let Some(scope) = scope.as_deref().filter(|s| !s.is_empty()) {
        body.push_str("&scope=");
        body.push_str(&form_encode(scope));
    }
    // RFC 7617: `id:secret` in standard base64, not URL-encoded first (Java's default).
    let basic = STANDARD.encode(format!("{client_id}:{}", client_secret.expose()));
    let req = client
        .post(endpoint)
        .header("Authorization", format!("Basic {basic}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("Accept", "application/json")
        .body(body);
    // Bytes from the network: a token answer is a few KiB.
    let (status, bytes) = send(req, &redact(endpoint), 1 << 20).await?;
    if !status.is_success() {
        // The answer of a refusal names the error (RFC 6749 §5.2), never a token.
        let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
        let retriable = status.is_server_error() || status.as_u16() == 429;
        return Err(fail(format!("HTTP {status}: {}", text.trim()), retriable));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| fail("the answer is not JSON".into(), false))?;
    let token = v
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| fail("the answer has no access_token".into(), false))?;
    // RFC 6750's b64token characters: anything else would break the SASL message's framing.
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
    {
        return Err(fail(
            "the access_token has characters a bearer token cannot have".into(),
            false,
        ));
    }
    let expires = jwt_expiry(token)
        .or_else(|| {
            v.get("expires_in")
                .and_then(|e| e.as_i64())
                .filter(|s| *s > 0)
                .map(|s| now_ms().saturating_add(s.min(MAX_LIFETIME_MS / 1000) * 1000))
        })
        .ok_or_else(|| {
            fail(
                "the token has no exp claim and the answer no expires_in".into(),
                false,
            )
        })?;
    Ok((Secret::new(token), expires))
}

/// `application/x-www-form-urlencoded` as Java's `URLEncoder` writes it.
fn form_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// SASL/OAUTHBEARER's client message (RFC 7628 §3.1, as Kafka writes it):
/// `n,,\x01auth=Bearer <token>\x01<key>=<value>...\x01\x01`.
pub fn initial_response(token: &Secret, extensions: &[(String, String)]) -> Vec<u8> {
    let mut out = format!("n,,\x01auth=Bearer {}", token.expose());
    for (k, v) in extensions {
        out.push('\x01');
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out.push_str("\x01\x01");
    out.into_bytes()
}

#[cfg(test)]
mod tests;
