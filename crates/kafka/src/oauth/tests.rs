//! Unit tests of `oauth`, kept apart so the module reads on its own.

use super::*;
use crate::settings::{TlsSettings, TrustMaterial};
use crate::token_cache::TokenCache;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn refresh() -> TokenRefresh {
    TokenRefresh::default()
}

/// One scripted answer of the test endpoint: HTTP status, JSON body, delay before it.
type Answer = (u16, String, Duration);

/// A token endpoint on 127.0.0.1 that gives `answers` in turn (the last one again when
/// they run out), over TLS with the test CA's certificate when `tls`; counts requests.
async fn endpoint(answers: Vec<Answer>, tls: bool) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(std::sync::Mutex::new(VecDeque::from(answers)));
    let acceptor = tls.then(|| {
        use rustls::pki_types::pem::PemObject;
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tls");
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(format!("{dir}/server.pem"))
            .unwrap()
            .collect::<std::result::Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_file(format!("{dir}/server.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let count = asked.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let answer = {
                let mut s = script.lock().unwrap();
                if s.len() > 1 {
                    s.pop_front().unwrap()
                } else {
                    s.front().unwrap().clone()
                }
            };
            let count = count.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    Some(a) => {
                        if let Ok(tls) = a.accept(tcp).await {
                            answer_one(tls, answer, &count).await;
                        }
                    }
                    None => answer_one(tcp, answer, &count).await,
                }
            });
        }
    });
    let scheme = if tls { "https" } else { "http" };
    (format!("{scheme}://127.0.0.1:{port}/token"), asked)
}

async fn answer_one(
    mut io: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    (status, body, delay): Answer,
    count: &AtomicUsize,
) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    count.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(delay).await;
    let reply = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = io.write_all(reply.as_bytes()).await;
    let _ = io.shutdown().await;
}

fn granted(token: &str, expires_in: u64) -> Answer {
    let body =
        format!(r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":{expires_in}}}"#);
    (200, body, Duration::ZERO)
}

/// Client-credential settings for `endpoint`; renewal at a quarter of the lifetime.
fn settings(endpoint: &str, tls: Option<TlsSettings>) -> OAuthBearer {
    OAuthBearer {
        source: TokenSource::ClientCredentials(ClientCredentials {
            endpoint: endpoint.into(),
            client_id: "kmirror".into(),
            client_secret: Secret::new("s3cret"),
            scope: None,
            tls,
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(5),
            retry_backoff: Duration::from_millis(50),
            retry_backoff_max: Duration::from_millis(300),
        }),
        extensions: vec![],
        refresh: TokenRefresh {
            window_factor_permille: 250,
            window_jitter_permille: 0,
            min_period: Duration::ZERO,
            buffer: Duration::ZERO,
        },
        cache: TokenCache::default(),
    }
}

#[tokio::test]
async fn the_token_endpoints_tls_trusts_what_the_jaas_line_names() {
    let (url, asked) = endpoint(vec![granted("tls-token", 600)], true).await;
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tls/ca.pem");
    let trusted = TlsSettings {
        trust: TrustMaterial::PemFile { path: ca.into() },
        identity: None,
        verify_hostname: true,
    };
    let t = settings(&url, Some(trusted)).token().await.unwrap();
    assert_eq!(t.expose(), "tls-token");
    // The platform's roots do not hold the test CA: refused, and not retried as if the
    // endpoint were down for a moment.
    let before = asked.load(Ordering::SeqCst);
    let e = settings(&url, None).token().await.unwrap_err().to_string();
    assert!(e.contains(&url) && e.contains("request failed"), "{e}");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        before,
        "no request got through"
    );
}

#[tokio::test]
async fn while_one_caller_renews_the_others_take_the_unexpired_token() {
    // Renewal is due after 1 s of a 4 s token; the renewal answer takes 1.5 s.
    let (url, asked) = endpoint(
        vec![
            granted("first", 4),
            (200, granted("second", 600).1, Duration::from_millis(1500)),
        ],
        false,
    )
    .await;
    let oauth = settings(&url, None);
    assert_eq!(oauth.token().await.unwrap().expose(), "first");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let renewing = tokio::spawn({
        let oauth = oauth.clone();
        async move { oauth.token().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    assert_eq!(oauth.token().await.unwrap().expose(), "first");
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(renewing.await.unwrap().unwrap().expose(), "second");
    assert_eq!(oauth.token().await.unwrap().expose(), "second");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failed_renewal_is_retried_then_the_held_token_serves_until_it_expires() {
    let down = (
        503,
        r#"{"error":"temporarily_unavailable"}"#.to_string(),
        Duration::ZERO,
    );
    let (url, asked) = endpoint(vec![granted("held", 3), down], false).await;
    let oauth = settings(&url, None);
    assert_eq!(oauth.token().await.unwrap().expose(), "held");
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Due: the endpoint answers 503, retried with backoff (50, 100, 200 ms within 300 ms),
    // then the held token serves.
    assert_eq!(oauth.token().await.unwrap().expose(), "held");
    let tries = asked.load(Ordering::SeqCst) - 1;
    assert!((2..=4).contains(&tries), "{tries} tries");
    // Expired: the failure is the caller's.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let e = oauth.token().await.unwrap_err().to_string();
    assert!(
        e.contains("503") && e.contains("temporarily_unavailable"),
        "{e}"
    );
    assert!(!e.contains("s3cret"), "{e}");
}

#[test]
fn an_hour_long_token_is_renewed_between_80_and_85_percent() {
    let hour = 3_600_000;
    assert_eq!(
        refresh_after(0, hour, &refresh(), 0.0),
        Duration::from_secs(2880)
    );
    assert_eq!(
        refresh_after(0, hour, &refresh(), 1.0),
        Duration::from_secs(3060)
    );
}

#[test]
fn the_buffer_and_the_minimum_period_bound_the_renewal() {
    // 10 minutes: 80 % is 8 min, but the 5-minute buffer wants it by 5 min.
    assert_eq!(
        refresh_after(0, 600_000, &refresh(), 0.0),
        Duration::from_secs(300)
    );
    // 30 s: too short for both; the fraction alone decides.
    assert_eq!(
        refresh_after(0, 30_000, &refresh(), 0.0),
        Duration::from_secs(24)
    );
    // Expired already: now.
    assert_eq!(
        refresh_after(10_000, 5_000, &refresh(), 0.5),
        Duration::ZERO
    );
    let slow = TokenRefresh {
        min_period: Duration::from_secs(400),
        buffer: Duration::from_secs(60),
        ..refresh()
    };
    // 20 minutes: 80 % is 16 min, within the buffer; 400 s minimum does not bind.
    assert_eq!(
        refresh_after(0, 1_200_000, &slow, 0.0),
        Duration::from_secs(960)
    );
}

#[test]
fn the_unsecured_token_is_kafkas_unsecured_jws() {
    let source = TokenSource::Unsecured {
        principal_claim: "sub".into(),
        principal: "alice".into(),
        lifetime_secs: 3600,
        scope_claim: "scope".into(),
        scope: vec!["a".into(), "b".into()],
    };
    let (token, exp) = unsecured(&source, 1_700_000_000_123);
    assert_eq!(exp, 1_700_003_600_000);
    let parts: Vec<&str> = token.expose().split('.').collect();
    assert_eq!(parts.len(), 3);
    assert_eq!(
        URL_SAFE_NO_PAD.decode(parts[0]).unwrap(),
        br#"{"alg":"none"}"#
    );
    assert_eq!(parts[2], "");
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["iat"], 1_700_000_000);
    assert_eq!(claims["exp"], 1_700_003_600);
    assert_eq!(claims["scope"], serde_json::json!(["a", "b"]));
    assert_eq!(jwt_expiry(token.expose()), Some(1_700_003_600_000));
}

#[test]
fn jwt_expiry_takes_only_well_formed_tokens() {
    let payload = URL_SAFE_NO_PAD.encode(r#"{"exp":12.5}"#);
    assert_eq!(jwt_expiry(&format!("h.{payload}.s")), Some(12_500));
    for bad in [
        "",
        "a.b",
        "h.!!!.s",
        &format!("h.{}.s", URL_SAFE_NO_PAD.encode("[]")),
        &format!("h.{}.s", URL_SAFE_NO_PAD.encode(r#"{"exp":"soon"}"#)),
        &format!("h.{}.s", URL_SAFE_NO_PAD.encode(r#"{"exp":-1}"#)),
    ] {
        assert_eq!(jwt_expiry(bad), None, "{bad}");
    }
}

#[test]
fn the_initial_response_is_kafkas() {
    let t = Secret::new("tok");
    assert_eq!(initial_response(&t, &[]), b"n,,\x01auth=Bearer tok\x01\x01");
    assert_eq!(
        initial_response(&t, &[("traceId".into(), "42".into())]),
        b"n,,\x01auth=Bearer tok\x01traceId=42\x01\x01"
    );
}

#[test]
fn a_serialized_endpoint_loses_its_credentials() {
    let source = TokenSource::ClientCredentials(ClientCredentials {
        endpoint: "https://id:pw@idp.example/token?key=k1".into(),
        client_id: "c".into(),
        client_secret: Secret::new("s3cret"),
        scope: None,
        tls: None,
        connect_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_secs(1),
        retry_backoff: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(1),
    });
    let json = serde_json::to_string(&source).unwrap();
    assert!(json.contains("https://idp.example/token"), "{json}");
    // The form plan's JSON has always had: the kind beside the fields, not nested.
    assert!(
        json.starts_with(r#"{"kind":"client_credentials","endpoint":"#),
        "{json}"
    );
    for secret in ["pw", "k1", "s3cret"] {
        assert!(!json.contains(secret), "{json}");
    }
}

#[test]
fn urls_lose_their_credentials_when_shown() {
    assert_eq!(
        redact("https://user:pw@idp.example/token?key=s3cret#x"),
        "https://idp.example/token"
    );
    assert_eq!(redact("http://127.0.0.1:8080/t"), "http://127.0.0.1:8080/t");
}

#[test]
fn scopes_are_form_encoded_as_java_does() {
    assert_eq!(form_encode("kafka read:all"), "kafka+read%3Aall");
}
