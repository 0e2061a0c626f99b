//! Unit tests of `kerberos`, kept apart so the module reads on its own.

use super::*;

#[test]
fn one_key_files_of_dead_processes_are_swept() {
    assert_eq!(orphan_pid("kmirror-4242-7.keytab"), Some(4242));
    for other in [
        "kmirror-wi-1",
        "kmirror-4242.keytab",
        "a.keytab",
        "kmirror-x-1.keytab",
    ] {
        assert_eq!(orphan_pid(other), None, "{other}");
    }
    // A pid above Linux's maximum runs nowhere.
    let dead = std::env::temp_dir().join("kmirror-4294967294-0.keytab");
    std::fs::write(&dead, b"key").unwrap();
    let mine = OneKeyFile::write(&keytab::KeytabKey::for_test()).unwrap();
    // (The first login of the process sweeps; here, another test's may have come first.)
    sweep_orphans();
    assert!(!dead.exists(), "the dead process's key is gone");
    assert!(mine.0.exists(), "a live process's key stays");
    let path = mine.0.clone();
    drop(mine);
    assert!(!path.exists());
}

#[test]
fn ticket_end_times_are_read_as_time_left() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_509_502); // 2026-12-05 22:25:02
    assert_eq!(
        remaining("20261205222602Z", now),
        Some(Duration::from_secs(60))
    );
    assert_eq!(remaining("20261205222502Z", now), None);
    assert_eq!(remaining("20261205222402Z", now), None);
    for bad in [
        "",
        "2026120522260Z",
        "20261305222602Z",
        "2026120522260xZ",
        "20261205222602",
    ] {
        assert_eq!(remaining(bad, now), None, "{bad}");
    }
}

#[test]
fn kdc_error_codes_are_said_as_what_to_check() {
    let d = describe("TGS KDC error code=7", "kafka/b1", "R.TEST", 2);
    assert!(
        d.contains("kafka/b1@R.TEST") && d.contains("sasl.kerberos.service.name"),
        "{d}"
    );
    let d = describe("KDC error code=24", "kafka/b1", "R.TEST", 3);
    assert!(d.contains("version 3") && d.contains("stale"), "{d}");
    let d = describe(
        "crypto error: HMAC verification failed",
        "kafka/b1",
        "R.TEST",
        3,
    );
    assert!(d.contains("stale") && d.contains("does not decrypt"), "{d}");
    let d = describe("TGS KDC error code=31", "kafka/b1", "R.TEST", 3);
    assert!(d.contains("aes-sha2") && !d.contains("stale"), "{d}");
    assert!(describe("code=37", "", "", 1).contains("clock"));
    assert!(describe("code=99", "", "", 1).contains("error 99"));
    assert_eq!(describe("other", "", "", 1), "other");
}

#[tokio::test]
async fn a_kdc_that_cannot_be_reached_is_retriable_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let conf = dir.path().join("krb5.conf");
    std::fs::write(
        &conf,
        format!("[realms]\nR.TEST = {{\nkdc = 127.0.0.1:{port}\n}}\n"),
    )
    .unwrap();
    let kt = dir.path().join("k.keytab");
    // One aes256 key for kmirror@R.TEST, as kadmin writes it.
    let mut e = Vec::new();
    e.extend(1u16.to_be_bytes());
    for s in ["R.TEST", "kmirror"] {
        e.extend((s.len() as u16).to_be_bytes());
        e.extend(s.as_bytes());
    }
    e.extend(1u32.to_be_bytes());
    e.extend(0u32.to_be_bytes());
    e.push(1);
    e.extend(18u16.to_be_bytes());
    e.extend(32u16.to_be_bytes());
    e.extend([5u8; 32]);
    let mut bytes = vec![5, 2];
    bytes.extend((e.len() as i32).to_be_bytes());
    bytes.extend(e);
    std::fs::write(&kt, bytes).unwrap();
    let k = Kerberos {
        service_name: "kafka".into(),
        principal: "kmirror@R.TEST".into(),
        keytab: kt.clone(),
        krb5_conf: conf,
    };
    let err = login(&k, "b1").await.unwrap_err();
    assert!(err.is_retriable(), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    let k = Kerberos {
        principal: "other@R.TEST".into(),
        ..k
    };
    let err = login(&k, "b1").await.unwrap_err();
    assert!(!err.is_retriable());
    assert!(
        err.to_string().contains("holds no key for other@R.TEST"),
        "{err}"
    );
}
