//! SASL/GSSAPI logins (RFC 4752 over Kafka's SaslAuthenticate; docs/configuration.md,
//! "Kerberos (GSSAPI)").
//!
//! A service ticket is had with an AS exchange (the cluster's own keytab) and a TGS exchange
//! for `<service>/<broker host>`, and serves that broker's connections and re-authentications
//! until 80 % of its life (the process-wide cache below); each authentication makes a new
//! krb5 GSS-API context with it. Two clusters with two keytabs share nothing (no credential
//! cache file, no environment variable).
//!
//! The Kerberos library (`krb5-gss`) reads keys only from a keytab file, takes the first entry
//! of the principal for pre-authentication and tries every entry on the KDC's answer whatever
//! its type (panicking on a key of the wrong length). So kmirror picks the key itself
//! ([`keytab::pick`]: newest version, best type) and hands the library a keytab holding that
//! key alone, in a private file (0600, in `TMPDIR`) that lives for the exchange.

pub mod keytab;
pub mod krb5_conf;

use crate::error::KafkaError;
use crate::settings::Kerberos;
use futures_util::FutureExt;
use krb5_gss::gss::{GssContext, NativeGssContext};
use krb5_gss::{AcquiredTicket, KdcBoxFuture, KdcTransport, KerberosCredentials, Krb5Client};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// KDC answers are small (a ticket and an encrypted part); more is refused unread.
const MAX_KDC_REPLY: usize = 256 * 1024;
const KDC_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KDC_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Java's `sasl.kerberos.ticket.renew.window.factor` default.
const RENEW_FACTOR: f64 = 0.8;
const RETRY_RENEWAL: Duration = Duration::from_secs(10);
/// RFC 4752 §3.3: the "no security layer" bit of the broker's offer and of kmirror's choice.
const NO_SECURITY_LAYER: u8 = 0x01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The AP-REQ was sent; the broker answers with its AP-REP.
    ApRep,
    /// kmirror sent the empty token; the broker answers with its wrapped security-layer offer.
    Offer,
    /// kmirror sent its wrapped choice; the broker's empty answer ends the exchange.
    Done,
}

/// A security context with the broker, from its first token (the AP-REQ) to the end of the
/// RFC 4752 security-layer negotiation.
pub struct Login {
    ctx: NativeGssContext,
    first: Option<Vec<u8>>,
    phase: Phase,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

/// Runs a library call on bytes from the network: a panic in it is an error, not a crash.
fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, krb5_gss::KerberosError>,
) -> Result<T, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: malformed")),
    }
}

impl Login {
    /// The first token to send: the AP-REQ in its GSS-API framing (RFC 2743 §3.1).
    pub fn start(&mut self) -> Vec<u8> {
        self.first.take().unwrap_or_default()
    }

    /// Feeds the broker's answer and returns the next token, or `None` once the exchange is
    /// complete. The broker's AP-REP is checked (mutual authentication); from its wrapped
    /// security-layer offer kmirror picks "no security layer" with a buffer size of 0, as
    /// Java's client does for Kafka (`sasl.qop` auth), and refuses a broker that does not offer
    /// it.
    pub fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let ctx = &mut self.ctx;
        match self.phase {
            Phase::ApRep => {
                guarded("the broker's AP-REP", || ctx.handle_challenge(server))?;
                self.phase = Phase::Offer;
                Ok(Some(Vec::new()))
            }
            Phase::Offer => {
                let offer = guarded("the broker's security-layer offer", || ctx.unwrap(server))?;
                if offer.len() != 4 {
                    return Err(format!(
                        "the broker's security-layer offer has {} bytes, not 4",
                        offer.len()
                    ));
                }
                if offer[0] & NO_SECURITY_LAYER == 0 {
                    return Err(format!(
                        "the broker requires a SASL security layer (offer 0x{:02x}: sasl.qop                          auth-int or auth-conf), which kmirror does not provide; use TLS                          (SASL_SSL) for protection on the wire",
                        offer[0]
                    ));
                }
                let choice = guarded("wrapping the answer", || {
                    ctx.wrap_next(NO_SECURITY_LAYER, 0)
                })?;
                self.phase = Phase::Done;
                Ok(Some(choice))
            }
            Phase::Done if server.is_empty() => Ok(None),
            Phase::Done => Err("the broker sent more after the exchange was complete".into()),
        }
    }
}

/// The broker principal's service part and host, as Java and MIT name it: the host in lower
/// case (Kerberos names are case-sensitive; `KRB_NT_SRV_HST` names are canonicalised so).
fn service_of(k: &Kerberos, host: &str) -> String {
    format!("{}/{}", k.service_name, host.to_ascii_lowercase())
}

/// Logs in as the cluster's principal and makes a context for broker `host`.
pub async fn login(k: &Kerberos, host: &str) -> Result<Login, KafkaError> {
    let service = service_of(k, host);
    let ticket = ticket(k, &service).await?;
    let mut ctx = NativeGssContext::from_acquired(ticket);
    let first =
        guarded("building the AP-REQ", || ctx.step(None)).map_err(|m| KafkaError::Kerberos {
            principal: k.principal.clone(),
            message: format!("{service}: {m}"),
            retriable: false,
        })?;
    Ok(Login {
        ctx,
        first: Some(first.unwrap_or_default()),
        phase: Phase::ApRep,
    })
}

/// Drops the ticket held for broker `host`: the broker refused a login with it (its keys may
/// have changed), so the next login has a new one.
pub fn forget(k: &Kerberos, host: &str) {
    let key = cache_key(k, &service_of(k, host));
    if let Ok(mut slots) = slots().lock() {
        slots.remove(&key);
    }
}

/// The tickets held in this process, by principal, keytab, krb5.conf and broker principal:
/// every client of a cluster (consumer, producer, admin, each flow) shares one ticket per
/// broker. A ticket is renewed from the keytab after 80 % of its life, so a keytab replaced on
/// disk is used from the next renewal on. One renewal per broker principal runs at a time;
/// meanwhile the others use the ticket held while it is valid. A renewal that fails while the
/// held ticket is still valid keeps that ticket, asked again every 10 s.
#[derive(Default)]
struct Slot {
    held: Mutex<Option<Held>>,
    renewing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Held {
    ticket: AcquiredTicket,
    renew_at: Instant,
    expires_at: Instant,
}

fn slots() -> &'static Mutex<HashMap<String, Arc<Slot>>> {
    static SLOTS: OnceLock<Mutex<HashMap<String, Arc<Slot>>>> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

fn cache_key(k: &Kerberos, service: &str) -> String {
    format!(
        "{}\0{}\0{}\0{service}",
        k.principal,
        k.keytab.display(),
        k.krb5_conf.display()
    )
}

fn held_now(slot: &Slot) -> Option<Held> {
    slot.held.lock().ok().and_then(|h| h.clone())
}

async fn ticket(k: &Kerberos, service: &str) -> Result<AcquiredTicket, KafkaError> {
    let slot = {
        let mut slots = slots().lock().map_err(|_| KafkaError::Kerberos {
            principal: k.principal.clone(),
            message: "the ticket cache is unusable after a panic".into(),
            retriable: false,
        })?;
        slots.entry(cache_key(k, service)).or_default().clone()
    };
    let now = Instant::now();
    let current = held_now(&slot);
    if let Some(h) = current.as_ref().filter(|h| now < h.renew_at) {
        return Ok(h.ticket.clone());
    }
    let _gate = match slot.renewing.try_lock() {
        Ok(g) => g,
        Err(_) => match current.as_ref().filter(|h| now < h.expires_at) {
            // Another connection renews it: this one uses the ticket held meanwhile.
            Some(h) => return Ok(h.ticket.clone()),
            None => slot.renewing.lock().await,
        },
    };
    // Renewed while this one waited for the gate.
    let now = Instant::now();
    if let Some(h) = held_now(&slot).filter(|h| now < h.renew_at) {
        return Ok(h.ticket.clone());
    }
    let fetched = fetch(k, service).await;
    let mut held = slot.held.lock().map_err(|_| KafkaError::Kerberos {
        principal: k.principal.clone(),
        message: "the ticket cache is unusable after a panic".into(),
        retriable: false,
    })?;
    match fetched {
        Ok(ticket) => {
            let life = remaining(&ticket.endtime, SystemTime::now());
            tracing::info!(
                principal = %k.principal,
                service,
                lifetime_s = life.map(|l| l.as_secs()),
                "Kerberos ticket obtained"
            );
            *held = life.map(|life| Held {
                ticket: ticket.clone(),
                renew_at: now + life.mul_f64(RENEW_FACTOR),
                expires_at: now + life,
            });
            Ok(ticket)
        }
        Err(e) => match held.as_mut().filter(|h| now < h.expires_at) {
            Some(h) => {
                tracing::warn!(principal = %k.principal, service, error = %e, expires_in_s = (h.expires_at - now).as_secs(), "Kerberos ticket renewal failed; the current ticket serves until it expires");
                h.renew_at = now + RETRY_RENEWAL;
                Ok(h.ticket.clone())
            }
            None => Err(e),
        },
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

/// The keytab handed to the library: the picked key alone, in a file only this user can
/// read, removed when dropped.
struct OneKeyFile(PathBuf);

impl OneKeyFile {
    fn write(key: &keytab::KeytabKey) -> std::io::Result<OneKeyFile> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        static N: AtomicU64 = AtomicU64::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(sweep_orphans);
        let path = std::env::temp_dir().join(format!(
            "kmirror-{}-{}.keytab",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let file = OneKeyFile(path);
        f.write_all(&keytab::single(key))?;
        Ok(file)
    }
}

/// Removes the one-key files of kmirror processes that no longer run (killed before their
/// `Drop`): a key must not outlive its process on disk.
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = orphan_pid(&name.to_string_lossy()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The process id in a one-key file's name (`kmirror-<pid>-<n>.keytab`).
fn orphan_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("kmirror-")?.strip_suffix(".keytab")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

impl Drop for OneKeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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
    let one = OneKeyFile::write(&key).map_err(|e| {
        fail(
            format!(
                "cannot write the key for the Kerberos library to {}: {e}",
                std::env::temp_dir().display()
            ),
            false,
        )
    })?;
    let creds = KerberosCredentials::new(k.principal.clone())
        .with_service_name(k.service_name.clone())
        .with_keytab(one.0.to_string_lossy().into_owned());
    let exchange = async {
        let client = Krb5Client::with_transport(&creds, Box::new(transport))?;
        client.acquire_service_ticket(service).await
    };
    // KDC answers are bytes from the network: a panic on them is a failed login.
    let result = AssertUnwindSafe(exchange).catch_unwind().await;
    drop(one);
    match result {
        Ok(Ok(ticket)) => Ok(ticket),
        Ok(Err(e)) => {
            let why = describe(&e.to_string(), service, &realm, key.kvno);
            Err(fail(
                format!("ticket for {service}@{realm}: {why}"),
                unreachable.load(Ordering::SeqCst),
            ))
        }
        // The library panics on a key whose length its cipher does not take: the KDC
        // answered in another encryption type than the key picked.
        Err(_) => Err(fail(
            format!(
                "ticket for {service}@{realm}: the KDC's answer could not be read with the \
                 keytab's {} key, version {} (the KDC answered in another encryption type, or \
                 the answer is malformed)",
                keytab::enctype_name(key.enctype),
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

/// Kerberos error codes a KDC answers with (RFC 4120 §7.5.9), and the library's failures,
/// said as what to check. The library's messages start with "TGS" for the ticket request.
fn describe(message: &str, service: &str, realm: &str, kvno: u32) -> String {
    let tgs = message.contains("TGS");
    let code = message
        .split("code=")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse::<i32>().ok());
    let stale = || {
        format!(
            "the KDC refused the keytab's key, version {kvno}: the keytab is stale (a newer key \
             was made since) or for another realm"
        )
    };
    match code {
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
        Some(24) => format!("{} (KDC_ERR_PREAUTH_FAILED)", stale()),
        Some(31) if tgs => "the KDC refused the ticket request's checksum \
                            (KRB_AP_ERR_BAD_INTEGRITY); realms that issue aes-sha2 (RFC 8009) \
                            session keys are not supported yet"
            .to_string(),
        Some(37) => "this host's clock and the KDC's differ by more than the KDC allows \
                     (KRB_AP_ERR_SKEW)"
            .to_string(),
        Some(c) => format!("the KDC answered with Kerberos error {c}"),
        None if !tgs
            && ["HMAC", "decrypt", "checksum", "integrity"]
                .iter()
                .any(|w| message.contains(w)) =>
        {
            format!("{} (its answer does not decrypt with that key)", stale())
        }
        None => message.to_string(),
    }
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
mod tests;
