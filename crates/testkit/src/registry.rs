//! A schema registry for tests: Apicurio Registry started through the harness (`registry
//! start`, `scripts/kafka/registry.sh`), in memory, on a free port of 127.0.0.1. kmirror speaks
//! the Confluent Schema Registry API, which Apicurio serves at `/apis/ccompat/v7`; [`Registry::url`]
//! is that base URL. Stopped when dropped, and by the run directory's watchdog when the test
//! process ends. Apicurio 3 needs Java 21 or newer: without one, `start` fails with the
//! harness's message naming where it looked.

use crate::{check, free_ports, harness, run, HarnessError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    pub name: String,
    url: String,
    port: u16,
}

impl Registry {
    /// Starts a registry named `name` (unique within the test process); returns once its
    /// Confluent API answers.
    pub fn start(name: &str) -> Result<Registry, HarnessError> {
        // Its HTTP port and, next to it, Quarkus's management interface.
        let port = free_ports(2);
        let what = format!("kafka-harness registry start {name}");
        check(
            &what,
            run(
                &what,
                harness(&["registry", "start", name, &port.to_string()]),
                None,
            )?,
        )?;
        Ok(Registry {
            name: name.into(),
            url: format!("http://127.0.0.1:{port}/apis/ccompat/v7"),
            port,
        })
    }

    /// The Confluent Schema Registry API's base URL (`http://127.0.0.1:PORT/apis/ccompat/v7`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Freezes the registry (SIGSTOP): connections are accepted and never answered, as a hung
    /// registry does. An in-memory registry cannot be restarted without losing everything.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("pause")
    }

    /// Lets a paused registry run again (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("resume")
    }

    /// Stops the registry and starts it again on the same port: in memory, it comes back empty,
    /// as a registry without storage does after a crash.
    pub fn restart_empty(&self) -> Result<(), HarnessError> {
        let what = format!("kafka-harness stop {}", self.name);
        check(&what, run(&what, harness(&["stop", &self.name]), None)?)?;
        let what = format!("kafka-harness registry start {}", self.name);
        let port = self.port.to_string();
        check(
            &what,
            run(
                &what,
                harness(&["registry", "start", &self.name, &port]),
                None,
            )?,
        )?;
        Ok(())
    }

    fn signal(&self, how: &str) -> Result<(), HarnessError> {
        let what = format!("kafka-harness registry {how} {}", self.name);
        check(
            &what,
            run(&what, harness(&["registry", how, &self.name]), None)?,
        )?;
        Ok(())
    }

    /// A plain HTTP GET of `path` (after the base URL) with a timeout: the status code and the
    /// body. For tests that look at the registry without a client library.
    /// A connection closed without an answer (seen once right after start-up, under load) is
    /// tried again within `timeout`.
    pub fn get(&self, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.get_once(path, timeout) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::UnexpectedEof
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                r => return r,
            }
        }
    }

    fn get_once(&self, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        write!(
            s,
            "GET /apis/ccompat/v7{path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        if text.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head}")))?;
        Ok((status, body.to_string()))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = run("kafka-harness stop", harness(&["stop", &self.name]), None);
    }
}

/// Protobuf or JSON Schema records written and read by the same Python serializers as
/// [`AvroRecords`]: `schema` is the value's `.proto` file (the `.proto` files beside it are its
/// imports, registered by the serializer as subjects of their own) or its JSON Schema file.
#[derive(Debug, Clone, Copy)]
pub struct TypedRecords<'a> {
    pub bootstrap: &'a str,
    pub registry: &'a str,
    pub topic: &'a str,
    /// `protobuf` or `json`.
    pub format: &'a str,
    pub schema: &'a Path,
}

impl TypedRecords<'_> {
    /// Writes records `start..start + count` (value `id` and `name`, a referenced message or
    /// object `{id, name}`), key the id as a string, record i to partition `i % partitions`.
    /// `references` (JSON only): `NAME=SUBJECT:VERSION`, subjects registered beforehand.
    pub fn produce(
        &self,
        references: &[&str],
        start: u64,
        count: u64,
        partitions: u32,
    ) -> Result<(), HarnessError> {
        let schema = self.schema.display().to_string();
        let (start, count, partitions) =
            (start.to_string(), count.to_string(), partitions.to_string());
        let mut args = vec![
            "serde",
            "produce",
            "--format",
            self.format,
            "--bootstrap",
            self.bootstrap,
            "--registry",
            self.registry,
            "--topic",
            self.topic,
            "--schema",
            &schema,
            "--start",
            &start,
            "--count",
            &count,
            "--partitions",
            &partitions,
        ];
        for r in references {
            args.extend(["--reference", r]);
        }
        let what = format!("serde.py produce {} to {}", self.format, self.topic);
        check(&what, run(&what, harness(&args), None)?)?;
        Ok(())
    }

    /// Reads `count` records from the start, each value decoded with the writer's schema that
    /// the registry gives for the record's id (references resolved there): as
    /// [`AvroRecords::consume`].
    pub fn consume(
        &self,
        count: u64,
        timeout: Duration,
    ) -> Result<Vec<serde_json::Value>, HarnessError> {
        let schema = self.schema.display().to_string();
        consume_lines(
            self.topic,
            &[
                "--format",
                self.format,
                "--bootstrap",
                self.bootstrap,
                "--registry",
                self.registry,
                "--schema",
                &schema,
            ],
            count,
            timeout,
        )
    }
}

/// Avro records written and read by a real serializer: Confluent's Python client and its
/// Schema Registry serializers (`scripts/kafka/serde.py`, from PyPI into the harness's cache),
/// against a cluster and a registry.
#[derive(Debug, Clone, Copy)]
pub struct AvroRecords<'a> {
    pub bootstrap: &'a str,
    pub registry: &'a str,
    pub topic: &'a str,
}

impl AvroRecords<'_> {
    /// Writes records `start..start + count` (value `{"id": i, "name": "record-<i>"}` under
    /// `schema`, an Avro schema's text; key the id as a string, or `{"id": i}` under
    /// `key_schema`), record i to partition `i % partitions`. The serializer registers the
    /// schemas, as a producer does.
    pub fn produce(
        &self,
        schema: &str,
        key_schema: Option<&str>,
        start: u64,
        count: u64,
        partitions: u32,
    ) -> Result<(), HarnessError> {
        let file = |name: &str, text: &str| -> Result<String, HarnessError> {
            let path = crate::run_root().join(format!(
                "{name}-{}-{}.avsc",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            std::fs::write(&path, text).map_err(|error| HarnessError::Spawn {
                what: format!("writing {}", path.display()),
                error,
            })?;
            Ok(path.display().to_string())
        };
        let value = file("value", schema)?;
        let (start, count, partitions) =
            (start.to_string(), count.to_string(), partitions.to_string());
        let mut args = vec![
            "serde",
            "produce",
            "--bootstrap",
            self.bootstrap,
            "--registry",
            self.registry,
            "--topic",
            self.topic,
            "--schema",
            &value,
            "--start",
            &start,
            "--count",
            &count,
            "--partitions",
            &partitions,
        ];
        let key = key_schema.map(|k| file("key", k)).transpose()?;
        if let Some(k) = &key {
            args.extend(["--key-schema", k.as_str()]);
        }
        let what = format!("serde.py produce to {}", self.topic);
        check(&what, run(&what, harness(&args), None)?)?;
        Ok(())
    }

    /// Reads `count` records from the start, decoded through the registry: one JSON object
    /// each (`partition`, `offset`, `key`, `value`, `key_schema_id`, `value_schema_id`).
    pub fn consume(
        &self,
        count: u64,
        timeout: Duration,
    ) -> Result<Vec<serde_json::Value>, HarnessError> {
        consume_lines(
            self.topic,
            &["--bootstrap", self.bootstrap, "--registry", self.registry],
            count,
            timeout,
        )
    }
}

/// `serde.py consume` from `topic` with `args`: one JSON object per record read.
fn consume_lines(
    topic: &str,
    args: &[&str],
    count: u64,
    timeout: Duration,
) -> Result<Vec<serde_json::Value>, HarnessError> {
    let (count, timeout) = (count.to_string(), timeout.as_secs().to_string());
    let mut all = vec!["serde", "consume", "--topic", topic];
    all.extend_from_slice(args);
    all.extend(["--count", &count, "--timeout", &timeout]);
    let what = format!("serde.py consume from {topic}");
    let out = check(&what, run(&what, harness(&all), None)?)?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l).map_err(|e| HarnessError::Failed {
                what: what.clone(),
                status: "a line that is not JSON".into(),
                stderr: format!("{e}: {l}"),
            })
        })
        .collect()
}
