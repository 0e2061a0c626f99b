//! The Confluent Schema Registry REST calls schema sync makes. Answers are bytes from the
//! network: bounded ([`MAX_ANSWER`]), parsed into typed answers, and anything else is a
//! [`RegistryError::BadAnswer`] naming the call. Credentials go in one header and nowhere else.

use crate::error::{RegistryError, SCHEMA_NOT_FOUND, SUBJECT_NOT_FOUND};
use crate::model::{Compatibility, Mode, Registered, Schema, SchemaId};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use kmirror_kafka::secret::redact_url;
use kmirror_kafka::{Secret, TlsSettings, TrustMaterial};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// The media type of the API's requests and answers.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// The largest answer read: a list of every subject of a large registry, or one large schema,
/// stays far below it.
pub const MAX_ANSWER: usize = 32 << 20;

/// How to reach one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    /// The API's base URL (`schema.registry.url`), e.g. `https://registry:8081` or Apicurio's
    /// `http://host:8080/apis/ccompat/v7`.
    pub url: String,
    pub auth: Auth,
    /// TLS to an `https` URL; the platform's roots when None.
    pub tls: Option<TlsSettings>,
    /// The bound of one call, from connecting to the last byte of its answer.
    pub timeout: Duration,
}

impl fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrySettings")
            .field("url", &redact_url(&self.url))
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The credentials a registry takes, as the Confluent clients name their sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    /// `basic.auth.credentials.source = USER_INFO` with `basic.auth.user.info = user:password`.
    Basic {
        user: String,
        password: Secret,
    },
    /// `bearer.auth.credentials.source = STATIC_TOKEN` with `bearer.auth.token`.
    Bearer(Secret),
}

/// A client of one registry.
pub struct RegistryClient {
    base: String,
    /// The base URL as errors show it.
    shown: String,
    http: reqwest::Client,
    auth: Auth,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct IdAnswer {
    id: SchemaId,
}

#[derive(Deserialize)]
struct SubjectVersion {
    subject: String,
    version: i32,
}

#[derive(Deserialize)]
struct ModeAnswer {
    mode: Mode,
}

#[derive(Deserialize)]
struct ConfigAnswer {
    #[serde(rename = "compatibilityLevel", alias = "compatibility")]
    compatibility: Compatibility,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error_code: Option<i64>,
    message: Option<String>,
}

impl RegistryClient {
    pub fn new(s: &RegistrySettings) -> Result<RegistryClient, RegistryError> {
        let base = s.url.trim_end_matches('/').to_string();
        let shown = redact_url(&base);
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(RegistryError::Config(format!(
                "schema.registry.url '{shown}': expected an http:// or https:// URL"
            )));
        }
        // reqwest asks for the process's default provider even for http://; ours is ring, as
        // for broker connections (a second install is refused, which is fine).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(s.timeout)
            .connect_timeout(s.timeout.min(Duration::from_secs(10)))
            // The registry named is the one asked: a redirect could carry the credentials away.
            .redirect(reqwest::redirect::Policy::none());
        if base.starts_with("https://") {
            let system = TlsSettings {
                trust: TrustMaterial::SystemRoots,
                identity: None,
                verify_hostname: true,
            };
            let config = kmirror_kafka::tls::client_config(s.tls.as_ref().unwrap_or(&system))
                .map_err(|e| RegistryError::Config(format!("TLS to {shown}: {e}")))?;
            builder = builder.use_preconfigured_tls((*config).clone());
        }
        let http = builder
            .build()
            .map_err(|e| RegistryError::Config(format!("HTTP client for {shown}: {e}")))?;
        Ok(RegistryClient {
            base,
            shown,
            http,
            auth: s.auth.clone(),
        })
    }

    /// The registry's URL as logs and errors show it (no user information, no query).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Every subject (with `deleted`, the soft-deleted ones too).
    pub async fn subjects(&self, deleted: bool) -> Result<Vec<String>, RegistryError> {
        self.get(&format!("/subjects{}", deleted_query(deleted)))
            .await
    }

    /// The versions of `subject`, oldest first (with `deleted`, the soft-deleted ones too).
    pub async fn versions(&self, subject: &str, deleted: bool) -> Result<Vec<i32>, RegistryError> {
        let mut v: Vec<i32> = self
            .get(&format!(
                "/subjects/{}/versions{}",
                segment(subject),
                deleted_query(deleted)
            ))
            .await?;
        v.sort_unstable();
        Ok(v)
    }

    /// One version of `subject` (with `deleted`, a soft-deleted one too).
    pub async fn version(
        &self,
        subject: &str,
        version: i32,
        deleted: bool,
    ) -> Result<Registered, RegistryError> {
        self.get(&format!(
            "/subjects/{}/versions/{version}{}",
            segment(subject),
            deleted_query(deleted)
        ))
        .await
    }

    /// The schema with id `id`.
    pub async fn schema(&self, id: SchemaId) -> Result<Schema, RegistryError> {
        self.get(&format!("/schemas/ids/{id}")).await
    }

    /// The subjects and versions under which the schema with id `id` is registered (soft-deleted
    /// ones too).
    pub async fn subjects_of(&self, id: SchemaId) -> Result<Vec<(String, i32)>, RegistryError> {
        let found: Vec<SubjectVersion> = self
            .get(&format!("/schemas/ids/{id}/versions?deleted=true"))
            .await?;
        Ok(found.into_iter().map(|v| (v.subject, v.version)).collect())
    }

    /// Registers `schema` under `subject` and returns its id. With `keep` (id and version), as
    /// an import asks: the registry must be in IMPORT mode, and may still answer with an id of
    /// its own, which the caller checks.
    pub async fn register(
        &self,
        subject: &str,
        schema: &Schema,
        keep: Option<(SchemaId, i32)>,
    ) -> Result<SchemaId, RegistryError> {
        let mut body = schema_body(schema)?;
        if let (Some((id, version)), Some(map)) = (keep, body.as_object_mut()) {
            map.insert("id".into(), id.0.into());
            map.insert("version".into(), version.into());
        }
        let path = format!("/subjects/{}/versions", segment(subject));
        let answer: IdAnswer = self.send(Method::POST, &path, Some(body)).await?;
        Ok(answer.id)
    }

    /// The version of `subject` whose schema is `schema`, if it has one (with `deleted`, a
    /// soft-deleted one too).
    pub async fn lookup(
        &self,
        subject: &str,
        schema: &Schema,
        deleted: bool,
    ) -> Result<Option<Registered>, RegistryError> {
        let body = schema_body(schema)?;
        let path = format!("/subjects/{}{}", segment(subject), deleted_query(deleted));
        match self.send(Method::POST, &path, Some(body)).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if matches!(e.code(), Some(SUBJECT_NOT_FOUND | SCHEMA_NOT_FOUND)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The mode of the registry (`subject` None) or of one subject; None when the subject has
    /// no mode of its own.
    pub async fn mode(&self, subject: Option<&str>) -> Result<Option<Mode>, RegistryError> {
        match self.get::<ModeAnswer>(&scoped("/mode", subject)).await {
            Ok(m) => Ok(Some(m.mode)),
            Err(e) if subject.is_some() && e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets the mode of the registry or of one subject.
    pub async fn set_mode(&self, subject: Option<&str>, mode: Mode) -> Result<(), RegistryError> {
        let body = serde_json::json!({ "mode": mode });
        // Confluent's registry puts a subject that has versions in IMPORT mode only when forced.
        let force = if mode == Mode::Import {
            "?force=true"
        } else {
            ""
        };
        let path = format!("{}{force}", scoped("/mode", subject));
        let _: ModeAnswer = self.send(Method::PUT, &path, Some(body)).await?;
        Ok(())
    }

    /// Removes one subject's own mode: it follows the registry's again.
    pub async fn delete_mode(&self, subject: &str) -> Result<(), RegistryError> {
        let path = format!("/mode/{}", segment(subject));
        let _: serde_json::Value = self.send(Method::DELETE, &path, None).await?;
        Ok(())
    }

    /// The compatibility level of the registry or of one subject; None when the subject has
    /// no level of its own.
    pub async fn compatibility(
        &self,
        subject: Option<&str>,
    ) -> Result<Option<Compatibility>, RegistryError> {
        match self.get::<ConfigAnswer>(&scoped("/config", subject)).await {
            Ok(c) => Ok(Some(c.compatibility)),
            Err(e) if subject.is_some() && e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets the compatibility level of the registry or of one subject.
    pub async fn set_compatibility(
        &self,
        subject: Option<&str>,
        level: Compatibility,
    ) -> Result<(), RegistryError> {
        let body = serde_json::json!({ "compatibility": level });
        let _: ConfigAnswer = self
            .send(Method::PUT, &scoped("/config", subject), Some(body))
            .await?;
        Ok(())
    }

    /// Removes one subject's own compatibility level: it follows the registry's again.
    pub async fn delete_compatibility(&self, subject: &str) -> Result<(), RegistryError> {
        let path = format!("/config/{}", segment(subject));
        let _: serde_json::Value = self.send(Method::DELETE, &path, None).await?;
        Ok(())
    }

    /// Deletes `subject` (softly, or for good with `permanent`, which needs a soft delete
    /// first); returns the versions deleted.
    pub async fn delete_subject(
        &self,
        subject: &str,
        permanent: bool,
    ) -> Result<Vec<i32>, RegistryError> {
        let query = if permanent { "?permanent=true" } else { "" };
        let path = format!("/subjects/{}{query}", segment(subject));
        self.send(Method::DELETE, &path, None).await
    }

    /// Deletes one version of `subject` (softly, or for good with `permanent`).
    pub async fn delete_version(
        &self,
        subject: &str,
        version: i32,
        permanent: bool,
    ) -> Result<(), RegistryError> {
        let query = if permanent { "?permanent=true" } else { "" };
        let path = format!("/subjects/{}/versions/{version}{query}", segment(subject));
        let _: i32 = self.send(Method::DELETE, &path, None).await?;
        Ok(())
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, RegistryError> {
        self.send(Method::GET, path, None).await
    }

    /// One call: the answer's JSON read into `T`, or the registry's refusal.
    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, RegistryError> {
        let what = format!("{method} {path}");
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("Accept", CONTENT_TYPE);
        req = match &self.auth {
            Auth::None => req,
            Auth::Basic { user, password } => {
                let pair = format!("{user}:{}", password.expose());
                req.header("Authorization", format!("Basic {}", STANDARD.encode(pair)))
            }
            Auth::Bearer(token) => {
                req.header("Authorization", format!("Bearer {}", token.expose()))
            }
        };
        if let Some(body) = body {
            req = req
                .header("Content-Type", CONTENT_TYPE)
                .body(body.to_string());
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&what, e))?;
        let status = resp.status();
        let bytes = self.read(resp, &what).await?;
        if !status.is_success() {
            let (code, message) = refusal(&bytes);
            return Err(RegistryError::Refused {
                url: self.shown.clone(),
                what,
                status: status.as_u16(),
                code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::BadAnswer {
            url: self.shown.clone(),
            what,
            message: format!("not the answer the API defines: {e}"),
        })
    }

    /// The body, at most [`MAX_ANSWER`] bytes.
    async fn read(
        &self,
        mut resp: reqwest::Response,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.unreachable(what, e))? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > MAX_ANSWER {
                return Err(RegistryError::BadAnswer {
                    url: self.shown.clone(),
                    what: what.into(),
                    message: format!("an answer larger than {MAX_ANSWER} bytes"),
                });
            }
        }
        Ok(bytes)
    }

    fn unreachable(&self, what: &str, e: reqwest::Error) -> RegistryError {
        // reqwest's errors name the URL, which may carry credentials: the registry is named
        // already, redacted.
        let e = e.without_url();
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        RegistryError::Unreachable {
            url: self.shown.clone(),
            what: what.into(),
            message,
        }
    }
}

/// A refusal's error code and message (`{"error_code": 40401, "message": "..."}`), shown
/// printable and short; a body of another shape is shown as text.
fn refusal(body: &[u8]) -> (Option<i64>, String) {
    let shown = |s: &str| -> String { s.chars().filter(|c| !c.is_control()).take(300).collect() };
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(e) => (
            e.error_code,
            shown(e.message.as_deref().unwrap_or_default()),
        ),
        Err(_) => (None, shown(&String::from_utf8_lossy(body))),
    }
}

/// A schema as a request's JSON body.
fn schema_body(schema: &Schema) -> Result<serde_json::Value, RegistryError> {
    serde_json::to_value(schema)
        .map_err(|e| RegistryError::Config(format!("a schema that cannot be written as JSON: {e}")))
}

fn deleted_query(deleted: bool) -> &'static str {
    if deleted {
        "?deleted=true"
    } else {
        ""
    }
}

/// `/mode` or `/mode/{subject}`, `/config` likewise.
fn scoped(base: &str, subject: Option<&str>) -> String {
    match subject {
        Some(s) => format!("{base}/{}", segment(s)),
        None => base.to_string(),
    }
}

/// A subject name as one URL path segment: subject names may hold any character.
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_names_are_one_path_segment() {
        assert_eq!(segment("orders-value"), "orders-value");
        assert_eq!(segment("A.orders-value"), "A.orders-value");
        assert_eq!(segment("a/b c?d"), "a%2Fb%20c%3Fd");
        assert_eq!(segment("é"), "%C3%A9");
        assert_eq!(scoped("/mode", Some("x/y")), "/mode/x%2Fy");
        assert_eq!(scoped("/config", None), "/config");
    }

    #[test]
    fn a_refusal_shows_its_code_and_a_short_printable_message() {
        let (code, message) =
            refusal(br#"{"error_code":40401,"message":"Subject 'x' not found."}"#);
        assert_eq!(
            (code, message.as_str()),
            (Some(40401), "Subject 'x' not found.")
        );
        let (code, message) = refusal(b"<html>\n502 Bad Gateway</html>");
        assert_eq!(code, None);
        assert_eq!(message, "<html>502 Bad Gateway</html>");
        let long = format!(r#"{{"error_code":1,"message":"{}"}}"#, "x".repeat(1000));
        assert_eq!(refusal(long.as_bytes()).1.len(), 300);
    }

    #[test]
    fn settings_and_clients_never_print_credentials() {
        let s = RegistrySettings {
            url: "https://user:pw@registry.example:8081/path?token=abc".into(),
            auth: Auth::Basic {
                user: "svc".into(),
                password: Secret::new("hunter2"),
            },
            tls: None,
            timeout: Duration::from_secs(5),
        };
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("pw@") && !shown.contains("abc"),
            "{shown}"
        );
        let c = RegistryClient::new(&s).unwrap();
        let shown = format!("{c:?}");
        assert!(
            shown.contains("https://registry.example:8081/path"),
            "{shown}"
        );
        assert!(!shown.contains("pw") && !shown.contains("abc"), "{shown}");
        let bearer = format!("{:?}", Auth::Bearer(Secret::new("tok-123")));
        assert!(!bearer.contains("tok-123"), "{bearer}");
    }

    #[test]
    fn a_url_that_is_not_http_is_refused_by_name() {
        let s = RegistrySettings {
            url: "registry:8081".into(),
            auth: Auth::None,
            tls: None,
            timeout: Duration::from_secs(5),
        };
        let e = RegistryClient::new(&s).unwrap_err().to_string();
        assert!(
            e.contains("schema.registry.url 'registry:8081'") && e.contains("http://"),
            "{e}"
        );
    }
}
