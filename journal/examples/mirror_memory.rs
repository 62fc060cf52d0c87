//! How the mirror's memory and disk grow with the history it holds, at the operator's scale:
//! `cargo run --release -p celld-journal --example mirror_memory -- [--fleets=1000]
//! [--operations=60] [--every=10] [--cache-bytes=8388608] [--retention=10000]
//! [--live-entries=256] [--dir=PATH]`
//! (`make bench-mirror` runs it with the operator's defaults and with sled's own cache bound).
//!
//! One sled mirror on disk, `--fleets` fleets, each given `--operations` operations in rounds
//! (one append and flush per operation, as the operator mirrors one committed write): a
//! rolling restart (4 entries) and a Retire contraction (7 entries) alternately, the entries
//! the journal benchmarks use. Every `--every` rounds it prints the process's anonymous
//! resident memory after `malloc_trim` (what the mirror holds: the process does nothing
//! else), the directory's size on disk and the time so far; at the end it closes the mirror,
//! reopens it and reads every fleet's head, as a restarted operator does, and prints the same.

#[path = "../benches/fixture/mod.rs"]
mod fixture;

use std::path::Path;
use std::time::Instant;

use journal::{Hash, Mirror, MirrorOptions, Seq, DEFAULT_CACHE_BYTES};

struct Args {
    fleets: u32,
    operations: u64,
    every: u64,
    options: MirrorOptions,
    dir: Option<std::path::PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        fleets: 1000,
        operations: 60,
        every: 10,
        options: MirrorOptions::default(),
        dir: None,
    };
    for arg in std::env::args().skip(1) {
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| format!("{arg}: expected --name=value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{key}={value}: {e}"))
        };
        match key {
            "--fleets" => {
                args.fleets = u32::try_from(number()?).map_err(|e| format!("{key}: {e}"))?
            }
            "--operations" => args.operations = number()?,
            "--every" => args.every = number()?.max(1),
            "--cache-bytes" => args.options.cache_bytes = number()?,
            "--retention" => args.options.retention = number()?,
            "--live-entries" => args.options.live_entries = number()?,
            "--dir" => args.dir = Some(value.into()),
            _ => return Err(format!("unknown option {key}")),
        }
    }
    Ok(args)
}

fn disk_bytes(dir: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    read.filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn report(label: &str, dir: &Path, started: Instant) {
    fixture::trim_heap();
    let mib = |field| fixture::status_kib(field).unwrap_or(0) as f64 / 1024.0;
    println!(
        "{label:<36} {:>9.1} {:>9.1} {:>9.1} {:>8.1}",
        mib("RssAnon:"),
        mib("VmRSS:"),
        disk_bytes(dir) as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("mirror_memory: {e}");
            std::process::exit(2);
        }
    };
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| scratch.path().join("journal"));
    let fleet = |i: u32| format!("5f0c9a6e-1b2c-4d3e-8f40-{i:012}");
    println!(
        "mirror: {} fleets, {} operations each, cache_bytes {} (default {DEFAULT_CACHE_BYTES}), \
         retention {}, live entries {}, {}",
        args.fleets,
        args.operations,
        args.options.cache_bytes,
        args.options.retention,
        args.options.live_entries,
        dir.display()
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>8}",
        "after", "anon MiB", "RSS MiB", "disk MB", "s"
    );
    let started = Instant::now();
    let mirror = Mirror::open(&dir, args.options).expect("open the mirror");
    report("open", &dir, started);
    let mut heads: Vec<(Seq, Hash)> = vec![(0, Hash::ZERO); args.fleets as usize];
    let mut entries_per_fleet = 0u64;
    let mut json_bytes = 0u64;
    for n in 1..=args.operations {
        for (i, head) in heads.iter_mut().enumerate() {
            let sealed = fixture::seal_operation(n, head);
            if i == 0 {
                entries_per_fleet += sealed.len() as u64;
                json_bytes += sealed.iter().map(|e| e.to_json().len() as u64).sum::<u64>();
            }
            mirror
                .append(&fleet(i as u32), &sealed)
                .expect("append to the mirror");
        }
        if n % args.every == 0 || n == args.operations {
            report(
                &format!(
                    "{n} ops ({entries_per_fleet} entries, {:.0} KB)/fleet",
                    json_bytes as f64 / 1e3
                ),
                &dir,
                started,
            );
        }
    }
    drop(mirror);
    let mirror = Mirror::open(&dir, args.options).expect("reopen the mirror");
    report("reopened", &dir, started);
    for (i, head) in heads.iter().enumerate() {
        let read = mirror.head(&fleet(i as u32)).expect("read a head");
        assert_eq!(read, Some(*head), "fleet {i}: the head read back");
    }
    report("reopened, every head read", &dir, started);
}
