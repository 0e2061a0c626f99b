//! Proves the harness against real brokers (needs Java and the jars from
//! `scripts/kafka/kafka-harness.sh fetch`; fails loudly without them).

use kmirror_kafka::cluster::KafkaCluster;
use kmirror_testkit::{eventually, Cluster, Security};
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

/// The leader of `topic`-`partition` per fresh metadata (-1: none, or the request failed).
async fn leader(k: &KafkaCluster, topic: &str, partition: i32) -> i32 {
    match k.refresh_metadata(Some(&[topic])).await {
        Ok(md) => md
            .topics
            .get(topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition == partition))
            .map_or(-1, |p| p.leader),
        Err(_) => -1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Named to sort first: libtest starts tests in name order, and this one is the longest.
async fn a_three_broker_cluster_replicates_moves_leaders_and_survives_a_crash() {
    let c = Cluster::start_nodes("trio", Security::Plaintext, 3, &[]).unwrap();
    eprintln!("3-broker cluster start: {:?}", c.start_time);
    assert_eq!(c.bootstrap().split(',').count(), 3, "{}", c.bootstrap());
    let k = KafkaCluster::connect(c.client_settings(None))
        .await
        .unwrap();
    let md = k.refresh_metadata(None).await.unwrap();
    assert_eq!(
        md.brokers.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    c.create_topic("orders", 3).unwrap();
    let md = k.refresh_metadata(Some(&["orders"])).await.unwrap();
    for p in &md.topics["orders"].partitions {
        let mut r = p.replicas.clone();
        r.sort();
        assert_eq!(r, vec![1, 2, 3], "orders-{} replicas", p.partition);
    }
    round_trip(&c, "orders", None);

    // A leader moved on request.
    let to = if leader(&k, "orders", 0).await == 2 {
        3
    } else {
        2
    };
    c.move_leader("orders", 0, to).unwrap();
    assert_eq!(leader(&k, "orders", 0).await, to);

    // kill -9 of that leader: another broker leads, and acks=all writes still succeed with 2 of
    // 3 replicas in sync (min.insync.replicas=2).
    c.kill_node(to as u16).unwrap();
    eventually(60, "a new leader for orders-0", || async {
        let l = leader(&k, "orders", 0).await;
        l > 0 && l != to
    })
    .await;
    let p = c
        .produce_lines("orders", &["during the crash"], None)
        .unwrap();
    assert!(
        p.status.success(),
        "produce with a broker down: {}",
        stderr(&p)
    );
    c.start_node(to as u16).unwrap();

    // A controlled shutdown moves leadership away from the stopping broker first.
    c.stop_node(1).unwrap();
    eventually(60, "no partition led by the stopped broker", || async {
        let mut ok = true;
        for p in 0..3 {
            let l = leader(&k, "orders", p).await;
            ok &= l > 0 && l != 1;
        }
        ok
    })
    .await;
    c.start_node(1).unwrap();
    let md = k.refresh_metadata(None).await.unwrap();
    assert_eq!(md.brokers.len(), 3, "all three back");
    c.create_topic("orders-after", 1).unwrap();
    round_trip(&c, "orders-after", None);
}
