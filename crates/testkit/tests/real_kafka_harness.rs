//! Proves the harness against real brokers (needs Java and the jars from
//! `scripts/kafka/kafka-harness.sh fetch`; fails loudly without them).

use kmirror_testkit::{Cluster, Security};
use std::process::Output;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn round_trip(c: &Cluster, topic: &str, user: Option<&str>) {
    let lines = ["first", "second record", "third"];
    let p = c.produce_lines(topic, &lines, user).unwrap();
    assert!(p.status.success(), "produce on {}: {}", c.name, stderr(&p));
    let out = c
        .consume_lines(topic, 3, &format!("g-{topic}"), user)
        .unwrap();
    assert!(
        out.status.success(),
        "consume on {}: {}",
        c.name,
        stderr(&out)
    );
    let got: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(got, lines, "records read back from {} {topic}", c.name);
}

#[test]
fn plaintext_and_sasl_acl_clusters_create_produce_consume() {
    // Started in parallel, as tests of the replicator will.
    let (plain, acl) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start("plain", Security::Plaintext).unwrap());
        let b = s.spawn(|| Cluster::start("acl", Security::SaslAcl).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    eprintln!(
        "broker start: plaintext {:?}, sasl+acl {:?} (in parallel)",
        plain.start_time, acl.start_time
    );
    plain.create_topic("orders", 3).unwrap();
    round_trip(&plain, "orders", None);

    // ACLs are enforced: alice may do nothing until granted.
    acl.create_topic("payments", 2).unwrap();
    let denied = acl
        .produce_lines("payments", &["x"], Some("alice"))
        .unwrap();
    let all = format!("{}{}", stdout(&denied), stderr(&denied));
    assert!(
        all.contains("TopicAuthorizationException") || all.contains("Not authorized"),
        "alice wrote without an ACL: {all}"
    );
    let admin = acl.client_config(None);
    for role in [
        &["--producer", "--topic", "payments"][..],
        &["--consumer", "--topic", "payments", "--group", "g-payments"][..],
    ] {
        let mut args = vec![
            "--bootstrap-server",
            acl.bootstrap(),
            "--command-config",
            admin.to_str().unwrap(),
            "--add",
            "--allow-principal",
            "User:alice",
        ];
        args.extend_from_slice(role);
        acl.tool("acls", &args, None).unwrap();
    }
    let listed = acl
        .tool(
            "acls",
            &[
                "--bootstrap-server",
                acl.bootstrap(),
                "--command-config",
                admin.to_str().unwrap(),
                "--list",
                "--topic",
                "payments",
            ],
            None,
        )
        .unwrap();
    assert!(
        listed.contains("User:alice") && listed.contains("WRITE"),
        "{listed}"
    );
    round_trip(&acl, "payments", Some("alice"));
}

#[test]
fn ssl_cluster_create_produce_consume() {
    let c = Cluster::start("ssl", Security::Mtls).unwrap();
    eprintln!("broker start (mTLS): {:?}", c.start_time);
    for key in ["SSL_CA_PEM", "SSL_CLIENT_CERT_PEM", "SSL_CLIENT_KEY_PEM"] {
        let path = c
            .env(key)
            .unwrap_or_else(|| panic!("{key} missing from the cluster env"));
        assert!(std::path::Path::new(path).is_file(), "{key}={path}");
    }
    c.create_topic("secure", 1).unwrap();
    round_trip(&c, "secure", None);
}
