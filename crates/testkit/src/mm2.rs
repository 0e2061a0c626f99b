//! MirrorMaker 2 from the harness's jars: a dedicated-mode process, and MM2's own classes run
//! through a single-file Java program, for compatibility tests.

use super::{check, harness, run, run_root, HarnessError};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs MirrorMaker 2's own Java classes through `java/MirrorInterop.java` (a single-file
/// program) on the harness's MM2 classpath; returns its standard output.
pub fn mirror_interop(args: &[&str]) -> Result<String, HarnessError> {
    let out = check(
        "kafka-harness classpath --mm2",
        run(
            "kafka-harness classpath",
            harness(&["classpath", "--mm2"]),
            None,
        )?,
    )?;
    let classpath = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/MirrorInterop.java");
    let mut java = Command::new("java");
    java.arg("-cp").arg(classpath).arg(source).args(args);
    let what = format!("java MirrorInterop {}", args.join(" "));
    let out = check(&what, run(&what, java, None)?)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A MirrorMaker 2 process (dedicated mode, from the harness's jars), stopped on drop.
#[derive(Debug)]
pub struct Mm2 {
    name: String,
}

impl Mm2 {
    /// Starts `connect-mirror-maker` with `config`; returns once MM2 logged that it started
    /// (its connectors start shortly after).
    pub fn start(name: &str, config: &Path) -> Result<Mm2, HarnessError> {
        let config = config.to_string_lossy().into_owned();
        check(
            &format!("kafka-harness mm2 {name}"),
            run(
                "kafka-harness mm2",
                harness(&["mm2", "-d", name, &config]),
                None,
            )?,
        )?;
        Ok(Mm2 { name: name.into() })
    }

    /// MM2's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(run_root().join(&self.name).join("logs/mm2.log"))
            .unwrap_or_default()
    }

    /// Kills MM2 with SIGKILL: a crash, its open transactions and unflushed offsets left
    /// behind.
    pub fn kill_9(&self) {
        if let Ok(pid) = std::fs::read_to_string(run_root().join(&self.name).join("mm2.pid")) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stops MM2 with SIGTERM (Connect commits source offsets as its tasks stop), waiting for
    /// it to exit.
    pub fn stop(&self) {
        let _ = run("kafka-harness stop", harness(&["stop", &self.name]), None);
    }
}

impl Drop for Mm2 {
    fn drop(&mut self) {
        self.stop();
    }
}
