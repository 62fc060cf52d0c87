//! The byte budget and compaction.
mod common;

use common::*;
use journal::*;

fn budget(kib: usize) -> Budget {
    Budget::new(kib * 1024).unwrap()
}

#[test]
fn the_budget_is_bounded_by_the_hard_maximum() {
    assert_eq!(Budget::default().bytes(), 65536);
    assert!(Budget::new(131072).is_ok());
    assert!(Budget::new(131073).is_err());
    assert!(Budget::new(100).is_err());
}

#[test]
fn nothing_is_compacted_while_the_document_fits() {
    let mut w = Writer::with_budget(budget(64));
    for n in 1..=10 {
        w.scale(op(n), n as i32, n as i32 + 1);
    }
    assert_eq!(w.journal.document().compacted_through(), 0);
    assert_eq!(w.journal.entries().len(), 40);
}

#[test]
fn compaction_drops_the_oldest_finished_operations_just_enough_to_fit() {
    let mut w = Writer::with_budget(budget(32));
    let mut compactions = Vec::new();
    for n in 1..=30 {
        for (i, body) in [
            intent_body(OperationKind::Scale, 1, 2),
            issued(op(n), "replicas"),
            observed(),
            completed(CompletedOutcome::Succeeded),
        ]
        .into_iter()
        .enumerate()
        {
            let _ = i;
            let staged = w.try_push(op(n), body).unwrap();
            assert!(staged.annotation().len() <= 32 * 1024);
            assert_eq!(staged.annotation().len(), staged.size().bytes);
            if let Some(c) = staged.compaction() {
                compactions.push(c.clone());
            }
        }
    }
    assert!(!compactions.is_empty());
    let doc = w.journal.document();
    // Each compaction drops whole operations, oldest first, and records the boundary.
    let first = doc.entries().first().unwrap();
    assert_eq!(first.seq(), doc.compacted_through() + 1);
    assert_eq!(first.prev(), doc.compacted_hash());
    assert_eq!(first.entry_type(), EntryType::Intent);
    chain::verify(doc).unwrap();
    // Only as much as needed: adding back the newest dropped operation would not fit.
    let last = compactions.last().unwrap();
    assert_eq!(last.dropped_operations.len(), 1);
    assert_eq!(last.dropped_entries, 4);
    // The fold forgot the dropped operations and the reload agrees.
    let reloaded = Journal::load(Some(&doc.encode()), FLEET).unwrap();
    assert_eq!(
        reloaded.fold().operations().len(),
        w.journal.fold().operations().len()
    );
    assert!(w.journal.fold().operation(op(1)).is_none());
}

#[test]
fn compaction_keeps_the_last_eight_finished_operations_while_they_fit() {
    let mut w = Writer::with_budget(budget(32));
    for n in 1..=30 {
        w.scale(op(n), 1, 2);
        let finished = w.journal.fold().finished_newest_first().len();
        assert!(finished >= 8.min(n as usize), "after {n}: kept {finished}");
    }
    assert!(w.journal.document().compacted_through() > 0);
    // An operation too large to fit next to the eight newest finished ones is still taken:
    // the oldest of them go, as a last resort, and never the last completed one of its kind.
    let mut large = intent(OperationKind::Restart, 30, 30);
    large.targets = (0..120).map(|m| target(&format!("beta-{m}"))).collect();
    w.push(op(98), EntryBody::Intent(large));
    let kept = w.journal.fold().finished_newest_first().len();
    assert!((1..8).contains(&kept), "kept {kept} finished operations");
    assert!(
        w.journal.fold().operation(op(30)).is_some(),
        "the last Scale is kept"
    );
    assert!(w.journal.document().encoded_len() <= 32 * 1024);
    w.push(op(98), abandoned());
    // One that cannot fit even alone is refused, and nothing changes.
    let mut huge = intent(OperationKind::Restart, 30, 30);
    huge.targets = (0..400).map(|m| target(&format!("beta-{m}"))).collect();
    let before = w.journal.document().clone();
    match w.try_push(op(99), EntryBody::Intent(huge)) {
        Err(StageError::OverBudget(o)) => {
            assert!(o.why.contains("is open"), "{}", o.why);
            assert_eq!(o.budget, 32 * 1024);
            assert!(o.smallest > 32 * 1024);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.journal.document(), &before);
}

#[test]
fn compaction_never_drops_an_open_operation() {
    let mut w = Writer::with_budget(budget(32));
    w.push(op(1), intent_body(OperationKind::Delete, 3, 0));
    let mut refused = None;
    for n in 0..400 {
        if let Err(e) = w.try_push(op(1), retired(&format!("data-beta-{n}"))) {
            refused = Some(e);
            break;
        }
    }
    match refused.expect("the open operation outgrows the budget") {
        StageError::OverBudget(o) => assert!(o.why.contains("is open"), "{}", o.why),
        other => panic!("{other}"),
    }
    assert_eq!(w.journal.document().compacted_through(), 0);
    assert_eq!(w.journal.entries()[0].entry_type(), EntryType::Intent);
    let size = w.journal.size_status(budget(32));
    assert!(!size.compactable);
    assert!(size.warning(), "over 75% with nothing to compact: {size:?}");
}

#[test]
fn the_size_warning_needs_both_fullness_and_nothing_to_compact() {
    let mut w = Writer::with_budget(budget(32));
    for n in 1..=24 {
        w.scale(op(n), 1, 2);
    }
    let s = w.journal.size_status(budget(32));
    assert!(s.bytes * 4 > s.budget * 3, "{s:?}");
    assert!(
        s.compactable,
        "finished operations beyond the last 8 can go"
    );
    assert!(!s.warning());
    let roomy = w.journal.size_status(budget(64));
    assert!(!roomy.warning());
}

#[test]
fn foreign_records_are_compacted_like_finished_operations() {
    let mut w = Writer::with_budget(budget(32));
    w.push(op(900), recovered(op(900), "template"));
    for n in 1..=30 {
        w.scale(op(n), 1, 2);
    }
    assert!(w.journal.fold().foreign_records().is_empty());
    assert!(w.journal.document().compacted_through() >= 1);
}

#[test]
fn a_lowered_budget_compacts_on_the_next_append() {
    let mut w = Writer::with_budget(budget(64));
    for n in 1..=40 {
        w.scale(op(n), 1, 2);
    }
    let before = w.journal.document().encoded_len();
    assert!(before > 32 * 1024);
    w.budget = budget(32);
    let staged = w
        .try_push(op(41), intent_body(OperationKind::Scale, 1, 2))
        .unwrap();
    assert!(staged.annotation().len() <= 32 * 1024);
    assert!(staged.compaction().unwrap().dropped_operations.len() > 1);
}

#[test]
fn documents_up_to_the_hard_maximum_decode() {
    let mut w = Writer::with_budget(budget(128));
    let mut n = 0;
    while w.journal.document().encoded_len() < 120 * 1024 {
        n += 1;
        w.scale(op(n), 1, 2);
    }
    let text = w.journal.document().encode();
    assert!(text.len() > 120 * 1024 && text.len() <= HARD_MAX_BYTES);
    Journal::load(Some(&text), FLEET).unwrap();
}
