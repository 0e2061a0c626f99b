//! `awsRoleArn` in the MSK IAM JAAS line (docs/configuration.md, "AWS MSK IAM"): the
//! credentials of the chain (or of `awsProfileName`) assume the role at STS (`AssumeRole`, a
//! SigV4-signed POST), and the role's temporary credentials sign the MSK payload, as AWS's
//! `aws-msk-iam-auth` library does. STS is `AWS_ENDPOINT_URL_STS` or `AWS_ENDPOINT_URL` when
//! set (the SDKs' override), else STS in `awsStsRegion` (default us-east-1, the library's).
//! The role's credentials are kept until five minutes before they expire.

use super::credentials::{query_encode, signing_credentials, AwsCredentials};
use crate::error::{KafkaError, Result};
use crate::settings::AwsRole;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

const EARLY: Duration = Duration::from_secs(300);

type Key = (String, String, String);

fn cache() -> &'static tokio::sync::Mutex<HashMap<Key, (AwsCredentials, Instant)>> {
    static CACHE: OnceLock<tokio::sync::Mutex<HashMap<Key, (AwsCredentials, Instant)>>> =
        OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The role's credentials, assumed with `base`.
pub async fn assume(
    role: &AwsRole,
    base: &AwsCredentials,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<AwsCredentials> {
    let region = role
        .sts_region
        .clone()
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = env("AWS_ENDPOINT_URL_STS")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com/"));
    let key = (
        role.arn.clone(),
        base.access_key_id.clone(),
        endpoint.clone(),
    );
    let mut held = cache().lock().await;
    if let Some((c, until)) = held.get(&key) {
        if Instant::now() < *until {
            return Ok(c.clone());
        }
    }
    let shown = crate::secret::redact_url(&endpoint);
    let fail = |message: String, retriable: bool| KafkaError::Token {
        endpoint: shown.clone(),
        message,
        retriable,
    };
    let mut body = format!(
        "Action=AssumeRole&Version=2011-06-15&RoleArn={}&RoleSessionName={}",
        query_encode(&role.arn),
        query_encode(&role.session_name)
    );
    if let Some(x) = &role.external_id {
        body.push_str(&format!("&ExternalId={}", query_encode(x.expose())));
    }
    let headers = signed_headers(&endpoint, &region, &body, base, SystemTime::now())
        .map_err(|e| fail(e, false))?;
    let client = crate::http::http_client(&endpoint, None, None, Duration::from_secs(30))
        .map_err(|e| fail(e, false))?;
    let mut req = client.post(&endpoint).body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let (creds, lifetime) =
        super::sts::exchange(req, &format!("AssumeRole of {}", role.arn), &shown).await?;
    tracing::info!(role = %role.arn, lifetime_s = lifetime.as_secs(), "AWS role assumed");
    let until = Instant::now() + lifetime.saturating_sub(EARLY);
    held.insert(key, (creds.clone(), until));
    Ok(creds)
}

/// The headers that sign `POST <endpoint>` with `body` for STS in `region` (SigV4,
/// `Authorization`, `X-Amz-Date`, and `X-Amz-Security-Token` for temporary credentials).
fn signed_headers(
    endpoint: &str,
    region: &str,
    body: &str,
    creds: &AwsCredentials,
    now: SystemTime,
) -> std::result::Result<Vec<(String, String)>, String> {
    let identity = signing_credentials(creds).into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("signing parameters: {e}"))?
        .into();
    let content_type = (
        "content-type",
        "application/x-www-form-urlencoded; charset=utf-8",
    );
    let request = SignableRequest::new(
        "POST",
        endpoint,
        std::iter::once(content_type),
        SignableBody::Bytes(body.as_bytes()),
    )
    .map_err(|e| format!("request: {e}"))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| format!("signing: {e}"))?
        .into_parts();
    let mut headers = vec![(content_type.0.to_string(), content_type.1.to_string())];
    headers.extend(
        instructions
            .headers()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One-shot STS on 127.0.0.1: answers `body` with `status`, hands back the request.
    async fn sts(status: &'static str, body: String) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req);
                if let Some(h) = text.find("\r\n\r\n") {
                    let len = text[..h]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if req.len() >= h + 4 + len || n == 0 {
                        break;
                    }
                }
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&req).into_owned()
        });
        (url, task)
    }

    fn base() -> AwsCredentials {
        AwsCredentials {
            access_key_id: "AKIDBASE".into(),
            secret_access_key: Secret::new("base-secret"),
            session_token: Some(Secret::new("base-session")),
        }
    }

    #[tokio::test]
    async fn a_role_is_assumed_with_a_signed_request_and_refusals_are_named() {
        let answer = "<AssumeRoleResponse><AssumeRoleResult><Credentials>\
            <AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>role-secret</SecretAccessKey>\
            <SessionToken>role-session</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration>\
            </Credentials></AssumeRoleResult></AssumeRoleResponse>";
        let (url, request) = sts("200 OK", answer.into()).await;
        let u = url.clone();
        let env = move |k: &str| (k == "AWS_ENDPOINT_URL_STS").then(|| u.clone());
        let role = AwsRole {
            arn: "arn:aws:iam::123456789012:role/msk-writer".into(),
            session_name: "kmirror".into(),
            external_id: Some(Secret::new("ext-1")),
            sts_region: Some("eu-west-1".into()),
        };
        let c = assume(&role, &base(), &env).await.unwrap();
        assert_eq!(c.access_key_id, "ASIAROLE");
        assert_eq!(c.secret_access_key.expose(), "role-secret");
        let req = request.await.unwrap();
        let lower = req.to_ascii_lowercase();
        assert!(req.starts_with("POST / "), "{req}");
        assert!(
            req.contains("Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fmsk-writer&RoleSessionName=kmirror&ExternalId=ext-1"),
            "{req}"
        );
        // Signed with the base credentials for STS in the role's region.
        assert!(
            lower.contains("authorization: aws4-hmac-sha256 credential=akidbase/")
                && lower.contains("/eu-west-1/sts/aws4_request"),
            "{req}"
        );
        assert!(
            lower.contains("x-amz-security-token: base-session"),
            "{req}"
        );
        assert!(!req.contains("base-secret"), "{req}");
        // Kept: asked again, nobody is asked (the stand-in is gone).
        assert_eq!(assume(&role, &base(), &env).await.unwrap(), c);

        let (url, _r) = sts(
            "403 Forbidden",
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>not authorized to perform sts:AssumeRole</Message></Error></ErrorResponse>".into(),
        )
        .await;
        let env = move |k: &str| (k == "AWS_ENDPOINT_URL").then(|| url.clone());
        let other = AwsRole {
            arn: "arn:aws:iam::123456789012:role/other".into(),
            ..role
        };
        let e = assume(&other, &base(), &env).await.unwrap_err().to_string();
        assert!(
            e.contains("HTTP 403") && e.contains("AccessDenied") && e.contains("role/other"),
            "{e}"
        );
        assert!(!e.contains("ext-1") && !e.contains("base-secret"), "{e}");
    }
}
