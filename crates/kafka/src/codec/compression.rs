//! Compressing and decompressing a batch's records section.
//!
//! gzip and Snappy come from `kafka_protocol::compression`. LZ4 and zstd are driven here, through
//! the same `lz4` and `zstd` crates `kafka_protocol` uses, for two measured reasons
//! (`cargo run --release -p kmirror-kafka --example codec_cost`, docs/benchmarks.md "Small
//! compressed batches"):
//! - `kafka_protocol` creates a zstd context for every call, which is most of the cost of a batch
//!   of a few records (7.8 CPU-s/GB to decode 800-byte batches); here each thread keeps one
//!   compression and one decompression context.
//! - it compresses LZ4 at level 4, which is LZ4HC (17 CPU-s/GB). kmirror only re-encodes to merge
//!   small batches or to change records, so it uses LZ4's fast mode, and zstd's level 1, and
//!   keeps the broker's own codec choice: the source producer's level is not recorded in a batch,
//!   so no replicator can keep it.

use super::batch::Codec;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Snappy};
use std::cell::RefCell;
use std::io::{Read, Write};

/// zstd's fastest regular level: merged runs are re-compressed once per copy, and the target
/// broker keeps whatever level arrives.
const ZSTD_LEVEL: i32 = 1;

/// LZ4 frame level 0: the fast (non-HC) compressor.
const LZ4_LEVEL: u32 = 0;

thread_local! {
    static ZSTD_COMPRESS: RefCell<zstd::zstd_safe::CCtx<'static>> = RefCell::new(zstd_compressor());
    static ZSTD_DECOMPRESS: RefCell<zstd::zstd_safe::DCtx<'static>> =
        RefCell::new(zstd::zstd_safe::DCtx::create());
}

fn zstd_compressor() -> zstd::zstd_safe::CCtx<'static> {
    let mut c = zstd::zstd_safe::CCtx::create();
    // Only fails for an out-of-range level; ZSTD_LEVEL is a valid constant.
    let _ = c.set_parameter(zstd::zstd_safe::CParameter::CompressionLevel(ZSTD_LEVEL));
    c
}

fn zstd_error(code: usize) -> String {
    zstd::zstd_safe::get_error_name(code).to_string()
}

/// Appends `plain` compressed with `codec` to `out`.
pub(crate) fn compress(codec: Codec, plain: &[u8], out: &mut BytesMut) -> Result<(), String> {
    let fill = |tmp: &mut BytesMut| {
        tmp.put_slice(plain);
        Ok(())
    };
    match codec {
        Codec::None => {
            out.put_slice(plain);
            Ok(())
        }
        Codec::Gzip => Gzip::compress(out, fill).map_err(|e| e.to_string()),
        Codec::Snappy => Snappy::compress(out, fill).map_err(|e| e.to_string()),
        Codec::Lz4 => {
            // Independent blocks: Kafka's Java reader (KafkaLZ4BlockInputStream) refuses linked
            // ones.
            let mut encoder = lz4::EncoderBuilder::new()
                .level(LZ4_LEVEL)
                .block_mode(lz4::BlockMode::Independent)
                .build(out.writer())
                .map_err(|e| e.to_string())?;
            encoder.write_all(plain).map_err(|e| e.to_string())?;
            encoder.finish().1.map_err(|e| e.to_string())
        }
        Codec::Zstd => ZSTD_COMPRESS.with(|c| {
            let mut c = c.borrow_mut();
            let mut buf = Vec::with_capacity(zstd::zstd_safe::compress_bound(plain.len()));
            c.compress2(&mut buf, plain).map_err(zstd_error)?;
            out.put_slice(&buf);
            Ok(())
        }),
    }
}

/// Decompresses a records section written with `codec`.
pub(crate) fn decompress(codec: Codec, section: Bytes) -> Result<Bytes, String> {
    match codec {
        Codec::None => Ok(section),
        Codec::Gzip => Gzip::decompress(&mut section.clone(), |b: &mut Bytes| Ok(b.clone()))
            .map_err(|e| e.to_string()),
        Codec::Snappy => Snappy::decompress(&mut section.clone(), |b: &mut Bytes| Ok(b.clone()))
            .map_err(|e| e.to_string()),
        Codec::Lz4 => {
            let mut plain = Vec::with_capacity(section.len() * 2);
            let mut d = lz4::Decoder::new(&section[..]).map_err(|e| e.to_string())?;
            d.read_to_end(&mut plain).map_err(|e| e.to_string())?;
            // read_to_end stops quietly at a cut frame; finish says whether the end mark came.
            d.finish()
                .1
                .map_err(|_| "truncated LZ4 frame".to_string())?;
            Ok(plain.into())
        }
        Codec::Zstd => ZSTD_DECOMPRESS.with(|d| zstd_decompress(&mut d.borrow_mut(), &section)),
    }
}

/// Decompresses every zstd frame in `src` (a producer may write more than one) with a reused
/// context.
fn zstd_decompress(d: &mut zstd::zstd_safe::DCtx<'static>, src: &[u8]) -> Result<Bytes, String> {
    use zstd::zstd_safe::{InBuffer, OutBuffer, ResetDirective};
    // A call that failed mid-frame leaves the context there.
    d.reset(ResetDirective::SessionOnly).map_err(zstd_error)?;
    let mut out: Vec<u8> = Vec::with_capacity((src.len() * 4).clamp(1024, 1 << 20));
    let mut input = InBuffer::around(src);
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.capacity());
        }
        let len = out.len();
        let mut o = OutBuffer::around_pos(&mut out, len);
        let hint = d
            .decompress_stream(&mut o, &mut input)
            .map_err(zstd_error)?;
        let full = o.pos() == o.capacity();
        if input.pos() == src.len() {
            if hint == 0 {
                return Ok(out.into());
            }
            if !full {
                return Err("truncated zstd frame".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..50_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect()
    }

    #[test]
    fn every_codec_round_trips_and_lz4_and_zstd_read_what_kafka_protocol_writes() {
        let plain = sample();
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let mut out = BytesMut::new();
            compress(codec, &plain, &mut out).unwrap();
            assert_eq!(decompress(codec, out.freeze()).unwrap(), plain, "{codec:?}");
        }
        let mut theirs = BytesMut::new();
        kafka_protocol::compression::Zstd::compress(&mut theirs, |b: &mut BytesMut| {
            b.put_slice(&plain);
            Ok(())
        })
        .unwrap();
        assert_eq!(decompress(Codec::Zstd, theirs.freeze()).unwrap(), plain);
        let mut theirs = BytesMut::new();
        kafka_protocol::compression::Lz4::compress(&mut theirs, |b: &mut BytesMut| {
            b.put_slice(&plain);
            Ok(())
        })
        .unwrap();
        assert_eq!(decompress(Codec::Lz4, theirs.freeze()).unwrap(), plain);
    }

    #[test]
    fn a_cut_lz4_frame_is_an_error() {
        let plain = sample();
        let mut out = BytesMut::new();
        compress(Codec::Lz4, &plain, &mut out).unwrap();
        let whole = out.freeze();
        assert!(decompress(Codec::Lz4, whole.slice(..whole.len() - 6)).is_err());
        assert!(decompress(Codec::Lz4, whole.slice(..whole.len() / 2)).is_err());
        assert_eq!(decompress(Codec::Lz4, whole).unwrap(), plain);
    }

    #[test]
    fn two_zstd_frames_back_to_back_decode_as_one_section() {
        let mut out = BytesMut::new();
        compress(Codec::Zstd, b"first ", &mut out).unwrap();
        compress(Codec::Zstd, b"second", &mut out).unwrap();
        assert_eq!(
            &decompress(Codec::Zstd, out.freeze()).unwrap()[..],
            b"first second"
        );
    }

    #[test]
    fn a_cut_or_corrupt_zstd_frame_is_an_error_and_the_context_recovers() {
        let plain = sample();
        let mut out = BytesMut::new();
        compress(Codec::Zstd, &plain, &mut out).unwrap();
        let whole = out.freeze();
        assert!(decompress(Codec::Zstd, whole.slice(..whole.len() / 2)).is_err());
        let mut bad = whole.to_vec();
        bad[5] ^= 0xff;
        bad[20] ^= 0xff;
        assert!(decompress(Codec::Zstd, Bytes::from(bad)).is_err());
        assert_eq!(decompress(Codec::Zstd, whole).unwrap(), plain);
    }
}
