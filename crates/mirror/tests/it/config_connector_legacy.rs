//! Connector-file and MM1 configuration forms (no brokers needed).

use kmirror_kafka::{AutoOffsetReset, SecurityProtocol};
use kmirror_mirror::config::connector;
use kmirror_mirror::config::legacy::{self, LegacyArgs};
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::SystemEnvironment;

fn props(name: &str, text: &str) -> Properties {
    Properties::parse(text, name).unwrap()
}

const SOURCE: &str = "connector.class=org.apache.kafka.connect.mirror.MirrorSourceConnector\nsource.cluster.alias=A\ntarget.cluster.alias=B\nsource.cluster.bootstrap.servers=a:9092\ntarget.cluster.bootstrap.servers=b:9092\n";

#[test]
fn each_connector_class_switches_on_its_part_of_the_flow() {
    let hb = props(
        "hb.properties",
        &SOURCE.replace("MirrorSourceConnector", "MirrorHeartbeatConnector"),
    );
    let c = connector::load(&[hb], None, &SystemEnvironment).unwrap();
    let f = &c.flows[0];
    assert!(!f.replication && f.emit_heartbeats.enabled && !f.emit_checkpoints.enabled);
    let src = props("src.properties", SOURCE);
    let c = connector::load(&[src], None, &SystemEnvironment).unwrap();
    let f = &c.flows[0];
    assert!(f.replication && !f.emit_heartbeats.enabled && !f.emit_checkpoints.enabled);
    // The data producer writes to target.cluster.* when there is no worker file.
    assert_eq!(f.clients.target_producer.bootstrap[0].to_string(), "b:9092");
    assert_eq!(
        f.clients.target_producer.security_protocol,
        SecurityProtocol::Plaintext
    );
    // A connector with enabled=false replicates nothing.
    let off = props("off.properties", &format!("{SOURCE}enabled=false\n"));
    assert!(
        !connector::load(&[off], None, &SystemEnvironment)
            .unwrap()
            .flows[0]
            .replication
    );
}

#[test]
fn connector_errors() {
    let cases = [
        ("source.cluster.alias=A\n", "connector.class is not set"),
        ("connector.class=org.apache.kafka.connect.file.FileStreamSourceConnector\n", "not a MirrorMaker 2 connector"),
        ("connector.class=MirrorSourceConnector\n", "source.cluster.alias is not set"),
        (
            "connector.class=MirrorSourceConnector\nsource.cluster.alias=A\nsource.cluster.bootstrap.servers=a:1\n",
            "cluster target has no bootstrap servers",
        ),
    ];
    for (text, needle) in cases {
        let e = connector::load(&[props("c.properties", text)], None, &SystemEnvironment)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
    assert!(connector::load(&[], None, &SystemEnvironment)
        .unwrap_err()
        .to_string()
        .contains("no connector file"));
}

#[test]
fn mm1_defaults_and_flags() {
    let c = props(
        "consumer.properties",
        "bootstrap.servers=old:9092\ngroup.id=mm1\nmax.poll.records=500\n",
    );
    let p = props(
        "producer.properties",
        "bootstrap.servers=new:9092\nretries=10\nlinger.ms=7\n",
    );
    let args = LegacyArgs {
        whitelist: Some("orders,payments.*".into()),
        ..LegacyArgs::default()
    };
    let cfg = legacy::load(&c, &p, &args, &SystemEnvironment).unwrap();
    assert!(
        cfg.topics.matches("orders")
            && cfg.topics.matches("payments.eu")
            && !cfg.topics.matches("x")
    );
    assert_eq!(cfg.num_streams, 1);
    assert_eq!(cfg.offset_commit_interval.as_millis(), 60_000);
    assert!(cfg.abort_on_send_failure);
    // Decision: a new group starts at the earliest offset (MM1's `latest` lost data on new topics).
    assert_eq!(
        cfg.consumer_tuning.auto_offset_reset,
        AutoOffsetReset::Earliest
    );
    assert_eq!(cfg.producer_tuning.linger.as_millis(), 7);
    let ignored: Vec<&str> = cfg.ignored.iter().map(|i| i.origin.key.as_str()).collect();
    // linger.ms is read and has no effect (each fetched chunk is sent at once): listed, so
    // `plan` says so.
    assert_eq!(ignored, ["max.poll.records", "retries", "linger.ms"]);
    assert!(
        cfg.ignored[2].reason.contains("as soon as it is encoded"),
        "{:?}",
        cfg.ignored[2]
    );
    // Group timings: the Java consumer's defaults; a client id to tell members apart.
    assert_eq!(cfg.session_timeout.as_millis(), 45_000);
    assert_eq!(cfg.heartbeat_interval.as_millis(), 3_000);
    assert_eq!(cfg.rebalance_timeout.as_millis(), 300_000);
    assert_eq!(cfg.consumer.client_id.as_deref(), Some("kmirror-mm1"));
    assert!(cfg.create_topics && cfg.transforms.is_empty());
    assert_eq!(cfg.rate_limit, None);
    let limited = LegacyArgs {
        rate_limit: Some("2000000".into()),
        ..args.clone()
    };
    let cfg = legacy::load(&c, &p, &limited, &SystemEnvironment).unwrap();
    assert_eq!(cfg.rate_limit, Some(2_000_000));
    // The Java classes' arguments, given alone, do nothing: listed by flag, with why.
    let with_args = LegacyArgs {
        message_handler_args: Some("a,b".into()),
        rebalance_listener_args: Some("c".into()),
        ..args.clone()
    };
    let cfg = legacy::load(&c, &p, &with_args, &SystemEnvironment).unwrap();
    for flag in ["--message.handler.args", "--rebalance.listener.args"] {
        let i = cfg
            .ignored
            .iter()
            .find(|i| i.origin.key == flag)
            .unwrap_or_else(|| panic!("{flag} not listed: {:?}", cfg.ignored));
        assert!(i.reason.contains("does not load"), "{i:?}");
    }
    let e = legacy::load(
        &c,
        &p,
        &LegacyArgs {
            rate_limit: Some("fast".into()),
            ..args.clone()
        },
        &SystemEnvironment,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--rate.limit.bytes.per.second = 'fast'"), "{e}");

    let tuned = props(
        "consumer.properties",
        "bootstrap.servers=old:9092\ngroup.id=mm1\nsession.timeout.ms=10000\nheartbeat.interval.ms=20000\n\
         partition.assignment.strategy=org.apache.kafka.clients.consumer.RoundRobinAssignor\n",
    );
    let e = legacy::load(&tuned, &p, &args, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("consumer.properties:4: heartbeat.interval.ms = '20000': must be lower than session.timeout.ms"),
        "{e}"
    );
    let round_robin = props(
        "consumer.properties",
        "bootstrap.servers=old:9092\ngroup.id=mm1\n\
         partition.assignment.strategy=org.apache.kafka.clients.consumer.RoundRobinAssignor\n",
    );
    let cfg = legacy::load(&round_robin, &p, &args, &SystemEnvironment).unwrap();
    assert!(cfg
        .diagnostics
        .warnings()
        .any(|w| w.to_string().contains("only the range assignor")));

    let both = LegacyArgs {
        include: Some("a".into()),
        whitelist: Some("b".into()),
        ..LegacyArgs::default()
    };
    let cfg = legacy::load(&c, &p, &both, &SystemEnvironment).unwrap();
    assert!(cfg.topics.matches("a") && !cfg.topics.matches("b"));
    assert!(cfg.diagnostics.warnings().any(|w| w
        .to_string()
        .contains("--whitelist: ignored because --include is given")));

    let no_group = props("consumer.properties", "bootstrap.servers=old:9092\n");
    let e = legacy::load(&no_group, &p, &args, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("consumer.properties: group.id is not set"),
        "{e}"
    );
    let bad = LegacyArgs {
        abort_on_send_failure: Some("maybe".into()),
        ..args
    };
    let e = legacy::load(&c, &p, &bad, &SystemEnvironment)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("command line: --abort.on.send.failure = 'maybe': expected true or false"),
        "{e}"
    );
}

#[test]
fn connector_mode_exactly_once_ids_use_the_worker_group_and_the_source_connector_name() {
    let src = props(
        "src.properties",
        &format!("name=dr-source\ntasks.max=3\n{SOURCE}"),
    );
    let ckpt = props(
        "ckpt.properties",
        &format!(
            "name=a-checkpoints\n{}",
            SOURCE.replace("MirrorSourceConnector", "MirrorCheckpointConnector")
        ),
    );
    let worker = props(
        "worker.properties",
        "bootstrap.servers=b:9092\ngroup.id=connect-dr\nexactly.once.source.support=enabled\n",
    );
    for files in [[ckpt.clone(), src.clone()], [src, ckpt]] {
        let c = connector::load(&files, Some(&worker), &SystemEnvironment).unwrap();
        let t = &c.flows[0].transactions;
        assert_eq!(t.support, "enabled");
        assert_eq!(
            t.id_range(),
            "connect-dr-dr-source-0 .. connect-dr-dr-source-2",
            "the source connector's name, whichever file came first"
        );
        assert!(
            !c.ignored.iter().any(|i| i.origin.key == "group.id"),
            "group.id names the ids"
        );
    }
}

/// All three forms share one front stage, so a key given twice is warned about in connector
/// files, their worker file and MM1's files alike (the later value wins, as in Java).
#[test]
fn duplicate_keys_warn_in_connector_worker_and_mm1_files() {
    let src = props(
        "src.properties",
        &format!("{SOURCE}replication.factor=1\nreplication.factor=3\n"),
    );
    let worker = props(
        "worker.properties",
        "bootstrap.servers=b:9092\ngroup.id=w\ngroup.id=w2\n",
    );
    let c = connector::load(&[src], Some(&worker), &SystemEnvironment).unwrap();
    assert_eq!(c.flows[0].replication_factor, 3);
    let w: Vec<String> = c.diagnostics.warnings().map(|w| w.to_string()).collect();
    assert!(
        w.iter()
            .any(|w| w.contains("src.properties:6: replication.factor: set again on line 7")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.contains("worker.properties:2: group.id: set again on line 3")),
        "{w:?}"
    );

    let c = props(
        "consumer.properties",
        "bootstrap.servers=old:9092\ngroup.id=first\ngroup.id=mm1\n",
    );
    let p = props(
        "producer.properties",
        "bootstrap.servers=new:9092\nlinger.ms=1\nlinger.ms=7\n",
    );
    let args = LegacyArgs {
        whitelist: Some("orders".into()),
        ..LegacyArgs::default()
    };
    let cfg = legacy::load(&c, &p, &args, &SystemEnvironment).unwrap();
    assert_eq!(cfg.group_id, "mm1");
    let w: Vec<String> = cfg.diagnostics.warnings().map(|w| w.to_string()).collect();
    for expected in [
        "consumer.properties:2: group.id: set again on line 3",
        "producer.properties:2: linger.ms: set again on line 3",
    ] {
        assert!(w.iter().any(|w| w.contains(expected)), "{expected}: {w:?}");
    }
}
