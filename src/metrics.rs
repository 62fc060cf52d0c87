//! Prometheus metrics (docs/design.md "Events and metrics") on `--metrics-bind-address`.

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

/// `verb`, `resource`: one API request of the operator's client.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// Resource (with subresource), e.g. `statefulsets`, `celldfleets/status`.
    pub resource: String,
}

/// `reason`, `outcome`: one completed member replacement.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplacementLabels {
    /// `DiskLost`, `ClaimDeleted`, `LongDown`, `Administrative`, `AdoptedHold`.
    pub reason: String,
    /// `Succeeded`, `ClaimKept`, `MemberChanged`.
    pub outcome: String,
}

/// `pass`: `cached` or `fresh`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    /// `cached`: ended from the caches with zero requests; `fresh`: ran from fresh reads.
    pub pass: String,
}

/// `cause`: why a cached pass escalated.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    /// The first request it was asked to make (`verb resource`), or another reason.
    pub cause: String,
}

/// `verb`: one answered API request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `get`, `list`, `create`, `update`, `patch`, `delete` (watches are not timed).
    pub verb: String,
}

type VerbHistogram = Family<VerbLabels, Histogram, fn() -> Histogram>;

fn request_histogram() -> Histogram {
    // 1 ms … 8.2 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
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
    /// Operations canceled before issue because the world moved under them
    /// (`PredecessorChanged`); their re-planning is paced.
    pub canceled_replans: Family<FleetLabels, Counter<u64, AtomicU64>>,
    /// Open operations.
    pub open_operations: FleetGauge,
    /// Stalled operations.
    pub stalled_operations: FleetGauge,
    /// Encoded journal size.
    pub journal_bytes: FleetGauge,
    /// This replica's journal mirror on disk, bytes (set when it opens and after each append).
    pub journal_mirror_disk_bytes: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Failed reconciles by category.
    pub reconcile_errors: Family<ReasonLabels, Counter<u64, AtomicU64>>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
    /// A reconcile's start → its guarded workload write answered (`crate::reaction`).
    pub reaction_pass: Histogram,
    /// The fleet's earliest pending trigger → the start of the reconcile that wrote
    /// (`crate::reaction`).
    pub reaction_wait: Histogram,
    /// Requests the reconcile sent up to and including its guarded workload write.
    pub reaction_requests: Histogram,
    /// Events queued and not yet sent (`crate::events`).
    pub events_pending: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// An Event queued → its request answered (`crate::events`).
    pub event_delay: Histogram,
    /// Requests sent to the API server by verb and resource.
    pub api_requests: Family<RequestLabels, Counter<u64, AtomicU64>>,
    /// Time from sending a request to its answer's headers, by verb (watches excluded).
    pub api_request_seconds: VerbHistogram,
    /// Completed member replacements by reason and outcome.
    pub replacements: Family<ReplacementLabels, Counter<u64, AtomicU64>>,
    /// Members deleted with grace 0 after their node failed to confirm termination.
    pub force_deletes: Family<FleetLabels, Counter<u64, AtomicU64>>,
    /// Reconciles by the pass that decided them.
    pub passes: Family<PassLabels, Counter<u64, AtomicU64>>,
    /// Planning reads of fresh passes answered from the pass's own earlier reads.
    pub pass_reads_reused: Counter<u64, AtomicU64>,
    /// Progress-only status changes left for the end of the fleet's pace interval.
    pub status_deferred: Counter<u64, AtomicU64>,
    /// Cached passes that handed over to a fresh pass, by cause.
    pub escalations: Family<CauseLabels, Counter<u64, AtomicU64>>,
    /// Distinct fleets reconciled by this process.
    pub fleets_reconciled: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Process start → leader ready (journals replayed, caches listed), seconds.
    pub leader_ready_seconds: Gauge<f64, AtomicU64>,
    /// Objects in the watch-fed caches.
    pub cached_objects: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Bytes the namespaces' compact stores hold (compressed JSON).
    pub cached_bytes: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Namespaces whose watches are open.
    pub watched_namespaces: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// HTTP/2 connections carrying namespace watches.
    pub watch_connections: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Records one answered request of `verb` that took `took`.
    pub fn api_request_duration(&self, verb: &str, took: std::time::Duration) {
        self.api_request_seconds
            .get_or_create(&VerbLabels { verb: verb.into() })
            .observe(took.as_secs_f64());
    }

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
            canceled_replans: Family::default(),
            open_operations: Family::default(),
            stalled_operations: Family::default(),
            journal_bytes: Family::default(),
            journal_mirror_disk_bytes: Gauge::default(),
            leader: Gauge::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            // 1 ms … 16 s.
            reaction_pass: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 1 ms … 16 s.
            reaction_wait: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 1 … 16 requests.
            reaction_requests: Histogram::new(
                prometheus_client::metrics::histogram::linear_buckets(1.0, 1.0, 16),
            ),
            events_pending: Gauge::default(),
            // 1 ms … 16 s.
            event_delay: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            api_requests: Family::default(),
            api_request_seconds: Family::new_with_constructor(request_histogram),
            replacements: Family::default(),
            force_deletes: Family::default(),
            passes: Family::default(),
            pass_reads_reused: Counter::default(),
            status_deferred: Counter::default(),
            escalations: Family::default(),
            fleets_reconciled: Gauge::default(),
            leader_ready_seconds: Gauge::default(),
            cached_objects: Gauge::default(),
            cached_bytes: Gauge::default(),
            watched_namespaces: Gauge::default(),
            watch_connections: Gauge::default(),
        };
        for pass in ["cached", "planned", "fresh"] {
            drop(m.passes.get_or_create(&PassLabels {
                pass: pass.to_string(),
            }));
        }
        // Every error category starts at 0, so a rate over it is a series (0) from the first
        // scrape, not an absent one (dashboards and alerts see "no errors", not "no data").
        for reason in crate::reconcile::ERROR_CATEGORIES {
            drop(m.reconcile_errors.get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            }));
        }
        r.register(
            "celld_operator_member_replacements",
            "completed member replacements by reason and outcome",
            m.replacements.clone(),
        );
        r.register(
            "celld_operator_member_force_deletes",
            "members deleted with grace 0 after their node failed to confirm termination",
            m.force_deletes.clone(),
        );
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
            "celld_journal_canceled_replans",
            "operations canceled before issue because the workload changed under them (re-planning is paced)",
            m.canceled_replans.clone(),
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
            "celld_journal_mirror_disk_bytes",
            "size on disk of this replica's local journal mirror (grows with the history held, up to --journal-retention entries per fleet)",
            m.journal_mirror_disk_bytes.clone(),
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
        r.register(
            "celld_operator_reaction_pass_seconds",
            "start of the reconcile that carried out a guarded workload write → that write answered (its prerequisite reads, journal appends, Events, guard reads and the write), seconds",
            m.reaction_pass.clone(),
        );
        r.register(
            "celld_operator_reaction_wait_seconds",
            "the reconcile that carried out a guarded workload write: its fleet's earliest watch event (fleet, workload, Pod, claim) not yet served by a started reconcile → that reconcile's start (a reconcile slot, the fleet's previous reconcile), seconds; reconciles started by a requeue alone are not observed",
            m.reaction_wait.clone(),
        );
        r.register(
            "celld_operator_reaction_pass_requests",
            "API requests the reconcile that carried out a guarded workload write sent up to and including that write",
            m.reaction_requests.clone(),
        );
        r.register(
            "celld_operator_events_pending",
            "Events queued and not yet sent (journal entries are committed before their Event is queued)",
            m.events_pending.clone(),
        );
        r.register(
            "celld_operator_event_delay_seconds",
            "an Event queued by a reconcile → its request answered, seconds",
            m.event_delay.clone(),
        );
        r.register(
            "celld_operator_api_requests",
            "requests sent to the API server, by verb and resource",
            m.api_requests.clone(),
        );
        r.register(
            "celld_operator_api_request_duration_seconds",
            "time from sending a request to the API server to its answer's headers, by verb (watches excluded; a retried read counts each attempt)",
            m.api_request_seconds.clone(),
        );
        r.register(
            "celld_operator_reconcile_passes",
            "reconciles by the pass that decided them: cached (zero requests), status (a cached pass that sent only the status), fresh (read from the API server) or stale (the cached fleet is older than this process's own write to it; left to that write's watch event, zero requests)",
            m.passes.clone(),
        );
        r.register(
            "celld_operator_pass_reads_reused",
            "planning reads of fresh passes answered from the same pass's earlier read (no write of the pass in between) instead of a request",
            m.pass_reads_reused.clone(),
        );
        r.register(
            "celld_operator_status_writes_deferred",
            "progress-only status changes (member counts, condition messages) left for the end of the fleet's --status-progress-interval",
            m.status_deferred.clone(),
        );
        r.register(
            "celld_operator_cache_escalations",
            "cached passes handed over to a fresh pass, by the first request they needed",
            m.escalations.clone(),
        );
        r.register(
            "celld_operator_fleets_reconciled",
            "distinct fleets this process has reconciled",
            m.fleets_reconciled.clone(),
        );
        r.register(
            "celld_operator_leader_ready_seconds",
            "seconds from process start until the leader was ready (journals replayed, caches listed)",
            m.leader_ready_seconds.clone(),
        );
        r.register(
            "celld_operator_cached_objects",
            "objects held in the watch-fed caches",
            m.cached_objects.clone(),
        );
        r.register(
            "celld_operator_cached_bytes",
            "bytes held by the namespaces' compact stores (LZ4-compressed JSON of labelled objects)",
            m.cached_bytes.clone(),
        );
        r.register(
            "celld_operator_watched_namespaces",
            "namespaces whose watches are open (9 watches each)",
            m.watched_namespaces.clone(),
        );
        r.register(
            "celld_operator_watch_connections",
            "HTTP/2 connections carrying the namespace watches (0: one HTTP/1.1 connection per watch)",
            m.watch_connections.clone(),
        );
        *m.registry.lock().expect("fresh lock") = r;
        m
    }

    /// Counts a cached pass that escalated.
    pub fn escalated(&self, cause: &str) {
        self.escalations
            .get_or_create(&CauseLabels {
                cause: cause.to_string(),
            })
            .inc();
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
        self.canceled_replans.remove(l);
        self.force_deletes.remove(l);
    }

    /// Observations of `celld_operator_reaction_pass_seconds`.
    #[cfg(test)]
    pub fn reaction_pass_count(&self) -> u64 {
        self.encode()
            .lines()
            .find_map(|l| l.strip_prefix("celld_operator_reaction_pass_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
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

/// Classifies an API request: `(verb, resource)` from its method, path and query.
///
/// `/api/v1/namespaces/ns/pods/p` → `("get", "pods")`;
/// `/apis/apps/v1/namespaces/ns/statefulsets?watch=true` → `("watch", "statefulsets")`;
/// `/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status` (PATCH) →
/// `("patch", "celldfleets/status")`.
pub fn classify(method: &str, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // Skip `api/v1` or `apis/<group>/<version>`.
    let rest: &[&str] = match segs.first() {
        Some(&"api") => segs.get(2..).unwrap_or(&[]),
        Some(&"apis") => segs.get(3..).unwrap_or(&[]),
        _ => &[],
    };
    let rest = match rest {
        // A namespaced resource; `namespaces/<ns>` alone is the namespace object.
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let named = rest.len() >= 2;
    let resource = match rest {
        [] => "other".to_string(),
        [r] | [r, _] => (*r).to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match method {
        "GET" if watch => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "other",
    };
    (verb, resource)
}

/// A tower layer for the kube client that counts every request in
/// `celld_operator_api_requests_total` (also the figure `make bench` reports as "API requests
/// per fleet at rest").
pub fn request_counter<B>(
    metrics: std::sync::Arc<Metrics>,
) -> tower::util::MapRequestLayer<impl Fn(http::Request<B>) -> http::Request<B> + Clone> {
    tower::util::MapRequestLayer::new(move |req: http::Request<B>| {
        let (verb, resource) = classify(req.method().as_str(), req.uri().path(), req.uri().query());
        metrics
            .api_requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource,
            })
            .inc();
        req
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_verb_and_resource() {
        let cases = [
            ("GET", "/api/v1/namespaces/ns/pods/p", None, ("get", "pods")),
            (
                "GET",
                "/api/v1/namespaces/ns/pods",
                Some("labelSelector=x"),
                ("list", "pods"),
            ),
            (
                "GET",
                "/apis/apps/v1/namespaces/ns/statefulsets",
                Some("watch=true&resourceVersion=5"),
                ("watch", "statefulsets"),
            ),
            (
                "PATCH",
                "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
                None,
                ("patch", "celldfleets/status"),
            ),
            (
                "GET",
                "/apis/celld.eric.dev/v1alpha1/celldfleets",
                None,
                ("list", "celldfleets"),
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/celld-system/leases/celld-operator",
                None,
                ("update", "leases"),
            ),
            ("GET", "/api/v1/namespaces/ns", None, ("get", "namespaces")),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                None,
                ("create", "events"),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/ns/persistentvolumeclaims/data-f-2",
                None,
                ("delete", "persistentvolumeclaims"),
            ),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                classify(method, path, query),
                (verb, resource.to_string()),
                "{method} {path}"
            );
        }
    }

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
