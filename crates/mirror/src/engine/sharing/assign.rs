//! How the processes serving one flow divide its source partitions (docs/sharing.md): what each
//! member tells the group (its flow settings, as one short hash per setting, and the partitions
//! it owns), and the leader's assignment, sticky and cooperative as KIP-429's assignor: a
//! partition stays with its owner unless balance needs it elsewhere, and one that must move is
//! first given to nobody, so that its owner drains it and stores its position before the next
//! rebalance hands it on. No I/O here.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A source partition of the flow.
pub type Key = (String, i32);

/// The group protocol this version speaks. A later version that changes the metadata or the
/// assignment lists its own name first and this one after it: the coordinator picks the first
/// protocol every member supports, so a rolling upgrade goes on in the old protocol until the
/// last old process is gone.
pub const PROTOCOL: &str = "kmirror-v1";

/// The group protocol of exactly-once flows, whose members are given slots, not partitions
/// (docs/sharing.md, "Exactly-once"): the only one they offer, so a version that would copy such
/// a flow without transactions has no protocol in common with them and the coordinator refuses
/// it.
pub const EOS_PROTOCOL: &str = "kmirror-eos-v1";

/// A slot's key in the assignment: the empty topic name, which no Kafka topic can have, and
/// the slot's index.
pub fn slot_key(index: u32) -> Key {
    (String::new(), index as i32)
}

/// The slot a key names, if it names one.
pub fn slot_index(key: &Key) -> Option<u32> {
    if key.0.is_empty() {
        u32::try_from(key.1).ok()
    } else {
        None
    }
}

/// What a member sends with JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberMetadata {
    /// The flow's settings, one hash per setting (`settings_digest`): compared so that processes
    /// with different settings are not mixed, and named when they differ, without showing values.
    pub settings: BTreeMap<String, String>,
    /// The partitions it serves now, by topic.
    pub owned: BTreeMap<String, Vec<i32>>,
    /// Where it runs (host name and process id), for `status` and the logs.
    pub host: String,
}

/// What the leader sends each member with SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Assignment {
    /// The partitions to serve, by topic.
    pub partitions: BTreeMap<String, Vec<i32>>,
    /// Set when the member is refused (its settings differ from the group's): it must stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Every member's share, as the leader assigned them, so that any process can show the whole
    /// group in `status` (a member of an older version ignores it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<Share>,
    /// The settings the group agreed on (hashes, as members offer them). A static member that
    /// came back is handed its old assignment without a rebalance, so no leader compared its
    /// settings: it compares them itself ([`differs`]) and rejoins if they differ, so the leader
    /// refuses it with the reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

/// Whether `mine` differs from the group's agreed settings in a setting both know (a setting
/// only one version has is not compared, as in [`assign`]).
pub fn differs(mine: &BTreeMap<String, String>, agreed: &BTreeMap<String, String>) -> bool {
    mine.iter()
        .any(|(k, v)| agreed.get(k).is_some_and(|a| a != v))
}

pub use crate::metrics::process::Share;

/// Puts the group view (every member that is not refused, by host, with its partition count) in
/// each assignment that is not a refusal. `hosts` maps member ids to their hosts.
pub fn add_group_view(
    out: &mut BTreeMap<String, Assignment>,
    leader: &str,
    hosts: &BTreeMap<&str, &str>,
) {
    let mut group: Vec<Share> = out
        .iter()
        .filter(|(_, a)| a.refused.is_none())
        .map(|(id, a)| Share {
            member: id.clone(),
            host: hosts.get(id.as_str()).copied().unwrap_or("?").to_string(),
            partitions: a.partitions.values().map(Vec::len).sum(),
            leader: id == leader,
        })
        .collect();
    group.sort_by(|a, b| a.host.cmp(&b.host).then_with(|| a.member.cmp(&b.member)));
    for a in out.values_mut().filter(|a| a.refused.is_none()) {
        a.group = group.clone();
    }
}

pub fn by_topic(keys: &BTreeSet<Key>) -> BTreeMap<String, Vec<i32>> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (t, p) in keys {
        out.entry(t.clone()).or_default().push(*p);
    }
    out
}

pub fn keys(by_topic: &BTreeMap<String, Vec<i32>>) -> BTreeSet<Key> {
    by_topic
        .iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
        .collect()
}

/// FNV-1a, 64 bits: stable across Rust versions and builds (std's hasher is not promised to
/// be), since members of different versions compare these during a rolling upgrade.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One hash per setting of a flow, from its settings as JSON (`FlowConfig` serialised). Left out:
/// what may differ between the processes of one deployment without changing what is copied or
/// how (whether this process serves the flow, client connection settings, rate limits, which
/// are per process), and `keys_set`, the keys as the file wrote them for `plan`: each is
/// compared through its own field, and the text also holds per-process values such as
/// `kmirror.sharing.instance.id` (a group refused every process but one for it).
pub fn settings_digest(flow: &serde_json::Value) -> BTreeMap<String, String> {
    const PER_PROCESS: [&str; 5] = [
        "served",
        "clients",
        "rate_limit",
        "process_rate_limit",
        "keys_set",
    ];
    let mut out = BTreeMap::new();
    if let Some(fields) = flow.as_object() {
        for (k, v) in fields {
            if PER_PROCESS.contains(&k.as_str()) {
                continue;
            }
            let mut v = v.clone();
            if k == "sharing" {
                // Each process's own static identity (absent when unset, so an older
                // version's hash of the other sharing settings is unchanged).
                if let Some(o) = v.as_object_mut() {
                    o.remove("instance_id");
                }
            }
            out.insert(
                k.clone(),
                format!("{:016x}", fnv1a(v.to_string().as_bytes())),
            );
        }
    }
    out
}

/// The settings whose hashes differ (or that one side lacks: [`assign`] compares only the
/// settings every member knows).
pub fn differences(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    names
        .into_iter()
        .filter(|n| a.get(*n) != b.get(*n))
        .cloned()
        .collect()
}

/// The leader's view of one member.
#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub metadata: MemberMetadata,
}

/// Divides `partitions` among `members`. `leader` holds the settings of the member computing it:
/// they win a tie. Members whose settings differ from the majority's are refused.
pub fn assign(
    leader: &BTreeMap<String, String>,
    members: &[Member],
    partitions: &BTreeSet<Key>,
) -> BTreeMap<String, Assignment> {
    let mut out = BTreeMap::new();
    // Only settings every member knows are compared: a newer version may add settings, and a
    // rolling upgrade must not refuse its first upgraded process (docs/sharing.md, "Versions").
    let mut common: Option<BTreeSet<&String>> = None;
    for keys in members
        .iter()
        .map(|m| m.metadata.settings.keys().collect::<BTreeSet<_>>())
        .chain(std::iter::once(leader.keys().collect()))
    {
        common = Some(match common {
            None => keys,
            Some(c) => c.intersection(&keys).copied().collect(),
        });
    }
    let common = common.unwrap_or_default();
    let known = |s: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        s.iter()
            .filter(|(k, _)| common.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let settings: Vec<BTreeMap<String, String>> = members
        .iter()
        .map(|m| known(&m.metadata.settings))
        .collect();
    let leader = known(leader);
    // The settings most members have; the leader's on a tie.
    let mut counts: Vec<(&BTreeMap<String, String>, usize, bool)> = Vec::new();
    for s in &settings {
        match counts.iter_mut().find(|c| c.0 == s) {
            Some(c) => {
                c.1 += 1;
            }
            None => counts.push((s, 1, *s == leader)),
        }
    }
    let Some(winner) = counts
        .iter()
        .max_by_key(|c| (c.1, c.2))
        .map(|c| c.0.clone())
    else {
        return out;
    };
    let agreeing = settings.iter().filter(|s| **s == winner).count();
    let mut eligible: Vec<&Member> = Vec::new();
    for (m, s) in members.iter().zip(&settings) {
        if *s == winner {
            eligible.push(m);
        } else {
            let diff = differences(&winner, s);
            out.insert(
                m.id.clone(),
                Assignment {
                    partitions: BTreeMap::new(),
                    group: Vec::new(),
                    settings: BTreeMap::new(),
                    refused: Some(format!(
                        "this process's flow settings differ from those of the {agreeing} other process(es) serving the flow: {} (start every process with the same configuration)",
                        diff.join(", ")
                    )),
                },
            );
        }
    }
    if eligible.is_empty() {
        return out;
    }
    // Members in a stable order: most owned first (they keep the larger quotas), then by id.
    eligible.sort_by(|a, b| {
        let (oa, ob) = (owned_count(a), owned_count(b));
        ob.cmp(&oa).then_with(|| a.id.cmp(&b.id))
    });
    let n = partitions.len();
    let m = eligible.len();
    let quota = |i: usize| n / m + usize::from(i < n % m);
    // Each partition is kept by at most one owner (the first in that order claiming it).
    let mut taken: BTreeSet<Key> = BTreeSet::new();
    let mut kept: Vec<BTreeSet<Key>> = Vec::with_capacity(m);
    // Partitions an owner must give up: assigned to nobody in this generation.
    let mut moving: BTreeSet<Key> = BTreeSet::new();
    for (i, member) in eligible.iter().enumerate() {
        let mut mine = BTreeSet::new();
        for key in keys(&member.metadata.owned) {
            if !partitions.contains(&key) || taken.contains(&key) {
                continue;
            }
            taken.insert(key.clone());
            if mine.len() < quota(i) {
                mine.insert(key);
            } else {
                moving.insert(key);
            }
        }
        kept.push(mine);
    }
    // Partitions nobody owns go to the members below their quota, the emptiest first.
    for key in partitions {
        if taken.contains(key) {
            continue;
        }
        let room = (0..m)
            .filter(|i| kept[*i].len() < quota(*i))
            .min_by_key(|i| (kept[*i].len(), *i));
        if let Some(i) = room {
            kept[i].insert(key.clone());
        }
    }
    for (member, mine) in eligible.iter().zip(kept) {
        out.insert(
            member.id.clone(),
            Assignment {
                partitions: by_topic(&mine),
                refused: None,
                group: Vec::new(),
                settings: winner.clone(),
            },
        );
    }
    out
}

fn owned_count(m: &Member) -> usize {
    m.metadata.owned.values().map(Vec::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(topic: &str, n: i32) -> BTreeSet<Key> {
        (0..n).map(|p| (topic.to_string(), p)).collect()
    }

    fn member(id: &str, owned: &BTreeSet<Key>) -> Member {
        Member {
            id: id.into(),
            metadata: MemberMetadata {
                settings: BTreeMap::from([("topics".into(), "1".into())]),
                owned: by_topic(owned),
                host: "h".into(),
            },
        }
    }

    fn of(a: &BTreeMap<String, Assignment>, id: &str) -> BTreeSet<Key> {
        keys(&a[id].partitions)
    }

    /// Runs rebalances as members do: each owns what it was assigned, and a member that lost
    /// partitions rejoins, until nothing moves. Returns every assignment seen.
    fn settle(
        ids: &[&str],
        mut owned: BTreeMap<String, BTreeSet<Key>>,
        partitions: &BTreeSet<Key>,
    ) -> Vec<BTreeMap<String, Assignment>> {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let members: Vec<Member> = ids
                .iter()
                .map(|id| member(id, owned.get(*id).unwrap_or(&BTreeSet::new())))
                .collect();
            let a = assign(&members[0].metadata.settings, &members, partitions);
            let before = owned.clone();
            for id in ids {
                owned.insert(id.to_string(), of(&a, id));
            }
            seen.push(a);
            if owned == before {
                break;
            }
        }
        seen
    }

    #[test]
    fn a_new_group_divides_evenly_and_covers_everything_once() {
        let all = parts("t", 25);
        let a = settle(&["m1", "m2", "m3"], BTreeMap::new(), &all);
        let last = a.last().unwrap();
        let sizes: Vec<usize> = ["m1", "m2", "m3"]
            .iter()
            .map(|m| of(last, m).len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 25);
        assert!(sizes.iter().all(|s| *s == 8 || *s == 9), "{sizes:?}");
        let union: BTreeSet<Key> = ["m1", "m2", "m3"]
            .iter()
            .flat_map(|m| of(last, m))
            .collect();
        assert_eq!(union, all);
        // Nothing owned yet: the first assignment is already final.
        assert_eq!(a.len(), 2, "one assignment, then one that changes nothing");
    }

    #[test]
    fn a_joining_member_takes_only_what_balance_needs_and_nothing_else_moves() {
        let all = parts("t", 24);
        let first = settle(&["m1", "m2", "m3"], BTreeMap::new(), &all);
        let first = first.last().unwrap();
        let owned: BTreeMap<String, BTreeSet<Key>> = ["m1", "m2", "m3"]
            .iter()
            .map(|m| (m.to_string(), of(first, m)))
            .collect();
        let rounds = settle(&["m1", "m2", "m3", "m4"], owned.clone(), &all);
        // Cooperative: in every round, each old member's assignment is a subset of what it
        // owned (it is never given a partition another member still serves) or only adds
        // partitions nobody owned.
        let mut now = owned.clone();
        for r in &rounds {
            let serving: BTreeMap<&String, &BTreeSet<Key>> = now.iter().collect();
            for (id, a) in r {
                for key in keys(&a.partitions) {
                    let elsewhere = serving
                        .iter()
                        .any(|(other, ks)| *other != id && ks.contains(&key));
                    assert!(
                        !elsewhere,
                        "{id} given {key:?} while another member serves it"
                    );
                }
            }
            for (id, a) in r {
                now.insert(id.clone(), keys(&a.partitions));
            }
        }
        let last = rounds.last().unwrap();
        let sizes: Vec<usize> = ["m1", "m2", "m3", "m4"]
            .iter()
            .map(|m| of(last, m).len())
            .collect();
        assert_eq!(sizes, vec![6, 6, 6, 6]);
        // Exactly 6 partitions moved, all to m4; every other partition stayed with its owner.
        for m in ["m1", "m2", "m3"] {
            assert!(of(last, m).is_subset(&owned[m]), "{m} kept only its own");
        }
        assert_eq!(rounds.len(), 3, "revoke, hand over, stable");
    }

    #[test]
    fn a_leaving_member_s_partitions_go_to_the_others_at_once() {
        let all = parts("t", 24);
        let first = settle(&["m1", "m2", "m3"], BTreeMap::new(), &all);
        let first = first.last().unwrap();
        let owned: BTreeMap<String, BTreeSet<Key>> = ["m1", "m2"]
            .iter()
            .map(|m| (m.to_string(), of(first, m)))
            .collect();
        let rounds = settle(&["m1", "m2"], owned.clone(), &all);
        let a = &rounds[0];
        assert_eq!(of(a, "m1").len() + of(a, "m2").len(), 24);
        for m in ["m1", "m2"] {
            assert!(owned[m].is_subset(&of(a, m)), "{m} keeps what it had");
        }
    }

    #[test]
    fn partitions_gone_or_claimed_twice_are_sorted_out() {
        let all = parts("t", 4);
        // m1 claims a partition that no longer exists; both claim t-0 (a member that lost its
        // membership without knowing it still reports it).
        let m1: BTreeSet<Key> = [("t".into(), 0), ("t".into(), 1), ("gone".into(), 0)].into();
        let m2: BTreeSet<Key> = [("t".into(), 0), ("t".into(), 2)].into();
        let (l1, l2) = (member("m1", &m1), member("m2", &m2));
        let a = assign(&l1.metadata.settings.clone(), &[l1, l2], &all);
        let (a1, a2) = (of(&a, "m1"), of(&a, "m2"));
        assert!(a1.is_disjoint(&a2));
        assert!(!a1.contains(&("gone".to_string(), 0)));
        assert_eq!(a1.len() + a2.len(), 4);
    }

    #[test]
    fn a_member_with_other_settings_is_refused_naming_them() {
        let all = parts("t", 4);
        let mut odd = member("m3", &BTreeSet::new());
        odd.metadata.settings =
            BTreeMap::from([("topics".into(), "2".into()), ("policy".into(), "x".into())]);
        let leader = member("m1", &BTreeSet::new());
        let a = assign(
            &leader.metadata.settings.clone(),
            &[leader, member("m2", &BTreeSet::new()), odd],
            &all,
        );
        let refused = a["m3"].refused.as_deref().unwrap();
        // `policy`, which the others do not know (an older version), is not compared.
        assert!(
            refused.ends_with(
                "serving the flow: topics (start every process with the same configuration)"
            ),
            "{refused}"
        );
        assert!(a["m3"].partitions.is_empty());
        assert_eq!(of(&a, "m1").len() + of(&a, "m2").len(), 4);
    }

    #[test]
    fn a_member_compares_only_the_settings_both_know() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let agreed = m(&[("topics", "1"), ("policy", "2")]);
        assert!(!differs(&m(&[("topics", "1"), ("policy", "2")]), &agreed));
        assert!(differs(&m(&[("topics", "9"), ("policy", "2")]), &agreed));
        // A setting one version adds, or an assignment from a version that sends none.
        assert!(!differs(&m(&[("topics", "1"), ("renames", "3")]), &agreed));
        assert!(!differs(&m(&[("topics", "9")]), &BTreeMap::new()));
    }

    #[test]
    fn the_settings_digest_leaves_out_what_is_per_process() {
        let a = serde_json::json!({"topics": ["a.*"], "served": true, "clients": {"x": 1}, "rate_limit": 5,
            "keys_set": [["kmirror.sharing.instance.id", "one"]]});
        let b = serde_json::json!({"topics": ["a.*"], "served": false, "clients": {"x": 2}, "rate_limit": null,
            "keys_set": [["kmirror.sharing.instance.id", "two"]]});
        let c = serde_json::json!({"topics": ["b.*"], "served": true});
        assert_eq!(settings_digest(&a), settings_digest(&b));
        assert_eq!(
            differences(&settings_digest(&a), &settings_digest(&c)),
            vec!["topics".to_string()]
        );
        // Stable across builds: a fixed input has a fixed hash.
        assert_eq!(
            settings_digest(&serde_json::json!({"k": 1}))["k"],
            format!("{:016x}", fnv1a(b"1"))
        );
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn slots_are_keys_no_topic_can_have_and_divide_like_partitions() {
        let slots: BTreeSet<Key> = (0..12).map(slot_key).collect();
        assert!(slots.iter().all(|k| slot_index(k).is_some()));
        assert_eq!(slot_index(&slot_key(7)), Some(7));
        assert_eq!(
            slot_index(&("t".into(), 7)),
            None,
            "a partition is not a slot"
        );
        assert_eq!(slot_index(&(String::new(), -1)), None);
        // They travel as the metadata's `owned` under the empty topic name.
        let text = serde_json::to_string(&by_topic(&slots)).unwrap();
        assert!(text.starts_with(r#"{"":[0,1,2"#), "{text}");
        assert_eq!(keys(&serde_json::from_str(&text).unwrap()), slots);
        // 12 slots over 3 processes, then a fourth joins: 3 each, and only 3 move.
        let a = settle(&["m1", "m2", "m3"], BTreeMap::new(), &slots);
        let last = a.last().unwrap();
        let owned: BTreeMap<String, BTreeSet<Key>> = ["m1", "m2", "m3"]
            .iter()
            .map(|m| (m.to_string(), of(last, m)))
            .collect();
        assert!(owned.values().all(|s| s.len() == 4), "{owned:?}");
        let after = settle(&["m1", "m2", "m3", "m4"], owned.clone(), &slots);
        let last = after.last().unwrap();
        assert_eq!(of(last, "m4").len(), 3);
        for (m, had) in &owned {
            let now = of(last, m);
            assert_eq!(now.len(), 3);
            assert!(now.is_subset(had), "{m} was given a slot it did not hold");
        }
    }

    #[test]
    fn metadata_and_assignment_round_trip_as_json() {
        let m = MemberMetadata {
            settings: BTreeMap::from([("topics".into(), "1".into())]),
            owned: by_topic(&parts("t", 3)),
            host: "h:1".into(),
        };
        let text = serde_json::to_vec(&m).unwrap();
        assert_eq!(serde_json::from_slice::<MemberMetadata>(&text).unwrap(), m);
        let a = Assignment::default();
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"partitions":{}}"#);
    }

    #[test]
    fn a_setting_only_newer_members_know_is_not_compared_until_every_member_knows_it() {
        let all = parts("t", 6);
        let with = |id: &str, extra: Option<&str>| {
            let mut m = member(id, &BTreeSet::new());
            if let Some(v) = extra {
                m.metadata.settings.insert("new_setting".into(), v.into());
            }
            m
        };
        // A rolling upgrade: one process of three is new and knows a setting the others lack.
        let old = with("m1", None);
        let a = assign(
            &old.metadata.settings.clone(),
            &[old, with("m2", None), with("m3", Some("x"))],
            &all,
        );
        assert!(a.values().all(|x| x.refused.is_none()), "{a:?}");
        assert_eq!(of(&a, "m3").len(), 2);
        // Every process upgraded: now the new setting counts.
        let first = with("m1", Some("x"));
        let a = assign(
            &first.metadata.settings.clone(),
            &[first, with("m2", Some("x")), with("m3", Some("y"))],
            &all,
        );
        let refused = a["m3"].refused.as_deref().unwrap();
        assert!(
            refused.contains("new_setting") && refused.contains("the 2 other"),
            "{refused}"
        );
    }
}
