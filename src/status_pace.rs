//! The pace of progress-only status writes (docs/design.md "Status writes at a pace").
//!
//! A fleet's status reports member counts (`replicas`, `observedReplicas`,
//! `joiningReplicas`, `terminatingReplicas`, `readyReplicas`) and condition messages that
//! change with every Pod event of an operation: a member created, scheduled, Ready, a member
//! terminating, gone. Written one by one that is about ten status writes per operation, each a
//! full write of the fleet on the API server (schema validation, managed fields, etcd, one
//! watch event per watcher), which under load delays every other fleet's reaction.
//!
//! A status change that is *progress only* (those counts and condition messages, nothing
//! else: no condition's status or reason, no operation, journal figure or generation) is
//! written at most once per `--status-progress-interval` per fleet: within the interval after
//! the fleet's last status write it waits, and the reconcile looks again when the interval
//! ends, so the newest counts are always written, at most one interval late. Every other
//! change is written at once, with the counts of that moment. `0s` writes every change at
//! once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `--status-progress-interval` default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Per fleet (`ns/name`), when this process last wrote its status.
#[derive(Debug, Default)]
pub struct StatusPace {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl StatusPace {
    /// Progress-only changes of a fleet written at most once per `interval` (zero: always).
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::default(),
        }
    }

    /// How long a progress-only change of fleet `key` must still wait at `now` (`None`: it
    /// may be written now). Entries older than the interval are dropped here, so only fleets
    /// written within the last interval are held.
    pub fn wait(&self, key: &str, now: Instant) -> Option<Duration> {
        if self.interval.is_zero() {
            return None;
        }
        let mut last = self.last.lock().ok()?;
        let since = now.saturating_duration_since(*last.get(key)?);
        if since >= self.interval {
            last.remove(key);
            return None;
        }
        Some(self.interval - since)
    }

    /// Fleet `key`'s status was written at `at`.
    pub fn wrote(&self, key: &str, at: Instant) {
        if self.interval.is_zero() {
            return;
        }
        if let Ok(mut last) = self.last.lock() {
            if last.len() > 4096 {
                let interval = self.interval;
                last.retain(|_, t| at.saturating_duration_since(*t) < interval);
            }
            last.insert(key.to_string(), at);
        }
    }

    /// Fleet `key` is gone.
    pub fn forget(&self, key: &str) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_change_waits_for_the_rest_of_the_interval_after_a_write() {
        let pace = StatusPace::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(pace.wait("ns/a", t0), None, "never written: now");
        pace.wrote("ns/a", t0);
        assert_eq!(
            pace.wait("ns/a", t0 + Duration::from_millis(300)),
            Some(Duration::from_millis(700))
        );
        assert_eq!(pace.wait("ns/b", t0), None, "per fleet");
        assert_eq!(pace.wait("ns/a", t0 + Duration::from_secs(1)), None);
        // The entry was dropped when its interval ended.
        assert_eq!(pace.wait("ns/a", t0 + Duration::from_millis(10)), None);
        pace.wrote("ns/a", t0);
        pace.forget("ns/a");
        assert_eq!(pace.wait("ns/a", t0), None);
    }

    #[test]
    fn a_zero_interval_never_waits() {
        let pace = StatusPace::new(Duration::ZERO);
        let t0 = Instant::now();
        pace.wrote("ns/a", t0);
        assert_eq!(pace.wait("ns/a", t0), None);
    }
}
