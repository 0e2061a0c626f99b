//! Hostile record batches on stable Rust, in the normal test suite (scripts/fuzz.sh
//! runs the same decoders under cargo-fuzz for longer): decompression bombs of every codec and
//! mutated or random bytes never panic, and never allocate beyond the decompression bound. The
//! bound is proven with a limited global allocator: an allocation beyond the limit aborts this
//! test binary, which fails the suite loudly. This file holds one test, so no other test's
//! allocations share the limit.

use bytes::{BufMut, Bytes, BytesMut};
use cap::Cap;
use kmirror_kafka::batch::{keep_until_corrupt, split_batches, Codec, RawBatch, HEADER_LEN};
use kmirror_kafka::records::{
    decode_batch_within, encode_batch, BatchOptions, DecodeError, Record,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::alloc::System;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The decompression bound the decoders get here.
const BOUND: usize = 1 << 20;
/// What decoding may allocate beyond the bound: the output's growth step, the records' index,
/// and the decoders' own state (LZ4 frames may declare 4 MiB blocks; zstd's window).
const SLACK: usize = 16 << 20;

const CODECS: [Codec; 5] = [
    Codec::None,
    Codec::Gzip,
    Codec::Snappy,
    Codec::Lz4,
    Codec::Zstd,
];

/// Runs `f` with the allocator limited to what is allocated now plus `extra` bytes.
fn within<T>(extra: usize, f: impl FnOnce() -> T) -> T {
    ALLOCATOR
        .set_limit(ALLOCATOR.allocated() + extra)
        .expect("a limit above what is allocated");
    let out = f();
    ALLOCATOR.set_limit(usize::MAX).unwrap();
    out
}

/// One record whose value is `plain`, as a batch with `codec`.
fn batch_of(codec: Codec, plain: Bytes, records: usize) -> RawBatch {
    let records: Vec<Record> = (0..records)
        .map(|i| Record {
            offset: i as i64,
            timestamp: 1_764_800_000_000,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(plain.clone()),
            headers: vec![],
        })
        .collect();
    encode_batch(
        &records,
        &BatchOptions {
            codec,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

/// A batch header (valid framing and CRC) around `section`, claiming `count` records.
fn framed(codec: Codec, count: i32, section: &[u8]) -> RawBatch {
    let mut b = BytesMut::new();
    b.put_i64(0);
    b.put_i32((HEADER_LEN - 12 + section.len()) as i32);
    b.put_i32(0);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(codec.bits());
    b.put_i32((count - 1).max(0));
    b.put_i64(1_764_800_000_000);
    b.put_i64(1_764_800_000_000);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(count);
    b.put_slice(section);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    RawBatch::new(b.freeze()).unwrap()
}

/// Everything a reader does with fetched bytes: split, check, decode within the bound, rewrite.
fn read_all(bytes: Bytes) {
    let Ok((mut batches, _)) = split_batches(bytes) else {
        return;
    };
    for b in &batches {
        let _ = decode_batch_within(b, BOUND);
    }
    let _ = keep_until_corrupt(&mut batches);
    for b in &batches {
        assert!(b.rewrite_for_produce(1, 0, 0, false).crc_valid());
    }
}

#[test]
fn hostile_batches_never_panic_nor_allocate_beyond_the_bound() {
    // Decompression bombs: 32 MiB of one byte in each codec, a few KiB compressed.
    let plain = Bytes::from(vec![b'z'; 32 << 20]);
    for codec in &CODECS[1..] {
        let bomb = batch_of(*codec, plain.clone(), 1);
        assert!(
            bomb.bytes().len() < 2 << 20,
            "{codec:?}: {}",
            bomb.bytes().len()
        );
        let got = within(BOUND + SLACK, || decode_batch_within(&bomb, BOUND));
        assert!(
            matches!(got, Err(DecodeError::TooLarge { limit: BOUND, .. })),
            "{codec:?}: {got:?}"
        );
    }
    // Snappy blocks declaring 4 GiB from a few bytes, raw and in snappy-java's framing.
    let raw = framed(Codec::Snappy, 1, &[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0]);
    let mut xerial = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    xerial.extend_from_slice(&8u32.to_be_bytes());
    xerial.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0]);
    let framed_bomb = framed(Codec::Snappy, 1, &xerial);
    for b in [raw, framed_bomb] {
        let got = within(BOUND + SLACK, || decode_batch_within(&b, BOUND));
        assert!(matches!(got, Err(DecodeError::TooLarge { .. })), "{got:?}");
    }
    // A count of 2^31 - 1 records in a batch of a few bytes.
    let counted = framed(Codec::None, i32::MAX, &[0; 16]);
    let got = within(SLACK, || decode_batch_within(&counted, BOUND));
    assert!(matches!(got, Err(DecodeError::Malformed(_))), "{got:?}");

    // Real batches of every codec, mutated: bytes flipped, cut, spliced; and random bytes.
    let seeds: Vec<Bytes> = CODECS
        .iter()
        .map(|c| {
            let v = Bytes::from("value ".repeat(40));
            batch_of(*c, v, 7).into_bytes()
        })
        .collect();
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    let mutated = (
        0..seeds.len(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    runner
        .run(&mutated, |(seed, flips, cut, tail)| {
            let mut b = seeds[seed].to_vec();
            for (at, x) in flips {
                let i = at.index(b.len());
                b[i] ^= x.max(1);
            }
            b.truncate(cut.index(b.len() + 1));
            b.extend_from_slice(&tail);
            within(BOUND + SLACK, || read_all(Bytes::from(b)));
            Ok(())
        })
        .unwrap();
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..2048), |bytes| {
            within(BOUND + SLACK, || read_all(Bytes::from(bytes)));
            Ok(())
        })
        .unwrap();
    // Random records sections of every codec behind a valid header, claiming random counts.
    runner
        .run(
            &(
                0..CODECS.len(),
                any::<i32>(),
                proptest::collection::vec(any::<u8>(), 0..512),
            ),
            |(codec, count, section)| {
                let b = framed(CODECS[codec], count.max(0), &section);
                within(BOUND + SLACK, || {
                    let _ = decode_batch_within(&b, BOUND);
                });
                Ok(())
            },
        )
        .unwrap();
}
