//! SASL/GSSAPI against real brokers and a real MIT KDC (docs/configuration.md
//! "Kerberos (GSSAPI)"): the testkit's KDC runs its own realm on 127.0.0.1; both clusters'
//! brokers log in with a keytab and end SASL sessions after 8 s
//! (`connections.max.reauth.ms`). kmirror logs in to each cluster as a different principal
//! with a different keytab, in one process; its principals' tickets live 30 s. While it copies
//! for longer than that, it must have new tickets from its keytabs as they age and lose
//! nothing; topic configs, ACLs (both clusters run an authorizer) and group offsets are synced
//! through the same logins. A stale keytab and a keytab of another principal give errors that
//! say so. MM1 mode takes the same lines. No key of a keytab appears in a log, `plan`,
//! `/status` or `/metrics`.

use base64::Engine;
use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::kerberos::keytab;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::kdc::Kdc;
use kmirror_testkit::{sync_check, Cluster, KillOnDrop, Security};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MODULE: &str = "com.sun.security.auth.module.Krb5LoginModule";
const REALM: &str = "KMIRROR.TEST";
/// Longer than the principals' ticket lifetime (30 s): logins must go on past the first tickets.
const COPY_FOR: Duration = Duration::from_secs(40);

fn broker_props(kdc: &Kdc, keytab: &Path) -> Vec<String> {
    vec![
        "sasl.enabled.mechanisms=PLAIN,GSSAPI".into(),
        "sasl.kerberos.service.name=kafka".into(),
        format!(
            "listener.name.sasl_plaintext.gssapi.sasl.jaas.config={MODULE} required useKeyTab=true storeKey=true keyTab=\"{}\" principal=\"kafka/127.0.0.1@{}\";",
            keytab.display(),
            kdc.realm()
        ),
        "listener.name.sasl_plaintext.gssapi.connections.max.reauth.ms=8000".into(),
    ]
}

fn client_lines(prefix: &str, kdc: &Kdc, keytab: &Path, principal: &str) -> String {
    format!(
        "{prefix}security.protocol = SASL_PLAINTEXT\n{prefix}sasl.mechanism = GSSAPI\n\
         {prefix}sasl.kerberos.service.name = kafka\n{prefix}sasl.kerberos.krb5.conf = {}\n\
         {prefix}sasl.jaas.config = {MODULE} required useKeyTab=true storeKey=true keyTab=\"{}\" principal=\"{principal}@{REALM}\";\n",
        kdc.krb5_conf().display(),
        keytab.display()
    )
}

async fn write(k: &KafkaCluster, from: i64, n: i64) {
    // Timestamps of now: older ones fall to the broker's time retention.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for p in 0..2 {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                offset: i,
                timestamp: now,
                key: None,
                value: Some(Bytes::from(format!("{p}:{}", from + i))),
                headers: vec![],
            })
            .collect();
        k.produce(
            "orders",
            p,
            &encode_batch(&records, &BatchOptions::default()).unwrap(),
        )
        .await
        .unwrap();
    }
}

async fn copied_to(b: &KafkaCluster, topic: &str, want: i64, log: &Path) {
    let t0 = Instant::now();
    loop {
        let _ = b.refresh_metadata(None).await;
        let mut total = 0;
        for p in 0..2 {
            total += b
                .list_offset(topic, p, LATEST, IsolationLevel::ReadUncommitted)
                .await
                .unwrap_or(0);
        }
        if total == want {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{total} of {want} records copied to {topic} after 90 s; kmirror's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn kmirror_output(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// Every key of a keytab as the texts a leak would show: hex (both cases) and base64.
fn key_texts(path: &Path) -> Vec<String> {
    let keys = keytab::parse(&std::fs::read(path).unwrap()).unwrap();
    assert!(!keys.is_empty());
    keys.iter()
        .flat_map(|k| {
            let hex: String = k.expose().iter().map(|b| format!("{b:02x}")).collect();
            [
                hex.to_uppercase(),
                base64::engine::general_purpose::STANDARD.encode(k.expose()),
                hex,
            ]
        })
        .collect()
}

fn assert_no_key(what: &str, text: &str, keys: &[String]) {
    for k in keys {
        assert!(
            !text.contains(k.as_str()),
            "{what} shows a keytab key:\n{text}"
        );
    }
}

/// Seconds of the day of the KDC log's `ISSUE` lines for `principal`'s initial tickets.
fn as_issues(kdc_log: &str, principal: &str) -> Vec<u32> {
    kdc_log
        .lines()
        .filter(|l| l.contains("AS_REQ") && l.contains("ISSUE") && l.contains(principal))
        .filter_map(|l| {
            // "Dec 05 22:25:02 host krb5kdc[..]..."
            let t = l.split_whitespace().nth(2)?;
            let mut p = t.split(':').map(|x| x.parse::<u32>().ok());
            Some(p.next()?? * 3600 + p.next()?? * 60 + p.next()??)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keytab_logins_per_cluster_outlive_their_tickets() {
    let kdc = Kdc::start(REALM).unwrap();
    kdc.add_principal("kafka/127.0.0.1", None).unwrap();
    kdc.add_principal("kmirror-a", Some("30 seconds")).unwrap();
    kdc.add_principal("kmirror-b", Some("30 seconds")).unwrap();
    let brokers_kt = kdc.keytab("kafka.keytab", &["kafka/127.0.0.1"]).unwrap();
    // kmirror-a needs pre-authentication, and its keytab holds two key versions, the older
    // first (`ktadd` twice into one file, as key rotations leave keytabs); the first version
    // alone, copied aside, is a stale keytab.
    kdc.require_preauth("kmirror-a").unwrap();
    let a_kt = kdc.keytab("a.keytab", &["kmirror-a"]).unwrap();
    let stale_kt = a_kt.with_file_name("a-old.keytab");
    std::fs::copy(&a_kt, &stale_kt).unwrap();
    kdc.keytab("a.keytab", &["kmirror-a"]).unwrap();
    let b_kt = kdc.keytab("b.keytab", &["kmirror-b"]).unwrap();
    let keys: Vec<String> = [&a_kt, &b_kt].iter().flat_map(|p| key_texts(p)).collect();

    // With an authorizer (ACL sync needs one on both sides), kmirror's principal on each side
    // a super user, as Kerberos principals map to `User:<first part>` by default.
    let props_for = |principal: &str| {
        let mut p = broker_props(&kdc, &brokers_kt);
        p.push(format!(
            "super.users=User:admin;User:ANONYMOUS;User:{principal}"
        ));
        p
    };
    let (props_a, props_b) = (props_for("kmirror-a"), props_for("kmirror-b"));
    let props_a: Vec<&str> = props_a.iter().map(String::as_str).collect();
    let props_b: Vec<&str> = props_b.iter().map(String::as_str).collect();
    let jvm = format!("-Djava.security.krb5.conf={}", kdc.krb5_conf().display());
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            Cluster::start_with_jvm("krb-a", Security::SaslAcl, &props_a, &[&jvm]).unwrap()
        });
        let b = s.spawn(|| {
            Cluster::start_with_jvm("krb-b", Security::SaslAcl, &props_b, &[&jvm]).unwrap()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    // The harness's admin speaks PLAIN on the same listener.
    let a = KafkaCluster::connect(ca.client_settings(None))
        .await
        .unwrap();
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    a.create_topics(
        &[NewTopic {
            name: "orders".into(),
            partitions: 2,
            replication_factor: 1,
            configs: vec![("max.message.bytes".into(), "500000".into())],
        }],
        false,
    )
    .await
    .unwrap();
    write(&a, 0, 500).await;
    sync_check::seed_syncables(&a, "orders").await;

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mm2.properties");
    let config = |a_keytab: &Path, a_principal: &str| {
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = orders\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
             refresh.topics.interval.seconds = 1\nsync.group.offsets.enabled = true\n\
             sync.group.offsets.interval.seconds = 1\nemit.checkpoints.interval.seconds = 1\n\
             sync.topic.acls.interval.seconds = 1\n{}{}",
            ca.bootstrap(),
            cb.bootstrap(),
            client_lines("A.", &kdc, a_keytab, a_principal),
            client_lines("B.", &kdc, &b_kt, "kmirror-b"),
        )
    };
    std::fs::write(&cfg, config(&a_kt, "kmirror-a")).unwrap();
    let (ok, plan) = kmirror_output(&["plan", cfg.to_str().unwrap()]);
    assert!(ok, "{plan}");
    assert!(
        plan.contains(&format!(
            "GSSAPI principal=kmirror-a@{REALM} keytab={}",
            a_kt.display()
        )) && plan.contains(&format!("principal=kmirror-b@{REALM}")),
        "plan names each cluster's principal and keytab:\n{plan}"
    );
    assert_no_key("plan", &plan, &keys);

    let log = dir.path().join("kmirror.log");
    let kmirror = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(&cfg)
            .args([
                "--metrics-address",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--log-level",
                "info,kmirror_kafka::conn=debug",
            ])
            .stdin(Stdio::null()),
        &log,
    );
    let t0 = Instant::now();
    let mut written = 500;
    while t0.elapsed() < COPY_FOR {
        write(&a, written, 50).await;
        written += 50;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    copied_to(&b, "A.orders", 2 * written, &log).await;
    // Config, ACL and group-offset sync: read through A's login, written through B's.
    sync_check::assert_synced(&b, "A.orders", ("max.message.bytes", "500000"), &log).await;
    let address = kmirror_testkit::logged_metrics_address(&log);
    for path in ["/status", "/metrics"] {
        let body = http_get(&address, path);
        assert!(body.len() > 100, "{path}: {body}");
        assert_no_key(path, &body, &keys);
    }
    let status = kmirror.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}\n{text}");
    assert!(!text.contains("authentication failed"), "{text}");
    assert!(!text.contains("Kerberos login as"), "{text}");
    assert_no_key("the log", &text, &keys);
    let reauths = text.matches("SASL session re-authenticated").count();
    assert!(reauths >= 8, "{reauths} re-authentications:\n{text}");
    // Each cluster's principal logged in with its own keytab, and had its tickets again from
    // the keytab as they aged (at 80 % of their 30 s), so that re-authentications after the
    // first tickets' end still went through (none failed, every record arrived).
    let kdc_log = kdc.log();
    for p in ["kmirror-a", "kmirror-b"] {
        let issued = as_issues(&kdc_log, &format!("{p}@{REALM} for krbtgt"));
        // Seconds of the day: a run across midnight wraps.
        let span = (issued.last().unwrap_or(&0) + 86_400 - issued.first().unwrap_or(&0)) % 86_400;
        assert!(
            issued.len() >= 2 && span >= 20,
            "{p}: {} logins over {span} s: tickets not renewed as they aged\n{kdc_log}",
            issued.len()
        );
        eprintln!("{p}: {} logins over {span} s", issued.len());
    }
    assert!(
        text.matches("Kerberos ticket obtained").count() >= 4,
        "{text}"
    );
    eprintln!("re-authentications logged: {reauths}");

    // A keytab of another principal, and a stale keytab (a new key made since): errors that
    // say which, from `verify`, which logs in to both clusters.
    let stale = dir.path().join("stale.properties");
    std::fs::write(&stale, config(&stale_kt, "kmirror-a")).unwrap();
    let wrong = dir.path().join("wrong.properties");
    std::fs::write(&wrong, config(&b_kt, "kmirror-a")).unwrap();
    let (ok, text) = kmirror_output(&["verify", wrong.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "holds no key for kmirror-a@{REALM} (it holds: kmirror-b@{REALM})"
        )),
        "{text}"
    );
    let (ok, text) = kmirror_output(&["verify", stale.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("Kerberos login as kmirror-a@{REALM}")) && text.contains("stale"),
        "a stale keytab is named as such:\n{text}"
    );
    assert_no_key("verify", &text, &keys);

    // MM1's command line with the same lines in its two files: `orders` into B's `orders`.
    let consumer = dir.path().join("consumer.properties");
    std::fs::write(
        &consumer,
        format!(
            "bootstrap.servers={}\ngroup.id=mm1-krb\nauto.offset.reset=earliest\n{}",
            ca.bootstrap(),
            client_lines("", &kdc, &a_kt, "kmirror-a").replace(" = ", "=")
        ),
    )
    .unwrap();
    let producer = dir.path().join("producer.properties");
    std::fs::write(
        &producer,
        format!(
            "bootstrap.servers={}\n{}",
            cb.bootstrap(),
            client_lines("", &kdc, &b_kt, "kmirror-b").replace(" = ", "=")
        ),
    )
    .unwrap();
    let mm1_log = dir.path().join("mm1.log");
    let mm1 = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("legacy")
            .args(["--consumer.config", consumer.to_str().unwrap()])
            .args(["--producer.config", producer.to_str().unwrap()])
            .args(["--whitelist", "orders"])
            .args(["--log-level", "info,kmirror_kafka::conn=debug"])
            .stdin(Stdio::null()),
        &mm1_log,
    );
    copied_to(&b, "orders", 2 * written, &mm1_log).await;
    // Past a session's end: the connections log in again and go on.
    tokio::time::sleep(Duration::from_secs(9)).await;
    write(&a, written, 50).await;
    copied_to(&b, "orders", 2 * (written + 50), &mm1_log).await;
    let status = mm1.terminate();
    let text = std::fs::read_to_string(&mm1_log).unwrap();
    assert!(status.success(), "MM1 mode exit: {status}\n{text}");
    assert!(text.contains("SASL session re-authenticated"), "{text}");
    assert_no_key("MM1 mode's log", &text, &keys);
}
