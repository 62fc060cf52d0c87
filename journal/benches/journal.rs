//! Benchmarks: `cargo bench -p celld-journal` (add `-- --measurement-time 3 --warm-up-time 1`
//! for a quick run).
//!
//! - `decode_and_fold_64k`: load a full 64 KiB annotation (strict decode, chain verify, fold);
//! - `append_with_compaction`: stage one entry on a journal at its budget (seal, check, compact,
//!   encode);
//! - `mirror_append_flush`: append one entry to an on-disk sled mirror and flush;
//! - `mirror_replay_10k`: read 10,000 entries of a fleet back from the mirror, verify their chain
//!   and fold them;
//! - `mirror_head_1000_fleets`: the newest entry of one fleet in a mirror holding 1,000 fleets
//!   (what every reconcile asks the mirror).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use journal::*;

mod fixture;
use fixture::{chain_of, new_entry, operation, FLEET};

/// A journal filled to its default budget (it has compacted before), and the next entry, whose
/// append compacts again.
fn full_journal() -> (Journal, NewEntry) {
    let budget = Budget::default();
    let mut journal = Journal::new(FLEET);
    let mut n = 0;
    loop {
        n += 1;
        for (id, body) in operation(n) {
            let entry = new_entry(id, body);
            let staged = journal.stage(entry.clone(), budget).unwrap();
            if staged.compaction().is_some() && journal.document().compacted_through() > 0 {
                return (journal, entry);
            }
            journal = staged.into_journal();
        }
    }
}

fn decode_and_fold(c: &mut Criterion) {
    let (journal, _) = full_journal();
    let text = journal.document().encode();
    println!(
        "decode_and_fold_64k: {} bytes, {} entries",
        text.len(),
        journal.entries().len()
    );
    assert!(text.len() > 62 * 1024 && text.len() <= 64 * 1024);
    c.bench_function("decode_and_fold_64k", |b| {
        b.iter(|| Journal::load(Some(std::hint::black_box(&text)), FLEET).unwrap())
    });
}

fn append_with_compaction(c: &mut Criterion) {
    let (journal, entry) = full_journal();
    // The fixture is at its budget: this append compacts.
    let staged = journal.stage(entry.clone(), Budget::default()).unwrap();
    assert!(staged.compaction().is_some());
    c.bench_function("append_with_compaction", |b| {
        b.iter_batched(
            || entry.clone(),
            |e| journal.stage(e, Budget::default()).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

fn mirror_append_flush(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mirror = Mirror::open(dir.path().join("journal"), MirrorOptions::default()).unwrap();
    let entries = chain_of(200_000);
    let mut next = 0usize;
    c.bench_function("mirror_append_flush", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let e = entries
                    .get(next)
                    .expect("prepared enough entries for the measurement");
                next += 1;
                let start = Instant::now();
                mirror.append(FLEET, std::slice::from_ref(e)).unwrap();
                total += start.elapsed();
            }
            total
        })
    });
}

fn mirror_replay(c: &mut Criterion) {
    let mirror = Mirror::temporary(MirrorOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let on_disk = Mirror::open(dir.path().join("journal"), MirrorOptions::default()).unwrap();
    let entries = chain_of(10_000);
    for chunk in entries.chunks(1000) {
        mirror.append(FLEET, chunk).unwrap();
        on_disk.append(FLEET, chunk).unwrap();
    }
    drop(mirror);
    c.bench_function("mirror_replay_10k", |b| {
        b.iter(|| {
            let read = on_disk.entries(FLEET).unwrap();
            assert_eq!(read.len(), 10_000);
            chain::verify_entries(&read, Some((0, Hash::ZERO))).unwrap();
            Fold::from_entries(&read).unwrap()
        })
    });
}

fn mirror_head_many_fleets(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let entries = chain_of(8);
    let fleet = |i: u32| format!("5f0c9a6e-1b2c-4d3e-8f40-{i:012}");
    {
        let mirror = Mirror::open(&path, MirrorOptions::default()).unwrap();
        for i in 0..1000 {
            mirror.append(&fleet(i), &entries).unwrap();
        }
    }
    // Reopened, as after a restart: the handles come from the database, not from the appends.
    let mirror = Mirror::open(&path, MirrorOptions::default()).unwrap();
    let probe = fleet(777);
    let newest = entries.last().map(Entry::seq);
    c.bench_function("mirror_head_1000_fleets", |b| {
        b.iter(|| {
            let head = mirror.head(std::hint::black_box(&probe)).unwrap();
            assert_eq!(head.map(|(seq, _)| seq), newest);
            head
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = decode_and_fold, append_with_compaction, mirror_append_flush, mirror_replay,
        mirror_head_many_fleets
}
criterion_main!(benches);
