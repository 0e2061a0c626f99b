//! Reads MIT keytab files (format versions 0x0501 and 0x0502, as `ktutil` and `kadmin ktadd`
//! write them; docs/configuration.md, "Kerberos (GSSAPI)") and picks the key a client logs in
//! with. A keytab holds long-term keys: the bytes never leave this module except as a
//! [`KeytabKey`], whose `Debug` hides them.
//!
//! Layout (big-endian in 0x0502, native order in 0x0501, which only x86 writers made, so
//! little-endian here): two version bytes, then entries, each a signed 32-bit length (negative:
//! a hole of that many bytes left by a deleted entry) followed by the entry: component count
//! (16 bits; 0x0501 counts the realm too), realm and components as 16-bit-length strings, name
//! type (32 bits, 0x0502 only), timestamp (32 bits), key version (8 bits), key type (16 bits),
//! key (16-bit-length bytes), and, when at least four bytes remain in the entry, a 32-bit key
//! version that replaces the 8-bit one.

use std::fmt;

/// The encryption types kmirror logs in with, best first (RFC 3962, RFC 8009). Older ones
/// (DES, RC4, 3DES) are refused: MIT has disabled them by default since 1.18.
pub const SUPPORTED_ENCTYPES: [(i32, &str); 2] = [
    (18, "aes256-cts-hmac-sha1-96"),
    (17, "aes128-cts-hmac-sha1-96"),
];

/// The name of encryption type `n` (RFC 3961, RFC 8009), for messages.
pub fn enctype_name(n: i32) -> String {
    match n {
        17 => "aes128-cts-hmac-sha1-96".into(),
        18 => "aes256-cts-hmac-sha1-96".into(),
        19 => "aes128-cts-hmac-sha256-128".into(),
        20 => "aes256-cts-hmac-sha384-192".into(),
        23 => "arcfour-hmac".into(),
        16 => "des3-cbc-sha1".into(),
        n => format!("type {n}"),
    }
}

/// One long-term key for a principal.
#[derive(Clone, PartialEq, Eq)]
pub struct KeytabKey {
    pub principal: String,
    pub kvno: u32,
    pub enctype: i32,
    key: Vec<u8>,
}

impl KeytabKey {
    /// The key bytes, for the one place that encrypts with them.
    pub fn expose(&self) -> &[u8] {
        &self.key
    }

    #[cfg(test)]
    pub(crate) fn for_test() -> KeytabKey {
        KeytabKey {
            principal: "kmirror@TEST".into(),
            kvno: 1,
            enctype: 18,
            key: vec![7; 32],
        }
    }
}

impl fmt::Debug for KeytabKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeytabKey")
            .field("principal", &self.principal)
            .field("kvno", &self.kvno)
            .field("enctype", &self.enctype)
            .field("key", &crate::secret::MASK)
            .finish()
    }
}

/// Every entry of a keytab, in file order. Errors name what is wrong, never a key byte.
pub fn parse(bytes: &[u8]) -> Result<Vec<KeytabKey>, String> {
    let mut r = Reader {
        b: bytes,
        pos: 0,
        big: true,
    };
    let version = r.u16()?;
    r.big = match version {
        0x0502 => true,
        0x0501 => false,
        v => {
            return Err(format!(
                "not a keytab: version 0x{v:04x}, expected 0x0502 or 0x0501"
            ))
        }
    };
    let mut keys = Vec::new();
    while r.pos < bytes.len() {
        let size = r.i32()?;
        if size == 0 {
            break;
        }
        let len = size.unsigned_abs() as usize;
        let body = r.take(len)?;
        if size < 0 {
            continue;
        }
        keys.push(entry(body, version)?);
    }
    Ok(keys)
}

fn entry(body: &[u8], version: u16) -> Result<KeytabKey, String> {
    let big = version == 0x0502;
    let mut r = Reader {
        b: body,
        pos: 0,
        big,
    };
    let mut count = r.u16()? as usize;
    if version == 0x0501 {
        count = count.checked_sub(1).ok_or("an entry has no realm")?;
    }
    let realm = r.string()?;
    let mut parts = Vec::with_capacity(count.min(8));
    for _ in 0..count {
        parts.push(r.string()?);
    }
    if big {
        r.u32()?; // name type
    }
    r.u32()?; // timestamp
    let mut kvno = u32::from(r.u8()?);
    let enctype = i32::from(r.u16()? as i16);
    let key_len = r.u16()? as usize;
    let key = r.take(key_len)?.to_vec();
    if body.len() - r.pos >= 4 {
        let long = r.u32()?;
        if long != 0 {
            kvno = long;
        }
    }
    Ok(KeytabKey {
        principal: format!("{}@{realm}", parts.join("/")),
        kvno,
        enctype,
        key,
    })
}

/// The key to log in as `principal` with: the newest key version, then the best supported
/// encryption type. The error lists what the keytab holds (principals and type numbers only).
pub fn pick(keys: &[KeytabKey], principal: &str) -> Result<KeytabKey, String> {
    let mine: Vec<&KeytabKey> = keys.iter().filter(|k| k.principal == principal).collect();
    if mine.is_empty() {
        let mut held: Vec<&str> = keys.iter().map(|k| k.principal.as_str()).collect();
        held.dedup();
        return Err(format!(
            "holds no key for {principal} (it holds: {})",
            if held.is_empty() {
                "nothing".into()
            } else {
                held.join(", ")
            }
        ));
    }
    let newest = mine.iter().map(|k| k.kvno).max().unwrap_or(0);
    for (enctype, _) in SUPPORTED_ENCTYPES {
        if let Some(k) = mine
            .iter()
            .find(|k| k.kvno == newest && k.enctype == enctype)
        {
            return Ok((*k).clone());
        }
    }
    let types: Vec<String> = mine
        .iter()
        .filter(|k| k.kvno == newest)
        .map(|k| enctype_name(k.enctype))
        .collect();
    Err(format!(
        "holds keys for {principal} of encryption types {} only; kmirror needs one of {}",
        types.join(", "),
        SUPPORTED_ENCTYPES
            .iter()
            .map(|(n, name)| format!("{name} ({n})"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// A keytab (0x0502) holding `key` alone: what the Kerberos library is given, so that it can
/// only use the key picked here (it takes the first entry of the principal for
/// pre-authentication and tries every entry on the KDC's answer, whatever its type).
pub fn single(key: &KeytabKey) -> Vec<u8> {
    let (name, realm) = key
        .principal
        .rsplit_once('@')
        .unwrap_or((&key.principal, ""));
    let parts: Vec<&str> = name.split('/').collect();
    let mut e = Vec::new();
    e.extend((parts.len() as u16).to_be_bytes());
    for s in std::iter::once(realm).chain(parts.iter().copied()) {
        e.extend((s.len() as u16).to_be_bytes());
        e.extend(s.as_bytes());
    }
    e.extend(1u32.to_be_bytes()); // KRB5_NT_PRINCIPAL
    e.extend(0u32.to_be_bytes()); // timestamp: unused by readers
    e.push(key.kvno.min(255) as u8);
    e.extend((key.enctype as u16).to_be_bytes());
    e.extend((key.key.len() as u16).to_be_bytes());
    e.extend(&key.key);
    e.extend(key.kvno.to_be_bytes());
    let mut out = vec![0x05, 0x02];
    out.extend((e.len() as i32).to_be_bytes());
    out.extend(e);
    out
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    big: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or("the keytab is truncated")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b: [u8; 2] = self.take(2)?.try_into().map_err(|_| "truncated")?;
        Ok(if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b: [u8; 4] = self.take(4)?.try_into().map_err(|_| "truncated")?;
        Ok(if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(self.u32()? as i32)
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| "a principal name is not UTF-8".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 0x0502 entry, built the way MIT writes it.
    fn entry_bytes(realm: &str, parts: &[&str], kvno: u32, enctype: u16, key: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend((parts.len() as u16).to_be_bytes());
        for s in std::iter::once(&realm).chain(parts) {
            e.extend((s.len() as u16).to_be_bytes());
            e.extend(s.as_bytes());
        }
        e.extend(1u32.to_be_bytes()); // KRB5_NT_PRINCIPAL
        e.extend(1_700_000_000u32.to_be_bytes());
        e.push(kvno as u8);
        e.extend(enctype.to_be_bytes());
        e.extend((key.len() as u16).to_be_bytes());
        e.extend(key);
        e.extend(kvno.to_be_bytes());
        let mut out = (e.len() as i32).to_be_bytes().to_vec();
        out.extend(e);
        out
    }

    fn keytab(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![0x05, 0x02];
        for e in entries {
            b.extend(e);
        }
        b
    }

    #[test]
    fn the_newest_key_of_the_best_type_is_picked_and_holes_are_skipped() {
        let mut hole = (-7i32).to_be_bytes().to_vec();
        hole.extend([0u8; 7]);
        let kt = keytab(&[
            entry_bytes("R.TEST", &["kmirror"], 1, 18, &[1; 32]),
            hole,
            entry_bytes("R.TEST", &["kmirror"], 300, 17, &[2; 16]),
            entry_bytes("R.TEST", &["kmirror"], 300, 18, &[3; 32]),
            entry_bytes("R.TEST", &["kafka", "localhost"], 2, 18, &[4; 32]),
        ]);
        let keys = parse(&kt).unwrap();
        assert_eq!(keys.len(), 4);
        assert_eq!(keys[3].principal, "kafka/localhost@R.TEST");
        // The 32-bit key version at the end wins over the 8-bit one (300 > 255).
        let k = pick(&keys, "kmirror@R.TEST").unwrap();
        assert_eq!((k.kvno, k.enctype, k.expose()), (300, 18, &[3u8; 32][..]));
        assert!(!format!("{k:?}").contains("3, 3"), "{k:?}");
    }

    #[test]
    fn a_single_key_keytab_reads_back_as_that_key() {
        let kt = keytab(&[
            entry_bytes("R.TEST", &["svc", "host"], 1, 17, &[1; 16]),
            entry_bytes("R.TEST", &["svc", "host"], 300, 18, &[2; 32]),
        ]);
        let k = pick(&parse(&kt).unwrap(), "svc/host@R.TEST").unwrap();
        let back = parse(&single(&k)).unwrap();
        assert_eq!(back, vec![k]);
    }

    #[test]
    fn missing_principals_weak_types_and_broken_files_are_named() {
        let kt = keytab(&[entry_bytes("R.TEST", &["other"], 1, 23, &[9; 16])]);
        let keys = parse(&kt).unwrap();
        let e = pick(&keys, "kmirror@R.TEST").unwrap_err();
        assert!(
            e.contains("no key for kmirror@R.TEST") && e.contains("other@R.TEST"),
            "{e}"
        );
        let e = pick(&keys, "other@R.TEST").unwrap_err();
        assert!(
            e.contains("types arcfour-hmac only") && e.contains("aes256"),
            "{e}"
        );
        assert!(parse(b"\x05\x03").unwrap_err().contains("0x0503"));
        let mut cut = kt.clone();
        cut.truncate(kt.len() - 10);
        assert!(parse(&cut).unwrap_err().contains("truncated"));
        // A length that points past the end is an error, not a panic or a huge allocation.
        let mut huge = vec![0x05, 0x02];
        huge.extend(i32::MAX.to_be_bytes());
        assert!(parse(&huge).is_err());
    }

    #[test]
    fn the_little_endian_0501_form_counts_the_realm_among_components() {
        let mut e = Vec::new();
        e.extend(2u16.to_le_bytes());
        for s in ["R.TEST", "kmirror"] {
            e.extend((s.len() as u16).to_le_bytes());
            e.extend(s.as_bytes());
        }
        e.extend(0u32.to_le_bytes());
        e.push(5);
        e.extend(17u16.to_le_bytes());
        e.extend(16u16.to_le_bytes());
        e.extend([7u8; 16]);
        let mut kt = vec![0x05, 0x01];
        kt.extend((e.len() as i32).to_le_bytes());
        kt.extend(e);
        let keys = parse(&kt).unwrap();
        assert_eq!(keys[0].principal, "kmirror@R.TEST");
        assert_eq!((keys[0].kvno, keys[0].enctype), (5, 17));
    }

    proptest::proptest! {
        #[test]
        fn hostile_bytes_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut kt = vec![0x05, 0x02];
            kt.extend(b);
            let _ = parse(&kt);
        }
    }
}
