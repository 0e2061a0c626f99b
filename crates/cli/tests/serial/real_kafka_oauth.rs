//! SASL/OAUTHBEARER against real brokers (docs/configuration.md "OAUTHBEARER"):
//! - OIDC client credentials: both clusters' brokers validate ES256 JWTs against the testkit's
//!   identity provider (`sasl.oauthbearer.jwks.endpoint.url`), run an authorizer with kmirror's
//!   subject a super user, and end SASL sessions after 8 s (`connections.max.reauth.ms`);
//!   tokens live 12 s. While kmirror copies a stream, it must renew its tokens and
//!   re-authenticate its connections, losing nothing, and sync topic configs, ACLs and group
//!   offsets through the same logins (the target's lines name the handler by its older
//!   `secured` class). A wrong client secret gives an error naming the endpoint and the
//!   refusal. MM1 mode takes the same lines. No secret or token is ever logged or served.
//! - The unsecured JWS of test setups, against Kafka's default validator.
use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic, LATEST};
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_kafka::IsolationLevel;
use kmirror_testkit::oidc::TokenServer;
use kmirror_testkit::{sync_check, Cluster, KillOnDrop, Security};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MODULE: &str = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";
const HANDLER: &str =
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler";
/// The handler's name before Kafka 3.7 moved it out of the `secured` package.
const OLD_HANDLER: &str =
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler";
const SECRET: &str = "kmirror-client-secret-42";

/// Broker properties: OAUTHBEARER next to PLAIN (the harness's admin and inter-broker
/// mechanism) on the SASL listener, sessions ending after `reauth_ms`.
fn oauth_props(validator: &[String], reauth_ms: u64) -> Vec<String> {
    let mut p = vec![
        "sasl.enabled.mechanisms=PLAIN,OAUTHBEARER".to_string(),
        format!("listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config={MODULE} required unsecuredLoginStringClaim_sub=\"admin\";"),
        format!("listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms={reauth_ms}"),
    ];
    p.extend(validator.iter().cloned());
    p
}

async fn source_topic(c: &Cluster) -> KafkaCluster {
    // The harness's admin speaks PLAIN.
    let k = KafkaCluster::connect(c.client_settings(None))
        .await
        .unwrap();
    k.create_topics(
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
    k
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

/// Waits until the target's `A.orders` holds `want` records; fails with kmirror's log if not.
async fn copied(b: &KafkaCluster, want: i64, log: &Path) {
    copied_to(b, "A.orders", want, log).await
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

fn config(path: &Path, a: &Cluster, b: &Cluster, auth: &str) {
    std::fs::write(
        path,
        format!(
            "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\nA->B.enabled = true\nA->B.topics = orders\n\
             replication.factor = 1\noffset.storage.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
             offset-syncs.topic.replication.factor = 1\nheartbeats.topic.replication.factor = 1\nemit.heartbeats.enabled = false\n\
             refresh.topics.interval.seconds = 1\nA.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = OAUTHBEARER\n{auth}",
            a.bootstrap(),
            b.bootstrap()
        ),
    )
    .unwrap();
}

fn run(config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("run")
            .arg(config)
            .args([
                "--metrics-address",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--log-level",
                "info,kmirror_kafka::conn=debug",
            ])
            .stdin(Stdio::null()),
        log,
    )
}

fn plan(config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("plan")
        .arg(config)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "plan:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_tokens_are_renewed_and_sessions_reauthenticated_while_copying() {
    let _alone = crate::ALONE.lock().await;
    let idp = TokenServer::start("kmirror", SECRET, Duration::from_secs(12));
    let validator = vec![
        "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler".to_string(),
        format!("sasl.oauthbearer.jwks.endpoint.url={}", idp.jwks_url()),
        "sasl.oauthbearer.expected.audience=kafka".to_string(),
        "sasl.oauthbearer.expected.issuer=kmirror-test-idp".to_string(),
    ];
    // An authorizer on both sides (ACL sync needs one), kmirror's subject a super user.
    let mut props = oauth_props(&validator, 8000);
    props.push("super.users=User:admin;User:ANONYMOUS;User:kmirror".into());
    let props: Vec<&str> = props.iter().map(String::as_str).collect();
    let allowed = format!(
        "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={}",
        idp.jwks_url()
    );
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            Cluster::start_with_jvm("oidc-a", Security::SaslAcl, &props, &[&allowed]).unwrap()
        });
        let b = s.spawn(|| {
            Cluster::start_with_jvm("oidc-b", Security::SaslAcl, &props, &[&allowed]).unwrap()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = source_topic(&ca).await;
    // The harness's admin speaks PLAIN on the same listener.
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    write(&a, 0, 500).await;
    sync_check::seed_syncables(&a, "orders").await;

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mm2.properties");
    let auth = format!(
        "A.sasl.login.callback.handler.class = {HANDLER}\nA.sasl.oauthbearer.token.endpoint.url = {url}\n\
         A.sasl.jaas.config = {MODULE} required clientId=\"kmirror\" clientSecret=\"{SECRET}\" scope=\"kafka\";\n\
         B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = OAUTHBEARER\n\
         B.sasl.login.callback.handler.class = {OLD_HANDLER}\nB.sasl.oauthbearer.token.endpoint.url = {url}\n\
         B.sasl.jaas.config = {MODULE} required clientId=\"kmirror\" clientSecret=\"{SECRET}\";\n\
         sync.group.offsets.enabled = true\nsync.group.offsets.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\nsync.topic.acls.interval.seconds = 1\n",
        url = idp.token_url()
    );
    config(&cfg, &ca, &cb, &auth);
    let text = plan(&cfg);
    assert!(
        text.contains(&format!(
            "OAUTHBEARER OIDC client credentials at {} client=kmirror secret=[hidden]",
            idp.token_url()
        )),
        "plan shows the source, not the secret:\n{text}"
    );
    assert!(!text.contains(SECRET), "{text}");

    let log = dir.path().join("kmirror.log");
    let kmirror = run(&cfg, &log);
    // 30 s of writes: past two token lifetimes and three session lifetimes.
    let t0 = Instant::now();
    let mut written = 500;
    while t0.elapsed() < Duration::from_secs(30) {
        write(&a, written, 50).await;
        written += 50;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    copied(&b, 2 * written, &log).await;
    // Config, ACL and group-offset sync: read through A's login, written through B's.
    sync_check::assert_synced(&b, "A.orders", ("max.message.bytes", "500000"), &log).await;
    // What an operator's tools read: no secret or token either.
    let address = kmirror_testkit::logged_metrics_address(&log);
    for path in ["/status", "/metrics"] {
        let body = kmirror_testkit::http_body(&address, path).unwrap_or_default();
        assert!(body.len() > 100, "{path}: {body}");
        assert!(
            !body.contains(SECRET) && !body.contains("eyJhbGciOiJFUzI1NiI"),
            "{path}: {body}"
        );
    }
    let status = kmirror.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}\n{text}");
    assert!(
        idp.issued() >= 3,
        "tokens renewed: {} issued\n{text}",
        idp.issued()
    );
    assert!(
        text.contains("SASL session re-authenticated"),
        "connections re-authenticated:\n{text}"
    );
    assert!(
        !text.contains(SECRET) && !text.contains("eyJhbGciOiJFUzI1NiI"),
        "a secret or a token in the log:\n{text}"
    );
    assert!(!text.contains("authentication failed"), "{text}");
    // No warning or error at all: renewals and re-authentications are quiet successes.
    let loud: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .collect();
    assert!(loud.is_empty(), "warnings or errors:\n{}", loud.join("\n"));
    eprintln!(
        "tokens issued: {}; re-authentications logged: {}",
        idp.issued(),
        text.matches("SASL session re-authenticated").count()
    );

    // A wrong secret: a clear error naming the endpoint and the refusal, without the secret.
    let wrong = dir.path().join("wrong.properties");
    config(&wrong, &ca, &cb, &auth.replace(SECRET, "not-the-secret-99"));
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["verify"])
        .arg(&wrong)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("OAuth token endpoint {}", idp.token_url())) && text.contains("401"),
        "the error names the endpoint and the refusal:\n{text}"
    );
    assert!(!text.contains("not-the-secret-99"), "{text}");
    assert!(idp.refused() >= 1);

    // MM1's command line with the same lines in --consumer.config: `orders` into B's `orders`.
    let consumer = dir.path().join("consumer.properties");
    std::fs::write(
        &consumer,
        format!(
            "bootstrap.servers={}
group.id=mm1-oauth
auto.offset.reset=earliest
security.protocol=SASL_PLAINTEXT
             sasl.mechanism=OAUTHBEARER
sasl.login.callback.handler.class={HANDLER}
sasl.oauthbearer.token.endpoint.url={}
             sasl.jaas.config={MODULE} required clientId=\"kmirror\" clientSecret=\"{SECRET}\";\n",
            ca.bootstrap(),
            idp.token_url()
        ),
    )
    .unwrap();
    let producer = dir.path().join("producer.properties");
    std::fs::write(
        &producer,
        format!(
            "bootstrap.servers={}\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n\
             sasl.login.callback.handler.class={HANDLER}\nsasl.oauthbearer.token.endpoint.url={}\n\
             sasl.jaas.config={MODULE} required clientId=\"kmirror\" clientSecret=\"{SECRET}\";\n",
            cb.bootstrap(),
            idp.token_url()
        ),
    )
    .unwrap();
    let mm1_log = dir.path().join("mm1.log");
    let before = idp.issued();
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
    // Past a session's end: the connections re-authenticate and go on.
    tokio::time::sleep(Duration::from_secs(9)).await;
    write(&a, written, 50).await;
    copied_to(&b, "orders", 2 * (written + 50), &mm1_log).await;
    let status = mm1.terminate();
    let text = std::fs::read_to_string(&mm1_log).unwrap();
    assert!(status.success(), "MM1 mode exit: {status}\n{text}");
    assert!(idp.issued() > before, "MM1 mode took its own token");
    assert!(text.contains("SASL session re-authenticated"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unsecured_jws_of_test_setups_is_accepted() {
    let _alone = crate::ALONE.lock().await;
    let props = oauth_props(&[], 0);
    let props: Vec<&str> = props.iter().map(String::as_str).collect();
    let (ca, cb) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start_with("jws-a", Security::SaslPlain, &props).unwrap());
        let b = s.spawn(|| Cluster::start("jws-b", Security::Plaintext).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    let a = source_topic(&ca).await;
    let b = KafkaCluster::connect(cb.client_settings(None))
        .await
        .unwrap();
    write(&a, 0, 300).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mm2.properties");
    config(
        &cfg,
        &ca,
        &cb,
        &format!(
            "A.sasl.jaas.config = {MODULE} required unsecuredLoginStringClaim_sub=\"admin\";\n"
        ),
    );
    assert!(plan(&cfg).contains("OAUTHBEARER unsecured JWS (test setups only) principal=admin"));
    let log = dir.path().join("kmirror.log");
    let kmirror = run(&cfg, &log);
    copied(&b, 600, &log).await;
    assert!(kmirror.terminate().success());
}
