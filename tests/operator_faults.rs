//! Faults other than a kill at a named failpoint (issue 14): a leader frozen past its Lease
//! while its write is decided, and API faults injected into a chosen request
//! (`--test-api-fault`, src/transport.rs).
//!
//! The stale-leader drill is the exact hole the issue names: leader A appends a contraction's
//! Intent (4 → 3), reads the workload, passes its Lease check and is frozen (SIGSTOP at the
//! `before-effect` failpoint); the fleet is paused; standby B takes the Lease and cancels the
//! Intent; A wakes up with its write decided on the old read. Required: no write by A is
//! accepted after B's first write, the workload keeps its replicas, the journal verifies. It
//! runs twice: with the transport's Lease guard (A's write is never sent) and without it
//! (`--test-skip-lease-guard`: A's write is sent, and the API server refuses it because B
//! fenced the workload before canceling).

mod e2e_common;

use celld_harness::operator::OperatorProcess;
use celld_operator::api::CelldFleet;
use e2e_common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::time::{Duration, Instant};

/// Waits until the Lease `ns/name` is held by `identity`.
async fn lease_held_by(client: &kube::Client, ns: &str, name: &str, identity: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holder = leases
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some(identity) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{identity} did not take the Lease {ns}/{name} (holder {holder:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stale_leader_drill(tag: &str, skip_guard: bool) {
    let (c, client, ns) = setup(tag).await;
    let admin = c.admin_kubeconfig.clone();
    let operator_ns = format!("celld-e2e-{tag}");
    let _ = c.kubectl(&["create", "namespace", &operator_ns]);
    let api: Api<CelldFleet> = Api::namespaced(client.clone(), &ns.name);
    let replica = |identity: &str, fault: Option<&str>, extra: &[&str]| {
        let mut opts = Operator::options(fault, &admin, &operator_ns, identity);
        opts.metrics_addr = None;
        opts.extra_args.extend(extra.iter().map(|s| s.to_string()));
        OperatorProcess::start(&opts)
    };
    {
        let mut settle = replica(&format!("{tag}-s"), None, &[]);
        create_ready(&api, &fleet("sl", "Bucket", 4, &unique_bucket("sl")), 4).await;
        assert_eq!(settle.terminate(Duration::from_secs(30)).await, 0);
    }
    let workloads = |events: &[AuditEvent]| -> Vec<String> {
        events
            .iter()
            .filter(|e| matches!(e.resource.as_str(), "deployments" | "statefulsets"))
            .filter(|e| e.name.as_deref() == Some("sl") && e.is_write())
            .filter(|e| e.namespace.as_deref() == Some(ns.name.as_str()))
            .map(|e| format!("{} {} {:?} by {}", e.verb, e.resource, e.code, e.user_agent))
            .collect()
    };
    let guard: &[&str] = if skip_guard {
        &["--test-skip-lease-guard"]
    } else {
        &[]
    };
    // Identities of this drill's own (drills run side by side; the audit log is shared).
    let (id_a, id_b) = (format!("{tag}-a"), format!("{tag}-b"));
    let (by_a, by_b) = (format!("({id_a})"), format!("({id_b})"));
    let a = replica(&id_a, Some("before-effect:1:stop"), guard);
    lease_held_by(&client, &operator_ns, &lease_name(), &id_a).await;
    let audit = audit_from_now();
    c.kubectl(&["-n", &ns.name, "scale", "celldfleet/sl", "--replicas=3"])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a.is_stopped() {
        assert!(
            Instant::now() < deadline,
            "replica-a never stopped at before-effect; log: {}",
            a.log().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // While A is frozen, after its Lease check: the fleet is paused.
    api.patch(
        "sl",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"paused": true}}})),
    )
    .await
    .unwrap();
    let _b = replica(&id_b, None, &[]);
    let outcome = until("B to cancel the Scale", 90, &api, "sl", || async {
        let s = api.get("sl").await.ok()?.status?;
        s.recent_operations
            .first()
            .filter(|o| format!("{:?}", o.kind) == "Scale")
            .map(|o| o.outcome.clone())
    })
    .await;
    assert_eq!(outcome, "CanceledBeforeIssue");
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        Api::namespaced(client.clone(), &ns.name)
            .get("sl")
            .await
            .unwrap();
    let fence = deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("celld.eric.dev/fence").cloned())
        .unwrap_or_default();
    assert!(
        fence.ends_with("/fenced"),
        "B fenced the workload before canceling: {fence:?}"
    );
    // A wakes up with its write decided on the read before the fence.
    a.signal("CONT");
    let mut a = a;
    let code = a.exited(Duration::from_secs(60)).await;
    assert_ne!(
        code, 0,
        "the deposed leader exits once it sees the Lease lost"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit.events().unwrap();
    let takeover = events
        .iter()
        .position(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_b))
        .expect("B wrote after taking over");
    let late: Vec<String> = events[takeover..]
        .iter()
        .filter(|e| e.succeeded() && e.is_write() && e.user_agent.contains(&by_a))
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect();
    assert!(
        late.is_empty(),
        "writes by the deposed leader were accepted after the takeover: {late:?}"
    );
    let by_a: Vec<String> = workloads(&events[takeover..])
        .into_iter()
        .filter(|w| w.contains(&by_a))
        .collect();
    let log = std::fs::read_to_string(a.log()).unwrap_or_default();
    if skip_guard {
        // The write went out and the fence refused it.
        assert!(
            by_a.iter()
                .any(|w| w.starts_with("update") && w.contains("Some(409)")),
            "A's decided write was sent and refused with 409: {by_a:?}\n{}",
            workloads(&events).join("\n")
        );
    } else {
        assert!(by_a.is_empty(), "A sent no workload write: {by_a:?}");
        assert!(
            log.contains("not sent"),
            "A's transport refused to send: {}",
            a.log().display()
        );
    }
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        Api::namespaced(client.clone(), &ns.name)
            .get("sl")
            .await
            .unwrap();
    assert_eq!(
        deployment.spec.and_then(|s| s.replicas),
        Some(4),
        "no contraction on the paused fleet"
    );
    api.patch(
        "sl",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maintenance": {"paused": false}}})),
    )
    .await
    .unwrap();
    cleanup(&client, ns).await;
}

#[tokio::test]
async fn a_frozen_leader_issues_nothing_after_the_takeover() {
    let _guard = isolated().await;
    stale_leader_drill("stale", false).await;
}

#[tokio::test]
async fn a_frozen_leaders_write_is_refused_by_the_fence() {
    let _guard = isolated().await;
    stale_leader_drill("fence", true).await;
}
