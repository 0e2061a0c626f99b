//! AWS credentials from where kmirror runs, the last sources of the SDKs' default chain
//! (docs/configuration.md, "AWS MSK IAM"):
//! - the container credentials endpoint: ECS task roles (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`,
//!   asked at 169.254.170.2) and EKS Pod Identity or any agent
//!   (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, with `AWS_CONTAINER_AUTHORIZATION_TOKEN` or
//!   `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` as its Authorization header);
//! - EC2 instance metadata, IMDSv2 only (a session token first, as AWS recommends; IMDSv1's
//!   unauthenticated GET is what SSRF attacks use), unless `AWS_EC2_METADATA_DISABLED` is true;
//!   `AWS_EC2_METADATA_SERVICE_ENDPOINT` moves it, as in the SDKs.
//!
//! Credentials are kept until five minutes before their `Expiration`. Every answer is bytes
//! from the network: bounded, and its secrets never shown.

use super::credentials::{remaining, AwsCredentials};
use crate::error::{KafkaError, Result};
use crate::http::{http_client, read, send, without_url};
use crate::Secret;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const CONTAINER_HOST: &str = "http://169.254.170.2";
const IMDS: &str = "http://169.254.169.254";
/// Renew this long before the credentials expire (the SDKs' own margin is close to it).
const EARLY: Duration = Duration::from_secs(300);
/// A credentials answer is a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;
/// The metadata service answers on the local link within milliseconds; where there is none
/// (not on EC2), the chain's last source must fail fast.
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);

type Env<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

fn cache() -> &'static tokio::sync::Mutex<HashMap<String, (AwsCredentials, Instant)>> {
    static CACHE: OnceLock<tokio::sync::Mutex<HashMap<String, (AwsCredentials, Instant)>>> =
        OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn fail(endpoint: &str, message: String, retriable: bool) -> KafkaError {
    KafkaError::Token {
        endpoint: endpoint.to_string(),
        message,
        retriable,
    }
}

/// The container endpoint's credentials, or None when no container endpoint is configured.
pub async fn container(env: Env<'_>) -> Result<Option<AwsCredentials>> {
    let some = |k: &str| env(k).filter(|v| !v.is_empty());
    let url = match (
        some("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        some("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    ) {
        (Some(rel), _) => format!("{CONTAINER_HOST}{rel}"),
        (None, Some(full)) => {
            // As the SDKs: plain http only to the link-local agents or this machine, so that
            // a changed variable cannot send the token to a stranger in clear.
            let allowed = full.starts_with("https://")
                || [
                    "http://127.",
                    "http://localhost",
                    "http://[::1]",
                    "http://169.254.170.2",
                    "http://169.254.170.23",
                    "http://[fd00:ec2::23]",
                ]
                .iter()
                .any(|p| full.starts_with(p));
            if !allowed {
                return Err(fail(
                    &crate::secret::redact_url(&full),
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI must be https, or http to a loopback or the container agent's address".into(),
                    false,
                ));
            }
            full
        }
        (None, None) => return Ok(None),
    };
    let token = match (
        some("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
        some("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
    ) {
        (Some(file), _) => Some(std::fs::read_to_string(&file).map_err(|e| {
            fail(
                &crate::secret::redact_url(&url),
                format!("cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {file}: {e}"),
                false,
            )
        })?),
        (None, t) => t,
    };
    let shown = crate::secret::redact_url(&url);
    if let Some(c) = held(&url).await {
        return Ok(Some(c));
    }
    let client = http_client(&url, None, None, Duration::from_secs(5))
        .map_err(|e| fail(&shown, e, false))?;
    let mut req = client.get(&url).header("Accept", "application/json");
    if let Some(t) = token {
        req = req.header("Authorization", t.trim());
    }
    let (status, body) = send(req, &shown, MAX_ANSWER).await?;
    if !status.is_success() {
        return Err(fail(
            &shown,
            format!("HTTP {status}: {}", shown_text(&body)),
            status.is_server_error() || status.as_u16() == 429,
        ));
    }
    let creds = parse_json(&body).map_err(|m| fail(&shown, m, false))?;
    keep(&url, &creds).await;
    tracing::info!(endpoint = %shown, "AWS container credentials obtained");
    Ok(Some(creds.0))
}

/// The instance role's credentials from IMDSv2, or None where the metadata service is
/// disabled or does not answer (not on EC2).
pub async fn instance(env: Env<'_>) -> Result<Option<AwsCredentials>> {
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| IMDS.into());
    let base = base.trim_end_matches('/').to_string();
    if let Some(c) = held(&base).await {
        return Ok(Some(c));
    }
    let shown = crate::secret::redact_url(&base);
    let client = http_client(&base, None, Some(IMDS_TIMEOUT), IMDS_TIMEOUT)
        .map_err(|e| fail(&shown, e, false))?;
    let token = client
        .put(format!("{base}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
        .send()
        .await;
    let token = match token {
        // Nothing answers: not on EC2, so this source has nothing.
        Err(e) if e.is_connect() || e.is_timeout() => return Ok(None),
        r => r.map_err(|e| fail(&shown, format!("IMDSv2 token: {}", without_url(&e)), true))?,
    };
    let (status, body) = read(token, &shown, MAX_ANSWER).await?;
    if !status.is_success() {
        return Err(fail(
            &shown,
            format!(
                "IMDSv2 token: HTTP {status} (IMDSv2 disabled, or a hop limit of 1 in a container)"
            ),
            false,
        ));
    }
    let token = String::from_utf8_lossy(&body).trim().to_string();
    let path = format!("{base}/latest/meta-data/iam/security-credentials/");
    let (status, body) = send(
        client.get(&path).header("X-aws-ec2-metadata-token", &token),
        &shown,
        MAX_ANSWER,
    )
    .await?;
    if status.as_u16() == 404 {
        return Err(fail(
            &shown,
            "this instance has no IAM role (instance profile)".into(),
            false,
        ));
    }
    if !status.is_success() {
        return Err(fail(
            &shown,
            format!("role name: HTTP {status}"),
            status.is_server_error(),
        ));
    }
    let role = String::from_utf8_lossy(&body)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if role.is_empty()
        || !role
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c))
    {
        return Err(fail(
            &shown,
            "the role name it answered is not an IAM role name".into(),
            false,
        ));
    }
    let (status, body) = send(
        client
            .get(format!("{path}{role}"))
            .header("X-aws-ec2-metadata-token", &token),
        &shown,
        MAX_ANSWER,
    )
    .await?;
    if !status.is_success() {
        return Err(fail(
            &shown,
            format!("credentials of role {role}: HTTP {status}"),
            status.is_server_error(),
        ));
    }
    let creds = parse_json(&body).map_err(|m| fail(&shown, format!("role {role}: {m}"), false))?;
    keep(&base, &creds).await;
    tracing::info!(role = %role, "AWS instance role credentials obtained");
    Ok(Some(creds.0))
}

async fn held(key: &str) -> Option<AwsCredentials> {
    let c = cache().lock().await;
    c.get(key)
        .filter(|(_, until)| Instant::now() < *until)
        .map(|(c, _)| c.clone())
}

async fn keep(key: &str, (creds, lifetime): &(AwsCredentials, Duration)) {
    let until = Instant::now() + lifetime.saturating_sub(EARLY);
    cache()
        .lock()
        .await
        .insert(key.to_string(), (creds.clone(), until));
}

/// A refusal's text, shown: printable and bounded (it holds no credentials).
fn shown_text(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(300)
        .collect()
}

/// The credentials document both services answer with, and how long it holds (an hour when
/// it names no expiry).
fn parse_json(body: &[u8]) -> std::result::Result<(AwsCredentials, Duration), String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "the answer is not JSON".to_string())?;
    if let Some(code) = v.get("Code").and_then(|c| c.as_str()) {
        if code != "Success" {
            return Err(format!(
                "the answer's Code is {}",
                shown_text(code.as_bytes())
            ));
        }
    }
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let (Some(id), Some(secret)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err("the answer has no AccessKeyId and SecretAccessKey".into());
    };
    let lifetime = field("Expiration")
        .and_then(|e| remaining(&e))
        .unwrap_or(Duration::from_secs(3600));
    Ok((
        AwsCredentials {
            access_key_id: id,
            secret_access_key: Secret::new(secret),
            session_token: field("Token").map(Secret::new),
        },
        lifetime,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stand-in on 127.0.0.1 answering each request by its first line; records the requests.
    async fn stand_in(
        answers: Vec<(&'static str, &'static str, String)>,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&req).contains("\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let text = String::from_utf8_lossy(&req).into_owned();
                let first = text.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(text);
                let (status, body) = answers
                    .iter()
                    .find(|(m, p, _)| first.starts_with(&format!("{m} {p} ")))
                    .map(|(_, _, b)| ("200 OK", b.clone()))
                    .unwrap_or(("404 Not Found", String::new()));
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        (url, seen)
    }

    const DOC: &str = r#"{"Code":"Success","AccessKeyId":"ASIAMETA","SecretAccessKey":"meta-secret","Token":"meta-session","Expiration":"2099-01-01T00:00:00Z"}"#;

    #[tokio::test]
    async fn instance_credentials_come_from_imdsv2_with_a_session_token() {
        let (url, seen) = stand_in(vec![
            ("PUT", "/latest/api/token", "imds-token-1".into()),
            (
                "GET",
                "/latest/meta-data/iam/security-credentials/",
                "kmirror-role\n".into(),
            ),
            (
                "GET",
                "/latest/meta-data/iam/security-credentials/kmirror-role",
                DOC.into(),
            ),
        ])
        .await;
        let u = url.clone();
        let env = move |k: &str| (k == "AWS_EC2_METADATA_SERVICE_ENDPOINT").then(|| u.clone());
        let c = instance(&env).await.unwrap().unwrap();
        assert_eq!(c.access_key_id, "ASIAMETA");
        assert_eq!(c.secret_access_key.expose(), "meta-secret");
        assert_eq!(c.session_token.as_ref().unwrap().expose(), "meta-session");
        let reqs = seen.lock().unwrap().clone();
        assert_eq!(reqs.len(), 3, "{reqs:?}");
        assert!(reqs[0]
            .to_ascii_lowercase()
            .contains("x-aws-ec2-metadata-token-ttl-seconds: 21600"));
        for r in &reqs[1..] {
            assert!(
                r.to_ascii_lowercase()
                    .contains("x-aws-ec2-metadata-token: imds-token-1"),
                "{r}"
            );
        }
        // Kept: asked again, nobody is asked.
        assert_eq!(instance(&env).await.unwrap().unwrap(), c);
        assert_eq!(seen.lock().unwrap().len(), 3);
        // Disabled, or nothing listening: this source has nothing (and never reaches AWS's
        // address: the endpoint is a closed port on this machine).
        let off = |k: &str| (k == "AWS_EC2_METADATA_DISABLED").then(|| "true".to_string());
        assert!(instance(&off).await.unwrap().is_none());
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let nobody =
            move |k: &str| (k == "AWS_EC2_METADATA_SERVICE_ENDPOINT").then(|| closed.clone());
        assert!(instance(&nobody).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_instance_without_a_role_is_said_so() {
        let (url, _) = stand_in(vec![("PUT", "/latest/api/token", "t".into())]).await;
        let env = move |k: &str| (k == "AWS_EC2_METADATA_SERVICE_ENDPOINT").then(|| url.clone());
        let e = instance(&env).await.unwrap_err().to_string();
        assert!(e.contains("no IAM role"), "{e}");
    }

    #[tokio::test]
    async fn container_credentials_take_the_agents_token_and_refuse_strangers() {
        let (url, seen) = stand_in(vec![(
            "GET",
            "/v1/credentials",
            DOC.replace("ASIAMETA", "ASIACONT"),
        )])
        .await;
        let dir = std::env::temp_dir().join(format!("kmirror-ct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "pod-identity-token\n").unwrap();
        let full = format!("{url}/v1/credentials");
        let tf = token_file.display().to_string();
        let env = move |k: &str| match k {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI" => Some(full.clone()),
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE" => Some(tf.clone()),
            _ => None,
        };
        let c = container(&env).await.unwrap().unwrap();
        assert_eq!(c.access_key_id, "ASIACONT");
        let reqs = seen.lock().unwrap().clone();
        assert!(
            reqs[0].contains("authorization: pod-identity-token")
                || reqs[0].contains("Authorization: pod-identity-token"),
            "{reqs:?}"
        );
        let stranger = |k: &str| {
            (k == "AWS_CONTAINER_CREDENTIALS_FULL_URI")
                .then(|| "http://credentials.example.com/x".to_string())
        };
        let e = container(&stranger).await.unwrap_err().to_string();
        assert!(e.contains("must be https"), "{e}");
        assert!(container(&|_: &str| None).await.unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn credential_documents_are_checked() {
        assert!(parse_json(b"not json").unwrap_err().contains("not JSON"));
        let e = parse_json(br#"{"Code":"AssumeRoleUnauthorizedAccess"}"#).unwrap_err();
        assert!(e.contains("AssumeRoleUnauthorizedAccess"), "{e}");
        assert!(parse_json(br#"{"AccessKeyId":"A"}"#)
            .unwrap_err()
            .contains("no AccessKeyId"));
        let (c, life) =
            parse_json(br#"{"AccessKeyId":"A","SecretAccessKey":"not-to-be-shown"}"#).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), life),
            ("A", Duration::from_secs(3600))
        );
        assert!(!format!("{c:?}").contains("not-to-be-shown"));
    }
}
