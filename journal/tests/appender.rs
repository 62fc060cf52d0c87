//! The compare-and-swap seam and its in-memory implementation.
mod common;

use common::*;
use journal::*;

fn intent_entry(n: u64) -> NewEntry {
    NewEntry {
        at: t(n as i64),
        op: op(n),
        leader: leader(),
        body: intent_body(OperationKind::Scale, 3, 4),
    }
}

#[test]
fn a_fleet_without_an_annotation_loads_an_empty_journal() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    assert_eq!(journal.document(), &Document::empty(FLEET));
    assert_eq!(version, Version("1".into()));
}

#[test]
fn an_append_writes_the_annotation_and_moves_the_version() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    let a = append(
        &store,
        &journal,
        &version,
        intent_entry(1),
        Budget::default(),
    )
    .unwrap();
    assert_ne!(a.version, version);
    assert_eq!(a.entry.seq(), 1);
    assert_eq!(store.annotation().unwrap(), a.journal.document().encode());
    let (reloaded, v) = load_journal(&store, FLEET).unwrap();
    assert_eq!(reloaded.document(), a.journal.document());
    assert_eq!(v, a.version);
}

#[test]
fn a_stale_version_is_a_conflict_and_writes_nothing() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    store.touch(); // someone else patched the fleet
    let e = append(
        &store,
        &journal,
        &version,
        intent_entry(1),
        Budget::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, AppendFailure::Store(AppendError::Conflict { .. })),
        "{e}"
    );
    assert_eq!(store.annotation(), None);
    assert!(store.writes().is_empty());
}

#[test]
fn a_deposed_leaders_late_append_fails() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    // The new leader appends first, from the same read.
    append(
        &store,
        &journal,
        &version,
        intent_entry(1),
        Budget::default(),
    )
    .unwrap();
    let late = append(
        &store,
        &journal,
        &version,
        intent_entry(2),
        Budget::default(),
    );
    assert!(matches!(
        late,
        Err(AppendFailure::Store(AppendError::Conflict { .. }))
    ));
    let (reloaded, _) = load_journal(&store, FLEET).unwrap();
    assert_eq!(reloaded.entries().len(), 1);
    assert_eq!(reloaded.entries()[0].op(), op(1));
}

#[test]
fn a_lost_response_leaves_the_write_applied() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    store.inject(Fault::LoseResponse);
    let e = append(
        &store,
        &journal,
        &version,
        intent_entry(1),
        Budget::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, AppendFailure::Store(AppendError::Lost { .. })),
        "{e}"
    );
    // The caller does not know; the next load shows the entry, so the decision is not
    // appended twice.
    let (reloaded, _) = load_journal(&store, FLEET).unwrap();
    assert_eq!(reloaded.entries().len(), 1);
    assert!(matches!(
        reloaded.check(&intent_entry(1)),
        Err(TransitionError::DuplicateOperation { .. })
    ));
}

#[test]
fn injected_conflicts_and_outages_write_nothing() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    store.inject_at(1, Fault::Conflict);
    store.inject_at(2, Fault::Unavailable);
    for expected in ["conflict", "unavailable"] {
        let e = append(
            &store,
            &journal,
            &version,
            intent_entry(1),
            Budget::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(expected), "{e}");
    }
    assert_eq!(store.cas_calls(), 2);
    assert_eq!(store.annotation(), None);
    append(
        &store,
        &journal,
        &version,
        intent_entry(1),
        Budget::default(),
    )
    .unwrap();
}

#[test]
fn a_refused_entry_is_never_sent() {
    let store = InMemoryAppender::new();
    let (journal, version) = load_journal(&store, FLEET).unwrap();
    let bad = NewEntry {
        body: observed(),
        ..intent_entry(1)
    };
    assert!(matches!(
        append(&store, &journal, &version, bad, Budget::default()),
        Err(AppendFailure::Stage(StageError::Transition(_)))
    ));
    assert_eq!(store.cas_calls(), 0);
}

#[test]
fn a_hand_edited_annotation_fails_to_load_with_the_reason() {
    let store = InMemoryAppender::with_annotation("{\"v\":1,\"fleetUID\":\"x\"");
    assert!(matches!(
        load_journal(&store, FLEET),
        Err(LoadFailure::Journal(LoadError::Decode(
            DecodeError::Syntax { .. }
        )))
    ));
    store.set_annotation(Some(Document::empty("another-fleet").encode()));
    assert!(matches!(
        load_journal(&store, FLEET),
        Err(LoadFailure::Journal(LoadError::ForeignFleet { .. }))
    ));
}
