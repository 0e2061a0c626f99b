//! A small OIDC identity provider on 127.0.0.1 for OAUTHBEARER tests (KIP-768): `POST /token`
//! grants client credentials (HTTP Basic) with ES256-signed JWTs of a chosen lifetime, and
//! `GET /jwks` serves the public key brokers validate them with
//! (`sasl.oauthbearer.jwks.endpoint.url`). It counts the tokens it issued, so a test can assert
//! that a client renewed its token.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The running provider; stops when dropped.
#[derive(Debug)]
pub struct TokenServer {
    port: u16,
    issued: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

struct Issuer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    client_id: String,
    client_secret: String,
    lifetime: Duration,
    issued: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl TokenServer {
    /// Grants tokens living `lifetime` to `client_id` / `client_secret`, for subject
    /// `client_id`.
    pub fn start(client_id: &str, client_secret: &str, lifetime: Duration) -> TokenServer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("a P-256 key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("the key just made");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the token server");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let issued = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let issuer = Arc::new(Issuer {
            key,
            rng,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            lifetime,
            issued: issued.clone(),
            refused: refused.clone(),
        });
        let halt = stop.clone();
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let issuer = issuer.clone();
                        std::thread::spawn(move || {
                            let _ = issuer.serve(conn);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        TokenServer {
            port,
            issued,
            refused,
            stop,
        }
    }

    pub fn token_url(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    pub fn jwks_url(&self) -> String {
        format!("http://127.0.0.1:{}/jwks", self.port)
    }

    /// Tokens granted so far.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Requests refused for wrong credentials.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Issuer {
    fn serve(&self, conn: TcpStream) -> std::io::Result<()> {
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or_default().to_string(),
            parts.next().unwrap_or_default().to_string(),
        );
        let mut length = 0usize;
        let mut authorization = String::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "authorization" => authorization = v.trim().to_string(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; length.min(65536)];
        reader.read_exact(&mut body)?;
        let (status, text) = match (method.as_str(), path.as_str()) {
            ("GET", "/jwks") => ("200 OK", self.jwks()),
            ("POST", "/token") => self.token(&authorization, &String::from_utf8_lossy(&body)),
            _ => ("404 Not Found", r#"{"error":"not_found"}"#.to_string()),
        };
        let mut out = conn;
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )?;
        out.flush()
    }

    fn jwks(&self) -> String {
        // Uncompressed point: 0x04 || X || Y.
        let public = self.key.public_key().as_ref();
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "k1",
            "x": URL_SAFE_NO_PAD.encode(&public[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&public[33..65]),
        }]})
        .to_string()
    }

    fn token(&self, authorization: &str, body: &str) -> (&'static str, String) {
        let expected = format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", self.client_id, self.client_secret))
        );
        if authorization != expected {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return (
                "401 Unauthorized",
                r#"{"error":"invalid_client","error_description":"bad client credentials"}"#.into(),
            );
        }
        if !body
            .split('&')
            .any(|p| p == "grant_type=client_credentials")
        {
            return (
                "400 Bad Request",
                r#"{"error":"unsupported_grant_type"}"#.into(),
            );
        }
        let iat = now_s();
        let exp = iat + self.lifetime.as_secs().max(1);
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","typ":"JWT","kid":"k1"}"#);
        let claims = URL_SAFE_NO_PAD.encode(
            serde_json::json!({
                "sub": self.client_id, "iss": "kmirror-test-idp", "aud": "kafka",
                "iat": iat, "exp": exp, "scope": "kafka",
            })
            .to_string(),
        );
        let signing_input = format!("{header}.{claims}");
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("signing");
        let jwt = format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        );
        self.issued.fetch_add(1, Ordering::Relaxed);
        (
            "200 OK",
            serde_json::json!({
                "access_token": jwt, "token_type": "Bearer",
                "expires_in": exp - iat, "scope": "kafka",
            })
            .to_string(),
        )
    }
}
