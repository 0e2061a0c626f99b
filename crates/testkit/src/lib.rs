//! Test support: real Apache Kafka (KRaft) clusters on 127.0.0.1, started through the project's
//! harness script (`scripts/kafka/kafka-harness.sh`), which runs jars Maven fetched from Maven
//! Central.
//!
//! - Ports are picked free (the broker's and the controller's, PORT+1).
//! - Every process gets its own harness run directory, and a watchdog that stops every broker of
//!   that directory when the test process exits, however it exits (a panic, `kill -9`), so no
//!   JVM outlives `cargo test`. A [`Cluster`] also stops its broker when dropped.
//! - Nothing is skipped: when Java, the jars or a broker are missing, the call fails loudly with
//!   the harness's message (which includes the tail of the broker log).
//!
//! Why one file of this size: `Cluster` is one handle on one harness script: each method wraps a
//! harness subcommand, a Kafka tool or a signal to a broker, through the private `harness`,
//! `run` and `check` and its private run dir, env file and proxies. MM2 (`mm2.rs`), the record
//! readers (`read.rs`) and the `kmirror` process helpers (`process.rs`) live apart; the
//! leadership steering (`describe_partition` to `move_leader`) would move next, into another
//! `impl Cluster` file.

mod faults;
mod harness;
pub mod kdc;
mod mm2;
pub mod netfault;
mod nodes;
pub mod oidc;
mod process;
mod read;
mod registry;
pub mod sync_check;
mod tools;

use harness::{addresses, check, free_ports_except, harness, run, run_root};
pub use harness::{free_port_pair, free_ports, harness_script};
pub use mm2::{mirror_interop, Mm2};
pub use process::{http_body, logged_metrics_address, scrape_metrics, KillOnDrop};
pub use read::{read_committed, read_partition};
pub use registry::{AvroRecords, Registry, TypedRecords};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A failure of the harness or of a tool it ran.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("could not run {what}: {error}")]
    Spawn { what: String, error: std::io::Error },
    #[error("{what} failed ({status}):\n{stderr}")]
    Failed {
        what: String,
        status: String,
        stderr: String,
    },
}

/// Security variants of a test cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    Plaintext,
    /// SASL/PLAIN (users admin, alice, bob, mm2).
    SaslPlain,
    /// SASL with SCRAM-SHA-256 and SCRAM-SHA-512 users as well.
    Scram,
    /// SASL/PLAIN with the StandardAuthorizer; `admin` is a super user, nobody else has rights.
    SaslAcl,
    /// As SaslAcl, with SCRAM-SHA-256/512 users as well.
    ScramAcl,
    /// TLS with a test CA.
    Ssl,
    /// TLS requiring a client certificate.
    Mtls,
    /// SASL/PLAIN over TLS.
    SaslSsl,
}

impl Security {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Security::Plaintext => &[],
            Security::SaslPlain => &["--sasl"],
            Security::Scram => &["--scram"],
            Security::SaslAcl => &["--acl"],
            Security::ScramAcl => &["--scram", "--acl"],
            Security::Ssl => &["--ssl"],
            Security::Mtls => &["--mtls"],
            Security::SaslSsl => &["--ssl", "--sasl"],
        }
    }
}

/// A partition as `kafka-topics --describe` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// -1 while it has none.
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// One running single-node KRaft cluster. Stops its broker when dropped.
#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub security: Security,
    bootstrap: String,
    env: HashMap<String, String>,
    dir: PathBuf,
    brokers: u16,
    /// How long `start` took (format + ready).
    pub start_time: Duration,
    /// One per node when started with [`Cluster::start_proxied`] (dropped after the brokers).
    proxies: Vec<netfault::Proxy>,
}

impl Cluster {
    /// Formats and starts a cluster, waiting until it answers admin requests.
    pub fn start(name: &str, security: Security) -> Result<Cluster, HarnessError> {
        Cluster::start_with(name, security, &[])
    }

    /// Like [`Cluster::start`], with extra broker properties (`key=value`).
    pub fn start_with(
        name: &str,
        security: Security,
        props: &[&str],
    ) -> Result<Cluster, HarnessError> {
        Cluster::start_nodes(name, security, 1, props)
    }

    /// A cluster of `brokers` nodes, each broker and controller (a quorum of them all); with 3
    /// or more, topics get replication factor 3 and `min.insync.replicas=2`, as in production.
    pub fn start_nodes(
        name: &str,
        security: Security,
        brokers: u16,
        props: &[&str],
    ) -> Result<Cluster, HarnessError> {
        Cluster::start_inner(name, security, brokers, props, &[], false)
    }

    /// One node with extra broker JVM options (`-Dkey=value`, kept across restarts).
    pub fn start_with_jvm(
        name: &str,
        security: Security,
        props: &[&str],
        jvm: &[&str],
    ) -> Result<Cluster, HarnessError> {
        Cluster::start_inner(name, security, 1, props, jvm, false)
    }

    /// A PLAINTEXT cluster of `brokers` nodes whose clients reach each broker through a
    /// [`netfault::Proxy`] ([`Cluster::proxy`]): the brokers advertise the proxies, and
    /// replicate among themselves on a listener of their own, so a fault cuts clients off a
    /// broker and leaves the cluster itself alone.
    pub fn start_proxied(
        name: &str,
        brokers: u16,
        props: &[&str],
    ) -> Result<Cluster, HarnessError> {
        Cluster::start_inner(name, Security::Plaintext, brokers, props, &[], true)
    }

    fn start_inner(
        name: &str,
        security: Security,
        brokers: u16,
        props: &[&str],
        jvm: &[&str],
        proxied: bool,
    ) -> Result<Cluster, HarnessError> {
        let t0 = Instant::now();
        let mut attempt = 0;
        let (unique, out, proxies) = loop {
            attempt += 1;
            let port = free_ports(2 * brokers);
            // The proxies listen before the brokers start: readiness is checked through them.
            let mut proxies = Vec::new();
            let mut abase = String::new();
            if proxied {
                let base = free_ports_except(2 * brokers, port, 2 * brokers);
                for k in 0..brokers {
                    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port + 2 * k));
                    proxies.push(netfault::Proxy::start(base + 2 * k, upstream).map_err(|e| {
                        HarnessError::Failed {
                            what: format!("proxy on port {}", base + 2 * k),
                            status: e.to_string(),
                            stderr: String::new(),
                        }
                    })?);
                }
                abase = base.to_string();
            }
            let port = port.to_string();
            let unique = format!("{name}-{port}");
            let nodes = brokers.to_string();
            let mut args = vec!["start", unique.as_str(), port.as_str()];
            if brokers > 1 {
                args.extend(["--brokers", nodes.as_str()]);
            }
            if proxied {
                args.extend(["--advertise-base", abase.as_str()]);
            }
            args.extend(security.flags());
            for p in props {
                args.extend(["--prop", p]);
            }
            for j in jvm {
                args.extend(["--jvm-opt", j]);
            }
            match check(
                &format!("kafka-harness start {unique}"),
                run("kafka-harness start", harness(&args), None)?,
            ) {
                Ok(out) => break (unique, out, proxies),
                // A port found free was taken before a node bound it: stop what started and
                // try other ports (twice at most; anything else fails at once).
                Err(HarnessError::Failed { ref stderr, .. })
                    if attempt < 3
                        && (stderr.contains("Unable to start acceptor")
                            || stderr.contains("Address already in use")) =>
                {
                    let _ = run("kafka-harness stop", harness(&["stop", &unique]), None);
                }
                Err(e) => return Err(e),
            }
        };
        let dir = run_root().join(&unique);
        let env: HashMap<String, String> = std::fs::read_to_string(dir.join("env"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        // The address comes from the cluster's env file, not from the harness's stdout: run from
        // a non-terminal under `timeout`, the last stdout line once carried escape sequences.
        let bootstrap = env
            .get(if proxied {
                "ADVERTISED_BOOTSTRAP"
            } else {
                "BOOTSTRAP"
            })
            .cloned()
            .ok_or_else(|| HarnessError::Failed {
                what: format!("kafka-harness start {unique}"),
                status: format!("no BOOTSTRAP= line in {}", dir.join("env").display()),
                stderr: String::from_utf8_lossy(&out.stdout).into_owned(),
            })?;
        Ok(Cluster {
            name: unique,
            security,
            bootstrap,
            env,
            dir,
            brokers,
            start_time: t0.elapsed(),
            proxies,
        })
    }

    /// The proxy in front of broker `node` (1 to N) of a [`Cluster::start_proxied`] cluster.
    pub fn proxy(&self, node: u16) -> &netfault::Proxy {
        assert!(
            !self.proxies.is_empty(),
            "{} was not started with Cluster::start_proxied",
            self.name
        );
        &self.proxies[usize::from(node - 1)]
    }

    /// How many nodes (broker ids 1 to N).
    pub fn brokers(&self) -> u16 {
        self.brokers
    }

    /// The replication factor the cluster gives new topics (3 from 3 nodes).
    pub fn replication_factor(&self) -> u16 {
        self.brokers.min(3)
    }
}

impl Cluster {
    /// Where clients connect (through the proxies of a [`Cluster::start_proxied`] cluster).
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Where the test's Java tools connect: the clients' address, except on a proxied cluster,
    /// where it is the brokers' INTERNAL listeners, so a fault injected for clients does not
    /// hang the tools a test uses to look at or steer the cluster (leaders then come back as
    /// INTERNAL addresses too, since a broker answers with the listener asked).
    pub fn tools_bootstrap(&self) -> &str {
        self.env("BOOTSTRAP").unwrap_or(&self.bootstrap)
    }

    /// A value of the harness's `env` file for this cluster (e.g. `SSL_CA_PEM`).
    pub fn env(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }

    /// The cluster's run directory (logs, certificates, client configs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Cluster {
    /// kmirror client settings for this cluster: PLAINTEXT, SASL/PLAIN as `user` (None: the
    /// admin super user) and TLS with the cluster's CA (and client certificate under mTLS).
    pub fn client_settings(&self, user: Option<&str>) -> kmirror_kafka::ClientSettings {
        use kmirror_kafka::{
            KeyMaterial, SaslCredentials, SaslMechanism, Secret, SecurityProtocol, TlsSettings,
            TrustMaterial,
        };
        let protocol =
            SecurityProtocol::parse(self.env("SECURITY_PROTOCOL").unwrap_or("PLAINTEXT"))
                .expect("a known protocol");
        let sasl = protocol.uses_sasl().then(|| {
            let name = user.unwrap_or_else(|| self.env("ADMIN_USER").unwrap_or("admin"));
            let password = if user.is_none() {
                self.env("ADMIN_PASSWORD")
                    .unwrap_or("admin-secret")
                    .to_string()
            } else {
                self.env("SASL_USERS")
                    .unwrap_or_default()
                    .split(',')
                    .find_map(|up| {
                        up.split_once(':')
                            .filter(|(u, _)| *u == name)
                            .map(|(_, p)| p.to_string())
                    })
                    .unwrap_or_else(|| format!("{name}-secret"))
            };
            SaslCredentials {
                mechanism: SaslMechanism::Plain,
                username: name.to_string(),
                password: Secret::new(password),
                oauth: None,
                aws: None,
                kerberos: None,
            }
        });
        let tls = protocol.uses_tls().then(|| TlsSettings {
            trust: TrustMaterial::PemFile {
                path: PathBuf::from(self.env("SSL_CA_PEM").expect("SSL_CA_PEM")),
            },
            identity: (self.env("MTLS") == Some("1")).then(|| KeyMaterial::Pkcs12File {
                path: PathBuf::from(self.env("SSL_KEYSTORE_P12").expect("SSL_KEYSTORE_P12")),
                password: self.env("SSL_STORE_PASSWORD").map(Secret::new),
                key_password: None,
            }),
            verify_hostname: true,
        });
        kmirror_kafka::ClientSettings {
            bootstrap: addresses(&self.bootstrap),
            security_protocol: protocol,
            sasl,
            tls,
            client_id: Some("kmirror-test".into()),
            request_timeout: Duration::from_secs(15),
        }
    }

    /// Like [`Cluster::client_settings`] for the admin user, connecting where the tools do
    /// ([`Cluster::tools_bootstrap`]): on a proxied cluster, a view of the cluster that no
    /// injected fault disturbs.
    pub fn direct_client_settings(&self) -> kmirror_kafka::ClientSettings {
        kmirror_kafka::ClientSettings {
            bootstrap: addresses(self.tools_bootstrap()),
            ..self.client_settings(None)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The data is deleted with the cluster: no controlled shutdown to wait for (SIGKILL
        // also ends a frozen node).
        let _ = run(
            "kafka-harness stop --kill",
            harness(&["stop", "--kill", &self.name]),
            None,
        );
    }
}

/// One PLAINTEXT source and one SASL/PLAIN target shared by every test of a test binary, for
/// tests that use their own topic names and do not interfere. Started on first use; stopped by
/// the exit watchdog when the test binary ends.
pub fn shared_pair() -> &'static (Cluster, Cluster) {
    static PAIR: OnceLock<(Cluster, Cluster)> = OnceLock::new();
    PAIR.get_or_init(|| {
        std::thread::scope(|s| {
            let a = s.spawn(|| Cluster::start("shared-a", Security::Plaintext));
            let b = s.spawn(|| Cluster::start("shared-b", Security::SaslPlain));
            let a = a
                .join()
                .expect("start thread")
                .unwrap_or_else(|e| panic!("{e}"));
            let b = b
                .join()
                .expect("start thread")
                .unwrap_or_else(|e| panic!("{e}"));
            (a, b)
        })
    })
}

/// Polls `check` every 300 ms until it holds; fails the test after `secs` seconds, naming `what`.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !check().await {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out after {secs} s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A record timestamp for test data: the time of this process's first call, the same for every
/// call. Fixed timestamps from the past are deleted by the broker's time-based retention
/// (`log.retention.hours`, a week), whose first check runs 30 s after a broker starts: a test
/// reading such records then meets a log start past them.
pub fn recent_ms() -> i64 {
    static FIRST: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *FIRST.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    })
}

/// Logs of the code under test, through the test writer (shown for failing tests), filtered by
/// RUST_LOG (default `info`).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Produces `key:value` lines (keys parsed at the first `:`) with the console producer as the
/// admin.
pub fn produce_keyed(c: &Cluster, topic: &str, lines: &[String]) {
    let cfg = c.client_config(None);
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = c
        .tool_output(
            "console-producer",
            &[
                "--bootstrap-server",
                c.tools_bootstrap(),
                "--producer.config",
                cfg.to_str().unwrap_or_default(),
                "--topic",
                topic,
                "--property",
                "parse.key=true",
                "--property",
                "key.separator=:",
            ],
            Some(input.as_bytes()),
        )
        .expect("console producer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `kmirror_*` metric name the Grafana dashboard in `deploy/grafana/kmirror.json` queries.
pub fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/kmirror.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut out = std::collections::BTreeSet::new();
    for p in v["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let mut rest = t["expr"].as_str().expect("an expr");
            while let Some(i) = rest.find("kmirror_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                out.insert(name);
            }
        }
    }
    out
}
