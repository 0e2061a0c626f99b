//! The records section of a batch behind a well-formed header: the first byte picks the codec
//! and timestamp type, the next four the record count, the rest is the (compressed) section.
//! This reaches every decompressor and the record decoder without the fuzzer having to find a
//! header that frames. Decompression bombs must stop at the bound.
#![no_main]

use bytes::{BufMut, BytesMut};
use kmirror_kafka::batch::{RawBatch, HEADER_LEN, LOG_OVERHEAD};
use kmirror_kafka::records::{decode_batch_within, DecodeError};
use libfuzzer_sys::fuzz_target;

const BOUND: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let attributes = (data[0] & 0x0f) as i16;
    let count = i32::from_be_bytes([data[1], data[2], data[3], data[4]]);
    let section = &data[5..];
    let mut b = BytesMut::with_capacity(HEADER_LEN + section.len());
    b.put_i64(1_000);
    b.put_i32((HEADER_LEN - LOG_OVERHEAD + section.len()) as i32);
    b.put_i32(0);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(attributes);
    b.put_i32(count.clamp(0, i32::MAX - 1));
    b.put_i64(1_700_000_000_000);
    b.put_i64(1_700_000_000_000);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(count);
    b.put_slice(section);
    let Ok(batch) = RawBatch::new(b.freeze()) else {
        return;
    };
    match decode_batch_within(&batch, BOUND) {
        Ok(records) => {
            assert!(records.len() <= count.max(0) as usize);
            let mut last = None;
            for r in &records {
                assert!(last.is_none_or(|l| r.offset > l), "offsets run upwards");
                assert!(r.offset <= batch.last_offset());
                last = Some(r.offset);
            }
        }
        Err(DecodeError::TooLarge { limit, .. }) => assert_eq!(limit, BOUND),
        Err(DecodeError::Malformed(_)) => {}
    }
});
