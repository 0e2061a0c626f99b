//! A fetched record set as a broker might send it: split into batches, each CRC-checked,
//! decoded within a bound and rewritten for produce. Nothing may panic, and no allocation may
//! exceed what the bytes can hold or the bound allows (scripts/fuzz.sh sets libFuzzer's
//! -malloc_limit_mb).
#![no_main]

use bytes::Bytes;
use kmirror_kafka::batch::{keep_until_corrupt, split_batches};
use kmirror_kafka::records::{decode_batch_within, DecodeError};
use libfuzzer_sys::fuzz_target;

const BOUND: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok((mut batches, _truncated)) = split_batches(Bytes::copy_from_slice(data)) else {
        return;
    };
    for b in &batches {
        // A batch that frames must describe itself without panicking.
        let _ = (b.last_offset(), b.codec(), b.offsets_contiguous(), format!("{b:?}"));
        match decode_batch_within(b, BOUND) {
            Ok(records) => {
                for r in &records {
                    assert!(r.offset >= b.base_offset() && r.offset <= b.last_offset());
                }
                let kept = records.iter().map(|r| r.value.as_ref().map_or(0, |v| v.len())).sum::<usize>();
                assert!(kept <= BOUND);
            }
            Err(DecodeError::TooLarge { limit, .. }) => assert_eq!(limit, BOUND),
            Err(DecodeError::Malformed(_)) => {}
        }
    }
    let _ = keep_until_corrupt(&mut batches);
    for b in &batches {
        let out = b.rewrite_for_produce(7, 1, 0, false);
        assert!(out.crc_valid(), "a rewritten batch carries a valid CRC");
        assert_eq!(&out.bytes()[61..], &b.bytes()[61..]);
    }
});
