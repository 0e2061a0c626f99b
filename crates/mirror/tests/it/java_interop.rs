//! Byte compatibility with MirrorMaker 2's own Java classes (connect-mirror 4.x, run through the
//! harness's jars): kmirror encodes Heartbeat, Checkpoint and OffsetSync records exactly as Java
//! does, and Java decodes what kmirror writes. No broker needed; Java and the jars are.

use kmirror_mirror::wire::internal::{Checkpoint, Heartbeat, OffsetSync};
use kmirror_mirror::wire::positions::SourcePosition;
use kmirror_testkit::mirror_interop;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn kmirror_and_java_agree_byte_for_byte() {
    let java = mirror_interop(&["encode"]).unwrap();
    let ours = [
        Heartbeat {
            source_cluster_alias: "source-1".into(),
            target_cluster_alias: "target-2".into(),
            timestamp: 1234567890,
        },
        Heartbeat {
            source_cluster_alias: "é-ü".into(),
            target_cluster_alias: "B".into(),
            timestamp: -1,
        },
    ]
    .iter()
    .map(|h| format!("heartbeat {} {}", hex(&h.key().unwrap()), hex(&h.value())))
    .chain(
        [
            Checkpoint {
                group: "group1".into(),
                topic: "A.topic1".into(),
                partition: 3,
                upstream_offset: 100,
                downstream_offset: 95,
                metadata: String::new(),
            },
            Checkpoint {
                group: "g".into(),
                topic: "t".into(),
                partition: 0,
                upstream_offset: 1 << 40,
                downstream_offset: 7,
                metadata: "meta".into(),
            },
        ]
        .iter()
        .map(|c| {
            format!(
                "checkpoint {} {}",
                hex(&c.key().unwrap()),
                hex(&c.value().unwrap())
            )
        }),
    )
    .chain(
        [
            OffsetSync {
                topic: "topic1".into(),
                partition: 3,
                upstream_offset: 100,
                downstream_offset: 95,
            },
            OffsetSync {
                topic: "x".into(),
                partition: i32::MAX,
                upstream_offset: 0,
                downstream_offset: 0,
            },
        ]
        .iter()
        .map(|s| format!("offsetsync {} {}", hex(&s.key().unwrap()), hex(&s.value()))),
    )
    .collect::<Vec<String>>();
    let java: Vec<&str> = java.lines().collect();
    assert_eq!(java, ours.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn java_reads_what_kmirror_writes() {
    let h = Heartbeat {
        source_cluster_alias: "east".into(),
        target_cluster_alias: "west-2".into(),
        timestamp: 1_796_000_000_123,
    };
    let out = mirror_interop(&[
        "decode",
        "heartbeat",
        &hex(&h.key().unwrap()),
        &hex(&h.value()),
    ])
    .unwrap();
    assert_eq!(out.trim(), "east|west-2|1796000000123");
    let c = Checkpoint {
        group: "billing-v2".into(),
        topic: "east.orders".into(),
        partition: 11,
        upstream_offset: 123_456_789_012,
        downstream_offset: 123_456_789_000,
        metadata: "{\"app\":\"x\"}".into(),
    };
    let out = mirror_interop(&[
        "decode",
        "checkpoint",
        &hex(&c.key().unwrap()),
        &hex(&c.value().unwrap()),
    ])
    .unwrap();
    assert_eq!(
        out.trim(),
        "billing-v2|east.orders-11|123456789012|123456789000|{\"app\":\"x\"}"
    );
    let s = OffsetSync {
        topic: "orders".into(),
        partition: 4,
        upstream_offset: 77,
        downstream_offset: 70,
    };
    let out = mirror_interop(&[
        "decode",
        "offsetsync",
        &hex(&s.key().unwrap()),
        &hex(&s.value()),
    ])
    .unwrap();
    assert_eq!(out.trim(), "orders-4|77|70");
}

/// Connect finds a stored source position by the key's bytes, so MM2 resumes from a position
/// kmirror wrote (and kmirror from MM2's) only if both write the same bytes. This proves it
/// without running MM2, so the takeover test's MM2 runs need only show it end to end.
#[test]
fn connect_stores_positions_with_kmirror_bytes() {
    for (cluster, topic, partition, offset) in [
        ("A", "ledger", 0, 999),
        ("east-1", "orders.v2", 2_147_483_647, 1 << 40),
        ("é", "t_x", 7, -1),
    ] {
        let java = mirror_interop(&[
            "position",
            cluster,
            topic,
            &partition.to_string(),
            &offset.to_string(),
        ])
        .unwrap();
        let ours = SourcePosition {
            cluster: cluster.into(),
            topic: topic.into(),
            partition,
            offset,
        };
        assert_eq!(
            java.trim(),
            format!("position {} {}", hex(&ours.key()), hex(&ours.value())),
            "{ours:?}"
        );
    }
}
