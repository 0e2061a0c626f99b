//! Writes the seed corpus (fuzz/corpus/<target>/seed-*) from real encodings, so each target
//! starts from inputs that reach deep: batches of every codec, MM2 records, typical patterns and
//! configuration files. Run from fuzz/: `cargo run --bin make_seeds`.

use bytes::Bytes;
use kmirror_kafka::batch::Codec;
use kmirror_kafka::records::{encode_batch, BatchOptions, Record};
use kmirror_mirror::wire::internal::{Checkpoint, Heartbeat, OffsetSync};
use std::fs;
use std::path::Path;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn main() {
    let codecs = [
        ("none", Codec::None),
        ("gzip", Codec::Gzip),
        ("snappy", Codec::Snappy),
        ("lz4", Codec::Lz4),
        ("zstd", Codec::Zstd),
    ];
    for (name, codec) in codecs {
        let records: Vec<Record> = (0..5)
            .map(|i| Record {
                offset: i,
                timestamp: 1_764_800_000_000 + i,
                key: (i % 2 == 0).then(|| Bytes::from(format!("key-{i}"))),
                value: Some(Bytes::from("value ".repeat(1 + i as usize))),
                headers: vec![(Bytes::from("h"), Some(Bytes::from("v")))],
            })
            .collect();
        let options = BatchOptions {
            codec,
            ..BatchOptions::default()
        };
        let one = encode_batch(&records, &options).unwrap();
        let two = encode_batch(&records[..2], &options).unwrap();
        write(
            "record_batches",
            name,
            &[one.bytes().as_ref(), two.bytes().as_ref()].concat(),
        );
        let mut section = vec![codec.bits() as u8];
        section.extend_from_slice(&5i32.to_be_bytes());
        section.extend_from_slice(&one.bytes()[61..]);
        write("records_section", name, &section);
    }
    let pair = |key: Vec<u8>, value: Vec<u8>| {
        let mut v = vec![key.len().min(255) as u8];
        v.extend(key);
        v.extend(value);
        v
    };
    let h = Heartbeat {
        source_cluster_alias: "A".into(),
        target_cluster_alias: "B".into(),
        timestamp: 1_764_800_000_000,
    };
    write("mm2_formats", "heartbeat", &pair(h.key().unwrap(), h.value()));
    let c = Checkpoint {
        group: "orders-app".into(),
        topic: "A.orders".into(),
        partition: 3,
        upstream_offset: 1_000,
        downstream_offset: 990,
        metadata: String::new(),
    };
    write(
        "mm2_formats",
        "checkpoint",
        &pair(c.key().unwrap(), c.value().unwrap()),
    );
    let s = OffsetSync {
        topic: "orders".into(),
        partition: 3,
        upstream_offset: 1_000,
        downstream_offset: 990,
    };
    write("mm2_formats", "offset-sync", &pair(s.key().unwrap(), s.value()));
    write(
        "mm2_formats",
        "position",
        &pair(
            br#"["MirrorSourceConnector",{"cluster":"A","partition":3,"topic":"orders"}]"#.to_vec(),
            br#"{"offset":1000}"#.to_vec(),
        ),
    );
    for (name, p) in [
        ("alternation", "orders|payments\\..*"),
        ("classes", "[a-z&&[^aeiou]]+_\\p{Alpha}{2,}"),
        ("quoted", "\\Qa.b\\E(?i)x(?-i)y"),
        ("groups", "(?<name>t[0-9]+)-(?:dev|prod)$"),
    ] {
        write("java_regex", name, p.as_bytes());
    }
    write(
        "config_text",
        "mm2",
        b"clusters = A, B\nA.bootstrap.servers = 127.0.0.1:9092\nB.bootstrap.servers = 127.0.0.1:9093\n\
A->B.enabled = true\nA->B.topics = orders.*\nreplication.factor = 1\n\
A.security.protocol = SASL_SSL\nA.sasl.mechanism = PLAIN\nB.config.providers = env\n\
B.config.providers.env.class = org.apache.kafka.common.config.provider.EnvVarConfigProvider\n",
    );
    write(
        "config_text",
        "jaas",
        b"org.apache.kafka.common.security.scram.ScramLoginModule required username=\"alice\"",
    );
}
