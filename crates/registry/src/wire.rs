//! The Confluent wire format of a record key or value: a zero "magic" byte, then the schema id
//! as a 4-byte big-endian integer, then the serialized data (for Protobuf, the message indexes
//! come first in it; they do not depend on the registry, so a translated record keeps them).
//! Bytes from the network: nothing here assumes more than it checks.

use crate::model::SchemaId;

/// The first byte of the wire format.
pub const MAGIC: u8 = 0;
/// The magic byte and the id.
pub const HEADER_LEN: usize = 5;

/// The schema id of `payload`, if it is in the wire format (at least the header, magic byte
/// first). A payload that is not returns None: it is copied as it is.
pub fn schema_id(payload: &[u8]) -> Option<SchemaId> {
    match payload {
        [MAGIC, a, b, c, d, ..] => Some(SchemaId(i32::from_be_bytes([*a, *b, *c, *d]))),
        _ => None,
    }
}

/// `payload` with its schema id replaced by `id`; None when it is not in the wire format.
pub fn with_schema_id(payload: &[u8], id: SchemaId) -> Option<Vec<u8>> {
    schema_id(payload)?;
    let mut out = payload.to_vec();
    out[1..HEADER_LEN].copy_from_slice(&id.0.to_be_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_read_only_from_a_whole_header_with_the_magic_byte() {
        assert_eq!(schema_id(&[0, 0, 0, 1, 2, 9, 9]), Some(SchemaId(258)));
        assert_eq!(schema_id(&[0, 0, 0, 0, 7]), Some(SchemaId(7)));
        assert_eq!(schema_id(&[0, 0, 0, 1]), None, "a header cut short");
        assert_eq!(schema_id(&[1, 0, 0, 0, 7, 1]), None, "another magic byte");
        assert_eq!(schema_id(b""), None);
        assert_eq!(schema_id(b"{\"json\": true}"), None);
    }

    #[test]
    fn a_new_id_changes_only_the_four_id_bytes() {
        let payload = [0, 0, 0, 0, 7, 0xde, 0xad, 0xbe, 0xef];
        let out = with_schema_id(&payload, SchemaId(0x01020304)).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(schema_id(&out), Some(SchemaId(0x01020304)));
        assert_eq!(with_schema_id(b"plain", SchemaId(1)), None);
    }
}
