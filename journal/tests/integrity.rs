//! When the world and the journal disagree, and when the journal must be rebuilt:
//! effect-marker classification, noise that cannot evict history, restoring a chain from a
//! fleet's history, repair commands, time sanity.
mod common;

use common::*;
use journal::*;

fn marker(op: OperationId, step: &str) -> String {
    format!("{op}/{step}")
}

#[test]
fn the_marker_of_the_last_effect_is_expected() {
    let mut w = Writer::new();
    assert_eq!(w.journal.check_marker(None), MarkerCheck::Expected);
    w.scale(op(1), 3, 4);
    assert_eq!(
        w.journal.check_marker(Some(&marker(op(1), "replicas"))),
        MarkerCheck::Expected
    );
}

#[test]
fn a_removed_marker_is_a_mismatch_that_names_what_was_expected() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    match w.journal.check_marker(None) {
        MarkerCheck::Mismatch {
            found,
            expected,
            why,
        } => {
            assert_eq!(found, None);
            assert_eq!(expected.unwrap().to_string(), marker(op(1), "replicas"));
            assert!(why.contains("missing"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_hand_written_marker_is_a_mismatch() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    for text in ["edited-by-hand", "not-a-uuid/replicas"] {
        assert!(
            matches!(
                w.journal.check_marker(Some(text)),
                MarkerCheck::Mismatch { .. }
            ),
            "{text}"
        );
    }
    // A step that never writes the workload marker.
    assert!(matches!(
        w.journal
            .check_marker(Some(&marker(op(9), "retire/data-beta-0"))),
        MarkerCheck::Mismatch { .. }
    ));
}

#[test]
fn an_older_recorded_effect_is_a_mismatch_a_workload_restored_from_a_backup() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.scale(op(2), 4, 5);
    match w.journal.check_marker(Some(&marker(op(1), "replicas"))) {
        MarkerCheck::Mismatch { why, .. } => assert!(why.contains("already recorded"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_landed_write_of_an_abandoned_operation_is_recorded_not_blocked() {
    // Killed after its write, then abandoned before the write was recorded: the journal
    // holds the operation without its effect; the marker shows it landed.
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(2), intent_body(OperationKind::Scale, 4, 5));
    w.push(op(2), abandoned());
    let landed = marker(op(2), "replicas");
    match w.journal.check_marker(Some(&landed)) {
        MarkerCheck::Unrecorded(e) => assert_eq!(e.to_string(), landed),
        other => panic!("{other:?}"),
    }
    // Recorded as Recovered, it is the predecessor of the next write.
    w.push(
        op(2),
        EntryBody::Recovered(Recovered {
            effect: landed.parse().unwrap(),
            source: "workload-marker".into(),
        }),
    );
    assert_eq!(w.journal.check_marker(Some(&landed)), MarkerCheck::Expected);
}

#[test]
fn a_canceled_operations_landed_write_is_recorded_a_deposed_leaders_write() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    w.push(op(2), intent_body(OperationKind::Scale, 4, 5));
    w.push(op(2), canceled(CancelReason::PredecessorChanged));
    assert!(matches!(
        w.journal.check_marker(Some(&marker(op(2), "replicas"))),
        MarkerCheck::Unrecorded(_)
    ));
    // The wrong step for the operation's kind cannot be recorded.
    assert!(matches!(
        w.journal.check_marker(Some(&marker(op(2), "template"))),
        MarkerCheck::Mismatch { .. }
    ));
}

#[test]
fn an_operation_the_annotation_never_held_is_recorded_a_rolled_back_annotation() {
    let mut w = Writer::new();
    w.scale(op(1), 3, 4);
    assert!(matches!(
        w.journal.check_marker(Some(&marker(op(7), "template"))),
        MarkerCheck::Unrecorded(_)
    ));
}

#[test]
fn canceled_operations_do_not_count_among_the_kept_eight() {
    // Ten real operations, then a run of cancellations: compaction drops the oldest real
    // ones only as far as it must, and the cancellations do not protect themselves as "the
    // last 8 finished" — the 8 newest real operations always stay.
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for n in 1..=10 {
        w.scale(op(n), n as i32, n as i32 + 1);
    }
    for n in 100..160 {
        w.push(op(n), intent_body(OperationKind::Scale, 11, 12));
        w.push(op(n), canceled(CancelReason::PredecessorChanged));
    }
    let fold = w.journal.fold();
    let real: Vec<u64> = (1..=10)
        .filter(|n| fold.operation(op(*n)).is_some())
        .collect();
    assert!(
        real.len() >= 8 && real.ends_with(&[3, 4, 5, 6, 7, 8, 9, 10]),
        "the 8 newest real operations stay: {real:?}"
    );
    let doc = w.journal.document();
    chain::verify(doc).unwrap();
    // The cancellations went into holes between kept entries; the document still decodes
    // and loads as this fleet's verified journal.
    Journal::load(Some(&doc.encode()), FLEET).unwrap();
}

#[test]
fn interleaved_noise_is_compacted_out_of_the_middle_and_history_stays() {
    // Real operations with cancellations between them: over the budget, cancellations go
    // first (into holes), so the real history stays as long as it fits.
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    let mut noise = 1000;
    for n in 1..=8 {
        w.scale(op(n), n as i32, n as i32 + 1);
        for _ in 0..6 {
            noise += 1;
            let mut i = intent(OperationKind::Scale, 9, 10);
            i.predecessor_effect = Some(marker(op(n), "replicas").parse().unwrap());
            w.push(op(noise), EntryBody::Intent(i));
            w.push(op(noise), canceled(CancelReason::PredecessorChanged));
        }
    }
    let doc = w.journal.document().clone();
    assert!(
        !doc.holes().is_empty(),
        "cancellations were dropped from the middle"
    );
    for n in 1..=8 {
        assert!(
            w.journal.fold().operation(op(n)).is_some(),
            "real operation {n} stays"
        );
    }
    chain::verify(&doc).unwrap();
    let back = decode_document(&doc.encode()).unwrap();
    assert_eq!(back, doc);
    // The predecessor effect is what it was.
    assert_eq!(
        w.journal.predecessor_effect().unwrap().to_string(),
        marker(op(8), "replicas")
    );
    // A forged hole (or one moved) is refused.
    let text = doc.encode();
    let h = doc.holes()[0];
    let forged = text.replacen(
        &format!("\"through\":{}", h.through),
        &format!("\"through\":{}", h.through + 1),
        1,
    );
    assert!(Journal::load(Some(&forged), FLEET).is_err());
}

#[test]
fn the_last_completed_operation_of_each_kind_and_the_last_token_stay() {
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    // A Provision and a Restart with a token, then many scales.
    w.push(op(1), intent_body(OperationKind::Provision, 0, 3));
    w.push(op(1), issued(op(1), "create"));
    w.push(op(1), observed());
    w.push(op(1), completed(CompletedOutcome::Succeeded));
    let mut restart = intent(OperationKind::Restart, 3, 3);
    restart.token = Some("t-2026-12-01".into());
    w.push(op(2), EntryBody::Intent(restart));
    w.push(op(2), issued(op(2), "template"));
    w.push(op(2), observed());
    w.push(op(2), completed(CompletedOutcome::Succeeded));
    for n in 3..=60 {
        w.scale(op(n), 3, 4);
    }
    let fold = w.journal.fold();
    assert!(fold.operation(op(1)).is_some(), "the last Provision stays");
    assert!(fold.operation(op(2)).is_some(), "the last Restart stays");
    assert_eq!(w.journal.last_restart_token(), Some("t-2026-12-01"));
    assert!(fold.operation(op(3)).is_none(), "old scales were compacted");
    chain::verify(w.journal.document()).unwrap();
}

#[test]
fn a_history_is_rebuilt_into_a_verified_compacted_journal() {
    let mut w = Writer::with_budget(Budget::new(64 * 1024).unwrap());
    let mut all = Vec::new();
    for n in 1..=40 {
        for body in [
            intent_body(OperationKind::Scale, 1, 2),
            issued(op(n), "replicas"),
            observed(),
            completed(CompletedOutcome::Succeeded),
        ] {
            all.push(w.push(op(n), body));
        }
    }
    let small = Budget::new(32 * 1024).unwrap();
    let rebuilt = Journal::from_history(FLEET, all.clone(), small).unwrap();
    let doc = rebuilt.document();
    assert!(doc.encode().len() <= 32 * 1024);
    assert!(doc.compacted_through() > 0);
    assert_eq!(doc.seq(), 160);
    chain::verify(doc).unwrap();
    assert_eq!(
        rebuilt.predecessor_effect().unwrap().to_string(),
        marker(op(40), "replicas")
    );
    // It decodes back as this fleet's journal, and not as another's.
    Journal::load(Some(&doc.encode()), FLEET).unwrap();
    assert!(matches!(
        Journal::load(Some(&doc.encode()), "5f0c9a6e-1b2c-4d3e-8f40-000000000002"),
        Err(LoadError::ForeignFleet { .. })
    ));
    // A history that starts later (mirror retention) is taken from its first entry.
    let tail = all[40..].to_vec();
    let rebuilt = Journal::from_history(FLEET, tail, Budget::default()).unwrap();
    assert_eq!(rebuilt.document().compacted_through(), 40);
    // A tampered history is refused.
    let mut swapped = all.clone();
    swapped.swap(5, 6);
    assert!(matches!(
        Journal::from_history(FLEET, swapped, Budget::default()),
        Err(LoadError::Chain(_))
    ));
    let mut removed = all;
    removed.remove(10);
    assert!(Journal::from_history(FLEET, removed, Budget::default()).is_err());
}

#[test]
fn repair_commands_parse_and_say_what_they_need() {
    assert_eq!(
        parse_repair_command("restore-from-mirror\n")
            .unwrap()
            .unwrap(),
        RepairCommand::RestoreFromMirror
    );
    assert_eq!(
        parse_repair_command("reset annotation deleted by velero")
            .unwrap()
            .unwrap(),
        RepairCommand::Reset {
            reason: "annotation deleted by velero".into()
        }
    );
    assert_eq!(
        parse_repair_command("reset").unwrap().unwrap_err(),
        CommandError::MissingReason
    );
    assert!(parse_repair_command("restore-from-mirror now")
        .unwrap()
        .is_err());
    assert!(parse_repair_command("reset a\u{7}b").unwrap().is_err());
    assert!(parse_repair_command(&format!("reset {}", "x".repeat(300)))
        .unwrap()
        .is_err());
    // Not a repair: left to the operation commands.
    assert!(parse_repair_command("abandon 0b5e8a52-6c3e-4c1f-9d7a-2f3b4c5d6e7f").is_none());
    assert!(parse_command("reset x").is_err());
}

#[test]
fn entries_out_of_time_order_or_from_the_future_are_reported() {
    let mut w = Writer::new();
    w.scale(op(1), 1, 2);
    let entries = w.journal.entries().to_vec();
    assert!(journal::audit::time_warnings(&entries, t(60)).is_empty());
    // Entry 3 written by a clock 10 minutes behind.
    let mut chain = raw_chain(vec![
        (op(1), intent_body(OperationKind::Scale, 1, 2)),
        (op(1), issued(op(1), "replicas")),
    ]);
    let late = chain::seal(
        2,
        chain[1].hash(),
        NewEntry {
            at: chain[1].at() - chrono::Duration::minutes(10),
            op: op(1),
            leader: leader(),
            body: observed(),
        },
    );
    chain.push(late);
    let warnings = journal::audit::time_warnings(&chain, t(60));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("entry 3") && warnings[0].contains("earlier than entry 2"));
    // Seen from an hour before they were written, every entry is in the future.
    let future = journal::audit::time_warnings(&entries, t(-60));
    assert_eq!(future.len(), entries.len(), "{future:?}");
}

#[test]
fn verify_of_an_annotation_describes_the_annotation() {
    let mut w = Writer::new();
    w.scale(op(1), 1, 2);
    w.scale(op(2), 2, 3);
    let text = w.journal.document().encode();
    let mut out = Vec::new();
    assert!(journal::audit::verify_annotation(FLEET, Some(&text), t(60), &mut out).unwrap());
    let shown = String::from_utf8(out).unwrap();
    assert!(shown.contains("annotation entries 1..8"), "{shown}");
    assert!(!shown.contains("mirror"), "{shown}");
    // Swap two entries: FAIL, the chain says where, nothing claims the chain is OK or
    // explains the break as a mirror gap.
    let mut entries = w.journal.entries().to_vec();
    entries.swap(2, 3);
    let doc = document_text(FLEET, (0, Hash::ZERO), &entries);
    let mut out = Vec::new();
    assert!(!journal::audit::verify_annotation(FLEET, Some(&doc), t(60), &mut out).unwrap());
    let shown = String::from_utf8(out).unwrap();
    assert!(shown.starts_with("FAIL"), "{shown}");
    assert!(shown.contains("chain: first bad entry"), "{shown}");
    assert!(
        !shown.contains("chain: OK") && !shown.contains("mirror"),
        "{shown}"
    );
    // Invalid JSON.
    let mut out = Vec::new();
    assert!(!journal::audit::verify_annotation(FLEET, Some("{nope"), t(60), &mut out).unwrap());
    assert!(String::from_utf8(out).unwrap().contains("does not decode"));
    // Another fleet's document.
    let mut out = Vec::new();
    assert!(!journal::audit::verify_annotation(
        "5f0c9a6e-1b2c-4d3e-8f40-000000000002",
        Some(&text),
        t(60),
        &mut out
    )
    .unwrap());
}

#[test]
fn the_smallest_budget_holds_what_compaction_keeps() {
    // 8 finished rolling operations, the last of each other kind and an open one at the
    // smallest accepted budget.
    assert!(Budget::new(32 * 1024 - 1).is_err());
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for (n, kind, step) in [
        (200, OperationKind::Provision, "create"),
        (201, OperationKind::Restart, "template"),
        (202, OperationKind::TemplateUpdate, "template"),
        (203, OperationKind::Scale, "replicas"),
    ] {
        w.push(op(n), intent_body(kind, 3, 3));
        w.push(op(n), issued(op(n), step));
        w.push(op(n), observed());
        w.push(op(n), completed(CompletedOutcome::Succeeded));
    }
    for n in 1..=30 {
        w.push(op(n), intent_body(OperationKind::Upgrade, 3, 3));
        w.push(op(n), issued(op(n), "template"));
        w.push(op(n), observed());
        w.push(op(n), completed(CompletedOutcome::Succeeded));
    }
    w.push(op(99), intent_body(OperationKind::Scale, 3, 4));
    w.push(op(99), issued(op(99), "replicas"));
}
