//! How long the reconcile that carries out a workload write takes to send it
//! (`celld_operator_reaction_pass_seconds`, docs/operations.md "Metrics"): from the start of
//! the reconcile to the guarded write's answer, i.e. the reconcile's requests before the write
//! (the prerequisite reads, the journal appends, the guard's fresh reads) and the write itself;
//! and how many requests that was (`celld_operator_reaction_pass_requests`, the write
//! included). The benchmark times reactions from outside (a member settled → the next
//! write); this is the part of that time spent in the reconcile that wrote, as opposed to
//! waiting for the watch event and a reconcile slot.
//!
//! A pass that took [`SLOW`] or longer to its write is logged (info, "slow reaction pass")
//! with each of its requests: when it was sent (ms after the pass started), how long its
//! answer took, and what it was; the time in none of them is the reconcile's own work and
//! waiting for the CPU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A reacting pass at least this long is logged with its requests.
pub const SLOW: Duration = Duration::from_millis(250);

/// Requests of one pass kept for the slow-pass log (the rest are only counted).
const KEPT: usize = 32;

struct Pass {
    started: Instant,
    requests: AtomicU32,
    /// `(sent at, took, verb resource)` of each answered request, in the order answered.
    log: Mutex<Vec<(Duration, Duration, String)>>,
}

tokio::task_local! {
    static PASS: Pass;
}

/// Runs reconcile `fut`, started now.
pub async fn scope<F: std::future::Future>(fut: F) -> F::Output {
    PASS.scope(
        Pass {
            started: Instant::now(),
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

/// A guarded workload write was answered: observes the time since its reconcile started
/// and the requests it sent so far, and logs a [`SLOW`] pass (outside a reconcile's
/// [`scope`], nothing).
pub fn wrote(metrics: &crate::metrics::Metrics, fleet: &str) {
    let _ = PASS.try_with(|p| {
        let elapsed = p.started.elapsed();
        let requests = p.requests.load(Ordering::Relaxed);
        metrics.reaction_pass.observe(elapsed.as_secs_f64());
        metrics.reaction_requests.observe(f64::from(requests));
        if elapsed >= SLOW {
            let log = p.log.lock().map(|l| l.clone()).unwrap_or_default();
            tracing::info!(
                fleet,
                ms = elapsed.as_millis() as u64,
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
        scope(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            sent();
            sent();
            sent();
            wrote(&metrics, "ns/f")
        })
        .await;
        assert_eq!(metrics.reaction_pass_count(), 1);
        let text = metrics.encode();
        // The 20 ms slept before the write are counted (at least that long, so not in the
        // 16 ms bucket; no upper bound is asserted: a loaded machine may take longer).
        assert!(
            text.contains("celld_operator_reaction_pass_seconds_bucket{le=\"0.016\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("celld_operator_reaction_pass_seconds_bucket{le=\"+Inf\"} 1"),
            "{text}"
        );
        // Three requests inside the scope; the one sent outside it is not counted.
        assert!(
            text.contains("celld_operator_reaction_pass_requests_sum 3.0"),
            "{text}"
        );
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
