//! Operating a running `kmirror run`: `/health` answers; `/ready` is true once both clusters
//! answer, false while the target is down and true again after it returns; `/metrics` values move
//! as data flows; `kmirror status` (not a terminal here: plain lines, and JSON) shows the flow.

use kmirror_testkit::{eventually, logged_metrics_address, Cluster, KillOnDrop, Security};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// (status code, body) of GET `path`.
fn get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(address).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// `kmirror run CONFIG` with a metrics address of its own, and that address.
fn run(config: &Path, log: &Path) -> (KillOnDrop, String) {
    let p = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args(["--metrics-address", "127.0.0.1:0", "--log-format", "json"]),
        log,
    );
    (p, logged_metrics_address(log))
}

fn records(address: &str) -> f64 {
    get(address, "/metrics").map_or(0.0, |(_, body)| {
        kmirror_mirror::metrics::sum_samples(&body, "kmirror_record_count_total", &[])
    })
}

fn produce(c: &Cluster, topic: &str, from: usize, n: usize) {
    let input: String = (from..from + n).map(|i| format!("r{i}\n")).collect();
    let cfg = c.client_config(None);
    c.tool(
        "console-producer",
        &[
            "--bootstrap-server",
            c.bootstrap(),
            "--producer.config",
            cfg.to_str().unwrap(),
            "--topic",
            topic,
        ],
        Some(input.as_bytes()),
    )
    .unwrap();
}

fn status(address: &str, format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["status", "--address", address, "--format", format])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_metrics_and_status_follow_the_clusters() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("ops-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("ops-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("live", 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = live\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n",
            ca.bootstrap(),
            cb.bootstrap()
        ),
    )
    .unwrap();
    let (_run, address) = run(&config, &dir.path().join("kmirror.log"));

    assert_eq!(get(&address, "/health").map(|r| r.0), Some(200));
    eventually(30, "/ready once both clusters answer", || async {
        get(&address, "/ready").map(|r| r.0) == Some(200)
    })
    .await;

    // Metrics move as data flows.
    let before = records(&address);
    produce(&ca, "live", 0, 1000);
    eventually(30, "record_count grows by 1000", || async {
        records(&address) >= before + 1000.0
    })
    .await;

    // Every metric the Grafana dashboard queries is exported (as a sample or a declared family).
    let (_, exposition) = get(&address, "/metrics").unwrap();
    let declared: std::collections::BTreeSet<String> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some(if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            })
        })
        .collect();
    for name in kmirror_testkit::dashboard_metrics() {
        assert!(
            declared.contains(&name),
            "the dashboard queries {name}, which kmirror does not export"
        );
    }

    // kmirror status, not on a terminal: plain lines, and JSON.
    let text = status(&address, "text");
    assert!(text.starts_with("ready (up "), "{text}");
    assert!(
        text.contains("A->B  connected  topics 1  partitions 3"),
        "{text}"
    );
    assert!(text.contains("records 1000"), "{text}");
    let v: serde_json::Value = serde_json::from_str(status(&address, "json").trim()).unwrap();
    assert_eq!(v["flows"][0]["flow"], "A->B");
    assert_eq!(v["flows"][0]["records"], 1000);
    assert_eq!(v["flows"][0]["lag_records"], 0);
    // The flow's group (sharing is on by default): this one process, leading it.
    assert!(
        text.contains("\n  processes: ") && text.contains(" (leader)"),
        "{text}"
    );
    assert_eq!(v["flows"][0]["members"][0]["leader"], true, "{v}");
    assert_eq!(
        v["flows"][0]["members"][0]["partitions"], v["flows"][0]["assigned_partitions"],
        "{v}"
    );

    // The target goes down: not ready, with the reason; back up: ready again, data flows.
    cb.pause().unwrap();
    let t0 = Instant::now();
    eventually(30, "/ready false while B is down", || async {
        matches!(get(&address, "/ready"), Some((503, body)) if body.contains("cluster not answering for A->B"))
    })
    .await;
    println!("/ready turned false {:?} after B stopped", t0.elapsed());
    assert_eq!(get(&address, "/health").map(|r| r.0), Some(200));
    let text = status(&address, "text");
    assert!(text.contains("DISCONNECTED"), "{text}");
    cb.restart().unwrap();
    eventually(60, "/ready true after B returned", || async {
        get(&address, "/ready").map(|r| r.0) == Some(200)
    })
    .await;
    produce(&ca, "live", 1000, 500);
    eventually(60, "records flow again", || async {
        records(&address) >= before + 1500.0
    })
    .await;
}

/// `kmirror.rate.limit.bytes.per.second` holds within 10% over 30 s on a backlog far larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds_within_ten_percent_over_30_seconds() {
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("rate-a", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("rate-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    ca.create_topic("bulk", 4).unwrap();
    let cfg = ca.client_config(None);
    let props = format!("bootstrap.servers={}", ca.bootstrap());
    ca.tool(
        "producer-perf-test",
        &[
            "--topic",
            "bulk",
            "--num-records",
            "45000",
            "--record-size",
            "1000",
            "--throughput",
            "-1",
            "--producer.config",
            cfg.to_str().unwrap(),
            "--producer-props",
            &props,
            "linger.ms=10",
            "batch.size=65536",
        ],
        None,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mm2.properties");
    const LIMIT: f64 = 1_000_000.0;
    std::fs::write(
        &config,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = bulk\n\
             A->B.kmirror.rate.limit.bytes.per.second = {}\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             checkpoints.topic.replication.factor = 1\noffset-syncs.topic.replication.factor = 1\n",
            ca.bootstrap(),
            cb.bootstrap(),
            LIMIT as u64
        ),
    )
    .unwrap();
    let (_run, address) = run(&config, &dir.path().join("kmirror.log"));
    let bytes = |address: &str| {
        get(address, "/metrics").map_or(0.0, |(_, body)| {
            kmirror_mirror::metrics::sum_samples(&body, "kmirror_byte_count_total", &[])
        })
    };
    eventually(30, "copying started", || async { bytes(&address) > 0.0 }).await;
    // Past the first second's burst.
    std::thread::sleep(Duration::from_secs(3));
    let (b1, t1) = (bytes(&address), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    let (b2, t2) = (bytes(&address), Instant::now());
    let rate = (b2 - b1) / t2.duration_since(t1).as_secs_f64();
    println!("rate limit {LIMIT} B/s: measured {rate:.0} B/s over 30 s");
    assert!(
        (rate - LIMIT).abs() <= LIMIT * 0.1,
        "measured {rate:.0} B/s against a limit of {LIMIT}"
    );
    let (_, body) = get(&address, "/metrics").unwrap();
    assert_eq!(
        kmirror_mirror::metrics::sum_samples(&body, "kmirror_rate_limit_bytes_per_second", &[]),
        LIMIT
    );
    assert!(kmirror_mirror::metrics::sum_samples(&body, "kmirror_throttled_ms_total", &[]) > 0.0);
}
