//! CRC-32C arithmetic for the header rewrite. A batch's CRC covers its header fields from
//! `attributes` on and then its records; a rewrite changes only header fields. CRCs are linear:
//! for two messages of the same length, the CRCs of `new ++ R` and `old ++ R` differ by the CRC
//! difference of `new` and `old` carried over `R.len()` zero bytes. So a batch whose stored CRC
//! was checked gets its new CRC from two 40-byte CRCs and one carry, instead of a pass over its
//! records (checking every fetched batch then costs what the rewrite used to).
//!
//! The carry is multiplication by x^(8·len) modulo the CRC polynomial, in the bit-reflected form
//! CRC-32C registers use (bit 31 is the coefficient of x^0). The powers x^(2^k) are a constant
//! table, so a carry costs one multiplication per set bit of `len`.

/// CRC-32C's polynomial, bit-reflected.
const POLY: u32 = 0x82F6_3B78;
/// The polynomial 1 in the reflected form.
const ONE: u32 = 1 << 31;

/// `a · b mod POLY`, both reflected.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `POWERS[k]` = x^(2^k) mod POLY.
const POWERS: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut p = ONE >> 1; // x^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = multiply(p, p);
        k += 1;
    }
    t
};

/// `crc` carried over `len` zero bytes (with no pre- or post-conditioning): x^(8·len) · crc.
pub(crate) fn carry(crc: u32, len: usize) -> u32 {
    // 8·len = len << 3: start three powers up.
    let mut factor = ONE;
    let mut n = len as u64;
    let mut k = 3;
    while n != 0 {
        if n & 1 != 0 {
            factor = multiply(POWERS[k % 64], factor);
        }
        n >>= 1;
        k += 1;
    }
    multiply(factor, crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carrying_matches_the_crc_of_concatenations() {
        // crc(A ++ B) = carry(crc(A), len B) ^ crc(B), for any split.
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for split in [0, 1, 40, 61, 1000, 4096, 65_537, 70_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                carry(crc32c::crc32c(a), b.len()) ^ crc32c::crc32c(b),
                crc32c::crc32c(&data),
                "split at {split}"
            );
        }
    }

    #[test]
    fn a_changed_prefix_moves_the_crc_by_its_carried_difference() {
        let mut data: Vec<u8> = (0..5_000u32).map(|i| (i % 253) as u8).collect();
        let before = crc32c::crc32c(&data);
        let old_head = crc32c::crc32c(&data[..40]);
        data[3] ^= 0x5a;
        data[20..28].copy_from_slice(&77i64.to_be_bytes());
        let new_head = crc32c::crc32c(&data[..40]);
        assert_eq!(
            before ^ carry(old_head ^ new_head, data.len() - 40),
            crc32c::crc32c(&data)
        );
    }
}
