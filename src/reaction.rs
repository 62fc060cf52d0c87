//! How long the reconcile that carries out a workload write takes to send it
//! (`celld_operator_reaction_pass_seconds`, docs/operations.md "Metrics"): from the start of
//! the reconcile to the guarded write's answer, i.e. the reconcile's requests before the write
//! (the prerequisite reads, the journal appends and their Events, the guard's fresh reads) and
//! the write itself. The benchmark times reactions from outside (a member settled → the next
//! write); this is the part of that time spent in the reconcile that wrote, as opposed to
//! waiting for the watch event and a reconcile slot.

use std::time::Instant;

tokio::task_local! {
    static STARTED: Instant;
}

/// Runs reconcile `fut`, started now.
pub async fn scope<F: std::future::Future>(fut: F) -> F::Output {
    STARTED.scope(Instant::now(), fut).await
}

/// A guarded workload write was answered: observes the time since its reconcile started
/// (outside a reconcile's [`scope`], nothing).
pub fn wrote(metrics: &crate::metrics::Metrics) {
    if let Ok(started) = STARTED.try_with(|s| *s) {
        metrics
            .reaction_pass
            .observe(started.elapsed().as_secs_f64());
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
        scope(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
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
    }
}
