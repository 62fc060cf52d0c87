//! Reaction time as the operator sees it (docs/operations.md "Metrics"): for each guarded
//! workload write, how long after the fleet's last member or workload watch event before the
//! reconcile started (`event_to_pass`: trigger delivery, the controller's queue, a pass left
//! to a later watch event), and how long that reconcile took to the write (`pass_to_write`:
//! its slot wait and its requests before the write). The benchmark's reaction figures are
//! timed from outside; these split them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Per fleet (`ns/name`), when the watches last forwarded an event of one of its objects.
#[derive(Debug, Default)]
pub struct EventClock {
    last: Mutex<HashMap<String, Instant>>,
}

/// Entries kept before the map is cleared (a bound, far above any fleet count served).
const MAX_FLEETS: usize = 65_536;

impl EventClock {
    /// An event of fleet `key`'s objects arrived now.
    pub fn saw(&self, key: &str) {
        if let Ok(mut last) = self.last.lock() {
            if last.len() >= MAX_FLEETS && !last.contains_key(key) {
                last.clear();
            }
            last.insert(key.to_string(), Instant::now());
        }
    }

    /// When fleet `key`'s last event arrived.
    pub fn last(&self, key: &str) -> Option<Instant> {
        self.last.lock().ok()?.get(key).copied()
    }

    /// Fleet `key` is gone.
    pub fn forget(&self, key: &str) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(key);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Started {
    at: Instant,
    event: Option<Instant>,
}

tokio::task_local! {
    static STARTED: Started;
}

/// Runs reconcile `fut`, started now, after the fleet's last event at `event`.
pub async fn scope<F: std::future::Future>(event: Option<Instant>, fut: F) -> F::Output {
    STARTED
        .scope(
            Started {
                at: Instant::now(),
                event,
            },
            fut,
        )
        .await
}

/// A guarded workload write was answered: observes its two parts (outside a reconcile's
/// [`scope`], nothing).
pub fn wrote(metrics: &crate::metrics::Metrics) {
    let Ok(started) = STARTED.try_with(|s| *s) else {
        return;
    };
    let part = |name: &str| {
        metrics.reaction.get_or_create(&crate::metrics::PartLabels {
            part: name.to_string(),
        })
    };
    if let Some(event) = started.event.filter(|e| *e <= started.at) {
        part("event_to_pass").observe(started.at.duration_since(event).as_secs_f64());
    }
    part("pass_to_write").observe(started.at.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_is_split_at_the_start_of_its_reconcile() {
        let metrics = crate::metrics::Metrics::default();
        let clock = EventClock::default();
        wrote(&metrics);
        assert_eq!(metrics.reaction_counts(), (0, 0), "outside a reconcile");
        clock.saw("ns/a");
        let event = clock.last("ns/a");
        assert!(event.is_some() && clock.last("ns/b").is_none());
        scope(event, async { wrote(&metrics) }).await;
        assert_eq!(metrics.reaction_counts(), (1, 1));
        // Without an event seen (e.g. a resync), only the pass is timed.
        scope(None, async { wrote(&metrics) }).await;
        assert_eq!(metrics.reaction_counts(), (1, 2));
        clock.forget("ns/a");
        assert!(clock.last("ns/a").is_none());
    }
}
