//! A `kmirror` under test as a child process: killed on drop, its metrics scraped, its logged
//! metrics address read.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A child process (a `kmirror` under test) that is killed and reaped when dropped, so that a
/// failing test leaves nothing running.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Spawns `cmd` with its standard output and error appended to `log`.
    pub fn spawn(cmd: &mut Command, log: &Path) -> KillOnDrop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("spawn");
        KillOnDrop(child)
    }

    /// SIGKILL, and wait for it.
    pub fn kill_9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// SIGTERM, and wait up to 60 s for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t0 = Instant::now();
        loop {
            if let Ok(Some(s)) = self.0.try_wait() {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Prometheus text a `kmirror` serves at `address`, or None while it does not answer
/// (paused, gone, starting).
pub fn scrape_metrics(address: &str) -> Option<String> {
    http_body(address, "/metrics")
}

/// The body of `GET path` from a kmirror's metrics endpoint (`/metrics`, `/status`, ...).
pub fn http_body(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(address).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

/// The metrics address a `kmirror` started with `--log-format json --metrics-address ...:0`
/// logged (waits up to 20 s).
pub fn logged_metrics_address(log: &Path) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.contains("serving Prometheus metrics"))
        {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
            return v["fields"]["address"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no metrics address logged in {}:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
