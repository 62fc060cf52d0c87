//! The mirror's memory stays bounded as it writes (its own test binary, so the process's
//! memory is this test's). sled keeps the pages it writes in its page cache; with sled's own
//! default bound (1 GiB) a mirror's memory grew by about 3.6 KB per operation written, without
//! end (docs/operations.md "Sizing the journal mirror"). `MirrorOptions::default()` bounds the
//! cache at 8 MiB.

#[path = "../benches/fixture/mod.rs"]
mod fixture;

use journal::{Hash, Mirror, MirrorOptions, Seq, DEFAULT_CACHE_BYTES};

/// Anonymous resident memory of this process, KiB, after glibc returned its free pages.
fn anon_kib() -> u64 {
    fixture::trim_heap();
    fixture::status_kib("RssAnon:").expect("RssAnon in /proc/self/status")
}

#[test]
fn writing_history_does_not_grow_the_mirror_past_its_cache_bound() {
    assert_eq!(MirrorOptions::default().cache_bytes, DEFAULT_CACHE_BYTES);
    assert_eq!(DEFAULT_CACHE_BYTES, 8 * 1024 * 1024);
    let dir = tempfile::tempdir().unwrap();
    let mirror = Mirror::open(dir.path().join("journal"), MirrorOptions::default()).unwrap();
    let fleets = 200u32;
    let operations = 60u64;
    let fleet = |i: u32| format!("5f0c9a6e-1b2c-4d3e-8f40-{i:012}");
    let mut heads: Vec<(Seq, Hash)> = vec![(0, Hash::ZERO); fleets as usize];
    // One operation for every fleet first: the trees and sled's start-up buffers exist.
    let mut written = 0u64;
    let mut append_round = |n: u64, heads: &mut Vec<(Seq, Hash)>| {
        for (i, head) in heads.iter_mut().enumerate() {
            let sealed = fixture::seal_operation(n, head);
            written += sealed.iter().map(|e| e.to_json().len() as u64).sum::<u64>();
            mirror.append(&fleet(i as u32), &sealed).unwrap();
        }
    };
    append_round(1, &mut heads);
    let before = anon_kib();
    for n in 2..=operations {
        append_round(n, &mut heads);
    }
    let grown_kib = anon_kib().saturating_sub(before);
    println!("wrote {written} bytes of entries; anonymous memory grew by {grown_kib} KiB");
    // Measured (test build, 2026-12-07): 12.6 MiB more with the 8 MiB bound, 42.5 MiB with
    // sled's 1 GiB bound, for these 59 rounds (28.7 MB of entry JSON).
    assert!(
        written > 25_000_000,
        "the test writes enough to tell: {written} bytes"
    );
    assert!(
        grown_kib < 28 * 1024,
        "the mirror grew by {grown_kib} KiB while writing {written} bytes of entries: \
         its page cache is not bounded by {DEFAULT_CACHE_BYTES} bytes"
    );
    // Everything written is still there.
    for (i, head) in heads.iter().enumerate() {
        assert_eq!(mirror.head(&fleet(i as u32)).unwrap(), Some(*head));
    }
}
