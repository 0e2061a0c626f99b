//! `kmirror verify`: proves a migration complete by comparing each flow's source and target, one
//! row per check and topic (or partition): the remote topic exists under the policy's name, has
//! the source's partition count, holds as many records per partition as the source (allowing for
//! data still in flight, as the stored positions show), is fresh (newest timestamps), has the
//! source's configs and ACLs (per the sync rules), and every consumer group's offsets are
//! translated on the target. `--deep N` also compares the last N records byte for byte.
//!
//! This module holds the verdicts (pure); [`collect`] reads both clusters.

pub mod collect;
pub mod schemas;

use kmirror_kafka::records::Record;
use serde::Serialize;
use std::fmt::Write;

/// The verdict of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Not a difference, but not complete yet: data still in flight, a checkpoint not yet
    /// refreshed.
    Pending,
    Failed,
    /// Not checked (the sync is off, no authorizer, ...); the detail says why.
    Skipped,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Pending => "pending",
            Status::Failed => "FAILED",
            Status::Skipped => "skipped",
        }
    }
}

/// One check of one topic, partition or group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub flow: String,
    /// `topic`, `partitions`, `records`, `freshness`, `configs`, `acls`, `group`, `deep`.
    pub check: &'static str,
    /// The source topic (or the group, for `group` rows).
    pub subject: String,
    pub partition: Option<i32>,
    pub status: Status,
    pub detail: String,
}

/// Everything `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub topics: usize,
    pub partitions: usize,
    pub seconds: f64,
}

/// Exit codes of `verify` (documented in the CLI help and docs/verify.md).
pub const EXIT_DIFFERENCES: u8 = 5;
pub const EXIT_PENDING: u8 = 6;

impl Report {
    pub fn count(&self, s: Status) -> usize {
        self.rows.iter().filter(|r| r.status == s).count()
    }

    /// 0 when everything matches; [`EXIT_DIFFERENCES`] when any check failed;
    /// [`EXIT_PENDING`] when nothing differs but data is still in flight.
    pub fn exit_code(&self) -> u8 {
        if self.count(Status::Failed) > 0 {
            EXIT_DIFFERENCES
        } else if self.count(Status::Pending) > 0 {
            EXIT_PENDING
        } else {
            0
        }
    }

    pub fn summary(&self) -> String {
        format!(
            "verify: {} topic(s), {} partition(s): {} ok, {} pending, {} failed, {} skipped ({:.1} s)",
            self.topics,
            self.partitions,
            self.count(Status::Ok),
            self.count(Status::Pending),
            self.count(Status::Failed),
            self.count(Status::Skipped),
            self.seconds
        )
    }

    /// A table: failures first, then pending, then the rest, each in flow/topic order.
    /// `all = false` folds the ok rows into the summary.
    pub fn render(&self, all: bool) -> String {
        let mut rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| all || r.status != Status::Ok)
            .collect();
        let rank = |s: Status| match s {
            Status::Failed => 0,
            Status::Pending => 1,
            Status::Skipped => 2,
            Status::Ok => 3,
        };
        rows.sort_by(|a, b| {
            (rank(a.status), &a.flow, &a.subject, a.partition, a.check).cmp(&(
                rank(b.status),
                &b.flow,
                &b.subject,
                b.partition,
                b.check,
            ))
        });
        let mut o = String::new();
        for r in rows {
            let part = r.partition.map(|p| format!("-{p}")).unwrap_or_default();
            let _ = writeln!(
                o,
                "{:<8} {:<8} {:<10} {}{}  {}",
                r.status.word(),
                r.flow,
                r.check,
                r.subject,
                part,
                r.detail
            );
        }
        let _ = writeln!(o, "{}", self.summary());
        o
    }
}

/// The `transactions` verdict of a target partition whose last stable offset is below its high
/// watermark: a producer whose open transaction has seen no write for longer than the target's
/// `transaction.max.timeout.ms` is past any timeout its coordinator would apply, so its marker
/// was dropped (KAFKA-20734) and read_committed readers are stuck there. None when every open
/// transaction is younger (a copy in progress).
pub fn judge_open_transactions(
    producers: &[kmirror_kafka::txn_state::ProducerOnPartition],
    now_ms: i64,
    max_timeout_ms: i64,
) -> Option<(Status, String)> {
    let stuck: Vec<String> = producers
        .iter()
        .filter(|p| p.open_since >= 0 && now_ms - p.last_timestamp > max_timeout_ms)
        .map(|p| {
            format!(
                "producer id {} holds a transaction open from offset {}, last written {} s ago",
                p.producer_id,
                p.open_since,
                (now_ms - p.last_timestamp) / 1000
            )
        })
        .collect();
    if stuck.is_empty() {
        return None;
    }
    Some((
        Status::Failed,
        format!(
            "{} (longer than transaction.max.timeout.ms = {} s): its marker was dropped, and read_committed readers stop there; a kmirror slot settles its own at its next write, others need kafka-transactions.sh abort",
            stuck.join("; "),
            max_timeout_ms / 1000
        ),
    ))
}

/// The offsets of one partition on both sides, and the stored position (the last source offset
/// copied, as `mm2-offsets.<source>.internal` holds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionCounts {
    pub source_start: i64,
    pub source_end: i64,
    pub target_start: i64,
    pub target_end: i64,
    pub position: Option<i64>,
}

/// The `records` verdict: the target must hold what the source holds once the position reached
/// the source's end; before that, the difference is data in flight.
/// On a compacted source topic offsets are not records (compaction leaves gaps that a copy does
/// not have), so a caught-up copy with fewer offsets passes, with a note.
pub fn judge_records(c: &PartitionCounts, compacted: bool) -> (Status, String) {
    let source = (c.source_end - c.source_start).max(0);
    let target = (c.target_end - c.target_start).max(0);
    let copied_to = c.position.map_or(c.source_start, |p| p + 1);
    let in_flight = (c.source_end - copied_to.max(c.source_start)).max(0);
    let counts = format!("source {source}, target {target}");
    if in_flight > 0 && source > 0 {
        // A partition assigned and never started has no position: all of it counts, and it
        // says so (a copy that stalls before its first record is not "nearly done").
        let at = match c.position {
            Some(_) => format!("position {copied_to}"),
            None => "not started: no position stored".to_string(),
        };
        return (
            Status::Pending,
            format!(
                "{counts}; {in_flight} record(s) not copied yet ({at}, source end {})",
                c.source_end
            ),
        );
    }
    if target == source {
        (Status::Ok, counts)
    } else if target < source && compacted {
        (
            Status::Ok,
            format!("{counts}: compacted topic, all copied (offsets are not records; --deep compares records)"),
        )
    } else if target < source {
        (
            Status::Failed,
            format!(
                "{counts}: {} record(s) missing on the target (transaction markers or compaction on the source also make counts differ: --deep compares records)",
                source - target
            ),
        )
    } else {
        // Duplicates after a crash (at-least-once) or retention that removed source records
        // the target still holds: nothing is missing.
        (
            Status::Ok,
            format!(
                "{counts}: the target holds {} more (copied again after a restart, or older records the source's retention removed)",
                target - source
            ),
        )
    }
}

/// How `records` rows count a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Count {
    /// By offsets; a partition the offsets find short is then counted record by record (its
    /// source offsets may include transaction markers and aborted transactions).
    #[default]
    Auto,
    /// By offsets only: fast, but transaction markers, aborted transactions and compaction on
    /// the source make a complete copy look short.
    Offsets,
    /// Every partition record by record, as a reader sees it (reads both logs).
    Records,
}

/// The `records` verdict from the records counted on both sides of a caught-up partition (what
/// a reader sees: no transaction markers, and with read_committed no aborted transactions).
/// `offsets` is the count by offsets (source, target), for the note.
pub fn judge_counted(source: i64, target: i64, offsets: (i64, i64)) -> (Status, String) {
    let counts = format!("source {source}, target {target} (counted record by record)");
    let markers = offsets.0 - source;
    if target < source {
        return (
            Status::Failed,
            format!(
                "{counts}: {} record(s) missing on the target",
                source - target
            ),
        );
    }
    let why = if markers > 0 {
        format!(
            "; the source's {} offsets include {markers} that are not records a reader sees (transaction markers, aborted transactions, compaction)",
            offsets.0
        )
    } else {
        String::new()
    };
    if target == source {
        (Status::Ok, format!("{counts}{why}"))
    } else {
        (
            Status::Ok,
            format!(
                "{counts}: the target holds {} more (copied again after a restart, or older records the source's retention removed){why}",
                target - source
            ),
        )
    }
}

/// The `freshness` verdict from the newest timestamps of both sides.
pub fn judge_freshness(source: Option<i64>, target: Option<i64>) -> (Status, String) {
    match (source, target) {
        (None, _) => (Status::Ok, "no records on the source".into()),
        (Some(s), Some(t)) if t >= s => (Status::Ok, format!("newest record at {t} on both")),
        (Some(s), Some(t)) => (
            Status::Pending,
            format!(
                "newest on the target {:.1} s older than on the source ({t} < {s})",
                (s - t) as f64 / 1000.0
            ),
        ),
        (Some(s), None) => (
            Status::Pending,
            format!("no records on the target yet (newest on the source: {s})"),
        ),
    }
}

/// The `deep` verdict: the last records of both sides, compared in order (key, value, headers,
/// timestamp). A key or value whose schema id was rewritten passes when the rest is equal and
/// `ids` maps the source's id to the target's (the two versions found canonically equal).
pub fn judge_deep(
    source: &[Record],
    target: &[Record],
    ids: &std::collections::BTreeMap<i32, i32>,
) -> (Status, String) {
    let same = |a: &Option<bytes::Bytes>, b: &Option<bytes::Bytes>| match (a, b) {
        (Some(a), Some(b)) => schemas::same_payload(a, b, ids),
        (a, b) => a == b,
    };
    if source.len() != target.len() {
        return (
            Status::Failed,
            format!(
                "last records: {} on the source, {} on the target",
                source.len(),
                target.len()
            ),
        );
    }
    for (i, (s, t)) in source.iter().zip(target).enumerate() {
        let what = if !same(&s.key, &t.key) {
            Some("key")
        } else if !same(&s.value, &t.value) {
            Some("value")
        } else if s.headers != t.headers {
            Some("headers")
        } else if s.timestamp != t.timestamp {
            Some("timestamp")
        } else {
            None
        };
        if let Some(what) = what {
            return (
                Status::Failed,
                format!(
                    "{what} differs: source offset {} vs target offset {} ({} from the end)",
                    s.offset,
                    t.offset,
                    source.len() - i
                ),
            );
        }
    }
    (
        Status::Ok,
        format!("last {} record(s) identical", source.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn counts(ss: i64, se: i64, ts: i64, te: i64, pos: Option<i64>) -> PartitionCounts {
        PartitionCounts {
            source_start: ss,
            source_end: se,
            target_start: ts,
            target_end: te,
            position: pos,
        }
    }

    fn judge_records_(c: &PartitionCounts) -> (Status, String) {
        judge_records(c, false)
    }

    #[test]
    fn counted_records_see_past_markers_and_still_find_a_missing_record() {
        // 70 records a reader sees behind 103 offsets (3 markers, 30 aborted): complete.
        let (s, d) = judge_counted(70, 70, (103, 70));
        assert_eq!(s, Status::Ok, "{d}");
        assert!(d.contains("include 33 that are not records"), "{d}");
        let (s, d) = judge_counted(70, 69, (103, 69));
        assert_eq!(s, Status::Failed);
        assert!(d.contains("1 record(s) missing"), "{d}");
        let (s, d) = judge_counted(70, 75, (70, 75));
        assert_eq!(s, Status::Ok);
        assert!(d.contains("5 more") && !d.contains("include"), "{d}");
    }

    #[test]
    fn records_rule() {
        let (s, d) = judge_records(&counts(0, 10, 0, 7, Some(9)), true);
        assert_eq!(s, Status::Ok);
        assert!(d.contains("compacted topic"), "{d}");
        assert_eq!(judge_records_(&counts(0, 10, 0, 10, Some(9))).0, Status::Ok);
        assert_eq!(judge_records_(&counts(0, 0, 0, 0, None)).0, Status::Ok);
        let (s, d) = judge_records_(&counts(0, 10, 0, 6, Some(5)));
        assert_eq!(s, Status::Pending);
        assert!(d.contains("4 record(s) not copied yet"), "{d}");
        let (s, d) = judge_records_(&counts(0, 10, 1, 10, Some(9)));
        assert_eq!(s, Status::Failed);
        assert!(d.contains("1 record(s) missing"), "{d}");
        // Duplicates, or source retention: more on the target is not a loss.
        assert_eq!(judge_records_(&counts(5, 10, 0, 12, Some(9))).0, Status::Ok);
        // No position stored yet for a non-empty partition: all of it is in flight.
        let (s, d) = judge_records_(&counts(0, 3, 0, 0, None));
        assert_eq!(s, Status::Pending);
        assert!(
            d.contains("3 record(s) not copied yet (not started: no position stored"),
            "{d}"
        );
    }

    #[test]
    fn freshness_rule() {
        assert_eq!(judge_freshness(Some(5), Some(5)).0, Status::Ok);
        assert_eq!(judge_freshness(None, None).0, Status::Ok);
        assert_eq!(judge_freshness(Some(5_000), Some(2_000)).0, Status::Pending);
        assert!(judge_freshness(Some(5_000), Some(2_000))
            .1
            .contains("3.0 s"));
        assert_eq!(judge_freshness(Some(5), None).0, Status::Pending);
    }

    fn rec(offset: i64, v: &str) -> Record {
        Record {
            offset,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(v.to_string())),
            headers: vec![],
        }
    }

    #[test]
    fn deep_compares_content_not_offsets() {
        let s = [rec(10, "a"), rec(11, "b")];
        let t = [rec(0, "a"), rec(1, "b")];
        assert_eq!(judge_deep(&s, &t, &Default::default()).0, Status::Ok);
        let t2 = [rec(0, "a"), rec(1, "c")];
        let (st, d) = judge_deep(&s, &t2, &Default::default());
        assert_eq!(st, Status::Failed);
        assert!(
            d.contains("value differs: source offset 11 vs target offset 1"),
            "{d}"
        );
        assert_eq!(
            judge_deep(&s, &t[..1], &Default::default()).0,
            Status::Failed
        );
    }

    #[test]
    fn only_transactions_open_past_the_broker_timeout_are_hanging() {
        use kmirror_kafka::txn_state::ProducerOnPartition;
        let p = |id, open_since, last_timestamp| ProducerOnPartition {
            producer_id: id,
            epoch: 0,
            last_timestamp,
            open_since,
        };
        let now = 10_000_000;
        let max = 900_000;
        assert_eq!(
            judge_open_transactions(&[p(1, 40, now - 5_000)], now, max),
            None
        );
        assert_eq!(judge_open_transactions(&[p(1, -1, 0)], now, max), None);
        let (status, detail) =
            judge_open_transactions(&[p(1, 40, now - 5_000), p(7, 12, now - 901_000)], now, max)
                .unwrap();
        assert_eq!(status, Status::Failed);
        assert!(
            detail.contains("producer id 7") && detail.contains("offset 12"),
            "{detail}"
        );
        assert!(!detail.contains("producer id 1 "), "{detail}");
    }

    #[test]
    fn exit_codes_and_summary() {
        let row = |status| Row {
            flow: "A->B".into(),
            check: "records",
            subject: "t".into(),
            partition: Some(0),
            status,
            detail: String::new(),
        };
        let mut r = Report {
            rows: vec![row(Status::Ok), row(Status::Skipped)],
            topics: 1,
            partitions: 1,
            seconds: 0.5,
        };
        assert_eq!(r.exit_code(), 0);
        r.rows.push(row(Status::Pending));
        assert_eq!(r.exit_code(), EXIT_PENDING);
        r.rows.push(row(Status::Failed));
        assert_eq!(r.exit_code(), EXIT_DIFFERENCES);
        assert!(r.summary().contains("1 ok, 1 pending, 1 failed, 1 skipped"));
        let text = r.render(false);
        assert!(text.starts_with("FAILED"), "{text}");
        assert!(!text.contains("ok       A->B"), "{text}");
    }
}
