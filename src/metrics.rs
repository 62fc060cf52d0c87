//! Prometheus metrics (behavior.md §15) on `--metrics-bind-address`.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `namespace`, `fleet`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetLabels {
    /// Fleet namespace.
    pub namespace: String,
    /// Fleet name.
    pub fleet: String,
}

/// `namespace`, `fleet`, `type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EntryLabels {
    /// Fleet namespace.
    pub namespace: String,
    /// Fleet name.
    pub fleet: String,
    /// Entry type.
    pub r#type: String,
}

/// `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Error category.
    pub reason: String,
}

type FleetGauge = Family<FleetLabels, Gauge<i64, std::sync::atomic::AtomicI64>>;

/// Every metric the operator exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// `celld_fleet_desired_replicas` … one gauge family per fleet figure.
    pub desired: FleetGauge,
    /// Applied replicas.
    pub applied: FleetGauge,
    /// Observed replicas.
    pub observed: FleetGauge,
    /// Ready replicas.
    pub ready: FleetGauge,
    /// Joining replicas.
    pub joining: FleetGauge,
    /// Terminating replicas.
    pub terminating: FleetGauge,
    /// Replica observation valid (0/1).
    pub observation_valid: FleetGauge,
    /// Blocked (0/1).
    pub blocked: FleetGauge,
    /// Seconds since Blocked turned True.
    pub blocked_age: FleetGauge,
    /// Journal appends by entry type.
    pub appends: Family<EntryLabels, Counter<u64, AtomicU64>>,
    /// Open operations resumed after a restart or leader change.
    pub replays: Family<FleetLabels, Counter<u64, AtomicU64>>,
    /// Open operations.
    pub open_operations: FleetGauge,
    /// Stalled operations.
    pub stalled_operations: FleetGauge,
    /// Encoded journal size.
    pub journal_bytes: FleetGauge,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Failed reconciles by category.
    pub reconcile_errors: Family<ReasonLabels, Counter<u64, AtomicU64>>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            desired: Family::default(),
            applied: Family::default(),
            observed: Family::default(),
            ready: Family::default(),
            joining: Family::default(),
            terminating: Family::default(),
            observation_valid: Family::default(),
            blocked: Family::default(),
            blocked_age: Family::default(),
            appends: Family::default(),
            replays: Family::default(),
            open_operations: Family::default(),
            stalled_operations: Family::default(),
            journal_bytes: Family::default(),
            leader: Gauge::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
        };
        r.register(
            "celld_fleet_desired_replicas",
            "spec.replicas",
            m.desired.clone(),
        );
        r.register(
            "celld_fleet_applied_replicas",
            "spec.replicas of the owned workload",
            m.applied.clone(),
        );
        r.register(
            "celld_fleet_observed_replicas",
            "Pods with the fleet label",
            m.observed.clone(),
        );
        r.register(
            "celld_fleet_ready_replicas",
            "ready members",
            m.ready.clone(),
        );
        r.register(
            "celld_fleet_joining_replicas",
            "members not yet Ready",
            m.joining.clone(),
        );
        r.register(
            "celld_fleet_terminating_replicas",
            "terminating members",
            m.terminating.clone(),
        );
        r.register(
            "celld_fleet_replica_observation_valid",
            "the Pod inventory is complete",
            m.observation_valid.clone(),
        );
        r.register("celld_fleet_blocked", "Blocked=True", m.blocked.clone());
        r.register(
            "celld_fleet_blocked_age_seconds",
            "seconds since Blocked turned True",
            m.blocked_age.clone(),
        );
        r.register(
            "celld_journal_appends",
            "journal entries appended",
            m.appends.clone(),
        );
        r.register(
            "celld_journal_replays",
            "open operations resumed after a restart or leader change",
            m.replays.clone(),
        );
        r.register(
            "celld_journal_open_operations",
            "open operations",
            m.open_operations.clone(),
        );
        r.register(
            "celld_journal_stalled_operations",
            "operations past their deadline after issue",
            m.stalled_operations.clone(),
        );
        r.register(
            "celld_journal_bytes",
            "encoded size of the journal annotation",
            m.journal_bytes.clone(),
        );
        r.register(
            "celld_operator_leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        r.register(
            "celld_operator_reconcile_errors",
            "failed reconciles by category",
            m.reconcile_errors.clone(),
        );
        r.register(
            "celld_operator_reconcile_duration_seconds",
            "reconcile duration",
            m.reconcile_duration.clone(),
        );
        *m.registry.lock().expect("fresh lock") = r;
        m
    }

    /// Removes every series of a deleted fleet.
    pub fn forget_fleet(&self, l: &FleetLabels) {
        for g in [
            &self.desired,
            &self.applied,
            &self.observed,
            &self.ready,
            &self.joining,
            &self.terminating,
            &self.observation_valid,
            &self.blocked,
            &self.blocked_age,
            &self.open_operations,
            &self.stalled_operations,
            &self.journal_bytes,
        ] {
            g.remove(l);
        }
        self.replays.remove(l);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_series_are_exported_and_forgotten_with_the_fleet() {
        let m = Metrics::new();
        let l = FleetLabels {
            namespace: "fleets".into(),
            fleet: "beta".into(),
        };
        m.desired.get_or_create(&l).set(3);
        m.appends
            .get_or_create(&EntryLabels {
                namespace: "fleets".into(),
                fleet: "beta".into(),
                r#type: "Intent".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains(r#"celld_fleet_desired_replicas{namespace="fleets",fleet="beta"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"celld_journal_appends_total{namespace="fleets",fleet="beta",type="Intent"} 1"#
            ),
            "{text}"
        );
        m.forget_fleet(&l);
        assert!(!m
            .encode()
            .contains(r#"celld_fleet_desired_replicas{namespace="fleets""#));
    }
}
