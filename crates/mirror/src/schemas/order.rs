//! The order in which versions are registered on a target registry: every version after the
//! versions it refers to (a registry refuses a schema whose references it does not have), and a
//! subject's versions oldest first (its history replays as it was written). Deterministic: by
//! subject name, then version, whenever references leave a choice.

use std::collections::{BTreeMap, BTreeSet};

/// A subject's version.
pub type VersionKey = (String, i32);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("schema {0}/{1} refers to {2} version {3}, which the source registry does not have")]
    MissingReference(String, i32, String, i32),
    #[error("schema references form a cycle through {}", .0.iter().map(|(s, v)| format!("{s}/{v}")).collect::<Vec<_>>().join(" -> "))]
    Cycle(Vec<VersionKey>),
}

/// The registration order of `versions` (each with the versions it refers to).
pub fn registration_order(
    versions: &BTreeMap<VersionKey, Vec<VersionKey>>,
) -> Result<Vec<VersionKey>, OrderError> {
    let mut done: BTreeSet<&VersionKey> = BTreeSet::new();
    let mut out = Vec::with_capacity(versions.len());
    for key in versions.keys() {
        let mut path = Vec::new();
        visit(key, versions, &mut done, &mut path, &mut out)?;
    }
    Ok(out)
}

fn visit<'a>(
    key: &'a VersionKey,
    versions: &'a BTreeMap<VersionKey, Vec<VersionKey>>,
    done: &mut BTreeSet<&'a VersionKey>,
    path: &mut Vec<&'a VersionKey>,
    out: &mut Vec<VersionKey>,
) -> Result<(), OrderError> {
    if done.contains(key) {
        return Ok(());
    }
    if let Some(at) = path.iter().position(|k| *k == key) {
        let mut cycle: Vec<VersionKey> = path[at..].iter().map(|k| (*k).clone()).collect();
        cycle.push(key.clone());
        return Err(OrderError::Cycle(cycle));
    }
    path.push(key);
    // A subject's earlier versions first, then what this one refers to.
    let (subject, version) = key;
    let earlier = versions
        .range((subject.clone(), i32::MIN)..(subject.clone(), *version))
        .map(|(k, _)| k);
    for before in earlier {
        visit(before, versions, done, path, out)?;
    }
    for r in &versions[key] {
        let Some((known, _)) = versions.get_key_value(r) else {
            return Err(OrderError::MissingReference(
                subject.clone(),
                *version,
                r.0.clone(),
                r.1,
            ));
        };
        visit(known, versions, done, path, out)?;
    }
    path.pop();
    done.insert(key);
    out.push(key.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str, v: i32) -> VersionKey {
        (s.to_string(), v)
    }

    fn order(edges: &[(VersionKey, &[VersionKey])]) -> Result<Vec<VersionKey>, OrderError> {
        let map = edges
            .iter()
            .map(|(key, refs)| (key.clone(), refs.to_vec()))
            .collect();
        registration_order(&map)
    }

    #[test]
    fn referenced_versions_go_first_and_histories_oldest_first() {
        let got = order(&[
            (k("a-value", 1), &[]),
            (k("a-value", 2), &[k("z-common", 2)]),
            (k("b-value", 1), &[k("z-common", 1)]),
            (k("z-common", 1), &[]),
            (k("z-common", 2), &[]),
        ])
        .unwrap();
        assert_eq!(
            got,
            vec![
                k("a-value", 1),
                k("z-common", 1),
                k("z-common", 2),
                k("a-value", 2),
                k("b-value", 1),
            ]
        );
    }

    #[test]
    fn a_version_refers_to_an_earlier_version_of_its_own_subject_or_to_nothing_missing() {
        let got = order(&[(k("s", 2), &[k("s", 1)]), (k("s", 1), &[])]).unwrap();
        assert_eq!(got, vec![k("s", 1), k("s", 2)]);
        let e = order(&[(k("s", 1), &[k("gone", 3)])]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "schema s/1 refers to gone version 3, which the source registry does not have"
        );
    }

    #[test]
    fn a_cycle_is_named() {
        let e = order(&[(k("a", 1), &[k("b", 1)]), (k("b", 1), &[k("a", 1)])]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "schema references form a cycle through a/1 -> b/1 -> a/1"
        );
        // A later version referred to by an earlier one of the same subject is a cycle too.
        let e = order(&[(k("s", 1), &[k("s", 2)]), (k("s", 2), &[])]).unwrap_err();
        assert!(matches!(e, OrderError::Cycle(_)), "{e}");
    }
}
