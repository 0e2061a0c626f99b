//! Group membership against a real broker: members get disjoint assignments that cover
//! everything, a member that dies without leaving loses its share within the session timeout,
//! and a kmirror member shares a `consumer`-protocol group with a Java console consumer.

use bytes::Bytes;
use kmirror_kafka::cluster::{KafkaCluster, NewTopic};
use kmirror_kafka::group::consumer_protocol::{parse_assignment, RangeAssignor};
use kmirror_kafka::group::{Assignor, GroupConfig, GroupMember};
use kmirror_kafka::Result;
use kmirror_testkit::{Cluster, Security};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Twelve work units dealt round-robin to the members sorted by id.
#[derive(Debug)]
struct Units;

impl Assignor for Units {
    fn protocol(&self) -> &str {
        "units"
    }
    fn metadata(&self) -> Bytes {
        Bytes::new()
    }
    fn assign(&self, _: &str, members: &[(String, Bytes)]) -> Result<Vec<(String, Bytes)>> {
        let mut ids: Vec<&String> = members.iter().map(|(m, _)| m).collect();
        ids.sort();
        Ok(ids
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let units: Vec<String> = (0..12)
                    .filter(|u| u % ids.len() == i)
                    .map(|u| u.to_string())
                    .collect();
                (m.to_string(), Bytes::from(units.join(",")))
            })
            .collect())
    }
}

fn units(b: &Bytes) -> BTreeSet<u32> {
    std::str::from_utf8(b)
        .unwrap()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

type View = Arc<Mutex<BTreeMap<usize, (i32, BTreeSet<u32>)>>>;

/// A member that heartbeats every 500 ms and publishes (generation, units) until aborted.
fn spawn_member(k: Arc<KafkaCluster>, idx: usize, view: View) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config = GroupConfig {
            group_id: "kmirror-workers".into(),
            protocol_type: "kmirror".into(),
            session_timeout: Duration::from_secs(6),
            rebalance_timeout: Duration::from_secs(10),
            instance_id: None,
        };
        let mut m = GroupMember::join(k, config, Arc::new(Units)).await.unwrap();
        loop {
            view.lock()
                .unwrap()
                .insert(idx, (m.generation(), units(m.assignment())));
            tokio::time::sleep(Duration::from_millis(500)).await;
            m.poll().await.unwrap();
        }
    })
}

/// Waits until the given members agree on a generation and their units are disjoint and cover 0..12.
async fn wait_stable(view: &View, members: &[usize], within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        {
            let v = view.lock().unwrap();
            let states: Vec<&(i32, BTreeSet<u32>)> =
                members.iter().filter_map(|i| v.get(i)).collect();
            if states.len() == members.len() && states.iter().all(|s| s.0 == states[0].0) {
                let total: usize = states.iter().map(|s| s.1.len()).sum();
                let union: BTreeSet<u32> =
                    states.iter().flat_map(|s| s.1.iter().copied()).collect();
                if total == 12 && union.len() == 12 && states.iter().all(|s| !s.1.is_empty()) {
                    return t0.elapsed();
                }
            }
        }
        assert!(
            t0.elapsed() < within,
            "no stable assignment within {within:?}: {:?}",
            view.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_work_and_a_dead_member_is_replaced() {
    let c = Cluster::start("group", Security::Plaintext).unwrap();
    let k = Arc::new(
        KafkaCluster::connect(c.client_settings(None))
            .await
            .unwrap(),
    );

    // Three kmirror members: disjoint shares covering all twelve units.
    let view: View = Arc::new(Mutex::new(BTreeMap::new()));
    let tasks: Vec<_> = (0..3)
        .map(|i| spawn_member(k.clone(), i, view.clone()))
        .collect();
    wait_stable(&view, &[0, 1, 2], Duration::from_secs(60)).await;
    let shares: Vec<usize> = (0..3).map(|i| view.lock().unwrap()[&i].1.len()).collect();
    assert_eq!(shares, [4, 4, 4]);

    // Member 2 dies without LeaveGroup: the others take over within the session timeout.
    tasks[2].abort();
    view.lock().unwrap().remove(&2);
    let took = wait_stable(&view, &[0, 1], Duration::from_secs(30)).await;
    eprintln!("rebalance after a member died: {took:?} (session timeout 6 s)");
    assert!(took < Duration::from_secs(6 + 10), "took {took:?}");
    for t in tasks {
        t.abort();
    }

    // A join held by the coordinator (another member is slow to rejoin) ends with its SyncGroup:
    // that, not the join's start, is when the coordinator began counting the member alive.
    let config = GroupConfig {
        group_id: "slow-join".into(),
        protocol_type: "kmirror".into(),
        session_timeout: Duration::from_secs(6),
        rebalance_timeout: Duration::from_secs(10),
        instance_id: None,
    };
    let mut first = GroupMember::join(k.clone(), config.clone(), Arc::new(Units))
        .await
        .unwrap();
    let started = Instant::now();
    let second = tokio::spawn(GroupMember::join(k.clone(), config, Arc::new(Units)));
    // The first member hears of the rebalance only at its next heartbeat, 3 s later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    first.poll().await.unwrap();
    let second = second.await.unwrap().unwrap();
    let held = second.synced_at().duration_since(started);
    eprintln!("a join held {held:?} by a slow member");
    assert!(
        held >= Duration::from_millis(2500) && second.synced_at() <= Instant::now(),
        "synced_at is {held:?} after the join began; the join was held about 3 s"
    );
    assert!(
        first.synced_at() > started,
        "the first member's rejoin synced again"
    );

    // A kmirror member and a Java console consumer in one consumer group.
    k.create_topics(
        &[NewTopic {
            name: "shared4".into(),
            partitions: 4,
            replication_factor: 1,
            configs: vec![],
        }],
        false,
    )
    .await
    .unwrap();
    let assignor = Arc::new(RangeAssignor {
        topics: vec!["shared4".into()],
        partition_counts: [("shared4".to_string(), 4)].into(),
    });
    let config = GroupConfig {
        group_id: "shared".into(),
        protocol_type: "consumer".into(),
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(20),
        instance_id: None,
    };
    let mut me = GroupMember::join(k.clone(), config, assignor)
        .await
        .unwrap();
    assert_eq!(
        parse_assignment(me.assignment()).unwrap()["shared4"],
        [0, 1, 2, 3]
    );
    let cfg = c.client_config(None);
    let mut java = c
        .spawn_tool(
            "console-consumer",
            &[
                "--bootstrap-server",
                c.bootstrap(),
                "--command-config",
                cfg.to_str().unwrap(),
                "--topic",
                "shared4",
                "--group",
                "shared",
                "--timeout-ms",
                "120000",
            ],
        )
        .unwrap();
    let t0 = Instant::now();
    let mine = loop {
        me.poll().await.unwrap();
        let a = parse_assignment(me.assignment()).unwrap();
        if a.get("shared4").map_or(0, |p| p.len()) == 2 {
            break a["shared4"].clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the Java consumer never joined"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // kafka-consumer-groups sees both members and the same split.
    let mut owners: BTreeMap<i32, String> = BTreeMap::new();
    for _ in 0..20 {
        me.poll().await.unwrap();
        let out = c
            .tool(
                "consumer-groups",
                &[
                    "--bootstrap-server",
                    c.bootstrap(),
                    "--command-config",
                    cfg.to_str().unwrap(),
                    "--describe",
                    "--group",
                    "shared",
                ],
                None,
            )
            .unwrap();
        owners = out
            .lines()
            .filter(|l| l.contains("shared4"))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.get(2)?.parse().ok()?, f.get(6)?.to_string()))
            })
            .collect();
        if owners.len() == 4 && owners.values().any(|o| o == me.member_id()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut expected_mine: Vec<i32> = owners
        .iter()
        .filter(|(_, o)| *o == me.member_id())
        .map(|(p, _)| *p)
        .collect();
    expected_mine.sort();
    assert_eq!(
        expected_mine, mine,
        "owners per kafka-consumer-groups: {owners:?}"
    );
    assert_eq!(
        owners.values().filter(|o| *o != me.member_id()).count(),
        2,
        "the Java consumer owns the other two: {owners:?}"
    );
    me.leave().await.unwrap();
    let _ = java.kill();
    let _ = java.wait();
}
