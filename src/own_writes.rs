//! Which cached copies this process knows to be stale (docs/design.md "Caches and the two
//! passes", "A copy older than the process's own write").
//!
//! Every write of the operator to a fleet (a journal append, a status write) or to its
//! workload (a guarded write) is conditioned on the object's resourceVersion. When one
//! succeeds, the resourceVersion it was conditioned on is *replaced*: the object has moved on,
//! and a copy still at that version is older than it. The stores are updated by the watches,
//! a few milliseconds after the write; a reconcile triggered in between (a Pod event, a
//! requeue) gets that older copy. Its cached pass would decide from a journal, status or
//! workload this process has already changed: its status write is answered 409, and an
//! escalation reads everything again only to find what the write's own watch event is about
//! to trigger anyway.
//!
//! [`OwnWrites`] keeps, per object, the last few replaced versions and when they were replaced.
//! A copy at one of them, within [`WINDOW`] of the write, is *known stale*: the reconcile
//! leaves it to the reconcile that the write's watch event brings (the store holds the newer
//! copy before that event triggers), with a requeue at the window's end to back it up. After
//! [`WINDOW`] a copy is treated as any other (a watch that has not delivered the write by then
//! may be down; the reconcile then reads fresh as it always did). Only equality is used:
//! resourceVersions are opaque, never compared in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The key of fleet `ns/name`'s workload.
pub fn workload_key(ns: &str, name: &str) -> String {
    format!("{ns}/workload/{name}")
}

/// Replaced versions kept per object (a burst of writes replaces one version per write).
const KEPT: usize = 4;

/// How long after the write a copy at the replaced version is known stale.
pub const WINDOW: Duration = Duration::from_secs(5);

/// Per object (a fleet's `ns/name`, a workload's [`workload_key`]), the resourceVersions this
/// process's own successful writes replaced.
#[derive(Debug, Default)]
pub struct OwnWrites {
    replaced: Mutex<HashMap<String, VecDeque<(String, Instant)>>>,
}

impl OwnWrites {
    /// A write of this process to object `key`, conditioned on `rv`, succeeded at `at`.
    pub fn replaced(&self, key: &str, rv: Option<&str>, at: Instant) {
        let (Some(rv), Ok(mut map)) = (rv, self.replaced.lock()) else {
            return;
        };
        let kept = map.entry(key.to_string()).or_default();
        kept.retain(|(_, when)| at.saturating_duration_since(*when) < WINDOW);
        kept.push_back((rv.to_string(), at));
        while kept.len() > KEPT {
            kept.pop_front();
        }
    }

    /// A copy of object `key` at `rv` is older than a write this process made to it less than
    /// [`WINDOW`] before `now`: how much of the window is left (`None`: not known stale).
    pub fn outdates(&self, key: &str, rv: Option<&str>, now: Instant) -> Option<Duration> {
        let (Some(rv), Ok(map)) = (rv, self.replaced.lock()) else {
            return None;
        };
        map.get(key)?
            .iter()
            .filter(|(r, _)| r == rv)
            .map(|(_, when)| WINDOW.saturating_sub(now.saturating_duration_since(*when)))
            .filter(|left| !left.is_zero())
            .max()
    }

    /// The fleet `ns/name` is gone: its records and its workload's go with it.
    pub fn forget(&self, ns: &str, name: &str) {
        if let Ok(mut map) = self.replaced.lock() {
            map.remove(&format!("{ns}/{name}"));
            map.remove(&workload_key(ns, name));
        }
    }

    /// Fleets with a record (for tests and the memory figures).
    pub fn len(&self) -> usize {
        self.replaced.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// No fleet has a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_at_a_replaced_version_is_stale_until_the_window_ends() {
        let w = OwnWrites::default();
        let t0 = Instant::now();
        w.replaced("ns/f", Some("10"), t0);
        assert_eq!(w.outdates("ns/f", Some("10"), t0), Some(WINDOW));
        let ms = Duration::from_millis(1);
        assert_eq!(w.outdates("ns/f", Some("10"), t0 + WINDOW - ms), Some(ms));
        assert_eq!(w.outdates("ns/f", Some("10"), t0 + WINDOW), None);
        // The version the write produced, any other version, another object: not known stale.
        assert_eq!(w.outdates("ns/f", Some("11"), t0), None);
        assert_eq!(w.outdates("ns/g", Some("10"), t0), None);
        assert_eq!(w.outdates(&workload_key("ns", "f"), Some("10"), t0), None);
        assert_eq!(w.outdates("ns/f", None, t0), None);
    }

    #[test]
    fn the_newest_versions_are_kept_and_a_gone_fleet_is_forgotten() {
        let w = OwnWrites::default();
        let t0 = Instant::now();
        for rv in 1..=6 {
            w.replaced("ns/f", Some(&rv.to_string()), t0);
        }
        assert_eq!(w.outdates("ns/f", Some("1"), t0), None);
        assert_eq!(w.outdates("ns/f", Some("2"), t0), None);
        for rv in 3..=6 {
            assert!(
                w.outdates("ns/f", Some(&rv.to_string()), t0).is_some(),
                "{rv}"
            );
        }
        // Versions past the window are dropped when the next write is recorded.
        w.replaced("ns/f", Some("7"), t0 + WINDOW);
        assert!(w.outdates("ns/f", Some("7"), t0 + WINDOW).is_some());
        assert_eq!(w.outdates("ns/f", Some("6"), t0 + WINDOW), None);
        // A write without a version records nothing.
        w.replaced("ns/g", None, t0);
        assert_eq!(w.len(), 1);
        // A gone fleet takes its workload's record with it.
        w.replaced(&workload_key("ns", "f"), Some("20"), t0);
        assert_eq!(w.len(), 2);
        w.forget("ns", "f");
        assert!(w.is_empty());
        assert_eq!(w.outdates("ns/f", Some("7"), t0 + WINDOW), None);
    }
}
