//! How long the reconcile that carries out a workload write takes to send it
//! (`celld_operator_reaction_pass_seconds`, docs/operations.md "Metrics"): from the start of
//! the reconcile to the guarded write's answer, i.e. the reconcile's requests before the write
//! (the prerequisite reads, the journal appends, the guard's fresh reads) and the write itself;
//! and how many requests that was (`celld_operator_reaction_pass_requests`, the write
//! included). The benchmark times reactions from outside (a member settled → the next
//! write); this is the part of that time spent in the reconcile that wrote.
//!
//! The time before it is timed too (`celld_operator_reaction_wait_seconds`): from the
//! fleet's earliest trigger that no started reconcile had served yet (a watch event of the
//! fleet, its workload, its Pods or claims, as it reached the operator, see [`Triggers`]) to
//! the start of the reconcile that wrote: waiting for a reconcile slot, or for the fleet's
//! previous reconcile to end. A reconcile started only by a requeue has no such trigger and is
//! not observed there. What neither times is the watch event's way from the API server to the
//! operator.
//!
//! A pass that took [`SLOW`] or longer to its write, or waited that long to start, is logged
//! (info, "slow reaction pass") with how long it waited (`waited_ms`) and each of its
//! requests: when it was sent (ms after the pass started), how long its answer took, and what
//! it was; the time in none of them is the reconcile's own work and waiting for the CPU.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A reacting pass at least this long is logged with its requests.
pub const SLOW: Duration = Duration::from_millis(250);

/// Requests of one pass kept for the slow-pass log (the rest are only counted).
const KEPT: usize = 32;

/// Per fleet (`ns/name`), when its earliest trigger not yet served by a started reconcile
/// reached the operator. Triggers that arrive while one is pending (kube-runtime runs one
/// reconcile for them all) keep the earliest time; a reconcile's start takes it.
#[derive(Debug, Default)]
pub struct Triggers(Mutex<Pending>);

#[derive(Debug, Default)]
struct Pending {
    since: HashMap<String, Instant>,
    swept: Option<Instant>,
}

/// A trigger pending this long is dropped: no reconcile will serve it (a Pod event of a
/// deleted fleet), so the map does not grow with every fleet ever deleted.
const FORGOTTEN: Duration = Duration::from_secs(3600);

impl Triggers {
    /// A watch event that triggers fleet `key`'s reconcile arrived now.
    pub fn arrived(&self, key: &str) {
        self.arrived_at(key, Instant::now());
    }

    fn arrived_at(&self, key: &str, now: Instant) {
        let Ok(mut p) = self.0.lock() else { return };
        // At most one sweep per `FORGOTTEN`: it drops what has waited longer than that.
        if p.swept
            .is_none_or(|at| now.saturating_duration_since(at) >= FORGOTTEN)
        {
            p.since
                .retain(|_, at| now.saturating_duration_since(*at) < FORGOTTEN);
            p.swept = Some(now);
        }
        if !p.since.contains_key(key) {
            p.since.insert(key.to_string(), now);
        }
    }

    /// Fleet `key`'s reconcile starts: how long its earliest pending trigger has waited
    /// (`None`: no trigger pending, e.g. a requeue).
    pub fn start(&self, key: &str) -> Option<Duration> {
        self.0.lock().ok()?.since.remove(key).map(|t| t.elapsed())
    }
}

struct Pass {
    started: Instant,
    /// Its fleet's earliest pending trigger → this reconcile's start.
    waited: Option<Duration>,
    requests: AtomicU32,
    /// `(sent at, took, verb resource)` of each answered request, in the order answered.
    log: Mutex<Vec<(Duration, Duration, String)>>,
}

tokio::task_local! {
    static PASS: Pass;
}

/// Runs reconcile `fut`, started now, `waited` after its earliest pending trigger
/// ([`Triggers::start`]).
pub async fn scope<F: std::future::Future>(waited: Option<Duration>, fut: F) -> F::Output {
    PASS.scope(
        Pass {
            started: Instant::now(),
            waited,
            requests: AtomicU32::new(0),
            log: Mutex::new(Vec::new()),
        },
        fut,
    )
    .await
}

/// The transport is sending one request on behalf of the running reconcile: counted, and
/// the time returned for [`answered`] (outside a reconcile's [`scope`], e.g. a watch or the
/// Event outbox's workers, nothing).
pub fn sent() -> Option<Instant> {
    PASS.try_with(|p| {
        p.requests.fetch_add(1, Ordering::Relaxed);
        Instant::now()
    })
    .ok()
}

/// The request [`sent`] at `at` was answered (or failed).
pub fn answered(at: Option<Instant>, what: &crate::transport::RequestInfo) {
    let Some(at) = at else { return };
    let _ = PASS.try_with(|p| {
        if let Ok(mut log) = p.log.lock() {
            if log.len() < KEPT {
                log.push((
                    at.saturating_duration_since(p.started),
                    at.elapsed(),
                    format!("{} {}", what.verb, what.resource),
                ));
            }
        }
    });
}

/// A guarded workload write was answered: observes the time since its reconcile started,
/// how long the reconcile waited to start, and the requests it sent so far, and logs a
/// [`SLOW`] pass (outside a reconcile's [`scope`], nothing).
pub fn wrote(metrics: &crate::metrics::Metrics, fleet: &str) {
    let _ = PASS.try_with(|p| {
        let elapsed = p.started.elapsed();
        let requests = p.requests.load(Ordering::Relaxed);
        metrics.reaction_pass.observe(elapsed.as_secs_f64());
        metrics.reaction_requests.observe(f64::from(requests));
        if let Some(waited) = p.waited {
            metrics.reaction_wait.observe(waited.as_secs_f64());
        }
        if elapsed >= SLOW || p.waited.is_some_and(|w| w >= SLOW) {
            let log = p.log.lock().map(|l| l.clone()).unwrap_or_default();
            tracing::info!(
                fleet,
                ms = elapsed.as_millis() as u64,
                waited_ms = p.waited.map(|w| w.as_millis() as u64),
                requests,
                outside_requests_ms = outside(&log, elapsed).as_millis() as u64,
                sent = %render(&log),
                "slow reaction pass"
            );
        }
    });
}

/// `+at ms took ms verb resource` of each request, in the order sent.
fn render(log: &[(Duration, Duration, String)]) -> String {
    let mut sorted = log.to_vec();
    sorted.sort_by_key(|(at, _, _)| *at);
    sorted
        .iter()
        .map(|(at, took, what)| format!("+{} {}ms {what}", at.as_millis(), took.as_millis()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Time of `elapsed` covered by no request of `log` (requests may overlap).
fn outside(log: &[(Duration, Duration, String)], elapsed: Duration) -> Duration {
    let mut spans: Vec<(Duration, Duration)> =
        log.iter().map(|(at, took, _)| (*at, *at + *took)).collect();
    spans.sort();
    let mut covered = Duration::ZERO;
    let mut end = Duration::ZERO;
    for (from, to) in spans {
        let from = from.max(end);
        if to > from {
            covered += to - from;
            end = to;
        }
    }
    elapsed.saturating_sub(covered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_write_inside_a_reconcile_is_timed_from_its_start() {
        let metrics = crate::metrics::Metrics::default();
        wrote(&metrics, "ns/f");
        assert_eq!(metrics.reaction_pass_count(), 0, "outside a reconcile");
        sent();
        scope(Some(Duration::from_millis(40)), async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            sent();
            sent();
            sent();
            wrote(&metrics, "ns/f")
        })
        .await;
        // A reconcile without a pending trigger (a requeue): its pass is timed, no wait.
        scope(None, async { wrote(&metrics, "ns/g") }).await;
        assert_eq!(metrics.reaction_pass_count(), 2);
        let text = metrics.encode();
        // The wait is observed once, as given: 40 ms, in the 64 ms bucket and not the 32.
        for (line, want) in [
            ("celld_operator_reaction_wait_seconds_count ", "1"),
            ("celld_operator_reaction_wait_seconds_sum ", "0.04"),
            (
                "celld_operator_reaction_wait_seconds_bucket{le=\"0.032\"} ",
                "0",
            ),
            (
                "celld_operator_reaction_wait_seconds_bucket{le=\"0.064\"} ",
                "1",
            ),
        ] {
            assert!(text.contains(&format!("{line}{want}\n")), "{line}: {text}");
        }
        // The 20 ms slept before the first write are counted (at least that long, so not in
        // the 16 ms bucket, which holds at most the second pass; no upper bound is asserted:
        // a loaded machine may take longer).
        let within_16ms: u64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("celld_operator_reaction_pass_seconds_bucket{le=\"0.016\"} ")
            })
            .and_then(|v| v.trim().parse().ok())
            .expect("the 16 ms bucket");
        assert!(within_16ms <= 1, "{text}");
        assert!(
            text.contains("celld_operator_reaction_pass_seconds_bucket{le=\"+Inf\"} 2"),
            "{text}"
        );
        // Three requests inside the first scope; the one sent outside it is not counted.
        assert!(
            text.contains("celld_operator_reaction_pass_requests_sum 3.0"),
            "{text}"
        );
    }

    #[test]
    fn a_reconcile_start_takes_its_fleets_earliest_pending_trigger() {
        let t = Triggers::default();
        assert_eq!(t.start("ns/f"), None, "nothing arrived");
        t.arrived("ns/f");
        std::thread::sleep(Duration::from_millis(30));
        // A later trigger of the same fleet, while the first is pending, keeps the first.
        t.arrived("ns/f");
        t.arrived("ns/g");
        let waited = t.start("ns/f").expect("pending");
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // Taken: the next reconcile of f waits only for triggers after this start.
        assert_eq!(t.start("ns/f"), None);
        assert!(
            t.start("ns/g").is_some_and(|w| w < waited),
            "g arrived later"
        );
    }

    #[test]
    fn a_trigger_no_reconcile_serves_is_dropped_after_an_hour() {
        let t = Triggers::default();
        let now = Instant::now();
        t.arrived_at("ns/deleted", now);
        t.arrived_at("ns/f", now + FORGOTTEN / 2);
        // Within the hour the sweep does not run again: all three are kept.
        t.arrived_at("ns/g", now + FORGOTTEN / 2);
        assert_eq!(t.0.lock().unwrap().since.len(), 3);
        // An hour after the last sweep, what has waited an hour is dropped, the rest kept.
        t.arrived_at("ns/h", now + FORGOTTEN);
        let mut kept: Vec<String> = t.0.lock().unwrap().since.keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["ns/f", "ns/g", "ns/h"]);
    }

    #[test]
    fn time_outside_requests_counts_overlapping_requests_once() {
        let ms = Duration::from_millis;
        let log = vec![
            (ms(10), ms(20), "patch celldfleets".to_string()),
            // Two reads sent together, overlapping.
            (ms(40), ms(30), "get statefulsets".to_string()),
            (ms(45), ms(10), "get pods".to_string()),
            (ms(90), ms(10), "update statefulsets".to_string()),
        ];
        // Covered: 10–30, 40–70, 90–100 = 60 ms of 100.
        assert_eq!(outside(&log, ms(100)), ms(40));
        assert_eq!(outside(&[], ms(100)), ms(100));
        assert_eq!(
            render(&log[..2]),
            "+10 20ms patch celldfleets, +40 30ms get statefulsets"
        );
    }
}
