//! Kafka's own command-line tools against a cluster, and data through them: create topics,
//! produce and consume lines, read committed records.

use crate::*;
use std::path::PathBuf;
use std::process::{Output, Stdio};

impl Cluster {
    /// The Java client config for the admin (super user) or a named user.
    pub fn client_config(&self, user: Option<&str>) -> PathBuf {
        match user {
            None => self.dir.join("client.properties"),
            Some(u) => self.dir.join(format!("client-{u}.properties")),
        }
    }

    /// Runs a Kafka tool (alias or class) and returns its output, whatever the exit status.
    pub fn tool_output(
        &self,
        tool: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<Output, HarnessError> {
        let mut all = vec!["tool", tool];
        all.extend(args);
        run(&format!("kafka tool {tool}"), harness(&all), stdin)
    }

    /// Starts a Kafka tool in the background (e.g. a console consumer); the caller kills it.
    pub fn spawn_tool(
        &self,
        tool: &str,
        args: &[&str],
    ) -> Result<std::process::Child, HarnessError> {
        let mut all = vec!["tool", tool];
        all.extend(args);
        harness(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| HarnessError::Spawn {
                what: format!("kafka tool {tool}"),
                error,
            })
    }

    /// Runs a Kafka tool and fails on a non-zero exit.
    pub fn tool(
        &self,
        tool: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, HarnessError> {
        let out = check(
            &format!("kafka tool {tool} {}", args.join(" ")),
            self.tool_output(tool, args, stdin)?,
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates a topic as the admin.
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), HarnessError> {
        let cfg = self.client_config(None);
        let p = partitions.to_string();
        self.tool(
            "topics",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--command-config",
                cfg.to_str().unwrap_or_default(),
                "--create",
                "--topic",
                topic,
                "--partitions",
                &p,
                "--replication-factor",
                &self.replication_factor().to_string(),
            ],
            None,
        )?;
        Ok(())
    }

    /// Produces one record per line with the console producer, as `user` (None: admin).
    pub fn produce_lines(
        &self,
        topic: &str,
        lines: &[&str],
        user: Option<&str>,
    ) -> Result<Output, HarnessError> {
        let cfg = self.client_config(user);
        let input = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        self.tool_output(
            "console-producer",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--producer.config",
                cfg.to_str().unwrap_or_default(),
                "--topic",
                topic,
            ],
            Some(input.as_bytes()),
        )
    }

    /// Consumes `n` records from the beginning with the console consumer, as `user`.
    pub fn consume_lines(
        &self,
        topic: &str,
        n: usize,
        group: &str,
        user: Option<&str>,
    ) -> Result<Output, HarnessError> {
        let cfg = self.client_config(user);
        let n = n.to_string();
        self.tool_output(
            "console-consumer",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--command-config", // --consumer.config prints a deprecation notice on stdout since Kafka 4.2
                cfg.to_str().unwrap_or_default(),
                "--topic",
                topic,
                "--from-beginning",
                "--max-messages",
                &n,
                "--timeout-ms",
                "30000",
                "--group",
                group,
            ],
            None,
        )
    }

    /// The lines Java's console consumer prints reading `topic` from the beginning as a
    /// read_committed consumer (aborted transactions left out): at most `max` records, ending
    /// after 8 s without a new one.
    pub fn read_committed_lines(
        &self,
        topic: &str,
        max: usize,
    ) -> Result<Vec<String>, HarnessError> {
        let max = max.to_string();
        let out = self.tool_output(
            "console-consumer",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--topic",
                topic,
                "--from-beginning",
                "--isolation-level",
                "read_committed",
                "--max-messages",
                &max,
                "--timeout-ms",
                "8000",
            ],
            None,
        )?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect())
    }
}
