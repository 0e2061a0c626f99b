//! One connection to one broker: TCP (and TLS), ApiVersions negotiation, SASL, then pipelined
//! requests matched to responses by correlation id.
//!
//! Requests are written in the order `submit` is called and a broker answers them in that order,
//! so a caller that needs ordering (the idempotent producer) submits in order and awaits the
//! responses later. Every request has a timeout; a broken connection fails every pending request
//! with an error naming the broker.
//!
//! Why one file of this size: the writer, the reader task and `ResponseFuture` share the
//! pending map and the `closed`/`silent` flags, and re-authentication runs the handshake's
//! `authenticate` through the pipelined writer (`SaslTransport`). Next to split out: the SASL
//! session (`Reauth`, `sasl_token`, `authenticate`) into `conn/auth.rs`, beside `sasl.rs`.

pub mod sasl;

use crate::error::{KafkaError, Result};
use crate::settings::{ClientSettings, SaslCredentials};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message, Request, StrBytes};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Largest response frame accepted once authenticated (a guard against garbage lengths). Fetch
/// responses are bounded by `fetch.max.bytes`, except that a broker returns a first batch larger
/// than every limit so that the consumer can make progress (KIP-74); a batch is bounded by the
/// broker's `socket.request.max.bytes` (100 MiB by default) when it is produced, so this leaves
/// room for brokers configured far beyond their defaults.
const MAX_FRAME: usize = 512 * 1024 * 1024;

/// Largest response frame accepted before authentication is complete (ApiVersions and SASL
/// answers are a few KiB): whoever answers on the port must not make kmirror allocate more
/// (librdkafka bounds every response, at 100 MB by default).
const HANDSHAKE_MAX_FRAME: usize = 1024 * 1024;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Stream = Box<dyn Io>;

struct Pending {
    api: ApiKey,
    version: i16,
    reply: oneshot::Sender<Result<Bytes>>,
}

type PendingMap = Arc<Mutex<HashMap<i32, Pending>>>;

/// An established, authenticated connection.
pub struct Connection {
    broker: String,
    client_id: Option<StrBytes>,
    request_timeout: Duration,
    versions: HashMap<i16, (i16, i16)>,
    next_correlation: AtomicI32,
    writer: tokio::sync::Mutex<WriteHalf<Stream>>,
    pending: PendingMap,
    closed: Arc<AtomicBool>,
    /// Set with `closed` when a request or a write timed out: the broker went silent (a hung
    /// process, a black-holed path), which the pool remembers to ask other brokers first.
    silent: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
    /// SASL: what to re-authenticate with before the broker's session ends (KIP-368).
    reauth: Option<Reauth>,
}

/// Closes the connection when dropped before `done` is set.
struct CloseUnlessDone<'a> {
    closed: &'a AtomicBool,
    done: bool,
}

impl Drop for CloseUnlessDone<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.closed.store(true, Ordering::SeqCst);
        }
    }
}

/// A SASL session's renewal: the broker gave it a lifetime (`connections.max.reauth.ms`, or a
/// token's expiry), after which it closes the connection at the next request that is not a
/// re-authentication.
struct Reauth {
    host: String,
    creds: SaslCredentials,
    at: Mutex<Option<tokio::time::Instant>>,
}

impl Reauth {
    fn due(&self) -> bool {
        lock(&self.at).is_some_and(|t| tokio::time::Instant::now() >= t)
    }

    /// As Java's client: at 85 % to 95 % of the session, so requests never meet its end.
    fn schedule(&self, lifetime: Option<Duration>) {
        *lock(&self.at) = lifetime.map(|l| {
            let share = 0.85 + 0.10 * rand::random::<f64>();
            tokio::time::Instant::now() + l.mul_f64(share)
        });
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("broker", &self.broker)
            .finish_non_exhaustive()
    }
}

/// A response that will arrive; await it with [`ResponseFuture::wait`].
#[derive(Debug)]
pub struct ResponseFuture<R: Request> {
    broker: String,
    api: ApiKey,
    version: i16,
    timeout: Duration,
    rx: oneshot::Receiver<Result<Bytes>>,
    /// Set by the first [`ResponseFuture::ready`]: it gives up `timeout` after that call, as
    /// `wait` does after its own start. (Counting from the write would time out requests that
    /// queue behind others on a busy connection, since a broker answers them one at a time.)
    deadline: Option<tokio::time::Instant>,
    /// What [`ResponseFuture::ready`] saw, kept for [`ResponseFuture::wait`].
    arrived: Option<Arrived>,
    /// The connection's flags: a request that times out marks it failed, and silent.
    closed: Arc<AtomicBool>,
    silent: Arc<AtomicBool>,
    _r: std::marker::PhantomData<fn() -> R>,
}

#[derive(Debug)]
enum Arrived {
    Body(Result<Bytes>),
    /// The connection ended before the answer.
    Dropped,
    TimedOut,
}

impl<R: Request> ResponseFuture<R> {
    /// Waits longer than the request timeout (for requests the broker holds on purpose, such as
    /// JoinGroup during a rebalance).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Waits until the answer is there, the connection ended, or the request timeout (counted
    /// from the first call) passed, without taking the answer: [`ResponseFuture::wait`] then
    /// returns at once. Cancel-safe, so a caller can wait for its oldest produce and for new
    /// data at the same time (`tokio::select!`) without losing either; the deadline stays that
    /// of the first call.
    pub async fn ready(&mut self) {
        if self.arrived.is_some() {
            return;
        }
        let timeout = self.timeout;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| tokio::time::Instant::now() + timeout);
        let arrived = match tokio::time::timeout_at(deadline, &mut self.rx).await {
            Err(_) => Arrived::TimedOut,
            Ok(Err(_)) => Arrived::Dropped,
            Ok(Ok(body)) => Arrived::Body(body),
        };
        self.arrived = Some(arrived);
    }

    /// Whether [`ResponseFuture::wait`] would return without waiting (looks, never blocks).
    pub fn is_ready(&mut self) -> bool {
        if self.arrived.is_none() {
            self.arrived = match self.rx.try_recv() {
                Ok(body) => Some(Arrived::Body(body)),
                Err(oneshot::error::TryRecvError::Closed) => Some(Arrived::Dropped),
                Err(oneshot::error::TryRecvError::Empty) => None,
            };
        }
        self.arrived.is_some()
    }

    pub async fn wait(self) -> Result<R::Response> {
        let arrived = match self.arrived {
            Some(a) => a,
            None => match tokio::time::timeout(self.timeout, self.rx).await {
                Err(_) => Arrived::TimedOut,
                Ok(Err(_)) => Arrived::Dropped,
                Ok(Ok(body)) => Arrived::Body(body),
            },
        };
        let body = match arrived {
            Arrived::TimedOut => {
                // A broker that does not answer in time may never answer on this connection
                // (a half-open socket, a broker that accepted but stalled): the next request
                // must open a new one instead of waiting on this one again. Requests the broker
                // holds on purpose ask for a longer timeout (`with_timeout`).
                self.silent.store(true, Ordering::SeqCst);
                self.closed.store(true, Ordering::SeqCst);
                return Err(KafkaError::Timeout {
                    broker: self.broker,
                    api: self.api,
                    after: self.timeout,
                });
            }
            Arrived::Dropped => {
                return Err(KafkaError::Disconnected {
                    broker: self.broker,
                })
            }
            Arrived::Body(r) => r?,
        };
        decode_body::<R::Response>(&self.broker, self.api, self.version, body)
    }
}

fn decode_body<T: Decodable>(
    broker: &str,
    api: ApiKey,
    version: i16,
    mut body: Bytes,
) -> Result<T> {
    T::decode(&mut body, version).map_err(|e| KafkaError::Protocol {
        broker: broker.into(),
        api,
        message: e.to_string(),
    })
}

fn api_of<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).unwrap_or(ApiKey::ApiVersions)
}

fn encode_frame<R: Request>(
    header: &RequestHeader,
    req: &R,
    version: i16,
    broker: &str,
) -> Result<Bytes> {
    let api = api_of::<R>();
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    let protocol = |message: String| KafkaError::Protocol {
        broker: broker.into(),
        api,
        message,
    };
    header
        .encode(&mut buf, R::header_version(version))
        .map_err(|e| protocol(e.to_string()))?;
    req.encode(&mut buf, version)
        .map_err(|e| protocol(e.to_string()))?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// Reads one size-prefixed frame of at most `max` bytes.
async fn read_frame<S: AsyncRead + Unpin + ?Sized>(
    s: &mut S,
    max: usize,
) -> std::io::Result<Bytes> {
    let len = s.read_i32().await?;
    let Some(len) = usize::try_from(len).ok().filter(|l| (4..=max).contains(l)) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad response frame length {len} (at most {max} bytes are accepted here)"),
        ));
    };
    // Zeroed memory of this size comes from the kernel's zero pages and becomes resident only
    // as the bytes arrive, so a length announced and never sent costs address space, not
    // memory; a buffer grown as bytes arrive instead cost 20-40 MB more peak RSS in the
    // benchmark (doubling, and the spare capacity a `Bytes` keeps).
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    Ok(Bytes::from(buf))
}

impl Connection {
    /// Connects, negotiates API versions and authenticates. `broker` names the broker in errors
    /// (e.g. `1@127.0.0.1:9092`).
    pub async fn connect(
        host: &str,
        port: u16,
        broker: String,
        settings: &ClientSettings,
    ) -> Result<Connection> {
        let timeout = settings.request_timeout;
        let io_err = |context: &'static str| {
            let broker = broker.clone();
            move |source: std::io::Error| KafkaError::Io {
                broker: broker.clone(),
                context,
                source,
            }
        };
        let timed_out = |_| KafkaError::Timeout {
            broker: broker.clone(),
            api: ApiKey::ApiVersions,
            after: timeout,
        };
        let tls_failed = |message: String| KafkaError::Tls {
            broker: broker.clone(),
            message,
        };
        let tcp = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(timed_out)?
            .map_err(io_err("connect"))?;
        configure_socket(&tcp).map_err(io_err("set TCP options"))?;
        let mut stream: Stream = match &settings.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let config = crate::tls::client_config(tls).map_err(tls_failed)?;
                let name = crate::tls::server_name(host).map_err(tls_failed)?;
                let connector = tokio_rustls::TlsConnector::from(config);
                let s = tokio::time::timeout(timeout, connector.connect(name, tcp))
                    .await
                    .map_err(timed_out)?
                    .map_err(|e| tls_failed(e.to_string()))?;
                Box::new(s)
            }
        };
        let client_id = settings.client_id.clone().map(StrBytes::from_string);
        let mut hs = Handshake {
            stream: &mut stream,
            broker: &broker,
            client_id: client_id.clone(),
            correlation: 0,
            timeout,
        };
        let versions = hs.api_versions().await?;
        let mut reauth = None;
        if let Some(creds) = &settings.sasl {
            let token = sasl_token(creds, host).await?;
            let lifetime = authenticate(&mut hs, &broker, creds, &versions, token)
                .await
                .inspect_err(|_| forget_ticket(creds, host))?;
            let r = Reauth {
                host: host.to_string(),
                creds: creds.clone(),
                at: Mutex::new(None),
            };
            r.schedule(lifetime);
            reauth = Some(r);
        }
        let correlation = hs.correlation;
        let (read, write) = tokio::io::split(stream);
        let pending: PendingMap = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_loop(
            read,
            pending.clone(),
            closed.clone(),
            broker.clone(),
        ));
        Ok(Connection {
            broker,
            client_id,
            request_timeout: timeout,
            versions,
            next_correlation: AtomicI32::new(correlation),
            writer: tokio::sync::Mutex::new(write),
            pending,
            closed,
            silent: Arc::new(AtomicBool::new(false)),
            reader,
            reauth,
        })
    }

    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// The error for a response that lacks the entry the request asked for.
    pub fn empty_response(&self, api: ApiKey) -> KafkaError {
        KafkaError::Protocol {
            broker: self.broker.clone(),
            api,
            message: "empty response".into(),
        }
    }

    /// Whether the connection has failed or was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Whether a request or a write on this connection timed out (it is then closed too).
    pub fn went_silent(&self) -> bool {
        self.silent.load(Ordering::SeqCst)
    }

    /// The highest version of `R` both sides support.
    pub fn version<R: Request>(&self) -> Result<i16> {
        negotiate(&self.versions, R::KEY, R::VERSIONS.min, R::VERSIONS.max).ok_or_else(|| {
            KafkaError::UnsupportedVersion {
                broker: self.broker.clone(),
                api: api_of::<R>(),
                ours: format!("{}..{}", R::VERSIONS.min, R::VERSIONS.max),
            }
        })
    }

    /// The broker's supported version range of an API, if any.
    pub fn broker_versions(&self, api: ApiKey) -> Option<(i16, i16)> {
        self.versions.get(&(api as i16)).copied()
    }

    /// Sends a request with the negotiated version and waits for its response.
    pub async fn send<R: Request>(&self, req: &R) -> Result<R::Response> {
        let version = self.version::<R>()?;
        self.submit(req, version).await?.wait().await
    }

    /// Writes a request now (in call order) and returns the response to await later.
    pub async fn submit<R: Request>(&self, req: &R, version: i16) -> Result<ResponseFuture<R>> {
        if self.is_closed() {
            return Err(KafkaError::Disconnected {
                broker: self.broker.clone(),
            });
        }
        if let Some(r) = self.reauth.as_ref().filter(|r| r.due()) {
            self.reauthenticate(r).await?;
        }
        let mut writer = self.writer.lock().await;
        self.write_locked(&mut writer, req, version).await
    }

    /// Re-authenticates on this connection (KIP-368), holding the writer so that nothing else
    /// is sent between SaslHandshake and the end of SaslAuthenticate; requests already sent
    /// are answered first (a broker answers in order). A failure closes the connection.
    async fn reauthenticate(&self, r: &Reauth) -> Result<()> {
        let token = match sasl_token(&r.creds, &r.host).await {
            Ok(t) => t,
            Err(e) => {
                // No credentials to renew the session with: the session ends anyway, and a new
                // connection reports the cause where it can be acted on.
                self.closed.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        let mut writer = self.writer.lock().await;
        if self.is_closed() {
            return Err(KafkaError::Disconnected {
                broker: self.broker.clone(),
            });
        }
        if !r.due() {
            return Ok(());
        }
        // Dropped half way (a caller's future cancelled between SaslHandshake and the end of
        // SaslAuthenticate), the broker would be left mid-exchange: the connection is closed
        // unless the exchange ends.
        let mut unfinished = CloseUnlessDone {
            closed: &self.closed,
            done: false,
        };
        let mut t = Pipelined {
            conn: self,
            writer: &mut writer,
        };
        let result = authenticate(&mut t, &self.broker, &r.creds, &self.versions, token).await;
        match result {
            Ok(lifetime) => {
                unfinished.done = true;
                r.schedule(lifetime);
                tracing::debug!(broker = %self.broker, session_ms = lifetime.map(|l| l.as_millis() as u64), "SASL session re-authenticated");
                Ok(())
            }
            Err(e) => {
                forget_ticket(&r.creds, &r.host);
                Err(e)
            }
        }
    }

    async fn write_locked<R: Request>(
        &self,
        writer: &mut WriteHalf<Stream>,
        req: &R,
        version: i16,
    ) -> Result<ResponseFuture<R>> {
        let api = api_of::<R>();
        let (tx, rx) = oneshot::channel();
        let correlation_id = self.next_correlation.fetch_add(1, Ordering::SeqCst);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(self.client_id.clone());
        let frame = encode_frame(&header, req, version, &self.broker)?;
        lock(&self.pending).insert(
            correlation_id,
            Pending {
                api,
                version,
                reply: tx,
            },
        );
        // Bounded: a broker that stopped reading fills the socket's send buffer, and an
        // unbounded write would hold the writer lock, and every request behind it, until the
        // kernel gives up on the connection (about 15 minutes).
        let written = tokio::time::timeout(self.request_timeout, writer.write_all(&frame)).await;
        let failed = match written {
            Ok(Ok(())) => None,
            Ok(Err(source)) => Some(KafkaError::Io {
                broker: self.broker.clone(),
                context: "write request",
                source,
            }),
            Err(_) => {
                self.silent.store(true, Ordering::SeqCst);
                Some(KafkaError::Timeout {
                    broker: self.broker.clone(),
                    api,
                    after: self.request_timeout,
                })
            }
        };
        if let Some(e) = failed {
            // A partly written frame leaves the stream unusable: nothing more goes on it.
            lock(&self.pending).remove(&correlation_id);
            self.closed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(ResponseFuture {
            broker: self.broker.clone(),
            api,
            version,
            timeout: self.request_timeout,
            rx,
            deadline: None,
            arrived: None,
            closed: self.closed.clone(),
            silent: self.silent.clone(),
            _r: std::marker::PhantomData,
        })
    }

    /// Closes the connection; pending requests fail with `Disconnected`.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.writer.lock().await.shutdown().await;
        self.reader.abort();
        fail_all(&self.pending, &self.broker);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// TCP options of a broker connection. No Nagle delay (requests are small and waited for).
/// Keepalive probes after a minute of silence, every 10 s, 3 of them: an idle connection to a
/// broker that vanished (a firewall or NAT dropping its state, a host gone) is found dead in
/// about 90 s instead of the kernel's 2 hours, before a request has to wait on it. Busy
/// connections are covered by the request timeout.
fn configure_socket(tcp: &TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (single inserts/removes).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fail_all(pending: &PendingMap, broker: &str) {
    for (_, p) in lock(pending).drain() {
        let _ = p.reply.send(Err(KafkaError::Disconnected {
            broker: broker.to_string(),
        }));
    }
}

async fn read_loop(
    mut read: ReadHalf<Stream>,
    pending: PendingMap,
    closed: Arc<AtomicBool>,
    broker: String,
) {
    loop {
        let mut frame = match read_frame(&mut read, MAX_FRAME).await {
            Ok(f) => f,
            Err(e) => {
                if !closed.swap(true, Ordering::SeqCst) {
                    tracing::debug!(broker = %broker, error = %e, "connection closed");
                }
                fail_all(&pending, &broker);
                return;
            }
        };
        let correlation_id = (&frame[..4]).get_i32();
        let Some(p) = lock(&pending).remove(&correlation_id) else {
            tracing::warn!(broker = %broker, correlation_id, "response for an unknown request; closing the connection");
            closed.store(true, Ordering::SeqCst);
            fail_all(&pending, &broker);
            return;
        };
        let header_version = p.api.response_header_version(p.version);
        let result = match ResponseHeader::decode(&mut frame, header_version) {
            Ok(_) => Ok(frame),
            Err(e) => Err(KafkaError::Protocol {
                broker: broker.clone(),
                api: p.api,
                message: e.to_string(),
            }),
        };
        let _ = p.reply.send(result);
    }
}

/// The highest common version, or `None`.
pub fn negotiate(
    broker: &HashMap<i16, (i16, i16)>,
    key: i16,
    our_min: i16,
    our_max: i16,
) -> Option<i16> {
    let &(min, max) = broker.get(&key)?;
    let v = max.min(our_max);
    (v >= min.max(our_min)).then_some(v)
}

/// The unpipelined exchanges before the connection is split: ApiVersions and SASL.
struct Handshake<'a> {
    stream: &'a mut Stream,
    broker: &'a str,
    client_id: Option<StrBytes>,
    correlation: i32,
    timeout: Duration,
}

impl Handshake<'_> {
    async fn round_trip<R: Request>(&mut self, req: &R, version: i16) -> Result<Bytes> {
        let api = api_of::<R>();
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(self.client_id.clone());
        self.correlation += 1;
        let frame = encode_frame(&header, req, version, self.broker)?;
        let broker = self.broker.to_string();
        let io = |context: &'static str| {
            let broker = broker.clone();
            move |source| KafkaError::Io {
                broker: broker.clone(),
                context,
                source,
            }
        };
        let exchange = async {
            self.stream
                .write_all(&frame)
                .await
                .map_err(io("write request"))?;
            read_frame(self.stream, HANDSHAKE_MAX_FRAME)
                .await
                .map_err(io("read response"))
        };
        let mut body = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| KafkaError::Timeout {
                broker: broker.clone(),
                api,
                after: self.timeout,
            })??;
        ResponseHeader::decode(&mut body, api.response_header_version(version)).map_err(|e| {
            KafkaError::Protocol {
                broker,
                api,
                message: e.to_string(),
            }
        })?;
        Ok(body)
    }

    async fn api_versions(&mut self) -> Result<HashMap<i16, (i16, i16)>> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kmirror"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let mut version = ApiVersionsRequest::VERSIONS.max.min(3);
        loop {
            let body = self.round_trip(&req, version).await?;
            let resp: ApiVersionsResponse =
                match decode_body(self.broker, ApiKey::ApiVersions, version, body.clone()) {
                    Ok(r) => r,
                    // A broker that does not know our version answers in v0 (KIP-511).
                    Err(_) => decode_body(self.broker, ApiKey::ApiVersions, 0, body)?,
                };
            let map: HashMap<i16, (i16, i16)> = resp
                .api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect();
            if let Some(e) = resp.error_code.err() {
                let fallback = map.get(&(ApiKey::ApiVersions as i16)).map(|r| r.1.min(3));
                match fallback {
                    Some(v) if v < version => {
                        version = v;
                        continue;
                    }
                    _ => {
                        return Err(KafkaError::Broker {
                            broker: self.broker.into(),
                            api: ApiKey::ApiVersions,
                            error: e,
                            message: None,
                        })
                    }
                }
            }
            return Ok(map);
        }
    }
}

/// What a mechanism has before the exchange: an OAUTHBEARER token, the AWS_MSK_IAM document
/// signed for `host`, or a Kerberos context for `<service>/<host>` (the broker's name as
/// dialled, which the broker checks).
async fn sasl_token(creds: &SaslCredentials, host: &str) -> Result<sasl::Prepared> {
    if let Some(o) = &creds.oauth {
        return Ok(sasl::Prepared::Token(o.token().await?));
    }
    if let Some(k) = &creds.kerberos {
        let login = crate::kerberos::login(k, host).await?;
        return Ok(sasl::Prepared::Kerberos(Box::new(login)));
    }
    match &creds.aws {
        Some(aws) => Ok(sasl::Prepared::Token(
            crate::aws::iam::payload_for(aws, host).await?,
        )),
        None => Ok(sasl::Prepared::Nothing),
    }
}

/// After a refused login: a Kerberos ticket the broker refused is not offered again (the
/// broker's keys may have changed since it was had).
fn forget_ticket(creds: &SaslCredentials, host: &str) {
    if let Some(k) = &creds.kerberos {
        crate::kerberos::forget(k, host);
    }
}

/// Sends SASL requests and reads their answers: during the handshake, on the bare stream; to
/// re-authenticate, through the pipelined connection.
trait SaslTransport {
    async fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response>;
}

impl SaslTransport for Handshake<'_> {
    async fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        let body = self.round_trip(req, version).await?;
        decode_body(self.broker, api_of::<R>(), version, body)
    }
}

/// The connection's writer, held for the whole re-authentication.
struct Pipelined<'a> {
    conn: &'a Connection,
    writer: &'a mut WriteHalf<Stream>,
}

impl SaslTransport for Pipelined<'_> {
    async fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        self.conn
            .write_locked(self.writer, req, version)
            .await?
            .wait()
            .await
    }
}

/// One SASL exchange (SaslHandshake, then SaslAuthenticate until done); returns the session
/// lifetime the broker gave (SaslAuthenticate v1+; none when it sets no limit).
async fn authenticate<T: SaslTransport>(
    t: &mut T,
    broker: &str,
    creds: &SaslCredentials,
    versions: &HashMap<i16, (i16, i16)>,
    prepared: sasl::Prepared,
) -> Result<Option<Duration>> {
    let mechanism = creds.mechanism.as_str();
    let auth_err = |message: String| KafkaError::Authentication {
        broker: broker.to_string(),
        mechanism,
        message,
    };
    let hs_version = negotiate(versions, SaslHandshakeRequest::KEY, 1, 1)
        .ok_or_else(|| auth_err("the broker does not support SaslHandshake v1".into()))?;
    let hs = t
        .send(
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
            hs_version,
        )
        .await?;
    if hs.error_code.err().is_some() {
        let enabled: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
        return Err(auth_err(format!(
            "the broker does not enable this mechanism (it enables: {})",
            enabled.join(", ")
        )));
    }
    let auth_version = negotiate(
        versions,
        SaslAuthenticateRequest::KEY,
        0,
        SaslAuthenticateRequest::VERSIONS.max,
    )
    .ok_or_else(|| auth_err("the broker does not support SaslAuthenticate".into()))?;
    let mut exchange = sasl::Exchange::new(creds, prepared);
    let mut bytes = exchange.start();
    loop {
        let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let resp = t.send(&req, auth_version).await?;
        if resp.error_code.err().is_some() {
            let mut msg = resp
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_else(|| "rejected".into());
            if let Some(r) = exchange.refusal() {
                msg = format!("{msg} ({r})");
            }
            return Err(auth_err(msg));
        }
        match exchange.next(&resp.auth_bytes).map_err(|e| auth_err(e.0))? {
            sasl::Step::Send(next) => bytes = next,
            sasl::Step::Done => {
                let ms = resp.session_lifetime_ms;
                return Ok((ms > 0).then(|| Duration::from_millis(ms as u64)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn broker_sockets_probe_an_idle_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        configure_socket(&tcp).unwrap();
        let s = socket2::SockRef::from(&tcp);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(60));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(10));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 3);
        assert!(tcp.nodelay().unwrap());
    }
    use crate::settings::{BrokerAddress, SecurityProtocol};
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::MetadataRequest;

    fn framed(len: i32, body: &[u8]) -> Vec<u8> {
        let mut v = len.to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[tokio::test]
    async fn frames_are_bounded_and_a_lying_length_is_an_error() {
        let small = framed(6, b"abcdef");
        assert_eq!(
            &read_frame(&mut &small[..], HANDSHAKE_MAX_FRAME)
                .await
                .unwrap()[..],
            b"abcdef"
        );
        let big_body = vec![7u8; 3 << 20];
        let big = framed(big_body.len() as i32, &big_body);
        assert_eq!(
            read_frame(&mut &big[..], MAX_FRAME).await.unwrap().len(),
            3 << 20
        );
        // Before authentication, a frame above 1 MiB is refused without reading it.
        let e = read_frame(&mut &big[..], HANDSHAKE_MAX_FRAME)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("at most 1048576"), "{e}");
        for len in [-1, 0, 3, i32::MAX] {
            let e = read_frame(&mut &framed(len, b"abcd")[..], MAX_FRAME)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{len}");
        }
        // 500 MiB announced, 4 bytes sent: an error once the peer stops.
        for len in [100, 500 << 20] {
            let e = read_frame(&mut &framed(len, b"abcd")[..], MAX_FRAME)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{len}");
        }
    }

    /// A broker that completes the ApiVersions handshake and then reads requests without ever
    /// answering them (a stalled broker, or a half-open connection).
    async fn silent_broker() -> (u16, tokio::task::JoinHandle<()>) {
        fake_broker(None).await
    }

    /// A broker that completes the handshake, then never reads again (a frozen process: the
    /// kernel buffers what arrives until its buffers are full).
    async fn deaf_broker() -> (u16, tokio::task::JoinHandle<()>) {
        fake_broker_reading(None, false).await
    }

    /// A broker that completes the ApiVersions handshake, then answers every Metadata request
    /// with an empty response `answer_after` later, or never (`None`).
    async fn fake_broker(answer_after: Option<Duration>) -> (u16, tokio::task::JoinHandle<()>) {
        fake_broker_reading(answer_after, true).await
    }

    async fn fake_broker_reading(
        answer_after: Option<Duration>,
        reads: bool,
    ) -> (u16, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut frame = read_frame(&mut s, MAX_FRAME).await.unwrap();
            let header = RequestHeader::decode(&mut frame, 2).unwrap();
            let mut buf = BytesMut::new();
            buf.put_i32(0);
            // ApiVersions answers with header v0 whatever the version (KIP-511).
            ResponseHeader::default()
                .with_correlation_id(header.correlation_id)
                .encode(&mut buf, 0)
                .unwrap();
            ApiVersionsResponse::default()
                .with_api_keys(vec![
                    ApiVersion::default()
                        .with_api_key(ApiKey::ApiVersions as i16)
                        .with_max_version(3),
                    ApiVersion::default()
                        .with_api_key(ApiKey::Metadata as i16)
                        .with_max_version(12),
                ])
                .encode(&mut buf, header.request_api_version)
                .unwrap();
            let len = (buf.len() - 4) as i32;
            buf[..4].copy_from_slice(&len.to_be_bytes());
            s.write_all(&buf).await.unwrap();
            if !reads {
                std::future::pending::<()>().await;
            }
            while let Ok(mut frame) = read_frame(&mut s, MAX_FRAME).await {
                let Some(delay) = answer_after else { continue };
                tokio::time::sleep(delay).await;
                // Metadata v9+ uses the flexible request header (v2) and response header (v1).
                let version = i16::from_be_bytes([frame[2], frame[3]]);
                let flexible = version >= 9;
                let header =
                    RequestHeader::decode(&mut frame, if flexible { 2 } else { 1 }).unwrap();
                let mut buf = BytesMut::new();
                buf.put_i32(0);
                ResponseHeader::default()
                    .with_correlation_id(header.correlation_id)
                    .encode(&mut buf, if flexible { 1 } else { 0 })
                    .unwrap();
                kafka_protocol::messages::MetadataResponse::default()
                    .encode(&mut buf, version)
                    .unwrap();
                let len = (buf.len() - 4) as i32;
                buf[..4].copy_from_slice(&len.to_be_bytes());
                s.write_all(&buf).await.unwrap();
            }
        });
        (port, task)
    }

    fn settings_for(port: u16, request_timeout: Duration) -> ClientSettings {
        ClientSettings {
            bootstrap: vec![BrokerAddress {
                host: "127.0.0.1".into(),
                port,
            }],
            security_protocol: SecurityProtocol::Plaintext,
            sasl: None,
            tls: None,
            client_id: None,
            request_timeout,
        }
    }

    /// `ready` is cancelled (as `select!` does when another branch wins) before the answer is
    /// there, waited on again, and the answer is still there for `wait`, at once.
    #[tokio::test]
    async fn ready_is_cancel_safe_and_keeps_the_answer() {
        let (port, task) = fake_broker(Some(Duration::from_millis(300))).await;
        let settings = settings_for(port, Duration::from_secs(5));
        let conn = Connection::connect("127.0.0.1", port, "1@fake".into(), &settings)
            .await
            .unwrap();
        let version = conn.version::<MetadataRequest>().unwrap();
        let mut f = conn
            .submit(&MetadataRequest::default(), version)
            .await
            .unwrap();
        let early = tokio::time::timeout(Duration::from_millis(50), f.ready()).await;
        assert!(early.is_err(), "no answer within 50 ms");
        assert!(!f.is_ready());
        tokio::time::timeout(Duration::from_secs(3), f.ready())
            .await
            .expect("the answer arrives after the cancelled wait");
        assert!(f.is_ready());
        let t = std::time::Instant::now();
        f.wait().await.expect("the answer kept by ready");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert!(!conn.is_closed());
        task.abort();
    }

    /// A broker that stopped reading: once the socket buffers are full, a write gives up at the
    /// request timeout instead of holding the writer (and every request behind it) until the
    /// kernel drops the connection, and the connection is failed and marked silent.
    #[tokio::test]
    async fn a_write_to_a_broker_that_stopped_reading_times_out() {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::messages::TopicName;
        let (port, task) = deaf_broker().await;
        let settings = settings_for(port, Duration::from_millis(400));
        let conn = Connection::connect("127.0.0.1", port, "1@deaf".into(), &settings)
            .await
            .unwrap();
        let version = conn.version::<MetadataRequest>().unwrap();
        // About 1 MiB per request.
        let topics: Vec<MetadataRequestTopic> = (0..32)
            .map(|i| {
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(
                    format!("{i}{}", "x".repeat(32 << 10)),
                ))))
            })
            .collect();
        let big = MetadataRequest::default().with_topics(Some(topics));
        let t = std::time::Instant::now();
        let mut outcome = None;
        for _ in 0..256 {
            match tokio::time::timeout(Duration::from_secs(5), conn.submit(&big, version)).await {
                Ok(Ok(_pending)) => continue,
                Ok(Err(e)) => {
                    outcome = Some(e);
                    break;
                }
                Err(_) => panic!("a write hung for 5 s with a 400 ms request timeout"),
            }
        }
        let e = outcome.expect("256 MiB fit into the socket buffers?");
        assert!(matches!(e, KafkaError::Timeout { .. }), "{e}");
        assert!(conn.is_closed() && conn.went_silent());
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        task.abort();
    }

    /// A request nobody answers: `ready` ends at the request timeout counted from its first
    /// call (not from the write, nor from a later call after a cancelled one), and `wait` then
    /// reports the timeout at once and fails the connection.
    #[tokio::test]
    async fn ready_ends_at_the_request_timeout() {
        let (port, task) = silent_broker().await;
        let settings = settings_for(port, Duration::from_millis(400));
        let conn = Connection::connect("127.0.0.1", port, "1@silent".into(), &settings)
            .await
            .unwrap();
        let version = conn.version::<MetadataRequest>().unwrap();
        let mut f = conn
            .submit(&MetadataRequest::default(), version)
            .await
            .unwrap();
        // Queued behind others for a while: not counted.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = std::time::Instant::now();
        let cancelled = tokio::time::timeout(Duration::from_millis(150), f.ready()).await;
        assert!(cancelled.is_err());
        f.ready().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(380) && waited < Duration::from_millis(1000),
            "ready ended {waited:?} after its first call, not 400 ms after it"
        );
        let t = std::time::Instant::now();
        let err = f.wait().await.unwrap_err();
        assert!(matches!(err, KafkaError::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_millis(100));
        assert!(conn.is_closed(), "a timed-out connection is failed");
        task.abort();
    }

    #[tokio::test]
    async fn a_request_that_times_out_marks_its_connection_failed() {
        let (port, task) = silent_broker().await;
        let settings = settings_for(port, Duration::from_millis(300));
        let conn = Connection::connect("127.0.0.1", port, "1@silent".into(), &settings)
            .await
            .unwrap();
        assert!(!conn.is_closed());
        let err = conn.send(&MetadataRequest::default()).await.unwrap_err();
        assert!(matches!(err, KafkaError::Timeout { .. }), "{err}");
        // The next request must not wait on this connection again.
        assert!(conn.is_closed(), "a timed-out connection is failed");
        let err = conn.send(&MetadataRequest::default()).await.unwrap_err();
        assert!(matches!(err, KafkaError::Disconnected { .. }), "{err}");
        task.abort();
    }

    #[test]
    fn version_negotiation_picks_the_highest_common_version() {
        let broker: HashMap<i16, (i16, i16)> = [(0, (3, 11)), (1, (4, 17)), (18, (0, 4))].into();
        assert_eq!(negotiate(&broker, 0, 0, 9), Some(9));
        assert_eq!(negotiate(&broker, 0, 0, 13), Some(11));
        assert_eq!(negotiate(&broker, 1, 0, 3), None);
        assert_eq!(negotiate(&broker, 2, 0, 3), None);
        assert_eq!(negotiate(&broker, 18, 3, 4), Some(4));
    }
}
