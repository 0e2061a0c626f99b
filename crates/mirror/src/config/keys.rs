//! The catalogue of keys: which ones kmirror honours, which it knows and ignores (and why), and
//! "did you mean" hints for the rest. Nothing a user wrote is dropped without a word.

/// Java client keys that MM2 copies from `<alias>.<key>` into every client of that cluster
/// (MirrorClientConfig's client config: bootstrap, security, SSL and SASL settings).
pub fn is_client_key(key: &str) -> bool {
    key == "bootstrap.servers"
        || key == "security.protocol"
        || key.starts_with("ssl.")
        || key.starts_with("sasl.")
}

/// The security keys kmirror's client reads (the rest of `ssl.*`/`sasl.*` is reported as ignored).
pub const SECURITY_KEYS: &[&str] = &[
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.jaas.config",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.truststore.password",
    "ssl.truststore.certificates",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    // OAUTHBEARER (config/oauth.rs)
    "sasl.login.callback.handler.class",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.buffer.seconds",
    "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms",
    "sasl.login.retry.backoff.ms",
    "sasl.login.retry.backoff.max.ms",
    // AWS_MSK_IAM (config/aws_iam.rs)
    "sasl.client.callback.handler.class",
    // GSSAPI (config/kerberos.rs)
    "sasl.kerberos.service.name",
    "sasl.kerberos.krb5.conf",
];

/// For a client key: `None` if it is not one; `Some(None)` if kmirror reads it; otherwise why it
/// is ignored and the honoured key it looks like.
#[allow(clippy::type_complexity)]
pub fn classify_security_key(key: &str) -> Option<Option<(String, Option<String>)>> {
    if !is_client_key(key) {
        return None;
    }
    if SECURITY_KEYS.contains(&key) {
        return Some(None);
    }
    let hint = did_you_mean(key, SECURITY_KEYS.iter().copied());
    let reason = if hint.is_some() {
        "unknown TLS/SASL key".to_string()
    } else {
        "a TLS/SASL setting kmirror's client does not use (rustls picks protocols and ciphers; Kerberos tickets are renewed at 80 % of their life)".to_string()
    };
    Some(Some((reason, hint)))
}

/// Connector keys kmirror honours, with MM2's meaning (mm2-compatibility §1.2–§1.5).
pub const CONNECTOR_KEYS: &[&str] = &[
    "enabled",
    "name",
    "connector.class",
    "source.cluster.alias",
    "target.cluster.alias",
    "topics",
    "topics.exclude",
    "topics.blacklist",
    "groups",
    "groups.exclude",
    "groups.blacklist",
    "config.properties.exclude",
    "config.properties.blacklist",
    "use.defaults.from",
    "refresh.topics.enabled",
    "refresh.topics.interval.seconds",
    "refresh.groups.enabled",
    "refresh.groups.interval.seconds",
    "sync.topic.configs.enabled",
    "sync.topic.configs.interval.seconds",
    "sync.topic.acls.enabled",
    "sync.topic.acls.interval.seconds",
    "emit.heartbeats.enabled",
    "emit.heartbeats.interval.seconds",
    "emit.checkpoints.enabled",
    "emit.checkpoints.interval.seconds",
    "sync.group.offsets.enabled",
    "sync.group.offsets.interval.seconds",
    "replication.factor",
    "offset-syncs.topic.replication.factor",
    "checkpoints.topic.replication.factor",
    "heartbeats.topic.replication.factor",
    "offset.lag.max",
    "offset-syncs.topic.location",
    "emit.offset-syncs.enabled",
    "heartbeats.replication.enabled",
    "exactly.once.support",
    // With exactly-once: the number of transactional slots (docs/engine.md, "Exactly-once";
    // listed as ignored, since at-least-once does not use it), and Connect's transaction
    // boundaries.
    "tasks.max",
    "transaction.boundary",
    "transaction.boundary.interval.ms",
    "admin.timeout.ms",
    // kmirror's own: what to do when the source deleted records before they were copied.
    "kmirror.source.truncation",
    // kmirror's own: where a partition without a stored position starts.
    "kmirror.start.position",
    "kmirror.rate.limit.bytes.per.second",
    "kmirror.process.rate.limit.bytes.per.second",
    // kmirror's own: false re-encodes every batch (record mode) with the producer's codec.
    "kmirror.batch.mode.enabled",
    // kmirror's own: false forwards small batches one by one instead of merging them.
    "kmirror.batch.merge.enabled",
    // kmirror's own: how often positions are stored; whether a starting partition looks on the
    // target for what was copied after its stored position (docs/engine.md).
    "kmirror.positions.interval.ms",
    "kmirror.resume.from.target.enabled",
    "kmirror.loop.prevention.enabled",
    // kmirror's own: processes serving a flow share its partitions (docs/sharing.md).
    "kmirror.sharing.enabled",
    // kmirror's own: an exactly-once transaction is committed early at this size.
    "kmirror.exactly.once.transaction.max.bytes",
    "kmirror.sharing.group.id",
    "kmirror.sharing.session.timeout.ms",
    "kmirror.sharing.rebalance.timeout.ms",
    "kmirror.sharing.instance.id",
    // kmirror's own: remote names for listed topics instead of the policy's (topologies.md).
    "kmirror.topics.rename",
    // kmirror's own: the bound on one batch's decoded records.
    "kmirror.batch.max.decompressed.bytes",
    // kmirror's own: also copy consumer-group READ ACLs (MM2 copies topic ACLs only).
    "kmirror.sync.group.acls.enabled",
    // kmirror's own: schema sync between the clusters' registries (docs/schemas.md).
    "kmirror.schemas.enabled",
    "kmirror.schemas.ids",
    "kmirror.schemas.subjects",
    "kmirror.schemas.refresh.interval.seconds",
    "replication.policy.class",
    "replication.policy.separator",
    "replication.policy.internal.topic.separator.enabled",
    "topic.filter.class",
    "group.filter.class",
    "config.property.filter.class",
    "forwarding.admin.class",
    "transforms",
    "predicates",
];

/// `transforms.<alias>.*` and `predicates.<alias>.*`: Connect's SMT keys, read (and checked key
/// by key) by `config::transforms::parse`.
pub fn is_transform_key(key: &str) -> bool {
    key.starts_with("transforms.") || key.starts_with("predicates.")
}

/// Connector and Connect keys kmirror accepts but does not use, with the reason.
pub fn ignored_connector_key(key: &str) -> Option<&'static str> {
    Some(match key {
        "tasks.max" | "tasks.max.enforce" => {
            "kmirror has no Connect tasks: it replicates every source partition in parallel (with exactly-once, tasks.max is the number of transactional slots)"
        }
        "key.converter" | "value.converter" | "header.converter" => {
            "kmirror always copies record bytes unchanged (as MM2 with ByteArrayConverter)"
        }
        "consumer.poll.timeout.ms" => "kmirror's fetch loop has no poll timeout",
        "config.action.reload" | "metric.reporters" | "add.source.alias.to.metrics" => {
            "a Kafka Connect setting with no meaning for kmirror"
        }
        "use.incremental.alter.configs" => {
            "removed in Kafka 4.0; kmirror always uses incremental config updates"
        }
        k if k.starts_with("errors.") => {
            "a Kafka Connect error-handling setting; kmirror reports every error"
        }
        k if k.starts_with("key.converter.")
            || k.starts_with("value.converter.")
            || k.starts_with("header.converter.") =>
        {
            "kmirror always copies record bytes unchanged"
        }
        _ => return None,
    })
}

/// Top-level (or `<alias>.`) Kafka Connect worker settings: meaningless without a Connect worker.
pub fn ignored_worker_key(key: &str) -> Option<&'static str> {
    const PREFIXES: &[&str] = &[
        "offset.storage",
        "config.storage",
        "status.storage",
        "task.",
        "worker.",
        "offset.flush",
        "rest.",
        "listeners",
        "admin.listeners",
        "plugin.",
        "access.control.",
        "response.http.headers",
        "connector.client.config.override.policy",
        "scheduled.rebalance.max.delay.ms",
        "connect.protocol",
        "inter.worker.",
        "dedicated.mode.enable.internal.rest",
        "group.id",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "rebalance.timeout.ms",
        "internal.key.converter",
        "internal.value.converter",
        "topic.creation.enable",
        "auto.include.jmx.reporter",
        "metrics.",
        "exactly.once.source.support.",
    ];
    PREFIXES
        .iter()
        .any(|p| key.starts_with(p))
        .then_some("a Kafka Connect worker setting; kmirror has no Connect worker (positions are kept in mm2-offsets.<source>.internal as MM2 keeps them)")
}

/// Consumer keys kmirror honours (besides the client keys).
pub const CONSUMER_KEYS: &[&str] = &[
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.min.bytes",
    "fetch.max.wait.ms",
    "isolation.level",
    "auto.offset.reset",
    "check.crcs",
    "group.id",
    "client.id",
    "request.timeout.ms",
];

/// Producer keys kmirror honours (besides the client keys).
pub const PRODUCER_KEYS: &[&str] = &[
    "batch.size",
    "linger.ms",
    "compression.type",
    "acks",
    "max.request.size",
    "buffer.memory",
    "client.id",
    "request.timeout.ms",
    "transaction.timeout.ms",
];

/// Producer keys that MM2 mode reads and cannot use, with why: it forwards the source's
/// batches instead of batching records itself (docs/engine.md). Checked before
/// [`PRODUCER_KEYS`] in MM2 mode.
pub fn unused_in_mm2_mode(key: &str) -> Option<&'static str> {
    matches!(key, "batch.size" | "linger.ms").then_some(
        "MM2 mode forwards the source's record batches as fetched (runs of small ones merged up to 256 KiB, at most half of max.request.size) and sends at once; the producer's batching does not apply",
    )
}

/// Admin keys kmirror honours (besides the client keys).
pub const ADMIN_KEYS: &[&str] = &["client.id", "request.timeout.ms"];

/// Standard Java client keys that kmirror knows and does not need, with the reason.
pub fn ignored_client_key(key: &str) -> Option<&'static str> {
    Some(match key {
        "enable.auto.commit" | "auto.commit.interval.ms" => {
            "kmirror stores source positions itself, only after the target acknowledged the data"
        }
        "enable.idempotence" | "retries" | "max.in.flight.requests.per.connection" | "delivery.timeout.ms" | "max.block.ms" => {
            "kmirror's producer is always idempotent, retries without limit and keeps order"
        }
        "key.deserializer" | "value.deserializer" | "key.serializer" | "value.serializer" => {
            "kmirror copies bytes; there is nothing to (de)serialize"
        }
        "transactional.id" => "kmirror names its transactional ids as Kafka Connect does (<worker group.id>-<connector>-<slot>; exactly.once.support switches them on)",
        "partitioner.class" | "partitioner.ignore.keys" | "partitioner.adaptive.partitioning.enable" | "partitioner.availability.timeout.ms" => {
            "kmirror keeps the source partition (MM2 mode) or uses Kafka's default partitioner (legacy mode)"
        }
        "interceptor.classes" | "metric.reporters" | "auto.include.jmx.reporter" => {
            "Java plug-in classes cannot be loaded by kmirror"
        }
        "max.poll.records" | "max.poll.interval.ms" | "session.timeout.ms" | "heartbeat.interval.ms"
        | "partition.assignment.strategy" | "group.instance.id" | "group.protocol" | "exclude.internal.topics"
        | "allow.auto.create.topics" | "default.api.timeout.ms" | "client.rack"
        | "send.buffer.bytes" | "receive.buffer.bytes" | "metadata.max.age.ms"
        | "metadata.max.idle.ms" | "reconnect.backoff.ms" | "reconnect.backoff.max.ms" | "retry.backoff.ms"
        | "retry.backoff.max.ms" | "connections.max.idle.ms" | "client.dns.lookup" | "socket.connection.setup.timeout.ms"
        | "socket.connection.setup.timeout.max.ms" | "compression.gzip.level" | "compression.lz4.level"
        | "compression.zstd.level" | "metrics.num.samples" | "metrics.sample.window.ms" | "metrics.recording.level"
        | "enable.metrics.push" | "producer.type" => "a Java client setting kmirror's client does not use",
        "linger.ms" => "kmirror sends each fetched chunk as soon as it is encoded; waiting to fill batches would only add latency",
        _ => return None,
    })
}

/// The closest known key, if `key` looks like a typo of one.
pub fn did_you_mean<'a>(
    key: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == key {
            return None;
        }
        let d = strsim::damerau_levenshtein(key, c);
        let limit = (c.len() / 6).clamp(1, 3);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_keys() {
        for k in [
            "bootstrap.servers",
            "security.protocol",
            "ssl.truststore.location",
            "sasl.jaas.config",
        ] {
            assert!(is_client_key(k), "{k}");
        }
        for k in ["client.id", "fetch.max.bytes", "sslx"] {
            assert!(!is_client_key(k), "{k}");
        }
    }

    #[test]
    fn typos_get_hints() {
        let keys = CONNECTOR_KEYS.iter().copied();
        assert_eq!(
            did_you_mean("topics.exlude", keys.clone()).as_deref(),
            Some("topics.exclude")
        );
        assert_eq!(
            did_you_mean("sync.group.offset.enabled", keys.clone()).as_deref(),
            Some("sync.group.offsets.enabled")
        );
        assert_eq!(
            did_you_mean("replication.factr", keys.clone()).as_deref(),
            Some("replication.factor")
        );
        assert_eq!(did_you_mean("completely.different", keys.clone()), None);
        assert_eq!(did_you_mean("topics", keys), None);
    }

    #[test]
    fn ignored_keys_say_why() {
        assert!(ignored_connector_key("tasks.max")
            .unwrap()
            .contains("every source partition"));
        assert!(ignored_worker_key("offset.storage.replication.factor").is_some());
        assert!(ignored_client_key("enable.idempotence")
            .unwrap()
            .contains("idempotent"));
        assert_eq!(ignored_client_key("fetch.max.bytes"), None);
    }
}
