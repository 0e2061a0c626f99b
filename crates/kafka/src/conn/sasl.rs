//! SASL client exchanges, as pure state machines: PLAIN (RFC 4616), SCRAM-SHA-256/512
//! (RFC 5802, RFC 7677), OAUTHBEARER (RFC 7628, with a token had beforehand), AWS_MSK_IAM and
//! GSSAPI (RFC 4752, with a Kerberos context made beforehand, `crate::kerberos`). The connection
//! sends the tokens through SaslAuthenticate.

use crate::settings::{SaslCredentials, SaslMechanism};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

/// Java's client refuses fewer SCRAM iterations than 4,096. Kafka's Admin API and storage tool
/// store at most 16,384, but ZooKeeper-era `kafka-configs` took any count, so the upper bound is
/// a CPU budget (about a second of PBKDF2), not Kafka's: it stops a hostile server from holding
/// a runtime worker for an hour with 4 billion.
const SCRAM_MIN_ITERATIONS: u32 = 4096;
const SCRAM_MAX_ITERATIONS: u32 = 1_000_000;

/// Why an exchange failed on the client side. Never contains the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SaslError(pub String);

/// The next step of an exchange.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this token and feed the server's answer to `next`.
    Send(Vec<u8>),
    /// Authentication is complete.
    Done,
}

/// A client exchange for one mechanism. Its Debug shows the mechanism and step only: the
/// PLAIN token holds the password, the OAUTHBEARER one a bearer token, the MSK IAM document a
/// session token.
pub enum Exchange {
    Plain {
        token: Option<Vec<u8>>,
    },
    Scram(Scram),
    /// The server answers an accepted token with nothing, a refused one with a JSON error, to
    /// which the client answers `\x01` before the server fails the exchange (RFC 7628 §3.2.2).
    OAuth {
        initial: Option<Vec<u8>>,
        refusal: Option<String>,
    },
    /// AWS_MSK_IAM: one signed document; the broker's answer (a JSON receipt) ends it.
    AwsIam {
        payload: Option<Vec<u8>>,
    },
    /// GSSAPI: the AP-REQ, the broker's AP-REP, an empty token, the broker's wrapped
    /// security-layer offer, kmirror's wrapped answer, and the broker's empty last word.
    Gssapi(Box<crate::kerberos::Login>),
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = |t: &Option<Vec<u8>>| if t.is_some() { "to send" } else { "sent" };
        match self {
            Exchange::Plain { token } => write!(f, "Exchange::Plain(token {})", pending(token)),
            Exchange::Scram(s) => f.debug_tuple("Exchange::Scram").field(s).finish(),
            Exchange::OAuth { initial, refusal } => write!(
                f,
                "Exchange::OAuth(token {}, refused: {})",
                pending(initial),
                refusal.is_some()
            ),
            Exchange::AwsIam { payload } => {
                write!(f, "Exchange::AwsIam(payload {})", pending(payload))
            }
            Exchange::Gssapi(l) => f.debug_tuple("Exchange::Gssapi").field(l).finish(),
        }
    }
}

/// What a mechanism has before its exchange starts.
#[derive(Debug)]
pub enum Prepared {
    Nothing,
    /// An OAUTHBEARER token or a signed AWS_MSK_IAM document.
    Token(crate::Secret),
    /// A Kerberos context for this broker.
    Kerberos(Box<crate::kerberos::Login>),
}

impl Exchange {
    /// An exchange; OAUTHBEARER and AWS_MSK_IAM need their token, GSSAPI its context.
    pub fn new(creds: &SaslCredentials, prepared: Prepared) -> Self {
        let (token, login) = match prepared {
            Prepared::Nothing => (None, None),
            Prepared::Token(t) => (Some(t), None),
            Prepared::Kerberos(l) => (None, Some(l)),
        };
        let token = token.as_ref();
        match creds.mechanism {
            SaslMechanism::Gssapi => match login {
                Some(l) => Exchange::Gssapi(l),
                // Unreachable through the connection, which logs in first; an empty token
                // makes the broker refuse the exchange with its own message.
                None => Exchange::Plain { token: None },
            },
            SaslMechanism::AwsMskIam => Exchange::AwsIam {
                payload: token.map(|t| t.expose().as_bytes().to_vec()),
            },
            SaslMechanism::OAuthBearer => {
                let extensions = creds
                    .oauth
                    .as_ref()
                    .map(|o| o.extensions.as_slice())
                    .unwrap_or_default();
                Exchange::OAuth {
                    initial: Some(crate::oauth::initial_response(
                        token.unwrap_or(&crate::Secret::default()),
                        extensions,
                    )),
                    refusal: None,
                }
            }
            SaslMechanism::Plain => {
                let mut t = Vec::new();
                t.push(0);
                t.extend_from_slice(creds.username.as_bytes());
                t.push(0);
                t.extend_from_slice(creds.password.expose().as_bytes());
                Exchange::Plain { token: Some(t) }
            }
            SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
                Exchange::Scram(Scram::new(creds, &random_nonce()))
            }
        }
    }

    /// The first token to send.
    pub fn start(&mut self) -> Vec<u8> {
        match self {
            Exchange::Plain { token } => token.take().unwrap_or_default(),
            Exchange::Scram(s) => s.client_first(),
            Exchange::OAuth { initial, .. } => initial.take().unwrap_or_default(),
            Exchange::AwsIam { payload } => payload.take().unwrap_or_default(),
            Exchange::Gssapi(l) => l.start(),
        }
    }

    /// What the server said when it refused a token, for the error message.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Exchange::OAuth { refusal, .. } => refusal.as_deref(),
            _ => None,
        }
    }

    /// Feeds the server's answer; returns what to do next.
    pub fn next(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        match self {
            Exchange::Plain { .. } | Exchange::AwsIam { .. } => Ok(Step::Done),
            Exchange::Scram(s) => s.next(server),
            Exchange::Gssapi(l) => match l.step(server).map_err(SaslError)? {
                Some(token) => Ok(Step::Send(token)),
                None => Ok(Step::Done),
            },
            Exchange::OAuth { refusal, .. } => {
                if server.is_empty() {
                    return Ok(Step::Done);
                }
                if let Some(r) = refusal {
                    return Err(SaslError(format!("the server refused the token: {r}")));
                }
                // Bytes from the server, shown in an error: printable and bounded.
                let text: String = String::from_utf8_lossy(server)
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(300)
                    .collect();
                *refusal = Some(text);
                Ok(Step::Send(b"\x01".to_vec()))
            }
        }
    }
}

fn random_nonce() -> String {
    use rand::Rng;
    let bytes: [u8; 24] = rand::thread_rng().gen();
    B64.encode(bytes)
}

#[derive(Debug, Clone, Copy)]
enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => {
                let mut m =
                    <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Hash::Sha512 => {
                let mut m =
                    <Hmac<Sha512> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => Sha256::digest(data).to_vec(),
            Hash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Hash::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Hash::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// SCRAM client state.
pub struct Scram {
    hash: Hash,
    username: String,
    password: crate::Secret,
    client_nonce: String,
    client_first_bare: String,
    server_signature: Option<Vec<u8>>,
}

impl std::fmt::Debug for Scram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scram")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// SCRAM's `saslname`: `=` and `,` escaped.
fn sasl_name(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

impl Scram {
    pub fn new(creds: &SaslCredentials, nonce: &str) -> Self {
        let hash = if creds.mechanism == SaslMechanism::ScramSha512 {
            Hash::Sha512
        } else {
            Hash::Sha256
        };
        Scram {
            hash,
            username: creds.username.clone(),
            password: creds.password.clone(),
            client_nonce: nonce.to_string(),
            client_first_bare: String::new(),
            server_signature: None,
        }
    }

    fn client_first(&mut self) -> Vec<u8> {
        self.client_first_bare = format!("n={},r={}", sasl_name(&self.username), self.client_nonce);
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    fn next(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        let msg = std::str::from_utf8(server)
            .map_err(|_| SaslError("the server's SCRAM message is not UTF-8".into()))?;
        if let Some(expected) = &self.server_signature {
            // server-final-message
            let attr = |k: &str| msg.split(',').find_map(|p| p.strip_prefix(k));
            if let Some(e) = attr("e=") {
                return Err(SaslError(format!(
                    "the server rejected the SCRAM proof: {e}"
                )));
            }
            let v = attr("v=").ok_or_else(|| {
                SaslError("the server's final SCRAM message has no signature".into())
            })?;
            let got = B64
                .decode(v)
                .map_err(|_| SaslError("the server's SCRAM signature is not base64".into()))?;
            if &got != expected {
                return Err(SaslError("the server's SCRAM signature does not match: the server does not know the password (possible impersonation)".into()));
            }
            return Ok(Step::Done);
        }
        // server-first-message: r=<nonce>,s=<salt>,i=<iterations>
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in msg.split(',') {
            if let Some(v) = part.strip_prefix("r=") {
                nonce = Some(v.to_string());
            } else if let Some(v) = part.strip_prefix("s=") {
                salt = Some(
                    B64.decode(v)
                        .map_err(|_| SaslError("the server's SCRAM salt is not base64".into()))?,
                );
            } else if let Some(v) = part.strip_prefix("i=") {
                iterations = v.parse::<u32>().ok();
            } else if let Some(v) = part.strip_prefix("e=") {
                return Err(SaslError(format!(
                    "the server refused SCRAM authentication: {v}"
                )));
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(SaslError(
                "the server's first SCRAM message lacks the nonce, salt or iteration count".into(),
            ));
        };
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(SaslError(
                "the server's SCRAM nonce does not extend the client's".into(),
            ));
        }
        if !(SCRAM_MIN_ITERATIONS..=SCRAM_MAX_ITERATIONS).contains(&iterations) {
            return Err(SaslError(format!(
                "the server asked for {iterations} SCRAM iterations; kmirror accepts \
                 {SCRAM_MIN_ITERATIONS} to {SCRAM_MAX_ITERATIONS}"
            )));
        }
        let h = self.hash;
        let salted = h.salted_password(self.password.expose().as_bytes(), &salt, iterations);
        let client_key = h.hmac(&salted, b"Client Key");
        let stored_key = h.digest(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{},{}", self.client_first_bare, msg, without_proof);
        let client_signature = h.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = h.hmac(&salted, b"Server Key");
        self.server_signature = Some(h.hmac(&server_key, auth_message.as_bytes()));
        Ok(Step::Send(
            format!("{without_proof},p={}", B64.encode(proof)).into_bytes(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;

    #[test]
    fn scram_refuses_iteration_counts_outside_its_bounds() {
        for i in ["0", "4095", "1000001", "4000000000"] {
            let mut s = Scram::new(&creds(SaslMechanism::ScramSha256, "u", "p"), "abc");
            s.client_first();
            let e = s
                .next(format!("r=abcdef,s=QUJD,i={i}").as_bytes())
                .unwrap_err();
            assert!(e.0.contains(&format!("{i} SCRAM iterations")), "{}", e.0);
        }
        let mut s = Scram::new(&creds(SaslMechanism::ScramSha256, "u", "p"), "abc");
        s.client_first();
        assert!(matches!(
            s.next(b"r=abcdef,s=QUJD,i=20000").unwrap(),
            Step::Send(_)
        ));
    }

    fn creds(mechanism: SaslMechanism, user: &str, pw: &str) -> SaslCredentials {
        SaslCredentials {
            mechanism,
            username: user.into(),
            password: Secret::new(pw),
            oauth: None,
            aws: None,
            kerberos: None,
        }
    }

    #[test]
    fn plain_token() {
        let mut e = Exchange::new(
            &creds(SaslMechanism::Plain, "alice", "pw"),
            Prepared::Nothing,
        );
        assert_eq!(e.start(), b"\0alice\0pw");
        assert_eq!(e.next(b""), Ok(Step::Done));
    }

    #[test]
    fn an_exchanges_debug_shows_no_password_token_or_document() {
        let plain = Exchange::new(
            &creds(SaslMechanism::Plain, "alice", "pw-secret-9"),
            Prepared::Nothing,
        );
        let bearer = Exchange::new(
            &creds(SaslMechanism::OAuthBearer, "", ""),
            Prepared::Token(Secret::new("eyJ.bearer-token-xyz")),
        );
        let msk = Exchange::new(
            &creds(SaslMechanism::AwsMskIam, "", ""),
            Prepared::Token(Secret::new("{\"x-amz-security-token\":\"session-xyz\"}")),
        );
        for (e, secret) in [
            (plain, "pw-secret-9"),
            (bearer, "bearer-token-xyz"),
            (msk, "session-xyz"),
        ] {
            let shown = format!("{e:?}");
            assert!(shown.contains("to send"), "{shown}");
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[test]
    fn scram_sha256_rfc7677_vector() {
        let mut s = Scram::new(
            &creds(SaslMechanism::ScramSha256, "user", "pencil"),
            "rOprNGfwEbeRWgbNEkqO",
        );
        assert_eq!(s.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let Step::Send(final_msg) = s.next(server_first).unwrap() else {
            panic!("expected a client-final message")
        };
        assert_eq!(
            String::from_utf8(final_msg).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            s.next(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Ok(Step::Done)
        );
    }

    #[test]
    fn scram_rejects_a_wrong_server_signature_and_bad_nonces() {
        let mut s = Scram::new(&creds(SaslMechanism::ScramSha512, "u", "p"), "abc");
        s.client_first();
        assert!(s
            .next(b"r=xyz123,s=QUJD,i=4096")
            .unwrap_err()
            .0
            .contains("nonce"));
        let mut s = Scram::new(&creds(SaslMechanism::ScramSha512, "u", "p"), "abc");
        s.client_first();
        assert!(matches!(
            s.next(b"r=abcdef,s=QUJD,i=4096").unwrap(),
            Step::Send(_)
        ));
        let e = s.next(b"v=AAAA").unwrap_err();
        assert!(e.0.contains("does not match"));
        assert!(!format!("{s:?}").contains('p') || !format!("{s:?}").contains("password"));
    }

    #[test]
    fn oauthbearer_sends_the_token_and_answers_a_refusal_as_kafka_does() {
        let c = creds(SaslMechanism::OAuthBearer, "", "");
        let mut e = Exchange::new(&c, Prepared::Token(Secret::new("tok")));
        assert_eq!(e.start(), b"n,,\x01auth=Bearer tok\x01\x01");
        assert_eq!(e.next(b""), Ok(Step::Done));
        let mut e = Exchange::new(&c, Prepared::Token(Secret::new("tok")));
        e.start();
        assert_eq!(
            e.next(br#"{"status":"invalid_token"}"#),
            Ok(Step::Send(b"\x01".to_vec()))
        );
        assert_eq!(e.refusal(), Some(r#"{"status":"invalid_token"}"#));
        assert!(e.next(b"x").unwrap_err().0.contains("invalid_token"));
    }

    #[test]
    fn scram_usernames_are_escaped() {
        let mut s = Scram::new(&creds(SaslMechanism::ScramSha256, "a=b,c", "p"), "n");
        assert_eq!(s.client_first(), b"n,,n=a=3Db=2Cc,r=n");
    }
}
