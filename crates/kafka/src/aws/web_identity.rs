//! AWS web identity credentials (EKS "IAM roles for service accounts"): with
//! `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` set, the token in the file is exchanged at
//! STS (`AssumeRoleWithWebIdentity`, an unsigned request) for temporary credentials, kept until
//! five minutes before they expire. The endpoint is `AWS_ENDPOINT_URL_STS` or `AWS_ENDPOINT_URL`
//! when set (the SDKs' own override), else STS in `AWS_REGION`, else the global one.

use super::credentials::{query_encode, AwsCredentials};
use crate::error::{KafkaError, Result};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Renew this long before the credentials expire.
const EARLY: Duration = Duration::from_secs(300);

type Cached = Option<((String, String, String), AwsCredentials, Instant)>;

fn cache() -> &'static tokio::sync::Mutex<Cached> {
    static CACHE: OnceLock<tokio::sync::Mutex<Cached>> = OnceLock::new();
    CACHE.get_or_init(|| tokio::sync::Mutex::new(None))
}

/// The role's credentials, or None when web identity is not configured.
pub async fn credentials(
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Option<AwsCredentials>> {
    let (Some(token_file), Some(role)) = (
        env("AWS_WEB_IDENTITY_TOKEN_FILE").filter(|v| !v.is_empty()),
        env("AWS_ROLE_ARN").filter(|v| !v.is_empty()),
    ) else {
        return Ok(None);
    };
    let endpoint = env("AWS_ENDPOINT_URL_STS")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(
            || match env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
                Some(r) if !r.is_empty() => format!("https://sts.{r}.amazonaws.com/"),
                _ => "https://sts.amazonaws.com/".into(),
            },
        );
    let key = (role.clone(), token_file.clone(), endpoint.clone());
    let mut held = cache().lock().await;
    if let Some((k, c, until)) = held.as_ref() {
        if *k == key && Instant::now() < *until {
            return Ok(Some(c.clone()));
        }
    }
    let shown = crate::secret::redact_url(&endpoint);
    let fail = |message: String, retriable: bool| KafkaError::Token {
        endpoint: shown.clone(),
        message,
        retriable,
    };
    let token = std::fs::read_to_string(&token_file).map_err(|e| {
        fail(
            format!("cannot read AWS_WEB_IDENTITY_TOKEN_FILE {token_file}: {e}"),
            false,
        )
    })?;
    let session = env("AWS_ROLE_SESSION_NAME")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("kmirror-{}", std::process::id()));
    let body = format!(
        "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={}&RoleSessionName={}&WebIdentityToken={}",
        query_encode(&role),
        query_encode(&session),
        query_encode(token.trim())
    );
    let client = crate::http::http_client(&endpoint, None, None, Duration::from_secs(30))
        .map_err(|e| fail(e, false))?;
    let req = client
        .post(&endpoint)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(body);
    let what = format!("AssumeRoleWithWebIdentity for {role}");
    let (creds, lifetime) = super::sts::exchange(req, &what, &shown).await?;
    let until = Instant::now() + lifetime.saturating_sub(EARLY);
    tracing::info!(role = %role, lifetime_s = lifetime.as_secs(), "AWS web identity credentials obtained");
    *held = Some((key, creds.clone(), until));
    Ok(Some(creds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One-shot STS: answers the first request with `status` and `body`, hands back the request.
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

    #[tokio::test]
    async fn a_web_identity_token_is_exchanged_at_sts_and_refusals_are_named() {
        let dir = std::env::temp_dir().join(format!("kmirror-wi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "eyJ.web.identity\n").unwrap();
        let answer =
            "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
            <AccessKeyId>ASIAEXAMPLE</AccessKeyId><SecretAccessKey>sts-secret</SecretAccessKey>\
            <SessionToken>sts-session</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration>\
            </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
        let (url, request) = sts("200 OK", answer.into()).await;
        let tf = token_file.display().to_string();
        let env = move |k: &str| match k {
            "AWS_WEB_IDENTITY_TOKEN_FILE" => Some(tf.clone()),
            "AWS_ROLE_ARN" => Some("arn:aws:iam::123456789012:role/kmirror".into()),
            "AWS_ROLE_SESSION_NAME" => Some("s1".into()),
            "AWS_ENDPOINT_URL_STS" => Some(url.clone()),
            _ => None,
        };
        let c = credentials(&env).await.unwrap().unwrap();
        assert_eq!(c.access_key_id, "ASIAEXAMPLE");
        assert_eq!(c.secret_access_key.expose(), "sts-secret");
        assert_eq!(c.session_token.as_ref().unwrap().expose(), "sts-session");
        let req = request.await.unwrap();
        assert!(req.starts_with("POST / "), "{req}");
        assert!(req.contains("Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fkmirror&RoleSessionName=s1&WebIdentityToken=eyJ.web.identity"), "{req}");
        // Kept: a second call asks nobody (the server is gone).
        assert_eq!(credentials(&env).await.unwrap().unwrap(), c);

        let (url, _request) = sts(
            "403 Forbidden",
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>".into(),
        )
        .await;
        let tf = token_file.display().to_string();
        let env = move |k: &str| match k {
            "AWS_WEB_IDENTITY_TOKEN_FILE" => Some(tf.clone()),
            "AWS_ROLE_ARN" => Some("arn:aws:iam::123456789012:role/other".into()),
            "AWS_ENDPOINT_URL_STS" => Some(url.clone()),
            _ => None,
        };
        let e = credentials(&env).await.unwrap_err().to_string();
        assert!(
            e.contains("HTTP 403") && e.contains("AccessDenied") && e.contains("role/other"),
            "{e}"
        );
        assert!(!e.contains("eyJ.web"), "{e}");
        assert!(credentials(&|_: &str| None).await.unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
