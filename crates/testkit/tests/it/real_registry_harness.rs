//! The harness's schema registry (Apicurio, its Confluent-compatible API): it starts empty,
//! answers, stops answering while paused and again once resumed, and its port is free once the
//! handle is dropped. Needs Java 21+ (fails loudly without one).

use kmirror_testkit::Registry;
use std::time::Duration;

#[test]
fn a_registry_starts_empty_answers_freezes_and_stops() {
    let r = Registry::start("registry-harness").unwrap();
    assert!(
        r.url().starts_with("http://127.0.0.1:") && r.url().ends_with("/apis/ccompat/v7"),
        "{}",
        r.url()
    );
    let (status, body) = r.get("/subjects", Duration::from_secs(10)).unwrap();
    assert_eq!((status, body.trim()), (200, "[]"));
    let (status, body) = r.get("/mode", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("READWRITE"), "{body}");
    let (status, body) = r.get("/schemas/ids/1", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("40403"), "{body}");

    r.pause().unwrap();
    assert!(
        r.get("/subjects", Duration::from_secs(2)).is_err(),
        "a paused registry answered"
    );
    r.resume().unwrap();
    let (status, _) = r.get("/subjects", Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200);

    let url = r.url().to_string();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    drop(r);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the registry still listens on {port} after it was dropped"
    );
}
