//! The `/metrics` endpoint: one read-only route, so a plain HTTP/1.1 responder on tokio rather
//! than a web framework. Each connection gets one response and is closed.

use kmirror_mirror::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, &metrics))
                        .await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
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
    let (status, body) = response(request.lines().next().unwrap_or(""), metrics);
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if status.starts_with("200") {
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            "text/plain; charset=utf-8"
        },
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn response(request_line: &str, metrics: &Metrics) -> (&'static str, String) {
    let mut parts = request_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => ("200 OK", metrics.render()),
        (Some("GET"), Some("/")) => ("200 OK", "kmirror: metrics at /metrics\n".into()),
        (Some("GET"), _) => ("404 Not Found", "not found; try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "only GET\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let m = Metrics::new();
        assert_eq!(response("GET /metrics HTTP/1.1", &m).0, "200 OK");
        assert!(response("GET /metrics HTTP/1.1", &m).1.ends_with("# EOF\n"));
        assert_eq!(response("GET /x HTTP/1.1", &m).0, "404 Not Found");
        assert_eq!(
            response("POST /metrics HTTP/1.1", &m).0,
            "405 Method Not Allowed"
        );
    }
}
