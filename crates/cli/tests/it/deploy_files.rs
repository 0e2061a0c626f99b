//! The packaging in `deploy/` (no brokers needed): the Kubernetes manifest's configuration is
//! valid for kmirror, its probes and ports match the process's endpoints and it runs as a
//! non-root user; the Dockerfile builds in two stages and runs as an unprivileged user; the
//! binary works as an unprivileged user; the systemd unit passes `systemd-analyze verify`; the
//! Grafana dashboard is valid JSON whose queries name only documented metrics (a running kmirror
//! exports them all: `real_kafka_operate`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `mm2.properties: |` block of the ConfigMap, unindented.
fn embedded_properties(yaml: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in yaml.lines() {
        if line.trim_start().starts_with("mm2.properties: |") {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("    ") && !line.trim().is_empty() {
                break;
            }
            out.push_str(line.strip_prefix("    ").unwrap_or(line));
            out.push('\n');
        }
    }
    out
}

/// A world-readable copy, so that an unprivileged user can read it.
fn public_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, p)
}

#[test]
fn kubernetes_manifest_holds_a_valid_config_and_matching_probes() {
    let yaml = read("deploy/kubernetes/kmirror.yaml");
    let props = embedded_properties(&yaml);
    assert!(props.contains("source->target.enabled = true"), "{props}");
    let (_dir, file) = public_file("mm2.properties", &props);
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["plan", file.to_str().unwrap(), "--check"])
        .env("KMIRROR_TARGET_USER", "mm2")
        .env("KMIRROR_TARGET_PASSWORD", "pw")
        .env("POD_NAME", "kmirror-7f9c-x2")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "plan --check of the ConfigMap:\n{text}"
    );
    // The pod's name is its static identity in the flow's group.
    assert!(
        text.contains("static member kmirror-7f9c-x2"),
        "plan shows the instance id:\n{text}"
    );
    assert!(
        yaml.contains(
            "- name: POD_NAME\n              valueFrom: {fieldRef: {fieldPath: metadata.name}}"
        ),
        "POD_NAME comes from the pod's name"
    );
    // Every env var the configuration reads comes from the Secret.
    for var in ["KMIRROR_TARGET_USER", "KMIRROR_TARGET_PASSWORD"] {
        assert!(props.contains(&format!("${{env:{var}}}")));
        assert!(yaml.contains(&format!("{var}:")), "{var} not in the Secret");
    }
    for needle in [
        "path: /health",
        "path: /ready",
        "containerPort: 9464",
        "\"--metrics-address\", \"0.0.0.0:9464\"",
        "prometheus.io/port: \"9464\"",
        "runAsNonRoot: true",
        "mountPath: /etc/kmirror",
        "\"run\", \"/etc/kmirror/mm2.properties\"",
        // Several replicas share the flow (docs/sharing.md), one disruption at a time.
        "replicas: 3",
        "kind: PodDisruptionBudget",
        "minAvailable: 2",
    ] {
        assert!(yaml.contains(needle), "manifest lacks {needle}");
    }
}

#[test]
fn dockerfile_builds_in_two_stages_and_runs_unprivileged() {
    let d = read("deploy/Dockerfile");
    assert_eq!(d.lines().filter(|l| l.starts_with("FROM ")).count(), 2);
    let user = d
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "{user}"
    );
    assert!(d.contains("EXPOSE 9464") && d.contains("\"0.0.0.0:9464\""));
    assert!(d.contains("/etc/kmirror/mm2.properties"));
    // What it copies exists.
    for path in ["Cargo.toml", "Cargo.lock", "crates"] {
        assert!(repo().join(path).exists(), "{path}");
    }
}

#[test]
fn the_binary_runs_as_an_unprivileged_user() {
    let props = embedded_properties(&read("deploy/kubernetes/kmirror.yaml"));
    let (_dir, file) = public_file("mm2.properties", &props);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kmirror"));
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(["plan", file.to_str().unwrap()])
        .env("KMIRROR_TARGET_USER", "mm2")
        .env("KMIRROR_TARGET_PASSWORD", "pw")
        .env("POD_NAME", "kmirror-7f9c-x2")
        .output()
        .expect("setpriv (util-linux) runs");
    assert!(
        out.status.success(),
        "as uid 65534: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Flow source->target"));
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    let unit = read("deploy/systemd/kmirror.service");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kmirror"));
    // The unit names the installed path; verify a copy that names this build.
    let unit = unit.replace("/usr/local/bin/kmirror", bin.to_str().unwrap());
    let (_dir, file) = public_file("kmirror.service", &unit);
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&file)
        .output()
        .expect("systemd-analyze is installed");
    let err = String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kmirror.service"))
        .collect();
    assert!(
        out.status.success() && problems.is_empty(),
        "systemd-analyze verify: {err}"
    );
}

#[test]
fn grafana_dashboard_queries_only_documented_metrics() {
    let names = kmirror_testkit::dashboard_metrics();
    assert!(names.len() >= 10, "{names:?}");
    let docs = read("docs/metrics.md");
    for n in &names {
        assert!(
            docs.contains(&format!("`{n}`")),
            "{n} is not in docs/metrics.md"
        );
    }
}
