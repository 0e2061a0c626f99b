//! Heartbeat, Checkpoint and OffsetSync keys and values in Kafka's legacy `Schema` encoding:
//! big-endian integers, strings as an int16 length and UTF-8 bytes; Heartbeat and Checkpoint
//! values start with an int16 version (0); readers ignore trailing bytes (mm2-compatibility §3).

use bytes::{Buf, BufMut, BytesMut};

/// A record that cannot be decoded (MM2's readers skip those).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {what}: {why}")]
pub struct WireError {
    pub what: &'static str,
    pub why: String,
}

fn put_str(b: &mut BytesMut, s: &str, what: &'static str) -> Result<(), WireError> {
    let len = i16::try_from(s.len()).map_err(|_| WireError {
        what,
        why: format!("string of {} bytes exceeds 32767", s.len()),
    })?;
    b.put_i16(len);
    b.put_slice(s.as_bytes());
    Ok(())
}

fn get_str(b: &mut &[u8], what: &'static str) -> Result<String, WireError> {
    if b.remaining() < 2 {
        return Err(WireError {
            what,
            why: "truncated string length".into(),
        });
    }
    let len = b.get_i16();
    if len < 0 || b.remaining() < len as usize {
        return Err(WireError {
            what,
            why: format!("bad string length {len}"),
        });
    }
    let s = std::str::from_utf8(&b[..len as usize])
        .map_err(|e| WireError {
            what,
            why: e.to_string(),
        })?
        .to_string();
    b.advance(len as usize);
    Ok(s)
}

fn need(b: &&[u8], n: usize, what: &'static str) -> Result<(), WireError> {
    if b.remaining() < n {
        Err(WireError {
            what,
            why: "truncated".into(),
        })
    } else {
        Ok(())
    }
}

/// A heartbeat (topic `heartbeats` and its remote copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub source_cluster_alias: String,
    pub target_cluster_alias: String,
    pub timestamp: i64,
}

impl Heartbeat {
    pub fn key(&self) -> Result<Vec<u8>, WireError> {
        let mut b = BytesMut::new();
        put_str(&mut b, &self.source_cluster_alias, "heartbeat key")?;
        put_str(&mut b, &self.target_cluster_alias, "heartbeat key")?;
        Ok(b.to_vec())
    }

    pub fn value(&self) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i64(self.timestamp);
        b.to_vec()
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<Heartbeat, WireError> {
        let mut k = key;
        let source_cluster_alias = get_str(&mut k, "heartbeat key")?;
        let target_cluster_alias = get_str(&mut k, "heartbeat key")?;
        let mut v = value;
        need(&v, 10, "heartbeat value")?;
        let _version = v.get_i16();
        Ok(Heartbeat {
            source_cluster_alias,
            target_cluster_alias,
            timestamp: v.get_i64(),
        })
    }
}

/// A checkpoint (topic `<source>.checkpoints.internal`): a group's committed offset on the source
/// and its translation, keyed by the target-side topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub upstream_offset: i64,
    pub downstream_offset: i64,
    pub metadata: String,
}

impl Checkpoint {
    pub fn key(&self) -> Result<Vec<u8>, WireError> {
        let mut b = BytesMut::new();
        put_str(&mut b, &self.group, "checkpoint key")?;
        put_str(&mut b, &self.topic, "checkpoint key")?;
        b.put_i32(self.partition);
        Ok(b.to_vec())
    }

    pub fn value(&self) -> Result<Vec<u8>, WireError> {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i64(self.upstream_offset);
        b.put_i64(self.downstream_offset);
        put_str(&mut b, &self.metadata, "checkpoint value")?;
        Ok(b.to_vec())
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<Checkpoint, WireError> {
        let mut k = key;
        let group = get_str(&mut k, "checkpoint key")?;
        let topic = get_str(&mut k, "checkpoint key")?;
        need(&k, 4, "checkpoint key")?;
        let partition = k.get_i32();
        let mut v = value;
        need(&v, 18, "checkpoint value")?;
        let _version = v.get_i16();
        let upstream_offset = v.get_i64();
        let downstream_offset = v.get_i64();
        let metadata = get_str(&mut v, "checkpoint value")?;
        Ok(Checkpoint {
            group,
            topic,
            partition,
            upstream_offset,
            downstream_offset,
            metadata,
        })
    }
}

/// An offset sync (topic `mm2-offset-syncs.<alias>.internal`): where a source record landed on
/// the target. The topic is the source name, not renamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetSync {
    pub topic: String,
    pub partition: i32,
    pub upstream_offset: i64,
    pub downstream_offset: i64,
}

impl OffsetSync {
    pub fn key(&self) -> Result<Vec<u8>, WireError> {
        let mut b = BytesMut::new();
        put_str(&mut b, &self.topic, "offset sync key")?;
        b.put_i32(self.partition);
        Ok(b.to_vec())
    }

    pub fn value(&self) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i64(self.upstream_offset);
        b.put_i64(self.downstream_offset);
        b.to_vec()
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<OffsetSync, WireError> {
        let mut k = key;
        let topic = get_str(&mut k, "offset sync key")?;
        need(&k, 4, "offset sync key")?;
        let partition = k.get_i32();
        let mut v = value;
        need(&v, 16, "offset sync value")?;
        Ok(OffsetSync {
            topic,
            partition,
            upstream_offset: v.get_i64(),
            downstream_offset: v.get_i64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect()
    }

    #[test]
    fn heartbeat_matches_mm2_bytes() {
        let h = Heartbeat {
            source_cluster_alias: "source-1".into(),
            target_cluster_alias: "target-2".into(),
            timestamp: 1_234_567_890,
        };
        assert_eq!(
            h.key().unwrap(),
            hex("00 08 73 6f 75 72 63 65 2d 31 00 08 74 61 72 67 65 74 2d 32")
        );
        assert_eq!(h.value(), hex("00 00 00 00 00 00 49 96 02 d2"));
        assert_eq!(Heartbeat::decode(&h.key().unwrap(), &h.value()).unwrap(), h);
    }

    #[test]
    fn checkpoint_matches_mm2_bytes() {
        let mut c = Checkpoint {
            group: "group1".into(),
            topic: "A.topic1".into(),
            partition: 3,
            upstream_offset: 100,
            downstream_offset: 95,
            metadata: String::new(),
        };
        assert_eq!(
            c.key().unwrap(),
            hex("00 06 67 72 6f 75 70 31 00 08 41 2e 74 6f 70 69 63 31 00 00 00 03")
        );
        assert_eq!(
            c.value().unwrap(),
            hex("00 00 00 00 00 00 00 00 00 64 00 00 00 00 00 00 00 5f 00 00")
        );
        c.metadata = "meta".into();
        assert_eq!(
            c.value().unwrap(),
            hex("00 00 00 00 00 00 00 00 00 64 00 00 00 00 00 00 00 5f 00 04 6d 65 74 61")
        );
        assert_eq!(
            Checkpoint::decode(&c.key().unwrap(), &c.value().unwrap()).unwrap(),
            c
        );
    }

    #[test]
    fn offset_sync_matches_mm2_bytes() {
        let s = OffsetSync {
            topic: "topic1".into(),
            partition: 3,
            upstream_offset: 100,
            downstream_offset: 95,
        };
        assert_eq!(s.key().unwrap(), hex("00 06 74 6f 70 69 63 31 00 00 00 03"));
        assert_eq!(
            s.value(),
            hex("00 00 00 00 00 00 00 64 00 00 00 00 00 00 00 5f")
        );
        assert_eq!(
            OffsetSync::decode(&s.key().unwrap(), &s.value()).unwrap(),
            s
        );
    }

    #[test]
    fn newer_versions_with_trailing_fields_still_decode_and_garbage_does_not_panic() {
        let h = Heartbeat {
            source_cluster_alias: "a".into(),
            target_cluster_alias: "b".into(),
            timestamp: 7,
        };
        let mut v = h.value();
        v[1] = 1;
        v.extend_from_slice(&[9, 9, 9]);
        assert_eq!(
            Heartbeat::decode(&h.key().unwrap(), &v).unwrap().timestamp,
            7
        );
        assert!(Checkpoint::decode(&[0, 5, 1], &[]).is_err());
        assert!(OffsetSync::decode(&[0xff, 0xff], &[0; 16]).is_err());
        assert!(Heartbeat::decode(&[0, 1, b'a', 0, 1, b'b'], &[0, 0]).is_err());
    }
}
