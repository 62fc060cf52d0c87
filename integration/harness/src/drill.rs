//! Seeded randomness for the drills that pick instants (kills, freezes): the seed is printed
//! by each drill and re-runnable with `CELLD_DRILL_SEED`.

/// The drill seed: `CELLD_DRILL_SEED` when set (to re-run a failure), else the clock.
pub fn seed() -> u64 {
    std::env::var("CELLD_DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// xorshift64 (state must be non-zero): uniform enough for picking an instant.
pub fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A uniformly random delay in `[0, window)` (at least 1 ms wide).
pub fn instant_within(state: &mut u64, window: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(next_random(state) % (window.as_millis().max(1) as u64))
}

/// What an operator run with `--test-api-fault` logged: the fault it injected (the line
/// naming the request it hit) and how many requests matched the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultLog {
    pub faulted: Option<String>,
    pub counted: usize,
}

/// Reads the operator log at `path` from byte `offset` (where the run began).
pub fn fault_log(path: &std::path::Path, offset: u64) -> FaultLog {
    let text = std::fs::read(path).unwrap_or_default();
    let log = String::from_utf8_lossy(&text[(offset as usize).min(text.len())..]).into_owned();
    let faulted = log
        .lines()
        .find(|l| l.contains("celld-operator: api fault"))
        .map(|l| l.trim().to_string());
    let counted = log
        .lines()
        .filter(|l| l.contains("api request counted"))
        .count()
        + usize::from(faulted.is_some());
    FaultLog { faulted, counted }
}

/// The length of the file at `path` now (0 when absent): a run's log `offset`.
pub fn log_offset(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_fixed_by_the_seed_and_stays_in_the_window() {
        let (mut a, mut b) = (42u64, 42u64);
        let w = std::time::Duration::from_millis(700);
        for _ in 0..100 {
            let (x, y) = (instant_within(&mut a, w), instant_within(&mut b, w));
            assert_eq!(x, y);
            assert!(x < w);
        }
        assert_ne!(a, 42);
    }

    #[test]
    fn the_fault_log_names_the_faulted_request_and_counts_the_matches() {
        let dir = std::env::temp_dir().join(format!("drill-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("operator.log");
        std::fs::write(&path, "old: api request counted\n").unwrap();
        let offset = log_offset(&path);
        let run = "x api request counted index=1\n\
                   celld-operator: api fault conflict injected at matching request #2: update deployments ns/sl\n";
        std::fs::write(&path, format!("old: api request counted\n{run}")).unwrap();
        let got = fault_log(&path, offset);
        assert_eq!(got.counted, 2);
        assert!(got.faulted.unwrap().contains("conflict injected"));
        assert_eq!(fault_log(&path, 0).counted, 3);
        std::fs::remove_dir_all(dir).ok();
    }
}
