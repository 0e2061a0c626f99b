//! MM2's internal record formats (heartbeats, checkpoints, offset syncs) and Connect source
//! positions, as anyone with write access to those topics could write them: decoding must not
//! panic, and whatever decodes must encode back to something that decodes the same.
#![no_main]

use kmirror_mirror::wire::internal::{Checkpoint, Heartbeat, OffsetSync};
use kmirror_mirror::wire::positions::SourcePosition;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = (split as usize).min(rest.len());
    let (key, value) = rest.split_at(at);
    if let Ok(h) = Heartbeat::decode(key, value) {
        if let Ok(k) = h.key() {
            assert_eq!(Heartbeat::decode(&k, &h.value()).ok(), Some(h));
        }
    }
    if let Ok(c) = Checkpoint::decode(key, value) {
        if let (Ok(k), Ok(v)) = (c.key(), c.value()) {
            assert_eq!(Checkpoint::decode(&k, &v).ok(), Some(c));
        }
    }
    if let Ok(s) = OffsetSync::decode(key, value) {
        if let Ok(k) = s.key() {
            assert_eq!(OffsetSync::decode(&k, &s.value()).ok(), Some(s));
        }
    }
    if let Some(p) = SourcePosition::decode(key, Some(value)) {
        assert_eq!(SourcePosition::decode(&p.key(), Some(&p.value())), Some(p));
    }
    let _ = SourcePosition::decode(key, None);
});
