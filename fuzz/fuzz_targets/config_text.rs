//! Properties files, MM2 configurations and JAAS lines, as users (and their templating) write
//! them: parsing must not panic, and no diagnostic may show a secret. The secret is appended by
//! the target, so whatever the fuzzer writes around it, an error that quotes it is a leak.
#![no_main]

use kmirror_kafka::SaslMechanism;
use kmirror_mirror::config::client::parse_jaas;
use kmirror_mirror::config::mm2;
use kmirror_mirror::config::properties::Properties;
use kmirror_mirror::config::providers::Environment;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const SECRET: &str = "fuzz-Secret-7f3a";

/// No variables and no files: the fuzzer must not read the machine's.
struct Empty;

impl Environment for Empty {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
    fn read_file(&self, path: &Path) -> std::io::Result<String> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            path.display().to_string(),
        ))
    }
}

fuzz_target!(|text: &str| {
    if text.contains("fuzz-Secret") {
        return;
    }
    let with_secret = format!(
        "{text}\nA.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"{SECRET}\";\nB.ssl.keystore.password = {SECRET}\n"
    );
    if let Ok(props) = Properties::parse(&with_secret, "fuzz.properties") {
        match mm2::load(&props, &[], &Empty) {
            Ok(config) => assert!(!format!("{config:?}").contains(SECRET), "Debug shows a secret"),
            Err(e) => assert!(!format!("{e} {e:?}").contains(SECRET), "an error shows a secret: {e}"),
        }
    }
    for mechanism in [
        SaslMechanism::Plain,
        SaslMechanism::ScramSha256,
        SaslMechanism::ScramSha512,
    ] {
        let line = format!("{text} password=\"{SECRET}\"");
        match parse_jaas(&line, mechanism) {
            Ok(c) => assert!(!format!("{c:?}").contains(SECRET)),
            Err(e) => assert!(!e.contains(SECRET), "a JAAS error shows the password: {e}"),
        }
    }
});
