//! Running the harness script (scripts/kafka/kafka-harness.sh): where it is, the run directory
//! every cluster of a test process lives under, commands with their output kept for errors, and
//! free ports on 127.0.0.1.

use crate::*;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The harness script of this repository.
pub fn harness_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka/kafka-harness.sh")
}

/// This process's harness run directory, with its exit watchdog.
pub(crate) fn run_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("kmirror-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("create harness run dir");
        // Stops every broker of this run directory once this process is gone.
        let script = harness_script();
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; KAFKA_HARNESS_RUN='{root}' bash '{script}' stop-all >/dev/null 2>&1; rm -rf '{root}'",
            pid = std::process::id(),
            root = root.display(),
            script = script.display()
        );
        Command::new("setsid")
            // --fork: setsid returns at once; the watchdog lives on in its own session.
            .args(["--fork", "sh", "-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("start the broker watchdog (setsid sh)");
        root
    })
}

pub(crate) fn harness(args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg(harness_script())
        .args(args)
        .env("KAFKA_HARNESS_RUN", run_root())
        // Kafka 4 logs "Kafka Server started" once the broker is unfenced and takes requests;
        // the harness's extra admin round trips through Java tools cost 2 to 5 s per node.
        .env("KAFKA_HARNESS_READY", "log")
        // A test's broker lives for seconds to minutes and carries little traffic: C1 and the
        // serial collector halve its CPU (docs/testing.md, "Start-up costs"), which is what the
        // suite runs short of on a small machine. Benchmarks start brokers with the full JIT.
        .env(
            "KAFKA_HARNESS_BROKER_JVM",
            std::env::var("KAFKA_HARNESS_BROKER_JVM").unwrap_or_else(|_| "light".into()),
        );
    c
}

pub(crate) fn run(
    what: &str,
    mut cmd: Command,
    stdin: Option<&[u8]>,
) -> Result<Output, HarnessError> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().map_err(|error| HarnessError::Spawn {
        what: what.into(),
        error,
    })?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data).map_err(|error| HarnessError::Spawn {
            what: what.into(),
            error,
        })?;
    }
    child
        .wait_with_output()
        .map_err(|error| HarnessError::Spawn {
            what: what.into(),
            error,
        })
}

pub(crate) fn check(what: &str, out: Output) -> Result<Output, HarnessError> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(HarnessError::Failed {
            what: what.into(),
            status: out.status.to_string(),
            stderr: tail(&String::from_utf8_lossy(&out.stderr), 40),
        })
    }
}

/// The last `n` lines of a tool's output (Java tools print their whole usage on a bad option).
pub(crate) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A port P such that P and P+1 (the controller) are free right now.
pub fn free_port_pair() -> u16 {
    free_ports(2)
}

/// `host:port,host:port` as broker addresses.
pub(crate) fn addresses(list: &str) -> Vec<kmirror_kafka::BrokerAddress> {
    list.split(',')
        .map(|a| {
            let (host, port) = a.rsplit_once(':').expect("host:port");
            kmirror_kafka::BrokerAddress {
                host: host.into(),
                port: port.parse().expect("a port"),
            }
        })
        .collect()
}

/// Like [`free_ports`], for a range that does not overlap `taken..taken + len` (found free
/// too, but not bound yet).
pub(crate) fn free_ports_except(n: u16, taken: u16, len: u16) -> u16 {
    loop {
        let p = free_ports(n);
        if p + n <= taken || p >= taken + len {
            return p;
        }
    }
}

/// An even port P such that P..P+n are all free right now (a broker and its controller per
/// node of a cluster).
pub fn free_ports(n: u16) -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..200 {
        // Spread candidates so parallel tests in one process do not race for the same ports.
        let step = n.max(2) as usize;
        // Below Linux's ephemeral range (32768 and up): a port free now must not be taken by a
        // client connection's local port before the broker binds it.
        let base = 20000
            + ((std::process::id() as usize * 7919 + NEXT.fetch_add(step, Ordering::SeqCst))
                % 12000) as u16;
        let port = base & !1;
        if (port..port + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return port;
        }
    }
    panic!("no {n} free ports in a row on 127.0.0.1");
}
