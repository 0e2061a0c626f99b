//! Compressing and decompressing a batch's records section.
//!
//! gzip and Snappy compression come from `kafka_protocol::compression`; every decoder is driven
//! here with an output bound (kafka-protocol's Snappy decoder allocates whatever length
//! a block declares, up to 4 GiB from a few bytes, and none of its decoders has a bound). LZ4 and zstd are driven here, through
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
use kafka_protocol::compression::{Compressor, Gzip, Snappy};
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

/// Why a records section could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecompressError {
    /// The output would exceed the caller's bound: a decompression bomb, or a batch larger than
    /// the bound allows.
    TooLarge { limit: usize },
    /// Not a valid stream of the codec.
    Corrupt(String),
}

fn corrupt(e: impl std::fmt::Display) -> DecompressError {
    DecompressError::Corrupt(e.to_string())
}

/// A first guess at the output size that never exceeds the bound: hostile input must not make
/// the guess itself the allocation the bound exists to prevent.
fn first_capacity(compressed: usize, limit: usize) -> usize {
    compressed.saturating_mul(4).clamp(1024, 1 << 20).min(limit)
}

/// Reads `reader` to its end, failing once it yields more than `limit` bytes.
fn read_bounded(
    mut reader: impl Read,
    compressed: usize,
    limit: usize,
) -> Result<Vec<u8>, DecompressError> {
    let mut plain = Vec::with_capacity(first_capacity(compressed, limit));
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    (&mut reader)
        .take(cap)
        .read_to_end(&mut plain)
        .map_err(corrupt)?;
    if plain.len() > limit {
        return Err(DecompressError::TooLarge { limit });
    }
    Ok(plain)
}

/// The stream header snappy-java's `SnappyOutputStream` writes (magic, then version and
/// compatible version, 4 bytes each); without it the section is one raw snappy block, which
/// Java's reader also accepts.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_LEN: usize = 16;

/// Decodes Kafka's Snappy framing. Every block declares its own decompressed length in its first
/// bytes; the declared lengths are summed against `limit` before anything is allocated (a few
/// bytes can declare 4 GiB).
fn snappy_decompress(section: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let declared = |block: &[u8], total: usize| {
        let n = snap::raw::decompress_len(block).map_err(corrupt)?;
        match total.checked_add(n) {
            Some(t) if t <= limit => Ok(n),
            _ => Err(DecompressError::TooLarge { limit }),
        }
    };
    let mut decoder = snap::raw::Decoder::new();
    if !section.starts_with(XERIAL_MAGIC) {
        let n = declared(section, 0)?;
        let mut plain = vec![0; n];
        decoder.decompress(section, &mut plain).map_err(corrupt)?;
        return Ok(plain);
    }
    let mut rest = section
        .get(XERIAL_HEADER_LEN..)
        .ok_or_else(|| corrupt("cut snappy stream header"))?;
    let mut plain = Vec::new();
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt("cut snappy block length"))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = tail
            .get(..len)
            .ok_or_else(|| corrupt(format!("snappy block of {len} bytes is cut")))?;
        let n = declared(block, plain.len())?;
        let at = plain.len();
        plain.resize(at + n, 0);
        let wrote = decoder
            .decompress(block, &mut plain[at..])
            .map_err(corrupt)?;
        plain.truncate(at + wrote);
        rest = &tail[len..];
    }
    Ok(plain)
}

/// Decompresses a records section written with `codec`, producing at most `limit` bytes.
/// Uncompressed sections are returned as they are (they allocate nothing new).
pub(crate) fn decompress(
    codec: Codec,
    section: Bytes,
    limit: usize,
) -> Result<Bytes, DecompressError> {
    match codec {
        Codec::None => Ok(section),
        // Java's GZIPInputStream reads concatenated members; so does MultiGzDecoder.
        Codec::Gzip => read_bounded(
            flate2::read::MultiGzDecoder::new(&section[..]),
            section.len(),
            limit,
        )
        .map(Bytes::from),
        Codec::Snappy => snappy_decompress(&section, limit).map(Bytes::from),
        Codec::Lz4 => {
            let mut d = lz4::Decoder::new(&section[..]).map_err(corrupt)?;
            let plain = read_bounded(&mut d, section.len(), limit)?;
            // read_to_end stops quietly at a cut frame; finish says whether the end mark came.
            d.finish().1.map_err(|_| corrupt("truncated LZ4 frame"))?;
            Ok(plain.into())
        }
        Codec::Zstd => {
            ZSTD_DECOMPRESS.with(|d| zstd_decompress(&mut d.borrow_mut(), &section, limit))
        }
    }
}

/// The largest zstd window (as a power of two) a frame may ask for when its output is bounded by
/// `limit`: the bound rounded up, but at least 8 MiB (what producers at levels up to 19 declare
/// when they do not know the content size) and at most 128 MiB (zstd's own default). Without it,
/// a 100-byte frame header makes the decoder allocate up to 128 MiB (found by
/// fuzzing).
fn zstd_window_log_max(limit: usize) -> u32 {
    let log = usize::BITS - limit.saturating_sub(1).leading_zeros();
    log.clamp(23, 27)
}

/// Decompresses every zstd frame in `src` (a producer may write more than one) with a reused
/// context, growing the output only up to `limit` bytes.
fn zstd_decompress(
    d: &mut zstd::zstd_safe::DCtx<'static>,
    src: &[u8],
    limit: usize,
) -> Result<Bytes, DecompressError> {
    use zstd::zstd_safe::{DParameter, InBuffer, OutBuffer, ResetDirective};
    let zstd = |code: usize| {
        let name = zstd_error(code);
        // The frame's window (declared in its header, allocated before any output) is larger
        // than zstd_window_log_max allows: as big a demand as output beyond the bound.
        if name.contains("too much memory") {
            DecompressError::TooLarge { limit }
        } else {
            corrupt(name)
        }
    };
    // A call that failed mid-frame leaves the context there.
    d.reset(ResetDirective::SessionOnly).map_err(zstd)?;
    d.set_parameter(DParameter::WindowLogMax(zstd_window_log_max(limit)))
        .map_err(zstd)?;
    // One byte beyond the bound: filling it proves the output is too large.
    let room = limit.saturating_add(1);
    let mut out: Vec<u8> = Vec::with_capacity(first_capacity(src.len(), room));
    let mut input = InBuffer::around(src);
    loop {
        if out.len() == out.capacity() {
            if out.len() >= room {
                return Err(DecompressError::TooLarge { limit });
            }
            out.reserve_exact(out.capacity().min(room - out.len()));
        }
        let len = out.len();
        let mut o = OutBuffer::around_pos(&mut out, len);
        let hint = d.decompress_stream(&mut o, &mut input).map_err(zstd)?;
        let full = o.pos() == o.capacity();
        if out.len() > limit {
            return Err(DecompressError::TooLarge { limit });
        }
        if input.pos() == src.len() {
            if hint == 0 {
                return Ok(out.into());
            }
            if !full {
                return Err(corrupt("truncated zstd frame"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_BOUND: usize = usize::MAX;

    const CODECS: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

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
            assert_eq!(
                decompress(codec, out.freeze(), NO_BOUND).unwrap(),
                plain,
                "{codec:?}"
            );
        }
        let mut theirs = BytesMut::new();
        kafka_protocol::compression::Zstd::compress(&mut theirs, |b: &mut BytesMut| {
            b.put_slice(&plain);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            decompress(Codec::Zstd, theirs.freeze(), NO_BOUND).unwrap(),
            plain
        );
        let mut theirs = BytesMut::new();
        kafka_protocol::compression::Lz4::compress(&mut theirs, |b: &mut BytesMut| {
            b.put_slice(&plain);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            decompress(Codec::Lz4, theirs.freeze(), NO_BOUND).unwrap(),
            plain
        );
    }

    #[test]
    fn a_cut_lz4_frame_is_an_error() {
        let plain = sample();
        let mut out = BytesMut::new();
        compress(Codec::Lz4, &plain, &mut out).unwrap();
        let whole = out.freeze();
        assert!(decompress(Codec::Lz4, whole.slice(..whole.len() - 6), NO_BOUND).is_err());
        assert!(decompress(Codec::Lz4, whole.slice(..whole.len() / 2), NO_BOUND).is_err());
        assert_eq!(decompress(Codec::Lz4, whole, NO_BOUND).unwrap(), plain);
    }

    #[test]
    fn two_zstd_frames_back_to_back_decode_as_one_section() {
        let mut out = BytesMut::new();
        compress(Codec::Zstd, b"first ", &mut out).unwrap();
        compress(Codec::Zstd, b"second", &mut out).unwrap();
        assert_eq!(
            &decompress(Codec::Zstd, out.freeze(), NO_BOUND).unwrap()[..],
            b"first second"
        );
    }

    #[test]
    fn a_cut_or_corrupt_zstd_frame_is_an_error_and_the_context_recovers() {
        let plain = sample();
        let mut out = BytesMut::new();
        compress(Codec::Zstd, &plain, &mut out).unwrap();
        let whole = out.freeze();
        assert!(decompress(Codec::Zstd, whole.slice(..whole.len() / 2), NO_BOUND).is_err());
        let mut bad = whole.to_vec();
        bad[5] ^= 0xff;
        bad[20] ^= 0xff;
        assert!(decompress(Codec::Zstd, Bytes::from(bad), NO_BOUND).is_err());
        assert_eq!(decompress(Codec::Zstd, whole, NO_BOUND).unwrap(), plain);
    }

    /// A zstd frame of one empty last block whose header declares a window of 2^`log` bytes and
    /// no content size: the decoder would allocate the window before reading the block.
    fn zstd_window_frame(log: u8) -> Bytes {
        let descriptor = (log - 10) << 3;
        Bytes::from(vec![
            0x28, 0xb5, 0x2f, 0xfd, 0x00, descriptor, 0x01, 0x00, 0x00,
        ])
    }

    #[test]
    fn a_zstd_window_beyond_the_bound_is_refused_before_it_is_allocated() {
        // Regression for fuzz/artifacts/record_batches/oom-c3625474...: a 92 MB window.
        assert_eq!(
            decompress(Codec::Zstd, zstd_window_frame(27), 1 << 20),
            Err(DecompressError::TooLarge { limit: 1 << 20 })
        );
        // 8 MiB windows (producers at levels up to 19) always decode; larger ones within the bound.
        assert_eq!(
            decompress(Codec::Zstd, zstd_window_frame(23), 1 << 20).unwrap(),
            b""[..]
        );
        assert_eq!(
            decompress(Codec::Zstd, zstd_window_frame(26), 50 << 20).unwrap(),
            b""[..]
        );
        assert_eq!(zstd_window_log_max(50 << 20), 26);
        assert_eq!(zstd_window_log_max(64 << 20), 26);
        assert_eq!(zstd_window_log_max((64 << 20) + 1), 27);
        assert_eq!(zstd_window_log_max(usize::MAX), 27);
        assert_eq!(zstd_window_log_max(0), 23);
    }

    #[test]
    fn every_codec_stops_at_the_bound_and_reads_exactly_up_to_it() {
        // 8 MiB of one byte: every codec squeezes it into a few KiB.
        let plain = vec![7u8; 8 << 20];
        for codec in &CODECS[1..] {
            let mut out = BytesMut::new();
            compress(*codec, &plain, &mut out).unwrap();
            let packed = out.freeze();
            assert!(packed.len() < 512 << 10, "{codec:?}: {}", packed.len());
            assert_eq!(
                decompress(*codec, packed.clone(), 1 << 20),
                Err(DecompressError::TooLarge { limit: 1 << 20 }),
                "{codec:?}"
            );
            assert_eq!(
                decompress(*codec, packed.clone(), plain.len() - 1),
                Err(DecompressError::TooLarge {
                    limit: plain.len() - 1
                }),
                "{codec:?}"
            );
            assert_eq!(
                decompress(*codec, packed, plain.len()).unwrap().len(),
                plain.len(),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn a_snappy_block_declaring_gigabytes_is_refused_before_allocating() {
        // A raw block whose length varint says 2^32 - 1 bytes, followed by junk.
        let raw = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 1, 2]);
        assert_eq!(
            decompress(Codec::Snappy, raw, 64 << 20),
            Err(DecompressError::TooLarge { limit: 64 << 20 })
        );
        // The same inside snappy-java's framing, after a block that fits.
        let mut framed = BytesMut::new();
        compress(Codec::Snappy, b"fits", &mut framed).unwrap();
        framed.put_u32(8);
        framed.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 1, 2]);
        assert_eq!(
            decompress(Codec::Snappy, framed.freeze(), 64 << 20),
            Err(DecompressError::TooLarge { limit: 64 << 20 })
        );
    }

    #[test]
    fn cut_or_junk_sections_are_corrupt_for_every_codec() {
        let plain = sample();
        for codec in &CODECS[1..] {
            let mut out = BytesMut::new();
            compress(*codec, &plain, &mut out).unwrap();
            let whole = out.freeze();
            for cut in [1, whole.len() / 2, whole.len() - 1] {
                assert!(
                    matches!(
                        decompress(*codec, whole.slice(..cut), NO_BOUND),
                        Err(DecompressError::Corrupt(_))
                    ),
                    "{codec:?} cut at {cut}"
                );
            }
        }
    }
}
