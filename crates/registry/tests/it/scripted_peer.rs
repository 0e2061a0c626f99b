//! The client against a scripted HTTP peer on 127.0.0.1 that records every request it gets:
//! the credentials reach the registry as the Confluent clients send them (HTTP Basic from
//! `basic.auth.user.info` or from the URL, a static bearer token), a TLS registry is trusted
//! through a private CA only, redirects are not followed (the credentials stay with the registry
//! named), and answers that are not the API's are errors that name the call and never a secret.
//! Apicurio's own authentication needs Keycloak, which tests here cannot run.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use kmirror_kafka::{Secret, TlsSettings, TrustMaterial};
use kmirror_registry::{Auth, RegistryClient, RegistryError, RegistrySettings};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The test CA and a certificate for 127.0.0.1 it signed (shared with the Kafka client's tests).
const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kafka/testdata/tls");

/// What the peer saw: each request's head, lower-cased header names.
type Seen = Arc<Mutex<Vec<String>>>;

/// A peer answering every request with `status` and `body` (over TLS with the test CA's
/// certificate when `tls`); its base URL and what it saw.
async fn peer(status: u16, body: &'static str, extra: &'static str, tls: bool) -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let acceptor = tls.then(|| {
        use rustls::pki_types::pem::PemObject;
        let chain =
            rustls::pki_types::CertificateDer::pem_file_iter(format!("{TLS_DIR}/server.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(format!("{TLS_DIR}/server.key"))
            .unwrap();
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
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (log, acceptor) = (log.clone(), acceptor.clone());
            tokio::spawn(async move {
                match acceptor {
                    Some(a) => {
                        if let Ok(s) = a.accept(tcp).await {
                            answer(s, status, body, extra, &log).await;
                        }
                    }
                    None => answer(tcp, status, body, extra, &log).await,
                }
            });
        }
    });
    let scheme = if tls { "https" } else { "http" };
    (format!("{scheme}://127.0.0.1:{port}/apis/ccompat/v7"), seen)
}

async fn answer(
    mut io: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    status: u16,
    body: &str,
    extra: &str,
    seen: &Mutex<Vec<String>>,
) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&request).to_string();
    let head = head.split("\r\n\r\n").next().unwrap_or_default();
    let lowered: Vec<String> = head
        .lines()
        .map(|l| match l.split_once(':') {
            Some((k, v)) => format!("{}:{v}", k.to_ascii_lowercase()),
            None => l.to_string(),
        })
        .collect();
    seen.lock().unwrap().push(lowered.join("\n"));
    let reply = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = io.write_all(reply.as_bytes()).await;
    let _ = io.shutdown().await;
}

fn client(url: &str, auth: Auth, tls: Option<TlsSettings>) -> RegistryClient {
    RegistryClient::new(&RegistrySettings {
        url: url.into(),
        auth,
        tls,
        timeout: Duration::from_secs(5),
    })
    .unwrap()
}

fn authorization(seen: &Seen) -> Vec<Option<String>> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|head| {
            head.lines()
                .find_map(|l| l.strip_prefix("authorization:"))
                .map(|v| v.trim().to_string())
        })
        .collect()
}

#[tokio::test]
async fn credentials_reach_the_registry_as_the_confluent_clients_send_them() {
    let (url, seen) = peer(200, r#"["orders-value"]"#, "", false).await;
    let basic = Auth::Basic {
        user: "kmirror".into(),
        password: Secret::new("s3cret:with-colon"),
    };
    assert_eq!(
        client(&url, basic, None).subjects(false).await.unwrap(),
        vec!["orders-value"]
    );
    let bearer = Auth::Bearer(Secret::new("tok-123"));
    client(&url, bearer, None).subjects(false).await.unwrap();
    client(&url, Auth::None, None)
        .subjects(false)
        .await
        .unwrap();
    // `basic.auth.credentials.source = URL`: the credentials in the URL, sent the same way.
    let in_url = url.replacen("http://", "http://alice:url-s3cret@", 1);
    client(&in_url, Auth::None, None)
        .subjects(false)
        .await
        .unwrap();
    let expected_basic = format!("Basic {}", STANDARD.encode("kmirror:s3cret:with-colon"));
    let expected_url = format!("Basic {}", STANDARD.encode("alice:url-s3cret"));
    assert_eq!(
        authorization(&seen),
        vec![
            Some(expected_basic),
            Some("Bearer tok-123".to_string()),
            None,
            Some(expected_url),
        ]
    );
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .all(|h| h.starts_with("GET /apis/ccompat/v7/subjects")),
        "{heads:?}"
    );
}

#[tokio::test]
async fn a_tls_registry_is_trusted_through_its_private_ca_only() {
    let (url, seen) = peer(200, r#"["s"]"#, "", true).await;
    let trusted = TlsSettings {
        trust: TrustMaterial::PemFile {
            path: format!("{TLS_DIR}/ca.pem").into(),
        },
        identity: None,
        verify_hostname: true,
    };
    let token = Auth::Bearer(Secret::new("tls-tok"));
    assert_eq!(
        client(&url, token.clone(), Some(trusted))
            .subjects(false)
            .await
            .unwrap(),
        vec!["s"]
    );
    assert_eq!(authorization(&seen), vec![Some("Bearer tls-tok".into())]);
    // The platform's roots do not hold the test CA: no request gets through, so the token
    // never leaves.
    let e = client(&url, token, None).subjects(false).await.unwrap_err();
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
    assert!(!e.to_string().contains("tls-tok"), "{e}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn redirects_are_not_followed_and_refusals_name_no_secret() {
    let (url, seen) = peer(307, "", "Location: http://127.0.0.1:9/steal\r\n", false).await;
    let basic = Auth::Basic {
        user: "u".into(),
        password: Secret::new("pw-s3cret"),
    };
    let e = client(&url, basic.clone(), None)
        .subjects(false)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RegistryError::Refused { status: 307, .. }),
        "{e}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "one request, to the registry named"
    );

    let (url, _) = peer(
        401,
        r#"{"error_code":40101,"message":"Unauthorized"}"#,
        "",
        false,
    )
    .await;
    let with_user = url.replacen("http://", "http://alice:url-s3cret@", 1);
    for c in [
        client(&url, basic, None),
        client(&with_user, Auth::None, None),
    ] {
        let e = c.subjects(false).await.unwrap_err();
        let shown = format!("{e} {e:?} {c:?}");
        assert!(shown.contains("401") && shown.contains("40101"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!e.is_retriable());
    }
}

#[tokio::test]
async fn an_answer_that_is_not_the_apis_is_a_clear_error() {
    for (status, body) in [(200, "not json"), (200, r#"{"subjects": 3}"#)] {
        let (url, _) = peer(status, body, "", false).await;
        let e = client(&url, Auth::None, None)
            .subjects(false)
            .await
            .unwrap_err();
        assert!(matches!(e, RegistryError::BadAnswer { .. }), "{e}");
        assert!(e.to_string().contains("GET /subjects"), "{e}");
    }
}
