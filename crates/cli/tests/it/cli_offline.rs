//! The binary without brokers: plan output, exit codes, connector and MM1 forms.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mirror/tests/fixtures")
        .join(name)
}

fn kmirror(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(args)
        .output()
        .expect("run kmirror")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn plan_of_the_sasl_fixture_masks_secrets() {
    let o = kmirror(&["plan", fixture("mm2-sasl.properties").to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("Flow source->target  [replicate]"), "{out}");
    assert!(!out.contains("mm2-secret") && !err.contains("mm2-secret"));
    let o = kmirror(&[
        "plan",
        "--check",
        fixture("mm2-sasl.properties").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(4), "tasks.max is an ignored key");
    let o = kmirror(&[
        "plan",
        "--format",
        "json",
        fixture("mm2-basic.properties").to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["flows"][0]["flow"], "A->B");
}

#[test]
fn exactly_once_is_shown_with_its_slots_ids_and_acls() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("eos.properties");
    let base = "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\nA->B.enabled = true\nB.exactly.once.source.support = enabled\n";
    std::fs::write(&f, base).unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("exactly-once   on: data and positions committed together in transactions"),
        "{out}"
    );
    assert!(!format!("{out}{err}").contains("not provide"), "{out}{err}");
    // What it uses, so ids and ACLs can be prepared.
    for line in [
        "slots        12 (default; set tasks.max to change), transactional ids A-mm2-MirrorSourceConnector-0 .. A-mm2-MirrorSourceConnector-11",
        "commits      every 500 ms (transaction.boundary = poll) or at 33554432 bytes; transaction.timeout.ms 60000",
        "TransactionalId prefix A-mm2-MirrorSourceConnector-: WRITE, DESCRIBE",
    ] {
        assert!(out.contains(line), "{line}\n{out}");
    }
    std::fs::write(
        &f,
        format!("{base}B.exactly.once.source.support = preparing\n"),
    )
    .unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("off: exactly.once.source.support = preparing"),
        "{out}"
    );
    // `required` is met now; sharing divides the slots.
    std::fs::write(&f, format!("{base}A->B.exactly.once.support = required\n")).unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("exactly-once   on:"), "{out}");
    std::fs::write(&f, format!("{base}kmirror.sharing.enabled = true\n")).unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("serves a share of the 12 exactly-once slots"),
        "{out}"
    );
    std::fs::write(&f, format!("{base}kmirror.sharing.enabled = false\n")).unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("off: this process holds every exactly-once slot"),
        "{out}"
    );
}

#[test]
fn invalid_configuration_exits_3_with_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.properties");
    std::fs::write(
        &f,
        "clusters = A, B\nA.bootstrap.servers = a:1\nA->B.enabled = maybe\n",
    )
    .unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("bad.properties:3: A->B.enabled = 'maybe': expected true or false"),
        "{err}"
    );
    assert!(err.contains("cluster B has no bootstrap servers"), "{err}");
    let o = kmirror(&["plan", "/nonexistent/mm2.properties"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o)
        .1
        .contains("cannot read /nonexistent/mm2.properties"));
    let o = kmirror(&["plan", "--bogus"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn missing_tls_files_and_bad_escapes_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("tls.properties");
    std::fs::write(&f, "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\nB.security.protocol = SSL\nB.ssl.truststore.location = /nope/ca.pem\nA->B.enabled = true\n").unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("TLS file /nope/ca.pem does not exist"),
        "{:?}",
        text(&o)
    );
    std::fs::write(&f, "clusters = A, B\nA.bootstrap.servers = a:1\\u12\n").unwrap();
    let o = kmirror(&["plan", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{:?}", text(&o));
    assert!(
        text(&o)
            .1
            .contains("tls.properties:2: malformed \\uXXXX escape"),
        "{:?}",
        text(&o)
    );
    // The file must come before --clusters, as with connect-mirror-maker.sh.
    let o = kmirror(&["plan", "--clusters", "A", f.to_str().unwrap()]);
    assert!(
        text(&o).1.contains("was read as a --clusters alias"),
        "{:?}",
        text(&o)
    );
}

#[test]
fn connector_files_with_a_worker() {
    let o = kmirror(&[
        "plan",
        "--connector",
        fixture("connector-source.properties").to_str().unwrap(),
        "--connector",
        fixture("connector-checkpoint.properties").to_str().unwrap(),
        "--worker",
        fixture("worker.properties").to_str().unwrap(),
        "--format",
        "json",
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let flows = v["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1);
    let f = &flows[0]["config"];
    assert_eq!(flows[0]["flow"], "A->B");
    assert_eq!(f["replication"], true);
    assert_eq!(
        f["topics"]["include"],
        serde_json::json!(["orders", "payments.*"])
    );
    assert_eq!(f["emit_checkpoints"]["interval"], 10);
    assert_eq!(f["sync_group_offsets"]["enabled"], true);
    assert_eq!(
        f["emit_heartbeats"]["enabled"], false,
        "no heartbeat connector file"
    );
    // The worker's producer settings apply to the data producer.
    assert_eq!(f["clients"]["producer_tuning"]["compression"], "lz4");
    assert_eq!(f["clients"]["producer_tuning"]["linger"], 20);
    let ignored: Vec<&str> = v["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["origin"]["key"].as_str().unwrap())
        .collect();
    assert!(
        ignored.contains(&"tasks.max")
            && ignored.contains(&"plugin.path")
            && ignored.contains(&"offset.storage.file.filename"),
        "{ignored:?}"
    );
}

#[test]
fn connector_worker_must_write_to_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("worker.properties");
    std::fs::write(&w, "bootstrap.servers=a1.example:9092\n").unwrap();
    let o = kmirror(&[
        "plan",
        "--connector",
        fixture("connector-source.properties").to_str().unwrap(),
        "--worker",
        w.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        text(&o).1.contains("must name the same cluster"),
        "{:?}",
        text(&o)
    );
}

#[test]
fn mm1_command_line() {
    let c = fixture("mm1-consumer.properties");
    let p = fixture("mm1-producer.properties");
    let base = [
        "legacy",
        "--consumer.config",
        c.to_str().unwrap(),
        "--producer.config",
        p.to_str().unwrap(),
    ];
    let mut args = base.to_vec();
    args.extend([
        "--whitelist",
        "projects.*",
        "--num.streams",
        "2",
        "--offset.commit.interval.ms",
        "5000",
        "--plan",
        "--format",
        "json",
    ]);
    let o = kmirror(&args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["num_streams"], 2);
    assert_eq!(v["offset_commit_interval"], 5000);
    assert_eq!(v["abort_on_send_failure"], true);
    assert_eq!(v["group_id"], "mm1-projects");
    assert_eq!(v["topics"][0], "projects.*");
    assert_eq!(v["producer_tuning"]["compression"], "lz4");
    assert!(!out.contains("mm1-secret"));
    let mut bad = base.to_vec();
    bad.extend([
        "--include",
        "a(?=b)",
        "--num.streams",
        "0",
        "--message.handler",
        "com.acme.Handler",
        "--plan",
    ]);
    let o = kmirror(&bad);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3));
    assert!(err.contains("--include = 'a(?=b)': invalid regex"), "{err}");
    assert!(
        err.contains("--num.streams = '0': expected a whole number between 1 and 1024"),
        "{err}"
    );
    assert!(
        err.contains(
            "--message.handler = 'com.acme.Handler': Java message handlers cannot be loaded"
        ),
        "{err}"
    );
    assert!(
        err.contains("use its built-in transforms instead (--transforms FILE"),
        "{err}"
    );

    // Transforms: shown by --plan; a misconfigured one is named with file, line and key.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("transforms.properties");
    std::fs::write(
        &good,
        "transforms = noTest, rename\n\
         transforms.noTest.type = Filter\n\
         transforms.noTest.predicate = isTest\n\
         transforms.rename.type = RegexRouter\n\
         transforms.rename.regex = (.*)\n\
         transforms.rename.replacement = dr.$1\n\
         predicates = isTest\n\
         predicates.isTest.type = KeyMatches\n\
         predicates.isTest.pattern = test-.*\n",
    )
    .unwrap();
    let mut plan = base.to_vec();
    plan.extend([
        "--whitelist",
        "x",
        "--transforms",
        good.to_str().unwrap(),
        "--create.topics",
        "false",
        "--plan",
    ]);
    let o = kmirror(&plan);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("transform     noTest: Filter: drop the record when isTest"),
        "{out}"
    );
    assert!(
        out.contains("transform     rename: RegexRouter: (.*) -> dr.$1"),
        "{out}"
    );
    assert!(out.contains("not created (the target's auto.create.topics.enable decides)"));
    let bad_file = dir.path().join("bad.properties");
    std::fs::write(
        &bad_file,
        "transforms = route\n\
         transforms.route.type = com.acme.MyRouter\n",
    )
    .unwrap();
    let mut bad = base.to_vec();
    bad.extend([
        "--whitelist",
        "x",
        "--transforms",
        bad_file.to_str().unwrap(),
        "--create.topics",
        "sometimes",
        "--plan",
    ]);
    let o = kmirror(&bad);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        err.contains("bad.properties:2: transforms.route.type = 'com.acme.MyRouter': kmirror cannot load Java transform classes"),
        "{err}"
    );
    assert!(
        err.contains("--create.topics = 'sometimes': expected true or false"),
        "{err}"
    );

    let mut check = base.to_vec();
    check.extend(["--whitelist", "x", "--check"]);
    // The producer file's linger.ms does nothing in MM1 mode (each fetched chunk is sent at
    // once): the one ignored key, so --check exits 4 naming it.
    let o = kmirror(&check);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(
        err.contains("0 warning(s), 1 ignored key(s)")
            && err
                .contains("mm1-producer.properties:7: linger.ms: kmirror sends each fetched chunk"),
        "{err}"
    );
    let mut none = base.to_vec();
    none.push("--plan");
    assert!(text(&kmirror(&none))
        .1
        .contains("one of --include or --whitelist is required"));
}
