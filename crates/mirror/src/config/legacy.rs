//! MirrorMaker 1 command lines (`kafka-mirror-maker.sh --consumer.config ... --producer.config
//! ... --whitelist ...`), with MM1's defaults (mm2-compatibility §9).

use super::client;
use super::diagnostics::{ConfigError, Diagnostics, Origin};
use super::keys;
use super::model::IgnoredKey;
use super::properties::Properties;
use super::providers::Environment;
use super::values::{Reader, Setting, SettingMap};
use crate::filter::PatternList;
use crate::transform::Chain;
use kmirror_kafka::{ClientSettings, ConsumerTuning, ProducerTuning};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The MM1 flags as typed (already split by the CLI).
#[derive(Debug, Clone, Default)]
pub struct LegacyArgs {
    pub include: Option<String>,
    pub whitelist: Option<String>,
    pub num_streams: Option<String>,
    pub offset_commit_interval_ms: Option<String>,
    pub abort_on_send_failure: Option<String>,
    pub message_handler: Option<String>,
    pub message_handler_args: Option<String>,
    pub rebalance_listener: Option<String>,
    pub rebalance_listener_args: Option<String>,
    /// `--create.topics`: create missing target topics (default true); false keeps MM1's
    /// reliance on the target's auto-creation.
    pub create_topics: Option<String>,
    /// `--loop.prevention`: kmirror's own (MM1 had none), as `kmirror.loop.prevention.enabled`.
    pub loop_prevention: Option<String>,
    /// `--transforms FILE`: built-in transforms in Connect's SMT syntax.
    pub transforms: Option<Properties>,
    /// `--rate.limit.bytes.per.second`: kmirror's own, as `kmirror.rate.limit.bytes.per.second`
    /// in MM2 mode (MM1 had no limit).
    pub rate_limit: Option<String>,
}

/// A validated MM1-style configuration.
#[derive(Debug, Clone, Serialize)]
pub struct LegacyConfig {
    pub consumer_file: String,
    pub producer_file: String,
    pub topics: PatternList,
    pub group_id: String,
    pub num_streams: u32,
    #[serde(serialize_with = "ms")]
    pub offset_commit_interval: Duration,
    pub abort_on_send_failure: bool,
    /// MM1's consumer excludes internal topics (`__consumer_offsets`, ...) unless told otherwise.
    pub exclude_internal_topics: bool,
    pub consumer: ClientSettings,
    pub consumer_tuning: ConsumerTuning,
    pub producer: ClientSettings,
    pub producer_tuning: ProducerTuning,
    /// Group membership timings from the consumer file (Java consumer defaults).
    #[serde(serialize_with = "ms")]
    pub session_timeout: Duration,
    #[serde(serialize_with = "ms")]
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms`: how long the coordinator waits for members to rejoin.
    #[serde(serialize_with = "ms")]
    pub rebalance_timeout: Duration,
    /// How often the topic list is read again for new matching topics and partitions.
    #[serde(serialize_with = "ms")]
    pub metadata_refresh: Duration,
    pub create_topics: bool,
    /// Leave out what kmirror copied into the source from the target (docs/legacy.md).
    pub loop_prevention: bool,
    /// Fetched bytes per second for the whole process; `None`: no limit.
    pub rate_limit: Option<u64>,
    pub transforms: Chain,
    /// Schema sync (docs/schemas.md): the consumer file's registry is the source's, the
    /// producer file's the target's; `kmirror.schemas.*` in the consumer file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemas: Option<super::model::SchemaSync>,
    pub ignored: Vec<IgnoredKey>,
    pub diagnostics: Diagnostics,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// MM1's transformation of `--include`/`--whitelist`: commas become `|`, spaces and surrounding
/// quotes are removed.
pub fn mm1_topic_regex(arg: &str) -> String {
    arg.trim()
        .trim_matches(|c| c == '"' || c == '\'')
        .replace(',', "|")
        .replace(' ', "")
}

pub fn load(
    consumer: &Properties,
    producer: &Properties,
    args: &LegacyArgs,
    env: &dyn Environment,
) -> Result<LegacyConfig, ConfigError> {
    let mut diags = Diagnostics::default();
    let cli: Arc<str> = Arc::from("command line");
    let flag = |k: &str| Origin {
        file: cli.clone(),
        line: 0,
        key: k.to_string(),
    };

    let raw = match (&args.include, &args.whitelist) {
        (Some(i), Some(_)) => {
            diags.warning(
                Some(&flag("--whitelist")),
                None,
                "ignored because --include is given (as in MM1)",
            );
            Some(i.clone())
        }
        (Some(i), None) => Some(i.clone()),
        (None, Some(w)) => Some(w.clone()),
        (None, None) => None,
    };
    let topics = match raw {
        None => {
            diags.error(
                None,
                None,
                "one of --include or --whitelist is required: a Java regex of the topics to mirror",
            );
            PatternList::parse("").expect("empty list")
        }
        Some(r) => {
            let key = if args.include.is_some() {
                "--include"
            } else {
                "--whitelist"
            };
            match PatternList::from_items(vec![mm1_topic_regex(&r)]) {
                Ok(p) => p,
                Err(e) => {
                    diags.error(Some(&flag(key)), Some(&r), format!("invalid regex: {e}"));
                    PatternList::parse("").expect("empty list")
                }
            }
        }
    };
    let mut flags = SettingMap::new();
    for (k, v) in [
        ("num.streams", &args.num_streams),
        ("offset.commit.interval.ms", &args.offset_commit_interval_ms),
        ("abort.on.send.failure", &args.abort_on_send_failure),
        ("create.topics", &args.create_topics),
        ("loop.prevention", &args.loop_prevention),
        ("rate.limit.bytes.per.second", &args.rate_limit),
    ] {
        if let Some(v) = v {
            flags.insert(
                k.into(),
                Setting {
                    value: v.clone(),
                    origin: flag(&format!("--{k}")),
                },
            );
        }
    }
    let mut r = Reader::new(&flags, &mut diags);
    let num_streams = r.int("num.streams", 1, 1, 1024) as u32;
    let offset_commit_interval = r.millis("offset.commit.interval.ms", 60_000);
    let abort_on_send_failure = r.bool("abort.on.send.failure", true);
    let create_topics = r.bool("create.topics", true);
    let loop_prevention = r.bool("loop.prevention", false);
    let rate_limit = match r.int("rate.limit.bytes.per.second", 0, 0, i64::MAX) {
        0 => None,
        v => Some(v as u64),
    };
    if let Some(h) = &args.message_handler {
        diags.error(
            Some(&flag("--message.handler")),
            Some(h),
            "Java message handlers cannot be loaded by kmirror; use its built-in transforms instead (--transforms FILE: Filter by topic, key or header, DropHeaders, InsertHeader, RegexRouter; see docs/transforms.md)",
        );
    }
    if let Some(l) = &args.rebalance_listener {
        diags.error(
            Some(&flag("--consumer.rebalance.listener")),
            Some(l),
            "Java rebalance listeners cannot be loaded by kmirror",
        );
    }

    let mut ignored = Vec::new();
    // MM1 passes these to the Java classes above, which kmirror does not load: listed, so
    // `plan` (and `plan --check`) say they do nothing.
    for (key, value, why) in [
        (
            "--message.handler.args",
            &args.message_handler_args,
            "arguments of --message.handler, whose Java class kmirror does not load (its built-in transforms replace handlers: --transforms FILE, docs/transforms.md)",
        ),
        (
            "--rebalance.listener.args",
            &args.rebalance_listener_args,
            "arguments of --consumer.rebalance.listener, whose Java class kmirror does not load (kmirror commits what the target acknowledged before it gives partitions up)",
        ),
    ] {
        if value.is_some() {
            ignored.push(IgnoredKey {
                origin: flag(key),
                reason: why.to_string(),
                did_you_mean: None,
            });
        }
    }
    let cmap = resolve(
        consumer,
        env,
        &mut diags,
        &[
            keys::CONSUMER_KEYS,
            LEGACY_CONSUMER_KEYS,
            &super::schemas::FLOW_KEYS,
        ]
        .concat(),
        &mut ignored,
    );
    // Each fetched chunk is sent as soon as it is encoded: `linger.ms` is listed as ignored
    // (`keys::ignored_client_key` says why).
    let producer_keys: Vec<&str> = keys::PRODUCER_KEYS
        .iter()
        .copied()
        .filter(|k| *k != "linger.ms")
        .collect();
    let pmap = resolve(producer, env, &mut diags, &producer_keys, &mut ignored);
    let group_id = match cmap
        .get("group.id")
        .map(|s| s.value.trim().to_string())
        .filter(|g| !g.is_empty())
    {
        Some(g) => g,
        None => {
            diags.error(None, None, format!("{}: group.id is not set: MM1 mode shares partitions through a consumer group on the source", consumer.source));
            String::new()
        }
    };
    let consumer_settings = client::connection(
        &cmap,
        &format!("the consumer ({})", consumer.source),
        "bootstrap.servers",
        &mut diags,
    );
    let producer_settings = client::connection(
        &pmap,
        &format!("the producer ({})", producer.source),
        "bootstrap.servers",
        &mut diags,
    );
    // Group tools show members by client id; Java names them consumer-<group>-<n>.
    let consumer_settings = consumer_settings.map(|mut c| {
        if c.client_id.is_none() {
            c.client_id = Some(format!("kmirror-{group_id}"));
        }
        c
    });
    let consumer_tuning = client::consumer_tuning(&cmap, &mut diags);
    let producer_tuning = client::producer_tuning(&pmap, &mut diags);
    // MM1's old `latest` default lost the first records of new topics; kmirror starts at the
    // beginning unless the consumer file says otherwise (client::consumer_tuning's default).

    let mut cr = Reader::new(&cmap, &mut diags);
    let exclude_internal_topics = cr.bool("exclude.internal.topics", true);
    // The Java consumer's defaults; MM1 processes and Java consumers share these groups.
    let session_timeout = cr.millis("session.timeout.ms", 45_000);
    let heartbeat_interval = cr.millis("heartbeat.interval.ms", 3_000);
    let rebalance_timeout = cr.millis("max.poll.interval.ms", 300_000);
    // Java's 5-minute metadata.max.age.ms would leave a new topic uncopied for minutes.
    let metadata_refresh = cr.millis("metadata.max.age.ms", 30_000);
    if let Some(s) = cr.get("partition.assignment.strategy") {
        if !s.value.contains("RangeAssignor") && !s.value.split(',').any(|v| v.trim() == "range") {
            cr.diags.warning(
                Some(&s.origin),
                Some(&s.value),
                "kmirror's members offer only the range assignor; a group needs one strategy all its members offer, so list org.apache.kafka.clients.consumer.RangeAssignor too",
            );
        }
    }
    if let Some(s) = cr.get("group.protocol") {
        if !s.value.trim().eq_ignore_ascii_case("classic") {
            cr.diags.warning(
                Some(&s.origin),
                Some(&s.value),
                "kmirror joins groups with the classic protocol (JoinGroup/SyncGroup)",
            );
        }
    }
    if heartbeat_interval >= session_timeout {
        if let Some(s) = cr.get("heartbeat.interval.ms") {
            cr.diags.error(
                Some(&s.origin),
                Some(&s.value),
                "must be lower than session.timeout.ms (a third of it is usual)",
            );
        }
    }
    let schemas = schemas(&cmap, &pmap, &producer.source, &mut diags, &mut ignored);
    let transforms = match &args.transforms {
        Some(p) => super::transforms::parse(&super::values::settings_of(p), &mut diags),
        None => Chain::default(),
    };
    if let (Some(c), Some(p)) = (&consumer_settings, &producer_settings) {
        let shared = super::flow::shared_addresses(&c.bootstrap, &p.bootstrap);
        if !shared.is_empty() {
            diags.error(
                None,
                None,
                format!("the consumer and the producer share the address {}: mirroring a cluster into itself would copy its data forever", shared.join(", ")),
            );
        }
    }
    match (consumer_settings, producer_settings) {
        (Some(c), Some(p)) if !diags.has_errors() => Ok(LegacyConfig {
            consumer_file: consumer.source.clone(),
            producer_file: producer.source.clone(),
            topics,
            group_id,
            num_streams,
            offset_commit_interval,
            abort_on_send_failure,
            exclude_internal_topics,
            consumer: c,
            consumer_tuning,
            producer: p,
            producer_tuning,
            session_timeout,
            heartbeat_interval,
            rebalance_timeout,
            metadata_refresh,
            create_topics,
            loop_prevention,
            rate_limit,
            transforms,
            schemas,
            ignored,
            diagnostics: diags,
        }),
        _ => Err(ConfigError(diags)),
    }
}

/// Schema sync in MM1 mode: each file's registry keys (as the Confluent serializers in those
/// clients would read them), `kmirror.schemas.*` from the consumer file. Those keys are listed
/// as ignored when no sync results.
fn schemas(
    cmap: &SettingMap,
    pmap: &SettingMap,
    producer_file: &str,
    diags: &mut Diagnostics,
    ignored: &mut Vec<IgnoredKey>,
) -> Option<super::model::SchemaSync> {
    let mut map = SettingMap::new();
    for (side, m) in [("source.cluster.", cmap), ("target.cluster.", pmap)] {
        for (k, v) in m.iter().filter(|(k, _)| super::schemas::is_registry_key(k)) {
            map.insert(format!("{side}{k}"), v.clone());
        }
    }
    for k in super::schemas::FLOW_KEYS {
        if let Some(v) = cmap.get(k) {
            map.insert(k.to_string(), v.clone());
        }
    }
    let hint = format!("schema.registry.url in {producer_file}");
    let sync = super::schemas::build_with("MM1 mode", &hint, &map, diags);
    let both = ["source.cluster.", "target.cluster."]
        .iter()
        .all(|side| map.contains_key(&format!("{side}schema.registry.url")));
    if sync.is_none() {
        for k in super::schemas::FLOW_KEYS {
            let moot = k != "kmirror.schemas.enabled" || !both;
            if let (Some(v), true) = (cmap.get(k), moot) {
                ignored.push(IgnoredKey {
                    origin: v.origin.clone(),
                    reason: "used only while schemas are synced: both the consumer and the producer file name a schema registry (schema.registry.url) and kmirror.schemas.enabled is not false".into(),
                    did_you_mean: None,
                });
            }
        }
    }
    sync
}

/// Consumer keys that only MM1 mode reads (it is a member of an ordinary consumer group).
const LEGACY_CONSUMER_KEYS: &[&str] = &[
    "exclude.internal.topics",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "metadata.max.age.ms",
    "partition.assignment.strategy",
    "group.protocol",
];

fn resolve(
    props: &Properties,
    env: &dyn Environment,
    diags: &mut Diagnostics,
    honoured: &[&str],
    ignored: &mut Vec<IgnoredKey>,
) -> SettingMap {
    let file: Arc<str> = Arc::from(props.source.as_str());
    let origin = |p: &super::properties::Property| Origin {
        file: file.clone(),
        line: p.line,
        key: p.key.clone(),
    };
    for p in props.iter() {
        if p.key.starts_with("config.providers") {
            continue;
        }
        if !keys::is_client_key(&p.key)
            && !honoured.contains(&p.key.as_str())
            && !super::schemas::is_registry_key(&p.key)
        {
            let (reason, hint) = match keys::ignored_client_key(&p.key) {
                Some(r) => (r.to_string(), None),
                None => (
                    "unknown key: not used by kmirror".to_string(),
                    keys::did_you_mean(&p.key, honoured.iter().copied()),
                ),
            };
            ignored.push(IgnoredKey {
                origin: origin(p),
                reason,
                did_you_mean: hint,
            });
        }
    }
    let mut out = super::front::read(props, None, env, diags).settings;
    out.retain(|k, _| !k.starts_with("config.providers"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_files(consumer: &str, producer: &str) -> Result<LegacyConfig, ConfigError> {
        let c = Properties::parse(
            &format!("bootstrap.servers = a:9092\ngroup.id = g\n{consumer}"),
            "consumer.properties",
        )
        .unwrap();
        let p = Properties::parse(
            &format!("bootstrap.servers = b:9092\n{producer}"),
            "producer.properties",
        )
        .unwrap();
        let args = LegacyArgs {
            include: Some("orders".into()),
            ..LegacyArgs::default()
        };
        load(&c, &p, &args, &crate::config::providers::SystemEnvironment)
    }

    #[test]
    fn schema_registries_come_from_the_client_files() {
        let c = load_files(
            "schema.registry.url = http://sr-a:8081\nbasic.auth.user.info = u:sr-secret\nkmirror.schemas.ids = translate\nkmirror.schemas.refresh.interval.seconds = 5\n",
            "schema.registry.url = http://sr-b:8081\nschema.registry.ssl.endpoint.identification.algorithm =\n",
        )
        .unwrap();
        assert!(c.ignored.is_empty(), "{:?}", c.ignored);
        let s = c.schemas.expect("both files name a registry");
        assert_eq!(s.ids, super::super::model::IdsMode::Translate);
        assert_eq!(s.refresh, Duration::from_secs(5));
        assert_eq!(s.target.0.url, "http://sr-b:8081");
        // Only the consumer's: a warning naming the producer file; kmirror's keys listed as
        // ignored (they have no effect).
        let c = load_files(
            "schema.registry.url = http://sr-a:8081\nkmirror.schemas.ids = translate\n",
            "",
        )
        .unwrap();
        assert!(c.schemas.is_none());
        let warnings: Vec<String> = c.diagnostics.warnings().map(|w| w.to_string()).collect();
        assert!(
            warnings.len() == 1
                && warnings[0].contains("schema.registry.url in producer.properties"),
            "{warnings:?}"
        );
        assert_eq!(c.ignored.len(), 1, "{:?}", c.ignored);
        assert_eq!(c.ignored[0].origin.key, "kmirror.schemas.ids");
    }

    #[test]
    fn mm1_whitelist_rewriting() {
        assert_eq!(
            mm1_topic_regex("\"projects.*, orders\""),
            "projects.*|orders"
        );
        assert_eq!(mm1_topic_regex("a,b"), "a|b");
    }
}
