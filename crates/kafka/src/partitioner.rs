//! Kafka's default partitioner for keyed records: murmur2 of the key bytes, made positive, modulo
//! the partition count (Java's `Utils.murmur2` and `Utils.toPositive`). Keyed records land where a
//! Java producer would put them, and Connect's offset store writes a key to the partition Java
//! would choose.

/// Java's `Utils.murmur2` (seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = len / 4;
    for i in 0..chunks {
        let b = &data[i * 4..i * 4 + 4];
        let mut k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = &data[chunks * 4..];
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Java's `Utils.toPositive`: clears the sign bit (not `abs`).
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition Java's default partitioner picks for a non-null key.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    to_positive(murmur2(key)) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_javas_murmur2_test_vectors() {
        // The cases of Kafka's UtilsTest.testMurmur2.
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (data, expected) in cases {
            assert_eq!(
                murmur2(data),
                *expected,
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn partitions_are_never_negative() {
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(i32::MIN), 0);
        for key in [&b"21"[..], b"foobar", b"", b"x"] {
            let p = partition_for_key(key, 7);
            assert!((0..7).contains(&p));
        }
    }
}
