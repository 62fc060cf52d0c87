//! `journal show|verify|export` over a mirror directory.
mod common;

use common::*;
use journal::audit::{self, AnnotationCheck, Format};
use journal::*;

fn sample() -> Writer {
    let mut w = Writer::new();
    w.scale(op(1), 3, 2);
    let mut i = intent(OperationKind::Restart, 2, 2);
    i.token = Some("tok-1".into());
    w.push(op(2), EntryBody::Intent(i));
    w.push(op(2), issued(op(2), "template"));
    w.push(op(2), blocked("rollout stuck"));
    w
}

fn mirror_with(w: &Writer) -> (tempfile::TempDir, Mirror) {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    m.append(FLEET, w.journal.entries()).unwrap();
    (dir, m)
}

#[test]
fn show_prints_operations_and_their_transitions_as_a_table() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut out = Vec::new();
    audit::show(&m, None, Format::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains(&format!("FLEET {FLEET} (entries 1..7, 2 operations)")),
        "{text}"
    );
    assert!(text.contains(&op(1).to_string()));
    assert!(text.contains("Completed/Succeeded"));
    assert!(text.contains("Open/Blocked"));
    assert!(text.contains("rollout stuck"));
    assert!(text.contains("token=tok-1"));
    assert_eq!(text.lines().filter(|l| l.contains("Issued")).count(), 2);
}

#[test]
fn the_table_shows_seconds_aligned_columns_and_filters() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut out = Vec::new();
    audit::show(&m, None, Format::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Times to the second: no fractional seconds anywhere in the table.
    let frac = regex_free_fraction(&text);
    assert!(!frac, "{text}");
    assert!(text.contains("deadline=2026-11-29T10:30:00Z"), "{text}");
    // The header's columns line up with the operations' rows.
    let header = lines.iter().find(|l| l.starts_with("OPERATION")).unwrap();
    let kind_at = header.find("KIND").unwrap();
    for (id, kind) in [(op(1), "Scale"), (op(2), "Restart")] {
        let row = lines
            .iter()
            .find(|l| l.starts_with(&id.to_string()))
            .unwrap();
        assert_eq!(row.find(kind), Some(kind_at), "{text}");
    }
    // Transition rows share column widths: every entry type starts in one column.
    let types: Vec<usize> = lines
        .iter()
        .filter(|l| l.starts_with("  ") && l.contains("T") && l.contains('Z'))
        .filter_map(|l| l.find('Z').map(|z| z + 3))
        .collect();
    assert!(types.windows(2).all(|w| w[0] == w[1]), "{text}");

    let only = |operation: Option<String>, since| {
        let mut out = Vec::new();
        let options = audit::ShowOptions {
            format: Format::JsonLines,
            operation,
            since,
        };
        audit::show_with(&m, None, &options, &mut out).unwrap();
        String::from_utf8(out).unwrap().lines().count()
    };
    assert_eq!(only(None, None), 2);
    assert_eq!(only(Some(op(1).to_string()), None), 1);
    let prefix = op(2).to_string()[..8].to_string();
    assert_eq!(only(Some(prefix), None), 2, "a prefix both ids share");
    assert_eq!(only(Some("zzz".into()), None), 0);
    let future = chrono::Utc::now() + chrono::Duration::days(3650);
    assert_eq!(only(None, Some(future)), 0);
    let past = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    assert_eq!(only(None, Some(past)), 2);
}

/// Whether `text` has a time with fractional seconds (`:SS.` followed by a digit).
fn regex_free_fraction(text: &str) -> bool {
    let b = text.as_bytes();
    (3..b.len().saturating_sub(1)).any(|i| {
        b[i] == b'.'
            && b[i - 1].is_ascii_digit()
            && b[i - 2].is_ascii_digit()
            && b[i - 3] == b':'
            && b[i + 1].is_ascii_digit()
    })
}

#[test]
fn show_prints_one_json_object_per_operation() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut out = Vec::new();
    audit::show(&m, Some(FLEET), Format::JsonLines, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["kind"], "Scale");
    assert_eq!(lines[0]["from"], 3);
    assert_eq!(lines[0]["state"], "Completed/Succeeded");
    assert_eq!(lines[0]["transitions"].as_array().unwrap().len(), 4);
    assert_eq!(lines[1]["state"], "Open/Blocked");
    assert_eq!(lines[1]["fleetUID"], FLEET);
}

#[test]
fn show_marks_entries_that_break_the_rules() {
    let entries = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 3, 4)),
        (op(1), issued(op(1), "replicas")),
        (op(1), canceled(CancelReason::RequestChanged)),
    ]);
    let mut out = Vec::new();
    audit::show_entries(FLEET, &entries, Format::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("!     3"), "{text}");
    assert!(text.contains("cannot cancel"), "{text}");
}

#[test]
fn export_writes_every_entry_as_a_json_line() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut out = Vec::new();
    assert_eq!(audit::export(&m, None, &mut out).unwrap(), 7);
    let text = String::from_utf8(out).unwrap();
    for (line, original) in text.lines().zip(w.journal.entries()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["fleetUID"], FLEET);
        let entry = decode_entry(&v["entry"].to_string()).unwrap();
        assert_eq!(&entry, original);
        assert_eq!(chain::recompute(&entry), entry.hash());
    }
}

#[test]
fn an_unknown_fleet_is_an_error_that_lists_the_known_ones() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let e = audit::export(&m, Some("nope"), &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains(FLEET), "{e}");
}

#[test]
fn verify_passes_a_mirror_in_sync_with_its_annotation() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut out = Vec::new();
    let report = audit::verify(&m, None, &[w.journal.document().clone()], &mut out).unwrap();
    assert!(report.ok());
    assert_eq!(report.fleets[0].annotation, Some(AnnotationCheck::InSync));
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("OK   fleet"), "{text}");
}

#[test]
fn verify_reports_the_first_bad_entry_of_a_tampered_mirror() {
    let w = sample();
    let dir = tempfile::tempdir().unwrap();
    {
        let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
        m.append(FLEET, w.journal.entries()).unwrap();
    }
    {
        let db = common::open_sled(dir.path());
        let tree = db.open_tree(format!("fleet/{FLEET}")).unwrap();
        let original = tree.get(3u64.to_be_bytes()).unwrap().unwrap();
        let changed = String::from_utf8(original.to_vec())
            .unwrap()
            .replace("rolled out", "rolled back");
        tree.insert(3u64.to_be_bytes(), changed.as_bytes()).unwrap();
        db.flush().unwrap();
    }
    let m = Mirror::open_existing(dir.path()).unwrap();
    let mut out = Vec::new();
    let report = audit::verify(&m, Some(FLEET), &[], &mut out).unwrap();
    assert!(!report.ok());
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("FAIL"), "{text}");
    assert!(
        text.contains("first bad entry: entry 3: stored hash"),
        "{text}"
    );
}

#[test]
fn verify_reports_a_mirror_that_disagrees_with_the_annotation() {
    let w = sample();
    let (_dir, m) = mirror_with(&w);
    let mut shorter = Writer::new();
    shorter.scale(op(1), 3, 2);
    let report = audit::verify(
        &m,
        None,
        &[shorter.journal.document().clone()],
        &mut Vec::new(),
    )
    .unwrap();
    assert!(!report.ok());
    assert!(matches!(
        &report.fleets[0].annotation,
        Some(AnnotationCheck::Disagree(s)) if s == &vec![Signal::JournalRollback { annotation_seq: 4, mirror_seq: 7 }]
    ));
}

#[test]
fn a_mirror_that_is_only_behind_still_verifies() {
    let w = sample();
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    m.append(FLEET, &w.journal.entries()[..5]).unwrap();
    let report = audit::verify(&m, None, &[w.journal.document().clone()], &mut Vec::new()).unwrap();
    assert!(report.ok());
    assert_eq!(
        report.fleets[0].annotation,
        Some(AnnotationCheck::MirrorBehind { missing: 2 })
    );
}

#[test]
fn verify_checks_the_transitions_of_a_complete_history() {
    let entries = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 3, 4)),
        (op(1), issued(op(1), "replicas")),
        (op(1), issued(op(1), "replicas")),
    ]);
    let r = audit::verify_fleet(FLEET, Ok(entries), 0, None);
    assert!(r.chain.is_ok());
    assert!(matches!(
        r.transitions,
        Some(Err((3, TransitionError::DuplicateEffect { .. })))
    ));
    assert!(!r.ok());
}

#[test]
fn a_gap_in_the_mirror_is_reported_but_is_not_a_failure() {
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for n in 1..=40 {
        w.scale(op(n), 1, 2);
    }
    let last = w.journal.entries().last().unwrap().seq();
    let ct = w.journal.document().compacted_through();
    assert!(ct > 10);
    // This replica saw the first two operations; another led until compaction; then this one
    // backfilled from the annotation.
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let mut early = Writer::new();
    early.scale(op(1), 1, 2);
    early.scale(op(2), 1, 2);
    m.append(FLEET, early.journal.entries()).unwrap();
    let plan = m.reconcile(w.journal.document()).unwrap();
    assert!(plan.signals.is_empty(), "{plan:?}");
    let mut out = Vec::new();
    let report = audit::verify(&m, None, &[w.journal.document().clone()], &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(report.ok(), "{text}");
    assert_eq!(report.fleets[0].gaps, vec![(9, ct)]);
    assert!(text.contains(&format!("gap: entries 9..{ct}")), "{text}");
    assert_eq!(report.fleets[0].range, Some((1, last)));
    assert_eq!(report.fleets[0].transitions, None);
}

#[test]
fn aligned_pads_every_column_but_the_last_to_its_widest_cell() {
    let rows = vec![
        vec!["A".to_string(), "BB".to_string(), "C".to_string()],
        vec!["long".to_string(), "x".to_string(), "y".to_string()],
    ];
    assert_eq!(audit::aligned(&rows), vec!["A     BB  C", "long  x   y"]);
}
