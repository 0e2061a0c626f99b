//! `kmirror legacy --plan`: what an MM1 command line will do, in words, before it runs.

use crate::config::legacy::LegacyConfig;
use crate::plan::{crc_check, describe_security};
use std::fmt::Write;

/// The text plan of an MM1 command line: topics, both clusters (secrets masked), streams,
/// commits, failure handling, start, checks, partitioning, topic creation, rate limit,
/// transforms, ignored keys and warnings.
pub fn text(cfg: &LegacyConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "kmirror legacy plan (MirrorMaker 1 command line)");
    let _ = writeln!(
        out,
        "  topics        {} (same names on the target)",
        cfg.topics.items().join(", ")
    );
    let _ = writeln!(
        out,
        "  source        {}  {}  group {}",
        cfg.consumer
            .bootstrap
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(","),
        describe_security(&cfg.consumer),
        cfg.group_id
    );
    let _ = writeln!(
        out,
        "  target        {}  {}",
        cfg.producer
            .bootstrap
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(","),
        describe_security(&cfg.producer)
    );
    let _ = writeln!(out, "  streams       {}", cfg.num_streams);
    let _ = writeln!(
        out,
        "  commit every  {} ms (only records the target acknowledged)",
        cfg.offset_commit_interval.as_millis()
    );
    let _ = writeln!(
        out,
        "  on send failure  {}",
        if cfg.abort_on_send_failure {
            "stop"
        } else {
            "log, count and continue"
        }
    );
    let _ = writeln!(
        out,
        "  start         {:?} when the group has no committed offset",
        cfg.consumer_tuning.auto_offset_reset
    );
    let _ = writeln!(
        out,
        "  checks        {}",
        crc_check(cfg.consumer_tuning.check_crcs)
    );
    let _ = writeln!(out,
            "  partitions    Java's default partitioner on the target (murmur2 of the key; keyless records sticky per batch)"
        );
    let _ = writeln!(
        out,
        "  target topics {}",
        if cfg.create_topics {
            "created when missing, with the source's partition count and configs"
        } else {
            "not created (the target's auto.create.topics.enable decides)"
        }
    );
    let _ = writeln!(
        out,
        "  loop guard    {}",
        if cfg.loop_prevention {
            "on: what kmirror copied into the source from the target is left out; producer ids registered in the target's kmirror-producers.internal"
        } else {
            "off (--loop.prevention true for two processes copying both ways under the same names)"
        }
    );
    let _ = match cfg.rate_limit {
        Some(l) => writeln!(out, "  rate limit    {l} fetched bytes per second"),
        None => writeln!(out, "  rate limit    none"),
    };
    for t in cfg.transforms.describe() {
        let _ = writeln!(out, "  transform     {t}");
    }
    let _ = match &cfg.schemas {
        Some(sc) => writeln!(
            out,
            "  schemas       from {} to {}, ids {}, every {} s: subjects of the copied topics (same names){}; a stream waits until the schemas its records name are on the target",
            kmirror_kafka::secret::redact_url(&sc.source.0.url),
            kmirror_kafka::secret::redact_url(&sc.target.0.url),
            match sc.ids {
                crate::config::model::IdsMode::Keep => "kept (IMPORT mode, checked first)",
                crate::config::model::IdsMode::Translate => "translated in every record",
            },
            sc.refresh.as_secs(),
            if sc.subjects.items().is_empty() {
                String::new()
            } else {
                format!(" and {}", sc.subjects.items().join(", "))
            }
        ),
        None => writeln!(
            out,
            "  schemas       off (schema.registry.url in both the consumer and the producer file copies subjects and schema ids)"
        ),
    };
    for i in &cfg.ignored {
        let hint = i
            .did_you_mean
            .as_ref()
            .map(|h| format!(" (did you mean '{h}'?)"))
            .unwrap_or_default();
        let _ = writeln!(out, "  ignored       {}: {}{hint}", i.origin, i.reason);
    }
    for w in cfg.diagnostics.warnings() {
        let _ = writeln!(out, "  {w}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::legacy::{load, LegacyArgs};
    use crate::config::properties::Properties;
    use crate::config::providers::SystemEnvironment;

    #[test]
    fn the_plan_says_what_the_command_line_does_with_secrets_hidden() {
        let consumer = Properties::parse(
            "bootstrap.servers=old:9092\ngroup.id=mm1\nsecurity.protocol=SASL_PLAINTEXT\n\
             sasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"s3cret-pw\";\n",
            "consumer.properties",
        )
        .unwrap();
        let producer =
            Properties::parse("bootstrap.servers=new:9092\n", "producer.properties").unwrap();
        let args = LegacyArgs {
            whitelist: Some("orders,payments.*".into()),
            num_streams: Some("3".into()),
            ..LegacyArgs::default()
        };
        let cfg = load(&consumer, &producer, &args, &SystemEnvironment).unwrap();
        let t = text(&cfg);
        for expected in [
            "kmirror legacy plan (MirrorMaker 1 command line)",
            "  topics        orders|payments.* (same names on the target)",
            "  source        old:9092  SASL_PLAINTEXT PLAIN",
            "group mm1",
            "  target        new:9092  PLAINTEXT",
            "  streams       3",
            "  rate limit    none",
            "  loop guard    off",
        ] {
            assert!(t.contains(expected), "{expected:?} not in:\n{t}");
        }
        assert!(!t.contains("s3cret-pw"), "{t}");
    }
}
