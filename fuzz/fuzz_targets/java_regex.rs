//! The Java-regex translator (topic and group filters come from users' MM2 files): any text
//! either translates to a pattern the regex crate accepts, or is refused with a position inside
//! the text. Deep nesting must be refused, not overflow the stack.
#![no_main]

use kmirror_mirror::filter::java_regex::translate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|pattern: &str| {
    match translate(pattern) {
        Ok(out) => {
            if let Err(e) = regex::RegexBuilder::new(&out).size_limit(1 << 24).build() {
                // Only size limits may refuse a translation.
                assert!(
                    matches!(e, regex::Error::CompiledTooBig(_)),
                    "{pattern:?} translated to {out:?}, which the regex crate refuses: {e}"
                );
            }
        }
        Err(e) => assert!(e.position <= pattern.chars().count(), "{e}"),
    }
});
