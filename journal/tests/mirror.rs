//! The sled mirror and its reconcile with the annotation.
mod common;

use common::*;
use journal::*;

/// A journal with `n` finished Scale operations (4 entries each).
fn history(n: u64) -> Writer {
    let mut w = Writer::new();
    for i in 1..=n {
        w.scale(op(i), 1, 2);
    }
    w
}

/// The entries of `w`'s journal that `m` does not hold yet (the annotation keeps only the
/// newest, so they are taken as each operation commits).
fn unmirrored(m: &Mirror, w: &Writer) -> Vec<Entry> {
    let held = m.head(FLEET).unwrap().map_or(0, |(seq, _)| seq);
    w.journal
        .entries()
        .iter()
        .filter(|e| e.seq() > held)
        .cloned()
        .collect()
}

/// Appends `ops` Scale operations to `m` as they commit (4 entries each, mirrored one
/// operation at a time, as the operator does), and returns every entry written.
fn grow(m: &Mirror, w: &mut Writer, ops: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
    let mut all = Vec::new();
    for i in ops {
        w.scale(op(i), 1, 2);
        let new = unmirrored(m, w);
        m.append(FLEET, &new).unwrap();
        all.extend(new);
    }
    all
}

fn hashes(entries: &[Entry]) -> Vec<(Seq, Hash)> {
    entries.iter().map(|e| (e.seq(), e.hash())).collect()
}

// ---- opening ----

#[test]
fn a_missing_directory_becomes_a_new_mirror_that_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let w = history(2);
    {
        let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
        m.append(FLEET, w.journal.entries()).unwrap();
    }
    let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
    assert_eq!(m.fleets(), vec![FLEET.to_owned()]);
    assert_eq!(&m.entries(FLEET).unwrap(), w.journal.entries());
    assert_eq!(m.path(), Some(path.as_path()));
}

#[test]
fn an_empty_directory_becomes_a_new_mirror_in_place() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("journal");
    std::fs::create_dir(&dir).unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dir).unwrap());
    Mirror::open(&dir, MirrorOptions::default()).unwrap();
    // Created inside the directory (a volume's mount point cannot be replaced), nothing
    // beside it (the parent may be a read-only root file system), no creation file left.
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dir).unwrap()),
        inode
    );
    let beside: Vec<_> = std::fs::read_dir(parent.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, vec![std::ffi::OsString::from("journal")]);
    assert!(!dir.join(mirror::CREATING).exists());
    let w = history(1);
    Mirror::open(&dir, MirrorOptions::default())
        .unwrap()
        .append(FLEET, w.journal.entries())
        .unwrap();
}

#[test]
fn a_fresh_volumes_lost_and_found_is_not_content() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("lost+found")).unwrap();
    let w = history(2);
    Mirror::open(dir.path(), MirrorOptions::default())
        .unwrap()
        .append(FLEET, w.journal.entries())
        .unwrap();
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    assert_eq!(&m.entries(FLEET).unwrap(), w.journal.entries());
    assert!(dir.path().join("lost+found").is_dir());
}

#[test]
fn an_interrupted_creation_is_completed() {
    let dir = tempfile::tempdir().unwrap();
    // What a creation stopped before the marker leaves: its file and a sled database
    // without the marker.
    std::fs::write(dir.path().join(mirror::CREATING), b"").unwrap();
    drop(sled::open(dir.path()).unwrap());
    assert!(matches!(
        Mirror::open_existing(dir.path()).unwrap_err(),
        MirrorError::Io { .. }
    ));
    let w = history(1);
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    m.append(FLEET, w.journal.entries()).unwrap();
    drop(m);
    assert!(!dir.path().join(mirror::CREATING).exists());
    let m = Mirror::open_existing(dir.path()).unwrap();
    assert_eq!(&m.entries(FLEET).unwrap(), w.journal.entries());
}

#[test]
fn an_interrupted_creation_beside_other_files_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(mirror::CREATING), b"").unwrap();
    drop(sled::open(dir.path()).unwrap());
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(
        matches!(&e, MirrorError::ForeignDirectory { found, .. } if found == "notes.txt"),
        "{e}"
    );
    assert!(dir.path().join("db").exists() && dir.path().join("notes.txt").exists());
}

#[test]
fn a_creation_file_beside_a_mirror_in_use_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let w = history(1);
    let live = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    live.append(FLEET, w.journal.entries()).unwrap();
    std::fs::write(dir.path().join(mirror::CREATING), b"").unwrap();
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(matches!(e, MirrorError::Locked { .. }), "{e}");
    assert_eq!(&live.entries(FLEET).unwrap(), w.journal.entries());
    drop(live);
    // Its owner gone, the file is taken for an interrupted creation of that mirror: the
    // marker is there, so the mirror opens with its entries.
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    assert_eq!(&m.entries(FLEET).unwrap(), w.journal.entries());
    assert!(!dir.path().join(mirror::CREATING).exists());
}

#[test]
fn an_empty_sled_database_without_the_marker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(sled::open(dir.path()).unwrap());
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(matches!(e, MirrorError::Corrupt { .. }), "{e}");
}

#[test]
fn a_directory_of_other_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    std::fs::write(dir.path().join("random.bin"), [7u8; 64]).unwrap();
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(matches!(e, MirrorError::ForeignDirectory { .. }), "{e}");
    assert!(e.to_string().contains("notes.txt"), "{e}");
    assert!(
        !dir.path().join("db").exists(),
        "nothing was written into the directory"
    );
}

#[test]
fn a_sled_database_without_the_marker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = common::open_sled(dir.path());
        db.insert("someone", "else's data").unwrap();
        db.flush().unwrap();
    }
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(matches!(e, MirrorError::NotAMirror { .. }), "{e}");
}

#[test]
fn a_mirror_of_another_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = common::open_sled(dir.path());
        db.insert("celld-journal-format", "celld-journal-mirror/v9")
            .unwrap();
        db.flush().unwrap();
    }
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(
        matches!(&e, MirrorError::UnsupportedFormat { found, .. } if found == "celld-journal-mirror/v9"),
        "{e}"
    );
}

#[test]
fn damaged_database_files_are_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conf"),
        b"\xff\x00garbage that is not a sled config",
    )
    .unwrap();
    std::fs::write(dir.path().join("db"), vec![0xA5u8; 4096]).unwrap();
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            MirrorError::Corrupt { .. } | MirrorError::NotAMirror { .. }
        ),
        "{e}"
    );
}

#[test]
fn a_scrambled_database_is_not_silently_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
        m.append(FLEET, history(3).journal.entries()).unwrap();
    }
    let db = dir.path().join("db");
    let mut bytes = std::fs::read(&db).unwrap();
    for b in bytes.iter_mut().skip(64) {
        *b ^= 0x5a;
    }
    std::fs::write(&db, &bytes).unwrap();
    // sled recovers such a file to an empty database; without the marker it is refused
    // instead of becoming an empty mirror that lost its archive.
    let e = Mirror::open(dir.path(), MirrorOptions::default()).unwrap_err();
    assert!(matches!(e, MirrorError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("rebuild"), "{e}");
}

#[test]
fn a_file_is_not_a_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    std::fs::write(&file, "x").unwrap();
    assert!(matches!(
        Mirror::open(&file, MirrorOptions::default()).unwrap_err(),
        MirrorError::NotADirectory { .. }
    ));
}

#[test]
fn a_mirror_in_use_is_reported_as_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _held = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    let e = Mirror::open_existing(dir.path()).unwrap_err();
    assert!(matches!(e, MirrorError::Locked { .. }), "{e}");
}

#[test]
fn the_audit_does_not_create_a_mirror() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Mirror::open_existing(dir.path().join("absent")).is_err());
    assert!(
        Mirror::open_existing(dir.path()).is_err(),
        "empty directory"
    );
}

// ---- appending ----

#[test]
fn a_failed_disk_is_told_apart_from_other_sled_errors() {
    let full = MirrorError::from(sled::Error::Io(std::io::Error::from(
        std::io::ErrorKind::StorageFull,
    )));
    assert!(matches!(full, MirrorError::DiskFailed(_)), "{full:?}");
    assert!(full.to_string().contains("opened again"), "{full}");
    let other = MirrorError::from(sled::Error::Unsupported("a feature".into()));
    assert!(matches!(other, MirrorError::Sled(_)), "{other:?}");
}

#[test]
fn its_size_on_disk_grows_with_the_history_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path().join("journal"), MirrorOptions::default()).unwrap();
    let empty = m.size_on_disk().unwrap();
    // 2,000 entries, each operation mirrored as it commits (the annotation keeps only the
    // newest): sled's log grows by whole segments (512 KiB).
    grow(&m, &mut Writer::new(), 1..=500);
    assert_eq!(m.head(FLEET).unwrap().map(|(seq, _)| seq), Some(2000));
    let full = m.size_on_disk().unwrap();
    assert!(
        full >= empty + 500_000,
        "size on disk {empty} -> {full} bytes after 2,000 entries"
    );
}

#[test]
fn appending_continues_the_chain_and_is_idempotent() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let w = history(2);
    let entries = w.journal.entries();
    m.append(FLEET, &entries[..3]).unwrap();
    m.append(FLEET, &entries[..5]).unwrap();
    m.append(FLEET, entries).unwrap();
    assert_eq!(&m.entries(FLEET).unwrap(), entries);
    let last = entries.last().unwrap();
    assert_eq!(m.head(FLEET).unwrap(), Some((last.seq(), last.hash())));
}

#[test]
fn an_append_that_skips_entries_is_out_of_sync() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let w = history(2);
    m.append(FLEET, &w.journal.entries()[..2]).unwrap();
    let e = m.append(FLEET, &w.journal.entries()[4..5]).unwrap_err();
    assert!(
        matches!(
            e,
            MirrorError::OutOfSync {
                seq: 5,
                head_seq: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn an_append_that_contradicts_the_mirror_is_out_of_sync() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let a = history(1);
    let mut b = Writer::new();
    b.scale(op(50), 5, 6);
    m.append(FLEET, a.journal.entries()).unwrap();
    assert!(matches!(
        m.append(FLEET, &b.journal.entries()[..1]).unwrap_err(),
        MirrorError::OutOfSync { .. }
    ));
}

#[test]
fn retention_keeps_the_newest_entries_per_fleet() {
    let m = Mirror::temporary(MirrorOptions {
        retention: 10,
        ..MirrorOptions::default()
    })
    .unwrap();
    let w = history(6);
    for e in w.journal.entries() {
        m.append(FLEET, std::slice::from_ref(e)).unwrap();
    }
    let kept = m.entries(FLEET).unwrap();
    assert_eq!(kept.len(), 10);
    assert_eq!(kept.first().unwrap().seq(), 15);
    assert_eq!(kept.last().unwrap().seq(), 24);
}

#[test]
fn fleets_are_kept_apart() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let w = history(1);
    m.append(FLEET, w.journal.entries()).unwrap();
    m.append("other-fleet", w.journal.entries()).unwrap();
    assert_eq!(m.fleets().len(), 2);
    assert!(m.entries("third").unwrap().is_empty());
    assert!(matches!(
        m.append("", w.journal.entries()).unwrap_err(),
        MirrorError::InvalidFleetUid(_)
    ));
}

#[test]
fn reading_an_unknown_fleet_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    {
        let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
        assert_eq!(m.head("never-seen").unwrap(), None);
        assert!(m.entries_from("never-seen", 0).unwrap().is_empty());
        assert!(m.fleets().is_empty());
    }
    let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
    assert!(m.fleets().is_empty(), "a read created a tree on disk");
}

#[test]
fn a_reopened_mirror_knows_every_fleet_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let names: Vec<String> = (0..40).map(|i| format!("fleet-{i:02}")).collect();
    {
        let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
        for (i, name) in names.iter().enumerate() {
            // Fleet i holds i + 1 operations (4 entries each).
            m.append(name, history(i as u64 + 1).journal.entries())
                .unwrap();
        }
    }
    let m = Mirror::open(&path, MirrorOptions::default()).unwrap();
    assert_eq!(m.fleets(), names);
    for (i, name) in names.iter().enumerate() {
        let w = history(i as u64 + 1);
        let last = w.journal.entries().last().unwrap();
        assert_eq!(m.head(name).unwrap(), Some((last.seq(), last.hash())));
        assert_eq!(&m.entries(name).unwrap(), w.journal.entries());
    }
    // A fleet first seen after the reopen is created once and then found.
    let w = history(1);
    m.append("late-fleet", w.journal.entries()).unwrap();
    assert_eq!(m.fleets().len(), names.len() + 1);
    assert_eq!(&m.entries("late-fleet").unwrap(), w.journal.entries());
}

// ---- reconcile (pure plan) ----

#[test]
fn a_mirror_missing_entries_is_backfilled() {
    let w = history(2);
    let doc = w.journal.document();
    let plan = plan_reconcile(&hashes(&doc.entries()[..3]), doc);
    assert!(plan.signals.is_empty());
    assert_eq!(plan.writes(), 5);
    assert_eq!(
        plan.actions,
        doc.entries()[3..]
            .iter()
            .cloned()
            .map(MirrorAction::Write)
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_mirror_in_sync_needs_nothing() {
    let w = history(2);
    let doc = w.journal.document();
    assert!(plan_reconcile(&hashes(doc.entries()), doc).is_empty());
}

#[test]
fn a_different_hash_at_the_same_seq_diverges_and_the_annotation_wins() {
    let ours = history(1);
    let mut theirs = history(1);
    theirs.scale(op(2), 2, 3);
    let mut mine = ours.clone_for_test();
    mine.scale(op(3), 2, 1);
    let plan = plan_reconcile(&hashes(mine.journal.entries()), theirs.journal.document());
    assert_eq!(plan.signals, vec![Signal::JournalDiverged { first_seq: 5 }]);
    assert_eq!(
        plan.actions[0],
        MirrorAction::MoveToDiverged {
            from: 5,
            through: 8,
            reason: DivergeReason::Diverged
        }
    );
    assert_eq!(plan.writes(), 4);
    assert_eq!(plan.signals[0].event_reason(), "JournalDiverged");
}

#[test]
fn a_mirror_ahead_of_the_annotation_is_a_rollback() {
    let w = history(3);
    let full = w.journal.entries().to_vec();
    let old = Writer {
        journal: Journal::load(
            Some(&document_text(FLEET, (0, Hash::ZERO), &full[..8])),
            FLEET,
        )
        .unwrap(),
        budget: Budget::default(),
        minute: 0,
    };
    let plan = plan_reconcile(&hashes(&full), old.journal.document());
    assert_eq!(
        plan.signals,
        vec![Signal::JournalRollback {
            annotation_seq: 8,
            mirror_seq: 12
        }]
    );
    assert_eq!(
        plan.actions,
        vec![MirrorAction::MoveToDiverged {
            from: 9,
            through: 12,
            reason: DivergeReason::Rollback
        }]
    );
    assert!(plan.signals[0].message().contains("Recovered"));
}

#[test]
fn an_absent_annotation_rolls_the_whole_mirror_back() {
    let w = history(1);
    let plan = plan_reconcile(&hashes(w.journal.entries()), &Document::empty(FLEET));
    assert_eq!(
        plan.actions,
        vec![MirrorAction::MoveToDiverged {
            from: 1,
            through: 4,
            reason: DivergeReason::Rollback
        }]
    );
}

#[test]
fn a_mismatch_at_the_compaction_boundary_sets_the_old_history_aside() {
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for n in 1..=40 {
        w.scale(op(n), 1, 2);
    }
    let doc = w.journal.document();
    let ct = doc.compacted_through();
    assert!(ct > 0);
    let mut other = Writer::new();
    for n in 100..=120 {
        other.scale(op(n), 1, 2);
    }
    let mirror: Vec<(Seq, Hash)> = hashes(&other.journal.entries()[..ct as usize]);
    let plan = plan_reconcile(&mirror, doc);
    assert_eq!(
        plan.signals,
        vec![Signal::JournalDiverged { first_seq: ct }]
    );
    assert_eq!(
        plan.actions[0],
        MirrorAction::MoveToDiverged {
            from: 1,
            through: ct,
            reason: DivergeReason::Diverged
        }
    );
}

#[test]
fn entries_compacted_out_of_the_annotation_stay_in_the_mirror() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for n in 1..=40 {
        for body in [
            intent_body(OperationKind::Scale, 1, 2),
            issued(op(n), "replicas"),
            observed(),
            completed(CompletedOutcome::Succeeded),
        ] {
            let e = w.push(op(n), body);
            m.append(FLEET, &[e]).unwrap();
        }
    }
    assert!(w.journal.document().compacted_through() > 0);
    let plan = m.reconcile(w.journal.document()).unwrap();
    assert!(plan.is_empty(), "{plan:?}");
    assert_eq!(m.entries(FLEET).unwrap().len(), 160);
    chain::verify_entries(&m.entries(FLEET).unwrap(), Some((0, Hash::ZERO))).unwrap();
}

// ---- reconcile (sled) ----

#[test]
fn reconcile_applies_backfill_divergence_and_rollback() {
    let m = Mirror::temporary(MirrorOptions::default()).unwrap();
    let base = history(1);
    let mut mine = base.clone_for_test();
    mine.scale(op(2), 2, 3);
    mine.scale(op(3), 3, 4);
    m.append(FLEET, mine.journal.entries()).unwrap();
    // The annotation went another way after entry 4 and is shorter.
    let mut theirs = base.clone_for_test();
    theirs.push(op(9), intent_body(OperationKind::Restart, 2, 2));
    theirs.push(op(9), issued(op(9), "template"));
    let plan = m.reconcile(theirs.journal.document()).unwrap();
    assert_eq!(
        plan.signals,
        vec![
            Signal::JournalDiverged { first_seq: 5 },
            Signal::JournalRollback {
                annotation_seq: 6,
                mirror_seq: 12
            }
        ]
    );
    assert_eq!(&m.entries(FLEET).unwrap(), theirs.journal.entries());
    let aside = m.diverged(FLEET).unwrap();
    assert_eq!(aside.len(), 8);
    assert_eq!(
        aside.iter().map(|d| d.entry.seq()).collect::<Vec<_>>(),
        (5..=12).collect::<Vec<_>>()
    );
    assert!(aside.iter().all(|d| d.reason == DivergeReason::Diverged));
    assert_eq!(&aside[0].entry, &mine.journal.entries()[4]);
    // Reconciling again changes nothing.
    assert!(m.reconcile(theirs.journal.document()).unwrap().is_empty());
}

#[test]
fn a_rebuilt_mirror_holds_the_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("garbage"), "x").unwrap();
    let a = history(2);
    let b = {
        let mut w = Writer {
            journal: Journal::new("fleet-b"),
            budget: Budget::default(),
            minute: 0,
        };
        w.scale(op(7), 0, 1);
        w
    };
    let rebuilt = Mirror::rebuild(
        &path,
        &[a.journal.document().clone(), b.journal.document().clone()],
        MirrorOptions::default(),
    )
    .unwrap();
    assert_eq!(rebuilt.entries, 12);
    let aside = rebuilt.set_aside.clone().unwrap();
    assert!(aside.join("garbage").exists(), "the old directory is kept");
    assert_eq!(&rebuilt.mirror.entries(FLEET).unwrap(), a.journal.entries());
    assert_eq!(
        &rebuilt.mirror.entries("fleet-b").unwrap(),
        b.journal.entries()
    );
}

#[test]
fn a_rebuild_refuses_a_document_that_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let w = history(1);
    let tampered = w
        .journal
        .document()
        .encode()
        .replacen("\"to\":2", "\"to\":3", 1);
    let doc = decode_document(&tampered).unwrap();
    assert!(matches!(
        Mirror::rebuild(dir.path().join("m"), &[doc], MirrorOptions::default()).unwrap_err(),
        MirrorError::InvalidDocument { .. }
    ));
}

#[test]
fn a_corrupt_stored_entry_is_reported_with_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let w = history(1);
    {
        let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
        m.append(FLEET, w.journal.entries()).unwrap();
    }
    {
        let db = common::open_sled(dir.path());
        let tree = db.open_tree(format!("fleet/{FLEET}")).unwrap();
        tree.insert(2u64.to_be_bytes(), &b"{not json"[..]).unwrap();
        db.flush().unwrap();
    }
    let m = Mirror::open(dir.path(), MirrorOptions::default()).unwrap();
    let e = m.entries(FLEET).unwrap_err();
    assert!(matches!(e, MirrorError::CorruptEntry { seq: 2, .. }), "{e}");
}

// ---- the archive (older entries out of sled) ----

fn small(live_entries: u64) -> MirrorOptions {
    MirrorOptions {
        live_entries,
        ..MirrorOptions::default()
    }
}

fn segments(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("archive").join(FLEET))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn sled_held(dir: &std::path::Path) -> (usize, String) {
    let db = common::open_sled(dir);
    let n = db.open_tree(format!("fleet/{FLEET}")).unwrap().len();
    let marker = db
        .get("celld-journal-format")
        .unwrap()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default();
    (n, marker)
}

#[test]
fn older_entries_move_to_archive_segments_and_read_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new();
    let all = {
        let m = Mirror::open(dir.path(), small(8)).unwrap();
        let all = grow(&m, &mut w, 1..=20);
        assert_eq!(all.len(), 80);
        assert_eq!(m.entries(FLEET).unwrap(), all);
        assert_eq!(m.entries_from(FLEET, 30).unwrap(), all[29..].to_vec());
        assert_eq!(m.head(FLEET).unwrap(), Some((80, all[79].hash())));
        all
    };
    // sled holds at most 8 of them; segments (all but the newest quarter each time sled held
    // more than 8) hold the rest, one entry per line, named by their first seq.
    let (held, marker) = sled_held(dir.path());
    assert!((2..=8).contains(&held), "sled holds {held}");
    assert_eq!(marker, "celld-journal-mirror/v2");
    let names = segments(dir.path());
    assert!(names.len() >= 8, "{names:?}");
    let mut lines = Vec::new();
    for name in &names {
        let text =
            std::fs::read_to_string(dir.path().join("archive").join(FLEET).join(name)).unwrap();
        let first: Seq = name.trim_end_matches(".jsonl").parse().unwrap();
        assert_eq!(first as usize, lines.len() + 1, "{name}");
        lines.extend(text.lines().map(str::to_owned));
    }
    assert_eq!(lines.len(), 80 - held);
    assert_eq!(
        lines,
        all[..80 - held]
            .iter()
            .map(|e| e.to_json())
            .collect::<Vec<_>>()
    );
    // Reopened: the same history, and the chain verifies across segments and sled.
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    let read = m.entries(FLEET).unwrap();
    assert_eq!(read, all);
    chain::verify_entries(&read, Some((0, Hash::ZERO))).unwrap();
    // The annotation agrees: nothing to do, and the archive is not read for it.
    assert!(m.reconcile(w.journal.document()).unwrap().is_empty());
}

#[test]
fn a_mirror_says_v1_until_its_first_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new();
    {
        let m = Mirror::open(dir.path(), small(8)).unwrap();
        grow(&m, &mut w, 1..=2);
    }
    // An operator that reads v1 only can still open it.
    assert_eq!(
        sled_held(dir.path()),
        (8, "celld-journal-mirror/v1".to_owned())
    );
    assert!(segments(dir.path()).is_empty());
    {
        let m = Mirror::open(dir.path(), small(8)).unwrap();
        grow(&m, &mut w, 3..=3);
    }
    assert_eq!(sled_held(dir.path()).1, "celld-journal-mirror/v2");
    assert_eq!(segments(dir.path()).len(), 1);
}

#[test]
fn a_v1_mirror_with_a_long_history_is_archived_at_its_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new();
    // Written by an operator before the archive: everything in sled.
    let mut all = {
        let m = Mirror::open(dir.path(), small(1_000)).unwrap();
        grow(&m, &mut w, 1..=30)
    };
    assert_eq!(
        sled_held(dir.path()),
        (120, "celld-journal-mirror/v1".to_owned())
    );
    {
        let m = Mirror::open(dir.path(), small(16)).unwrap();
        all.extend(grow(&m, &mut w, 31..=31));
        assert_eq!(m.entries(FLEET).unwrap(), all);
    }
    let (held, marker) = sled_held(dir.path());
    assert_eq!((held, marker.as_str()), (4, "celld-journal-mirror/v2"));
    assert_eq!(segments(dir.path()).len(), 1);
}

#[test]
fn retention_removes_archived_segments_once_all_their_entries_are_older() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(
        dir.path(),
        MirrorOptions {
            retention: 40,
            ..small(8)
        },
    )
    .unwrap();
    let mut w = Writer::new();
    let all = grow(&m, &mut w, 1..=50);
    let kept = m.entries(FLEET).unwrap();
    // At least the newest 40, at most one segment (6) more; contiguous up to the head.
    assert!((40..=46).contains(&kept.len()), "kept {}", kept.len());
    assert_eq!(kept, all[all.len() - kept.len()..].to_vec());
    assert!(
        segments(dir.path()).len() <= 7,
        "{:?}",
        segments(dir.path())
    );
    // A smaller retention at the next start trims the archive at the next append.
    drop(m);
    let m = Mirror::open(
        dir.path(),
        MirrorOptions {
            retention: 10,
            ..small(8)
        },
    )
    .unwrap();
    let all = [all, grow(&m, &mut w, 51..=51)].concat();
    let kept = m.entries(FLEET).unwrap();
    assert!((10..=16).contains(&kept.len()), "kept {}", kept.len());
    assert_eq!(kept, all[all.len() - kept.len()..].to_vec());
}

#[test]
fn a_rollback_into_the_archive_sets_the_archived_entries_aside() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    let mut w = Writer::new();
    let all = grow(&m, &mut w, 1..=20);
    // A backup from seq 31 was restored: the annotation ends there.
    let restored = Journal::load(
        Some(&document_text(FLEET, (0, Hash::ZERO), &all[..31])),
        FLEET,
    )
    .unwrap();
    let plan = m.reconcile(restored.document()).unwrap();
    assert_eq!(
        plan.signals,
        vec![Signal::JournalRollback {
            annotation_seq: 31,
            mirror_seq: 80
        }]
    );
    assert_eq!(m.entries(FLEET).unwrap(), all[..31].to_vec());
    let aside = m.diverged(FLEET).unwrap();
    assert_eq!(
        aside.iter().map(|d| d.entry.seq()).collect::<Vec<_>>(),
        (32..=80).collect::<Vec<_>>()
    );
    assert!(aside.iter().all(|d| d.reason == DivergeReason::Rollback));
    assert_eq!(aside[0].entry, all[31]);
    // The segment that held seq 31 was cut there; nothing after it is left in the archive.
    let names = segments(dir.path());
    let last = std::fs::read_to_string(
        dir.path()
            .join("archive")
            .join(FLEET)
            .join(names.last().unwrap()),
    )
    .unwrap();
    assert_eq!(last.lines().last().unwrap(), all[30].to_json());
    // The restored journal goes on from 31, and reads back as one chain after a reopen.
    let mut next = Writer {
        journal: restored,
        budget: Budget::default(),
        minute: 100,
    };
    next.push(op(8), completed(CompletedOutcome::Succeeded));
    m.append(FLEET, &unmirrored(&m, &next)).unwrap();
    drop(m);
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    let read = m.entries(FLEET).unwrap();
    assert_eq!(read.len(), 32);
    chain::verify_entries(&read, Some((0, Hash::ZERO))).unwrap();
}

#[test]
fn a_mismatch_at_the_compaction_boundary_moves_archived_history_aside() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    // The mirror holds another journal's 80 entries; the annotation (compacted) disagrees at
    // its compaction boundary, which is inside the archive.
    let mut other = Writer::new();
    let theirs_held = grow(&m, &mut other, 100..=139);
    let mut w = Writer::with_budget(Budget::new(32 * 1024).unwrap());
    for n in 1..=40 {
        w.scale(op(n), 1, 2);
    }
    let doc = w.journal.document();
    let ct = doc.compacted_through();
    assert!(ct > 8 && ct < 150, "compacted through {ct}");
    let plan = m.reconcile(doc).unwrap();
    assert_eq!(plan.signals[0], Signal::JournalDiverged { first_seq: ct });
    // Every entry the mirror held is aside (once), and what it holds now is the annotation's.
    let mut aside: Vec<Seq> = m
        .diverged(FLEET)
        .unwrap()
        .iter()
        .map(|d| d.entry.seq())
        .collect();
    aside.sort();
    assert_eq!(aside, (1..=160).collect::<Vec<_>>());
    assert_eq!(aside.len(), theirs_held.len());
    assert_eq!(&m.entries(FLEET).unwrap(), doc.entries());
}

#[test]
fn a_reset_sets_archived_entries_aside_too() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    let mut w = Writer::new();
    grow(&m, &mut w, 1..=20);
    assert_eq!(m.set_aside(FLEET).unwrap(), 80);
    assert!(m.entries(FLEET).unwrap().is_empty());
    assert_eq!(m.head(FLEET).unwrap(), None);
    assert!(segments(dir.path()).is_empty());
    assert_eq!(m.diverged(FLEET).unwrap().len(), 80);
    // A new journal starts again at seq 1.
    let mut fresh = Writer::new();
    let new = grow(&m, &mut fresh, 1..=1);
    assert_eq!(m.entries(FLEET).unwrap(), new);
}

#[test]
fn an_archiving_interrupted_before_sled_let_go_counts_each_entry_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new();
    let mut all = {
        let m = Mirror::open(dir.path(), small(8)).unwrap();
        grow(&m, &mut w, 1..=10)
    };
    // What a crash after a segment's rename and before sled's removal leaves: sled still
    // holds the newest segment's entries.
    let newest: usize = segments(dir.path())
        .last()
        .unwrap()
        .trim_end_matches(".jsonl")
        .parse()
        .unwrap();
    assert!(newest > 1);
    {
        let db = common::open_sled(dir.path());
        let tree = db.open_tree(format!("fleet/{FLEET}")).unwrap();
        for e in &all[newest - 1..] {
            tree.insert(e.seq().to_be_bytes(), e.to_json().as_bytes())
                .unwrap();
        }
        db.flush().unwrap();
    }
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    assert_eq!(m.entries(FLEET).unwrap(), all);
    all.extend(grow(&m, &mut w, 11..=12));
    assert_eq!(m.entries(FLEET).unwrap(), all);
    drop(m);
    assert!(sled_held(dir.path()).0 <= 8);
}

#[test]
fn a_damaged_segment_is_reported_with_its_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = Mirror::open(dir.path(), small(8)).unwrap();
        grow(&m, &mut Writer::new(), 1..=5);
    }
    let second = segments(dir.path())[1].clone();
    let seg = dir.path().join("archive").join(FLEET).join(&second);
    let text = std::fs::read_to_string(&seg).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.swap(1, 2);
    std::fs::write(&seg, lines.join("\n")).unwrap();
    let m = Mirror::open(dir.path(), small(8)).unwrap();
    let e = m.entries(FLEET).unwrap_err();
    assert!(
        matches!(e, MirrorError::CorruptEntry { .. }) && e.to_string().contains(&second),
        "{e}"
    );
}

trait CloneForTest {
    fn clone_for_test(&self) -> Writer;
}

impl CloneForTest for Writer {
    fn clone_for_test(&self) -> Writer {
        Writer {
            journal: self.journal.clone(),
            budget: self.budget,
            minute: self.minute,
        }
    }
}
