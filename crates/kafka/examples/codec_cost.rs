//! What decoding and re-encoding small compressed batches costs, per codec and batch shape:
//! the CPU side of merging small batches (docs/benchmarks.md). No broker.
//!
//!     cargo run --release -p kmirror-kafka --example codec_cost
use bytes::Bytes;
use kmirror_kafka::batch::{Codec, RawBatch};
use kmirror_kafka::records::{decode_batch, encode_batch, encode_within, BatchOptions, Record};
use std::time::Instant;

/// Values like the bench's Load.java: 1,024 payloads of random capital letters, keys "key-N".
fn batches(codec: Codec, per_batch: usize, size: usize, n: usize) -> Vec<RawBatch> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let values: Vec<Bytes> = (0..1024)
        .map(|_| {
            Bytes::from(
                (0..size)
                    .map(|_| b'A' + (rnd() % 26) as u8)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let mut offset = 0i64;
    (0..n)
        .map(|_| {
            let records: Vec<Record> = (0..per_batch)
                .map(|i| Record {
                    offset: i as i64,
                    timestamp: 1_700_000_000_000 + i as i64,
                    key: Some(Bytes::from(format!("key-{}", rnd() % 100_000))),
                    value: Some(values[(rnd() % 1024) as usize].clone()),
                    headers: vec![],
                })
                .collect();
            let b = encode_batch(
                &records,
                &BatchOptions {
                    codec,
                    ..BatchOptions::default()
                },
            )
            .unwrap();
            let mut bytes = b.bytes().to_vec();
            bytes[..8].copy_from_slice(&offset.to_be_bytes());
            offset += per_batch as i64;
            RawBatch::new(Bytes::from(bytes)).unwrap()
        })
        .collect()
}

fn main() {
    for (codec, per_batch, size) in [
        (Codec::Zstd, 5, 200),
        (Codec::Zstd, 40, 200),
        (Codec::Lz4, 5, 200),
        (Codec::Lz4, 150, 100),
        (Codec::None, 150, 100),
    ] {
        let run = batches(codec, per_batch, size, 3_000_000 / (per_batch * size));
        // Once to warm up (thread-local contexts, allocator), once measured.
        let _ = merge_cost(codec, size, &run);
        let (decode, encode, out, decoded) = merge_cost(codec, size, &run);
        let source_bytes: usize = run.iter().map(|b| b.bytes().len()).sum();
        let plain_mb = (run.len() * per_batch * size) as f64 / 1e6;
        println!(
            "{codec:?} {per_batch} x {size} B: {} batches of {} B avg, {decoded} records; decode {:.2} CPU-s/GB, encode {:.2} CPU-s/GB ({:.0}% of source bytes out)",
            run.len(),
            source_bytes / run.len(),
            decode / plain_mb * 1000.0,
            encode / plain_mb * 1000.0,
            out as f64 * 100.0 / source_bytes as f64,
        );
    }
}

/// Decodes every batch, then encodes the records again in runs of about 256 KiB (as merging
/// does): (decode seconds, encode seconds, bytes out, records).
fn merge_cost(codec: Codec, size: usize, run: &[RawBatch]) -> (f64, f64, usize, usize) {
    {
        let t = Instant::now();
        let mut decoded = 0;
        let mut records = Vec::new();
        for b in run {
            let r = decode_batch(b).unwrap();
            decoded += r.len();
            records.extend(r);
        }
        let decode = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut out = 0;
        for chunk in records.chunks(records.len().min(256 * 1024 / size)) {
            let o = BatchOptions {
                codec,
                ..BatchOptions::default()
            };
            for (b, _) in encode_within(chunk, &o, 1 << 20).unwrap() {
                out += b.bytes().len();
            }
        }
        let encode = t.elapsed().as_secs_f64();
        (decode, encode, out, decoded)
    }
}
