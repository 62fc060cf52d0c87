//! How long the reconcile that carries out a workload write takes to send it
//! (`celld_operator_reaction_pass_seconds`, docs/operations.md "Metrics"): from the start of
//! the reconcile to the guarded write's answer, i.e. the reconcile's requests before the write
//! (the prerequisite reads, the journal appends, the guard's fresh reads) and the write itself;
//! and how many requests that was (`celld_operator_reaction_pass_requests`, the write
//! included). The benchmark times reactions from outside (a member settled → the next
//! write); this is the part of that time spent in the reconcile that wrote, as opposed to
//! waiting for the watch event and a reconcile slot.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

struct Pass {
    started: Instant,
    requests: AtomicU32,
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
        },
        fut,
    )
    .await
}

/// The transport is sending one request on behalf of the running reconcile (outside a
/// reconcile's [`scope`], e.g. a watch or the Event outbox's workers, nothing).
pub fn sent() {
    let _ = PASS.try_with(|p| p.requests.fetch_add(1, Ordering::Relaxed));
}

/// A guarded workload write was answered: observes the time since its reconcile started
/// and the requests it sent so far (outside a reconcile's [`scope`], nothing).
pub fn wrote(metrics: &crate::metrics::Metrics) {
    if let Ok((elapsed, requests)) =
        PASS.try_with(|p| (p.started.elapsed(), p.requests.load(Ordering::Relaxed)))
    {
        metrics.reaction_pass.observe(elapsed.as_secs_f64());
        metrics.reaction_requests.observe(f64::from(requests));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_write_inside_a_reconcile_is_timed_from_its_start() {
        let metrics = crate::metrics::Metrics::default();
        wrote(&metrics);
        assert_eq!(metrics.reaction_pass_count(), 0, "outside a reconcile");
        sent();
        scope(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            sent();
            sent();
            sent();
            wrote(&metrics)
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
}
