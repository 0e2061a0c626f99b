//! SASL/AWS_MSK_IAM (Amazon MSK's IAM access control): the client sends one JSON document, the
//! fields of a SigV4-presigned `GET https://<broker host>/?Action=kafka-cluster:Connect` for the
//! service `kafka-cluster` (valid 15 minutes), plus `version`, `host` and `user-agent`; the
//! broker answers with a JSON document of its own. This is the payload format of AWS's
//! `aws-msk-iam-auth` library (docs/configuration.md, "AWS MSK IAM"). Signing is
//! `aws-sigv4`'s, checked against AWS's published presigning example.
//!
//! Credentials, in this order: the JAAS line's `awsProfileName` (shared files only); the
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`); web identity
//! (`super::web_identity`); the shared files' profile (`AWS_PROFILE`, else `default`);
//! then the container endpoint and instance metadata (`super::metadata`).

pub use super::credentials::AwsCredentials;
use super::credentials::{query_encode, signing_credentials};
use crate::error::{KafkaError, Result};
use crate::settings::AwsIam;
use crate::Secret;
use aws_sigv4::http_request::{
    sign, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
};
use aws_sigv4::sign::v4;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

const VERSION: &str = "2020_10_22";
const SERVICE: &str = "kafka-cluster";
const ACTION: &str = "kafka-cluster:Connect";
const EXPIRES: Duration = Duration::from_secs(900);

fn config_err(message: String) -> KafkaError {
    KafkaError::Config(message)
}

/// The region in an MSK broker's host name (`b-1.c.x.c2.kafka.us-east-1.amazonaws.com`,
/// `.amazonaws.com.cn` in China): the label before `amazonaws`.
pub fn region_of_host(host: &str) -> Option<String> {
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let i = labels
        .iter()
        .position(|l| l.eq_ignore_ascii_case("amazonaws"))?;
    let region = labels.get(i.checked_sub(1)?)?;
    let ok = region.len() >= 6
        && region.contains('-')
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then(|| region.to_string())
}

/// The payload for a connection to `host`, signed now with the credentials as they are now; the
/// region is the host name's, else `AWS_REGION` or `AWS_DEFAULT_REGION`.
pub async fn payload_for(settings: &AwsIam, host: &str) -> Result<Secret> {
    let keys = credentials(settings).await?;
    let region = region_of_host(host)
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .ok_or_else(|| {
            config_err(format!(
                "AWS_MSK_IAM: no region in the broker name {host} and AWS_REGION is not set"
            ))
        })?;
    payload(host, &region, &keys, SystemTime::now())
}

/// The authentication payload for `host` (the broker's host name as the client dialled it).
pub fn payload(
    host: &str,
    region: &str,
    creds: &AwsCredentials,
    now: SystemTime,
) -> Result<Secret> {
    let mut doc = BTreeMap::new();
    doc.insert("version".to_string(), VERSION.to_string());
    doc.insert("host".to_string(), host.to_string());
    doc.insert("user-agent".to_string(), user_agent());
    doc.insert("action".to_string(), ACTION.to_string());
    for (k, v) in presign(host, region, creds, now)? {
        doc.insert(k.to_ascii_lowercase(), v);
    }
    let text = serde_json::to_string(&doc).unwrap_or_default();
    Ok(Secret::new(text))
}

/// MSK IAM's OAUTHBEARER token (`IAMOAuthBearerLoginCallbackHandler`): the URL presigned for
/// `kafka.<region>.amazonaws.com` with `User-Agent` appended after signing, base64url without
/// padding; it expires with the signature. Returns the token and its expiry (ms).
pub async fn oauth_token(settings: &AwsIam, now: SystemTime) -> Result<(Secret, i64)> {
    let env = |k: &str| std::env::var(k).ok();
    let region = region_from(settings, &env)?;
    let creds = credentials(settings).await?;
    oauth_token_with(&region, &creds, now)
}

fn oauth_token_with(
    region: &str,
    creds: &AwsCredentials,
    now: SystemTime,
) -> Result<(Secret, i64)> {
    use base64::Engine;
    let host = format!("kafka.{region}.amazonaws.com");
    let params = presign(&host, region, creds, now)?;
    let mut url = format!("https://{host}/?Action=kafka-cluster%3AConnect");
    for (k, v) in params {
        url.push('&');
        url.push_str(&k);
        url.push('=');
        url.push_str(&query_encode(&v));
    }
    url.push_str("&User-Agent=");
    url.push_str(&query_encode(&user_agent()));
    let expires = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        + EXPIRES.as_millis() as i64;
    Ok((
        Secret::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url)),
        expires,
    ))
}

fn user_agent() -> String {
    format!("kmirror/{}", env!("CARGO_PKG_VERSION"))
}

/// The region for the OAUTHBEARER form: `AWS_REGION`, `AWS_DEFAULT_REGION`, else the profile's
/// `region` in the config file.
fn region_from(settings: &AwsIam, env: &dyn Fn(&str) -> Option<String>) -> Result<String> {
    if let Some(r) = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .filter(|r| !r.is_empty())
    {
        return Ok(r);
    }
    let profile = settings
        .profile
        .clone()
        .or_else(|| env("AWS_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    let text = std::fs::read_to_string(config_file(env)).unwrap_or_default();
    ini_section(&text, &section).get("region").cloned().ok_or_else(|| {
        config_err(format!(
            "AWS_MSK_IAM (OAUTHBEARER): no region: set AWS_REGION or region in profile '{profile}' of {}",
            config_file(env).display()
        ))
    })
}

/// The `X-Amz-*` query parameters of the presigned `GET https://<host>/?Action=...`.
fn presign(
    host: &str,
    region: &str,
    creds: &AwsCredentials,
    now: SystemTime,
) -> Result<Vec<(String, String)>> {
    let identity = signing_credentials(creds).into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(EXPIRES);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| config_err(format!("AWS_MSK_IAM signing parameters: {e}")))?
        .into();
    let url = format!("https://{host}/?Action=kafka-cluster%3AConnect");
    let request = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| config_err(format!("AWS_MSK_IAM request for {host}: {e}")))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| config_err(format!("AWS_MSK_IAM signing: {e}")))?
        .into_parts();
    Ok(instructions
        .params()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Credentials from the configured profile, else the SDKs' default chain; with `awsRoleArn`,
/// those of the role they assume.
pub async fn credentials(settings: &AwsIam) -> Result<AwsCredentials> {
    let env = |k: &str| std::env::var(k).ok();
    let base = credentials_with(settings, &env).await?;
    match &settings.role {
        Some(role) => super::assume_role::assume(role, &base, &env).await,
        None => Ok(base),
    }
}

/// The chain, with the environment given (tests pass stand-in endpoints through it): with
/// `awsProfileName`, that profile only; else the environment's keys, web identity, the shared
/// files' profile, the container endpoint, then instance metadata.
pub(crate) async fn credentials_with(
    settings: &AwsIam,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<AwsCredentials> {
    if settings.profile.is_none() && env("AWS_ACCESS_KEY_ID").is_none_or(|v| v.is_empty()) {
        if let Some(c) = super::web_identity::credentials(env).await? {
            return Ok(c);
        }
    }
    if let Some(c) = credentials_from(settings, env)? {
        return Ok(c);
    }
    if let Some(c) = super::metadata::container(env).await? {
        return Ok(c);
    }
    if let Some(c) = super::metadata::instance(env).await? {
        return Ok(c);
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    Err(config_err(format!(
        "AWS_MSK_IAM: no credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set, profile '{profile}' is not in {} or {}, AWS_WEB_IDENTITY_TOKEN_FILE/AWS_ROLE_ARN and AWS_CONTAINER_CREDENTIALS_* are not set, and no instance metadata service answered",
        credentials_file(env).display(),
        config_file(env).display()
    )))
}

/// Static keys: the named profile (an error if it has none), else the environment's, else the
/// shared files' profile; `None` when the default chain must look further.
fn credentials_from(
    settings: &AwsIam,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<AwsCredentials>> {
    if let Some(profile) = &settings.profile {
        return profile_credentials(profile, env)?
            .ok_or_else(|| {
                config_err(format!(
                    "AWS_MSK_IAM: profile '{profile}' (awsProfileName) has no aws_access_key_id and aws_secret_access_key in {} or {}",
                    credentials_file(env).display(),
                    config_file(env).display()
                ))
            })
            .map(Some);
    }
    if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        if !id.is_empty() && !secret.is_empty() {
            return Ok(Some(AwsCredentials {
                access_key_id: id,
                secret_access_key: Secret::new(secret),
                session_token: env("AWS_SESSION_TOKEN")
                    .filter(|t| !t.is_empty())
                    .map(Secret::new),
            }));
        }
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    profile_credentials(&profile, env)
}

fn home(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    PathBuf::from(env("HOME").unwrap_or_default())
}

fn credentials_file(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home(env).join(".aws/credentials"))
}

fn config_file(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    env("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home(env).join(".aws/config"))
}

/// A profile's static keys: the credentials file's `[name]`, then the config file's
/// `[profile name]` (`[default]` in both for the default profile).
fn profile_credentials(
    profile: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<AwsCredentials>> {
    let config_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    for (path, section) in [
        (credentials_file(env), profile.to_string()),
        (config_file(env), config_section),
    ] {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(config_err(format!(
                    "AWS_MSK_IAM: cannot read {}: {e}",
                    path.display()
                )))
            }
        };
        let keys = ini_section(&text, &section);
        if let (Some(id), Some(secret)) = (
            keys.get("aws_access_key_id"),
            keys.get("aws_secret_access_key"),
        ) {
            return Ok(Some(AwsCredentials {
                access_key_id: id.clone(),
                secret_access_key: Secret::new(secret.clone()),
                session_token: keys.get("aws_session_token").cloned().map(Secret::new),
            }));
        }
    }
    Ok(None)
}

/// The `key = value` lines of `[section]` in an AWS shared file.
fn ini_section(text: &str, section: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
