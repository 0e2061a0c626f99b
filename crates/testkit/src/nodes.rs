//! A cluster's nodes and partition leaders: stop, kill and start one node, describe a
//! partition's replicas, move a leader, elect an unclean leader.

use crate::*;
use std::time::{Duration, Instant};

impl Cluster {
    pub(crate) fn node_command(&self, what: &str, args: &[&str]) -> Result<(), HarnessError> {
        check(
            &format!("kafka-harness {what} {} {}", self.name, args.join(" ")),
            run(&format!("kafka-harness {what}"), harness(args), None)?,
        )?;
        Ok(())
    }

    /// Stops broker `node` (1 to N) with SIGTERM: a controlled shutdown, leadership moves first.
    pub fn stop_node(&self, node: u16) -> Result<(), HarnessError> {
        let k = node.to_string();
        self.node_command("stop-node", &["stop-node", &self.name, &k])
    }

    /// Kills broker `node` with SIGKILL: a crash, its partitions lose their leader until the
    /// controller elects another.
    pub fn kill_node(&self, node: u16) -> Result<(), HarnessError> {
        let k = node.to_string();
        self.node_command("stop-node", &["stop-node", &self.name, &k, "--kill"])
    }

    /// Starts a stopped broker again on its data, waiting until every broker is registered.
    pub fn start_node(&self, node: u16) -> Result<(), HarnessError> {
        let k = node.to_string();
        self.node_command("start-node", &["start-node", &self.name, &k])
    }

    /// (leader, replicas) of a partition, as `kafka-topics --describe` shows it.
    pub fn describe_partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<(i32, Vec<i32>), HarnessError> {
        self.partition_state(topic, partition)
            .map(|p| (p.leader, p.replicas))
    }

    /// A partition's leader (-1 for none), replicas and in-sync replicas, as
    /// `kafka-topics --describe` shows them.
    pub fn partition_state(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<PartitionState, HarnessError> {
        let cfg = self.client_config(None);
        let out = self.tool(
            "topics",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--command-config",
                cfg.to_str().unwrap_or_default(),
                "--describe",
                "--topic",
                topic,
            ],
            None,
        )?;
        let field = |line: &str, name: &str| -> Option<String> {
            line.split('\t')
                .find_map(|f| f.trim().strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let ids = |v: Option<String>| -> Vec<i32> {
            v.unwrap_or_default()
                .split(',')
                .filter_map(|r| r.trim().parse().ok())
                .collect()
        };
        for line in out.lines() {
            if field(line, "Partition:").and_then(|v| v.parse::<i32>().ok()) == Some(partition) {
                return Ok(PartitionState {
                    leader: field(line, "Leader:")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(-1),
                    replicas: ids(field(line, "Replicas:")),
                    isr: ids(field(line, "Isr:")),
                });
            }
        }
        Err(HarnessError::Failed {
            what: format!("kafka-topics --describe --topic {topic}"),
            status: format!("no partition {partition} in the output"),
            stderr: out,
        })
    }

    /// Runs an unclean leader election for a partition that has no leader, so that an
    /// out-of-sync replica takes over with the log it has (records only the lost leader held are
    /// gone), and waits until broker `to` leads it (30 s).
    pub fn elect_unclean(&self, topic: &str, partition: i32, to: i32) -> Result<(), HarnessError> {
        // Refused while the controller still counts the out-of-sync broker as fenced: hence
        // the retries.
        self.elect_until(topic, partition, to, "UNCLEAN")
    }

    /// Runs `kafka-leader-election` of `election` type for a partition again and again (each
    /// refusal is expected for a while) until broker `to` leads it, for at most 30 s.
    pub(crate) fn elect_until(
        &self,
        topic: &str,
        partition: i32,
        to: i32,
        election: &str,
    ) -> Result<(), HarnessError> {
        let cfg = self.client_config(None);
        let cfg = cfg.to_str().unwrap_or_default();
        let p = partition.to_string();
        let t0 = Instant::now();
        loop {
            let _ = self.tool_output(
                "leader-election",
                &[
                    "--bootstrap-server",
                    self.tools_bootstrap(),
                    "--admin.config",
                    cfg,
                    "--election-type",
                    election,
                    "--topic",
                    topic,
                    "--partition",
                    &p,
                ],
                None,
            )?;
            let leader = self.partition_state(topic, partition)?.leader;
            if leader == to {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(HarnessError::Failed {
                    what: format!("{election} election of broker {to} for {topic}-{partition}"),
                    status: format!("leader {leader} after 30 s"),
                    stderr: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Makes broker `to` the leader of a partition: reorders its replicas with `to` first and
    /// runs a preferred leader election, then waits until the cluster reports it (30 s).
    pub fn move_leader(&self, topic: &str, partition: i32, to: i32) -> Result<(), HarnessError> {
        let (_, replicas) = self.describe_partition(topic, partition)?;
        let mut order = vec![to];
        order.extend(replicas.iter().copied().filter(|r| *r != to));
        let plan = self.dir.join(format!("move-{topic}-{partition}-{to}.json"));
        let list: Vec<String> = order.iter().map(i32::to_string).collect();
        std::fs::write(
            &plan,
            format!(
                "{{\"version\":1,\"partitions\":[{{\"topic\":\"{topic}\",\"partition\":{partition},\"replicas\":[{}]}}]}}",
                list.join(",")
            ),
        )
        .map_err(|error| HarnessError::Spawn {
            what: format!("write {}", plan.display()),
            error,
        })?;
        let cfg = self.client_config(None);
        let cfg = cfg.to_str().unwrap_or_default();
        let plan = plan.to_str().unwrap_or_default();
        self.tool(
            "reassign-partitions",
            &[
                "--bootstrap-server",
                self.tools_bootstrap(),
                "--command-config",
                cfg,
                "--reassignment-json-file",
                plan,
                "--execute",
            ],
            None,
        )?;
        // The reassignment only reorders replicas (no data moves), so it completes at once;
        // an election while it is still pending is refused, hence the retries.
        self.elect_until(topic, partition, to, "PREFERRED")
    }
}
