//! Restarting a cluster, pausing it, and freezing one node's process (SIGSTOP) to test what a
//! silent broker does to its clients.

use crate::*;
use std::process::Command;

impl Cluster {
    /// Stops the broker (SIGTERM, then SIGKILL after the harness's timeout) and starts it again
    /// on the same data and port, waiting until it answers admin requests.
    pub fn restart(&self) -> Result<(), HarnessError> {
        check(
            &format!("kafka-harness restart {}", self.name),
            run(
                "kafka-harness restart",
                harness(&["restart", &self.name]),
                None,
            )?,
        )?;
        Ok(())
    }

    /// Stops the broker but keeps its data, so that [`Cluster::restart`] brings it back (a
    /// cluster that is down for a while).
    pub fn pause(&self) -> Result<(), HarnessError> {
        check(
            &format!("kafka-harness stop --keep-data {}", self.name),
            run(
                "kafka-harness stop",
                harness(&["stop", "--keep-data", &self.name]),
                None,
            )?,
        )?;
        Ok(())
    }

    /// Stops the broker now (also done on drop).
    pub fn stop(&self) {
        for node in 1..=self.brokers {
            self.thaw_node(node);
        }
        let _ = run("kafka-harness stop", harness(&["stop", &self.name]), None);
    }

    pub(crate) fn node_pid(&self, node: u16) -> Result<String, HarnessError> {
        let file = if self.brokers == 1 {
            self.dir.join("broker.pid")
        } else {
            self.dir.join(format!("node-{node}/broker.pid"))
        };
        std::fs::read_to_string(&file)
            .map(|p| p.trim().to_string())
            .map_err(|e| HarnessError::Failed {
                what: format!("reading {}", file.display()),
                status: e.to_string(),
                stderr: String::new(),
            })
    }

    /// Freezes broker `node` (1 to N) with SIGSTOP: its connections stay open, requests are
    /// accepted by the kernel and never answered. A silent broker, as a hung JVM or a
    /// black-holed network path looks to a client. [`Cluster::thaw_node`] resumes it; `stop`
    /// and drop thaw every node first.
    pub fn freeze_node(&self, node: u16) -> Result<(), HarnessError> {
        let pid = self.node_pid(node)?;
        let mut kill = Command::new("kill");
        kill.args(["-STOP", &pid]);
        check("kill -STOP", run("kill -STOP", kill, None)?).map(|_| ())
    }

    /// Resumes a node frozen by [`Cluster::freeze_node`] (harmless on a running one).
    pub fn thaw_node(&self, node: u16) {
        if let Ok(pid) = self.node_pid(node) {
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
        }
    }
}
