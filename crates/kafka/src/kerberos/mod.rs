//! SASL/GSSAPI logins (RFC 4752 over Kafka's SaslAuthenticate; docs/configuration.md,
//! "Kerberos (GSSAPI)").
//!
//! A service ticket is had with an AS exchange (the cluster's own keytab) and a TGS exchange
//! for `<service>/<broker host>`, and serves that broker's connections and re-authentications
//! until 80 % of its life ([`TicketCache`]); each authentication makes a new krb5 GSS-API
//! context with it. Two clusters with two keytabs share nothing in one process (no credential
//! cache file, no environment variable).

pub mod keytab;
pub mod krb5_conf;

use crate::error::KafkaError;
use crate::settings::Kerberos;
use futures_util::FutureExt;
use krb5_gss::gss::{GssContext, NativeGssContext};
use krb5_gss::{AcquiredTicket, KdcBoxFuture, KdcTransport, KerberosCredentials, Krb5Client};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// KDC answers are small (a ticket and an encrypted part); more is refused unread.
const MAX_KDC_REPLY: usize = 256 * 1024;
const KDC_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KDC_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A security context with the broker, from its first token (the AP-REQ) to the end of the
/// RFC 4752 security-layer negotiation.
pub struct Login {
    ctx: NativeGssContext,
    first: Option<Vec<u8>>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("complete", &self.ctx.is_complete())
            .finish_non_exhaustive()
    }
}

impl Login {
    /// The first token to send: the AP-REQ in its GSS-API framing (RFC 2743 §3.1).
    pub fn start(&mut self) -> Vec<u8> {
        self.first.take().unwrap_or_default()
    }

    /// Feeds the broker's answer and returns the next token, or `None` once the context is
    /// complete. The broker's AP-REP is checked (mutual authentication), then its wrapped
    /// security-layer offer, to which kmirror answers "no security layer" as Java's client does
    /// for Kafka (`sasl.qop` auth). Bytes from the broker are hostile: a panic inside the
    /// Kerberos library on them is an error, not a crash.
    pub fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if self.ctx.is_complete() {
            return if server.is_empty() {
                Ok(None)
            } else {
                Err("the broker sent more after the exchange was complete".into())
            };
        }
        let ctx = &mut self.ctx;
        match std::panic::catch_unwind(AssertUnwindSafe(|| ctx.handle_challenge(server))) {
            Ok(Ok(next)) => Ok(Some(next.unwrap_or_default())),
            Ok(Err(e)) => Err(format!("the broker's Kerberos answer was refused: {e}")),
            Err(_) => Err("the broker's Kerberos answer is malformed".into()),
        }
    }
}

/// Logs in as the cluster's principal and makes a context for broker `host`.
pub async fn login(k: &Kerberos, host: &str) -> Result<Login, KafkaError> {
    let service = format!("{}/{host}", k.service_name);
    let ticket = k.cache.ticket(k, &service).await?;
    let mut ctx = NativeGssContext::from_acquired(ticket);
    let first = match std::panic::catch_unwind(AssertUnwindSafe(|| ctx.step(None))) {
        Ok(Ok(t)) => t.unwrap_or_default(),
        Ok(Err(e)) => {
            return Err(KafkaError::Kerberos {
                principal: k.principal.clone(),
                message: format!("building the request to {service}: {e}"),
                retriable: false,
            })
        }
        Err(_) => {
            return Err(KafkaError::Kerberos {
                principal: k.principal.clone(),
                message: format!("the ticket for {service} is malformed"),
                retriable: false,
            })
        }
    };
    Ok(Login {
        ctx,
        first: Some(first),
    })
}

/// The service tickets of one cluster's Kerberos settings, by broker principal. Clones share
/// them; they are not configuration (equal whatever they hold) and never print.
///
/// A ticket serves every connection to its broker, and every re-authentication (each sends a
/// new authenticator), until 80 % of its life has passed, as Java's client renews
/// (`sasl.kerberos.ticket.renew.window.factor`'s default); then it is had again from the
/// keytab, so a keytab replaced on disk is used from the next renewal on. A renewal that fails
/// while the held ticket is still valid keeps that ticket, asked again every 10 s.
#[derive(Clone, Default)]
pub struct TicketCache(Arc<tokio::sync::Mutex<HashMap<String, Held>>>);

struct Held {
    ticket: AcquiredTicket,
    renew_at: Instant,
    expires_at: Instant,
}

impl PartialEq for TicketCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for TicketCache {}

impl std::fmt::Debug for TicketCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketCache")
    }
}

const RENEW_FACTOR: f64 = 0.8;
const RETRY_RENEWAL: Duration = Duration::from_secs(10);

impl TicketCache {
    async fn ticket(&self, k: &Kerberos, service: &str) -> Result<AcquiredTicket, KafkaError> {
        let mut held = self.0.lock().await;
        let now = Instant::now();
        if let Some(h) = held.get(service).filter(|h| now < h.renew_at) {
            return Ok(h.ticket.clone());
        }
        match fetch(k, service).await {
            Ok(ticket) => {
                let life = remaining(&ticket.endtime, SystemTime::now());
                tracing::info!(
                    principal = %k.principal,
                    service,
                    lifetime_s = life.map(|l| l.as_secs()),
                    "Kerberos ticket obtained"
                );
                if let Some(life) = life {
                    held.insert(
                        service.to_string(),
                        Held {
                            ticket: ticket.clone(),
                            renew_at: now + life.mul_f64(RENEW_FACTOR),
                            expires_at: now + life,
                        },
                    );
                }
                Ok(ticket)
            }
            Err(e) => match held.get_mut(service).filter(|h| now < h.expires_at) {
                Some(h) => {
                    tracing::warn!(principal = %k.principal, service, error = %e, expires_in_s = (h.expires_at - now).as_secs(), "Kerberos ticket renewal failed; the current ticket serves until it expires");
                    h.renew_at = now + RETRY_RENEWAL;
                    Ok(h.ticket.clone())
                }
                None => Err(e),
            },
        }
    }
}

/// How long a ticket ending at `endtime` (GeneralizedTime, `YYYYMMDDHHMMSSZ`) has left; `None`
/// if it has ended or cannot be read.
fn remaining(endtime: &str, now: SystemTime) -> Option<Duration> {
    let b = endtime.as_bytes();
    if b.len() != 15 || b[14] != b'Z' || !b[..14].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = |from: usize, to: usize| endtime[from..to].parse::<i64>().ok();
    let date = time::Date::from_calendar_date(
        n(0, 4)? as i32,
        time::Month::try_from(n(4, 6)? as u8).ok()?,
        n(6, 8)? as u8,
    )
    .ok()?;
    let at = date
        .with_hms(n(8, 10)? as u8, n(10, 12)? as u8, n(12, 14)? as u8)
        .ok()?
        .assume_utc();
    let end =
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(at.unix_timestamp()).ok()?);
    end.duration_since(now).ok().filter(|d| !d.is_zero())
}

/// A service ticket for `service` from the realm's KDCs, logging in with the keytab.
async fn fetch(k: &Kerberos, service: &str) -> Result<AcquiredTicket, KafkaError> {
    let fail = |message: String, retriable: bool| KafkaError::Kerberos {
        principal: k.principal.clone(),
        message,
        retriable,
    };
    let conf = krb5_conf::Krb5Conf::load(&k.krb5_conf).map_err(|m| fail(m, false))?;
    let realm = realm_of(&k.principal).to_string();
    let kdcs = conf
        .kdcs_of(&realm)
        .map_err(|m| fail(format!("krb5.conf {} {m}", k.krb5_conf.display()), false))?;
    // Read the keytab here first: its errors then name the file and what it holds.
    // A keytab is a few hundred bytes: read in place.
    let bytes = std::fs::read(&k.keytab).map_err(|e| {
        fail(
            format!("cannot read keytab {}: {e}", k.keytab.display()),
            false,
        )
    })?;
    let keys = keytab::parse(&bytes)
        .map_err(|m| fail(format!("keytab {}: {m}", k.keytab.display()), false))?;
    let key = keytab::pick(&keys, &k.principal)
        .map_err(|m| fail(format!("keytab {} {m}", k.keytab.display()), false))?;
    let unreachable = Arc::new(AtomicBool::new(false));
    let transport = Kdcs {
        kdcs,
        unreachable: unreachable.clone(),
    };
    let creds = KerberosCredentials::new(k.principal.clone())
        .with_service_name(k.service_name.clone())
        .with_keytab(k.keytab.to_string_lossy().into_owned());
    let exchange = async {
        let client = Krb5Client::with_transport(&creds, Box::new(transport))?;
        client.acquire_service_ticket(service).await
    };
    // KDC answers are bytes from the network: a panic on them is a failed login.
    match AssertUnwindSafe(exchange).catch_unwind().await {
        Ok(Ok(ticket)) => Ok(ticket),
        Ok(Err(e)) => {
            let why = describe(&e.to_string(), service, &realm, key.kvno);
            Err(fail(
                format!("ticket for {service}@{realm}: {why}"),
                unreachable.load(Ordering::SeqCst),
            ))
        }
        // The library panics when the KDC's answer names a key the keytab does not hold (a
        // key made since the keytab was written): the usual cause, said first.
        Err(_) => Err(fail(
            format!(
                "ticket for {service}@{realm}: the KDC's answer could not be read with the \
                 keytab's key, version {}: the keytab is stale (a newer key was made since) or \
                 the answer is malformed",
                key.kvno
            ),
            false,
        )),
    }
}

/// The realm of `name@REALM` (the configuration layer always adds one).
pub fn realm_of(principal: &str) -> &str {
    principal.rsplit_once('@').map(|(_, r)| r).unwrap_or("")
}

/// Kerberos error codes a KDC answers with (RFC 4120 §7.5.9), said as what to check.
fn describe(message: &str, service: &str, realm: &str, kvno: u32) -> String {
    let code = message
        .split("code=")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse::<i32>().ok());
    let why = match code {
        Some(6) => "the KDC does not know this principal (KDC_ERR_C_PRINCIPAL_UNKNOWN)".to_string(),
        Some(7) => format!(
            "the KDC does not know the broker's principal {service}@{realm} \
             (KDC_ERR_S_PRINCIPAL_UNKNOWN): check sasl.kerberos.service.name, and that the \
             brokers' principals name their hosts as kmirror reaches them"
        ),
        Some(14) => "the KDC holds no key of a type kmirror uses, aes256-cts-hmac-sha1-96 or \
                     aes128-cts-hmac-sha1-96 (KDC_ERR_ETYPE_NOSUPP)"
            .to_string(),
        Some(18) => "the principal is locked or disabled (KDC_ERR_CLIENT_REVOKED)".to_string(),
        Some(23) => "the principal's key has expired (KDC_ERR_KEY_EXPIRED)".to_string(),
        Some(24) | Some(31) => format!(
            "the KDC refused the keytab's key, version {kvno}: the keytab is stale or for \
             another realm (KDC_ERR_PREAUTH_FAILED)"
        ),
        Some(37) => "this host's clock and the KDC's differ by more than the KDC allows \
                     (KRB_AP_ERR_SKEW)"
            .to_string(),
        Some(c) => format!("the KDC answered with Kerberos error {c}"),
        None if message.contains("decrypt") || message.contains("checksum") => format!(
            "the KDC's answer does not decrypt with the keytab's key, version {kvno}: the \
             keytab is stale or for another principal ({message})"
        ),
        None => message.to_string(),
    };
    why
}

/// The realm's KDCs over TCP (RFC 4120 §7.2.2), tried in krb5.conf's order.
struct Kdcs {
    kdcs: Vec<(String, u16)>,
    unreachable: Arc<AtomicBool>,
}

impl KdcTransport for Kdcs {
    fn exchange<'a>(&'a self, _realm: &'a str, req: &'a [u8]) -> KdcBoxFuture<'a> {
        Box::pin(async move {
            let mut last = String::new();
            for (host, port) in &self.kdcs {
                match ask(host, *port, req).await {
                    Ok(reply) => {
                        self.unreachable.store(false, Ordering::SeqCst);
                        return Ok(reply);
                    }
                    Err(e) => last = format!("KDC {host}:{port}: {e}"),
                }
            }
            self.unreachable.store(true, Ordering::SeqCst);
            Err(krb5_gss::KerberosError::Protocol(last))
        })
    }
}

async fn ask(host: &str, port: u16, req: &[u8]) -> Result<Vec<u8>, String> {
    let mut s = tokio::time::timeout(
        KDC_CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .map_err(|_| format!("no connection within {KDC_CONNECT_TIMEOUT:?}"))?
    .map_err(|e| e.to_string())?;
    let exchange = async {
        let mut framed = (req.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(req);
        s.write_all(&framed).await.map_err(|e| e.to_string())?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.map_err(|e| e.to_string())?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_KDC_REPLY {
            return Err(format!(
                "an answer of {len} bytes (at most {MAX_KDC_REPLY} expected)"
            ));
        }
        let mut reply = vec![0u8; len];
        s.read_exact(&mut reply).await.map_err(|e| e.to_string())?;
        Ok(reply)
    };
    tokio::time::timeout(KDC_REPLY_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {KDC_REPLY_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_end_times_are_read_as_time_left() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_509_502); // 2026-12-05 22:25:02
        assert_eq!(
            remaining("20261205222602Z", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(remaining("20261205222502Z", now), None);
        assert_eq!(remaining("20261205222402Z", now), None);
        for bad in [
            "",
            "2026120522260Z",
            "20261305222602Z",
            "2026120522260xZ",
            "20261205222602",
        ] {
            assert_eq!(remaining(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn kdc_error_codes_are_said_as_what_to_check() {
        let d = describe("TGS KDC error code=7", "kafka/b1", "R.TEST", 2);
        assert!(
            d.contains("kafka/b1@R.TEST") && d.contains("sasl.kerberos.service.name"),
            "{d}"
        );
        let d = describe("AS KDC error code=24", "kafka/b1", "R.TEST", 3);
        assert!(d.contains("version 3") && d.contains("stale"), "{d}");
        assert!(describe("code=37", "", "", 1).contains("clock"));
        assert!(describe("code=99", "", "", 1).contains("error 99"));
        assert_eq!(describe("other", "", "", 1), "other");
    }

    #[tokio::test]
    async fn a_kdc_that_cannot_be_reached_is_retriable_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let conf = dir.path().join("krb5.conf");
        std::fs::write(
            &conf,
            format!("[realms]\nR.TEST = {{\nkdc = 127.0.0.1:{port}\n}}\n"),
        )
        .unwrap();
        let kt = dir.path().join("k.keytab");
        // One aes256 key for kmirror@R.TEST, as kadmin writes it.
        let mut e = Vec::new();
        e.extend(1u16.to_be_bytes());
        for s in ["R.TEST", "kmirror"] {
            e.extend((s.len() as u16).to_be_bytes());
            e.extend(s.as_bytes());
        }
        e.extend(1u32.to_be_bytes());
        e.extend(0u32.to_be_bytes());
        e.push(1);
        e.extend(18u16.to_be_bytes());
        e.extend(32u16.to_be_bytes());
        e.extend([5u8; 32]);
        let mut bytes = vec![5, 2];
        bytes.extend((e.len() as i32).to_be_bytes());
        bytes.extend(e);
        std::fs::write(&kt, bytes).unwrap();
        let k = Kerberos {
            service_name: "kafka".into(),
            principal: "kmirror@R.TEST".into(),
            keytab: kt.clone(),
            krb5_conf: conf,
            cache: TicketCache::default(),
        };
        let err = login(&k, "b1").await.unwrap_err();
        assert!(err.is_retriable(), "{err}");
        let text = err.to_string();
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        let k = Kerberos {
            principal: "other@R.TEST".into(),
            ..k
        };
        let err = login(&k, "b1").await.unwrap_err();
        assert!(!err.is_retriable());
        assert!(
            err.to_string().contains("holds no key for other@R.TEST"),
            "{err}"
        );
    }
}
