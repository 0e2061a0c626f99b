//! Network faults between clients and one broker: a TCP proxy the broker advertises
//! to clients (`kafka-harness.sh start --advertise-base`), whose traffic a test can black-hole,
//! slow down, throttle or reset while the broker itself, and its replication on a listener of
//! its own, carry on.
//!
//! Each proxy runs on a small runtime of its own, so it works the same from synchronous tests,
//! from `#[tokio::test]` and from the soak binary, and a test's runtime stalling does not stall
//! the network.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// What the proxy does to the bytes it carries, in both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Bytes flow as they come.
    #[default]
    None,
    /// Nothing flows; connections stay open and new ones are accepted (a dead link or a hung
    /// peer: only timeouts notice). What was held flows once the fault is lifted.
    BlackHole,
    /// Every chunk is delivered this long after it was read.
    Latency(Duration),
    /// At most this many bytes per second in each direction of each connection.
    Bandwidth(u64),
}

#[derive(Debug)]
struct Shared {
    fault: watch::Sender<Fault>,
    /// Incremented by [`Proxy::reset`]: connections of an older generation are reset.
    generation: watch::Sender<u64>,
    connections: AtomicU64,
    bytes: AtomicU64,
}

/// A proxy from a local port to a broker. Stops (and resets its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    listen: SocketAddr,
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Proxy {
    /// Listens on 127.0.0.1:`port` and forwards every connection to `upstream`. A connection
    /// the upstream refuses (the broker is down) is closed at once, as the broker would be.
    pub fn start(port: u16, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("netfault")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(("127.0.0.1", port)))?;
        let listen = listener.local_addr()?;
        let shared = Arc::new(Shared {
            fault: watch::channel(Fault::None).0,
            generation: watch::channel(0).0,
            connections: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        runtime.spawn(accept(listener, upstream, shared.clone()));
        Ok(Proxy {
            listen,
            shared,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.listen
    }

    /// Applies `fault` to every connection, open and future, until the next call.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Resets every open connection (an RST to both sides, as a middlebox dropping its state
    /// does); new connections are served as before.
    pub fn reset(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far, both directions together.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.reset();
        if let Some(rt) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Not shutdown_timeout: a proxy may be dropped inside a test's runtime, where
            // blocking is not allowed. Its tasks hold nothing that needs an orderly end.
            rt.shutdown_background();
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve(client, upstream, shared.clone()));
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut reset = shared.generation.subscribe();
    let born = *reset.borrow_and_update();
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Linger 0: closing sends an RST instead of a FIN, which is what a reset means.
    let _ = client.set_zero_linger();
    let _ = server.set_zero_linger();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, shared.clone());
    let down = pump(sr, cw, shared.clone());
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = async {
            while reset.changed().await.is_ok() {
                if *reset.borrow() != born {
                    return;
                }
            }
        } => {}
    }
    // Dropping both halves of both sockets closes them (with an RST, see above).
}

/// Carries one direction: a reader that keeps reading into a bounded queue (as a kernel buffer
/// would) and a writer that delivers what the fault allows.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: Arc<Shared>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let mut fault = shared.fault.subscribe();
    let write = async move {
        let mut next_free = Instant::now();
        while let Some((read_at, chunk)) = rx.recv().await {
            loop {
                let now = *fault.borrow_and_update();
                match now {
                    Fault::BlackHole => {
                        if fault.changed().await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Fault::Latency(d) => {
                        let due = read_at + d;
                        tokio::select! {
                            _ = tokio::time::sleep_until(due.into()) => {}
                            r = fault.changed() => { if r.is_err() { return; } continue; }
                        }
                    }
                    Fault::None | Fault::Bandwidth(_) => {}
                }
                break;
            }
            // Under a bandwidth limit, pieces of 50 ms worth, each sent when its turn comes.
            let piece = match *fault.borrow() {
                Fault::Bandwidth(rate) => usize::try_from(rate / 20).unwrap_or(usize::MAX).max(1),
                _ => chunk.len().max(1),
            };
            for part in chunk.chunks(piece) {
                let now = *fault.borrow();
                if let Fault::Bandwidth(rate) = now {
                    let start = next_free.max(Instant::now());
                    tokio::time::sleep_until(start.into()).await;
                    next_free =
                        start + Duration::from_secs_f64(part.len() as f64 / rate.max(1) as f64);
                }
                if to.write_all(part).await.is_err() {
                    return;
                }
                shared.bytes.fetch_add(part.len() as u64, Ordering::Relaxed);
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An upstream that echoes what it receives.
    fn echo_server() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(c: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        c.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got)?;
        Ok(got)
    }

    #[test]
    fn faults_hold_delay_and_reset_traffic() {
        let proxy = Proxy::start(0, echo_server()).unwrap();
        let mut c = std::net::TcpStream::connect(proxy.address()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(round_trip(&mut c, b"hello").unwrap(), b"hello");

        // Black hole: nothing comes back in time; lifted, what was held arrives.
        proxy.set(Fault::BlackHole);
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        c.write_all(b"held").unwrap();
        let mut buf = [0u8; 4];
        assert!(c.read_exact(&mut buf).is_err(), "nothing flows");
        proxy.set(Fault::None);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");

        // Latency: 200 ms each way.
        proxy.set(Fault::Latency(Duration::from_millis(200)));
        let t = Instant::now();
        round_trip(&mut c, b"slow").unwrap();
        let rtt = t.elapsed();
        assert!(rtt >= Duration::from_millis(400), "{rtt:?}");
        assert!(rtt < Duration::from_secs(3), "{rtt:?}");

        // Bandwidth: 64 KiB at 128 KiB/s each way takes about half a second per direction.
        proxy.set(Fault::Bandwidth(128 * 1024));
        let big = vec![7u8; 64 * 1024];
        let t = Instant::now();
        assert_eq!(round_trip(&mut c, &big).unwrap(), big);
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );

        // Reset: the open connection dies, a new one works.
        proxy.set(Fault::None);
        proxy.reset();
        let dead = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            round_trip(&mut c, b"x").is_err()
        });
        assert!(dead, "the reset connection stopped working");
        let mut c2 = std::net::TcpStream::connect(proxy.address()).unwrap();
        c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(round_trip(&mut c2, b"again").unwrap(), b"again");
        assert_eq!(proxy.connections(), 2);
        assert!(proxy.bytes() > 2 * big.len() as u64);
    }
}
