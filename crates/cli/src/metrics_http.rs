//! kmirror's HTTP endpoint: `/metrics` (Prometheus text), `/health` (alive, and no flow wedged),
//! `/ready` (every flow's clusters answer and no partition is stopped: 200, else 503 with the
//! reason) and `/status` (JSON that `kmirror status` reads). A few read-only routes, so a plain
//! HTTP/1.1 responder on tokio rather than a web framework; each connection gets one response.

use kmirror_mirror::engine::Supervisor;
use kmirror_mirror::metrics::Metrics;
use kmirror_mirror::status::Sampler;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Connections answered at once. Scrapers and probes use one or two; more are closed at once, so
/// a flood of idle connections cannot make the process hold a task and a buffer for each.
/// Each connection also has [`ANSWER_WITHIN`] to send its request.
const MAX_CONNECTIONS: usize = 32;
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long one round of a flow's control loop may run before `/health` fails. A round creates
/// remote topics and starts partition tasks; with thousands of topics on a busy target it takes
/// minutes, never this long.
const STALLED_AFTER: Duration = Duration::from_secs(15 * 60);

/// Serves the endpoint, and samples the counters for `/status`, under the process's supervisor.
pub(crate) fn serve(listener: TcpListener, metrics: Arc<Metrics>, process: &Supervisor) {
    let sampler = Arc::new(Sampler::default());
    {
        let (sampler, metrics) = (sampler.clone(), metrics.clone());
        process.spawn("status sampler", "process", async move {
            loop {
                let t = std::time::Instant::now();
                sampler.tick(&metrics);
                // A sample reads every partition's series: microseconds for a few hundred
                // partitions, about a millisecond at 10,000. The pause is 100 times what it took
                // (at least 1 s, at most 30 s), so sampling never costs more than about 1% of a
                // core.
                let pause =
                    (t.elapsed() * 100).clamp(Duration::from_secs(1), Duration::from_secs(30));
                tokio::time::sleep(pause).await;
            }
        });
    }
    process.spawn(
        "metrics endpoint",
        "process",
        accept(listener, metrics, sampler, MAX_CONNECTIONS),
    );
}

async fn accept(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    sampler: Arc<Sampler>,
    max_connections: usize,
) {
    let open = Arc::new(tokio::sync::Semaphore::new(max_connections));
    // The connections' tasks: one that panics (a bug) ends the endpoint with its panic, which
    // fails the process's supervisor, rather than vanishing with its task.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(done) = connections.join_next() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = open.clone().try_acquire_owned() else {
                        tracing::debug!(%peer, "metrics endpoint: too many open connections; closed");
                        drop(stream);
                        continue;
                    };
                    let (metrics, sampler) = (metrics.clone(), sampler.clone());
                    connections.spawn(async move {
                        let _ =
                            tokio::time::timeout(ANSWER_WITHIN, answer(stream, &metrics, &sampler))
                                .await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    sampler: &Sampler,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let (status, content_type, body) =
        response(request.lines().next().unwrap_or(""), metrics, sampler);
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

const TEXT: &str = "text/plain; charset=utf-8";

/// `/health`: 503 once a flow's control loop has been in one round longer than `limit`, so a
/// liveness probe restarts a wedged process.
fn health(metrics: &Metrics, limit: Duration) -> (&'static str, &'static str, String) {
    match metrics.process.stalled_round(limit) {
        None => ("200 OK", TEXT, "ok\n".into()),
        Some((flow, running)) => (
            "503 Service Unavailable",
            TEXT,
            format!(
                "flow {flow}: its control loop has been in one round for {} s\n",
                running.as_secs()
            ),
        ),
    }
}

fn response(
    request_line: &str,
    metrics: &Metrics,
    sampler: &Sampler,
) -> (&'static str, &'static str, String) {
    let mut parts = request_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        (Some("GET"), Some("/health")) => health(metrics, STALLED_AFTER),
        (Some("GET"), Some("/ready")) => {
            let s = sampler.status(metrics);
            match s.reason {
                None if s.ready => ("200 OK", TEXT, "ready\n".into()),
                reason => (
                    "503 Service Unavailable",
                    TEXT,
                    format!("not ready: {}\n", reason.unwrap_or_default()),
                ),
            }
        }
        (Some("GET"), Some("/status")) => (
            "200 OK",
            "application/json",
            serde_json::to_string(&sampler.status(metrics)).unwrap_or_default(),
        ),
        (Some("GET"), Some("/")) => (
            "200 OK",
            TEXT,
            "kmirror: /metrics /health /ready /status\n".into(),
        ),
        (Some("GET"), _) => (
            "404 Not Found",
            TEXT,
            "not found; try /metrics, /health, /ready or /status\n".into(),
        ),
        _ => ("405 Method Not Allowed", TEXT, "only GET\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn idle_connections_beyond_the_limit_are_closed_and_the_endpoint_keeps_answering() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(accept(
            listener,
            Arc::new(Metrics::new()),
            Arc::new(Sampler::default()),
            4,
        ));
        // Four idle connections hold every slot.
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The fifth is closed at once, without an answer.
        let refused = tokio::time::timeout(Duration::from_secs(2), get(addr, "/health"))
            .await
            .expect("closed at once, not held");
        assert_eq!(refused, "");
        // Once the idle ones go, probes are answered again.
        drop(idle);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(get(addr, "/health").await.starts_with("HTTP/1.1 200 OK"));
        server.abort();
    }

    #[test]
    fn routes() {
        let m = Metrics::new();
        let s = Sampler::default();
        assert_eq!(response("GET /metrics HTTP/1.1", &m, &s).0, "200 OK");
        assert!(response("GET /metrics HTTP/1.1", &m, &s)
            .2
            .ends_with("# EOF\n"));
        assert_eq!(response("GET /health HTTP/1.1", &m, &s).0, "200 OK");
        // A round just started is healthy; a wedged one is found by stalled_round.
        m.process.round_started("A->B");
        assert_eq!(response("GET /health HTTP/1.1", &m, &s).0, "200 OK");
        let (code, _, body) = health(&m, Duration::ZERO);
        assert_eq!(code, "503 Service Unavailable");
        assert!(body.contains("A->B"), "{body}");
        m.process.round_ended("A->B");
        assert_eq!(health(&m, Duration::ZERO).0, "200 OK");
        // No flow has connected yet.
        assert_eq!(
            response("GET /ready HTTP/1.1", &m, &s).0,
            "503 Service Unavailable"
        );
        let labels = kmirror_mirror::metrics::FlowLabels {
            source: "A".into(),
            target: "B".into(),
        };
        m.connected_gauge(&labels).set(1);
        assert_eq!(response("GET /ready HTTP/1.1", &m, &s).0, "200 OK");
        let (code, ty, body) = response("GET /status HTTP/1.1", &m, &s);
        assert_eq!((code, ty), ("200 OK", "application/json"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["flows"][0]["flow"], "A->B");
        assert_eq!(v["ready"], true);
        assert_eq!(response("GET /x HTTP/1.1", &m, &s).0, "404 Not Found");
        assert_eq!(
            response("POST /metrics HTTP/1.1", &m, &s).0,
            "405 Method Not Allowed"
        );
    }
}
