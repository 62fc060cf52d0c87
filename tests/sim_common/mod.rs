//! Helpers shared by the suites that run the operator with simulator members
//! (`operator_sim`, `operator_strict`): each test gets its own namespace, operator installation
//! (its own Lease namespace, scoped with --watch-namespaces) and bucket.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use celld_harness::operator::OperatorOptions;
use celld_harness::TestNamespace;
use celld_operator::api::CelldFleet;
use celld_testbed::{TestBed, RUNTIME_IMAGE, STORAGE_CLASS};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Polls `check` every 500 ms until it holds, or fails naming `what` and the operator log.
pub async fn poll_until<F, Fut>(what: &str, secs: u64, log: &std::path::Path, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; operator log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn wait_settled(api: &Api<CelldFleet>, name: &str, n: i32, log: &std::path::Path) {
    poll_until(
        &format!("{name} to settle at {n} ready members"),
        180,
        log,
        || async {
            let status = api.get(name).await.ok().and_then(|f| f.status);
            status.is_some_and(|s| {
                s.current_operation.is_none()
                    && s.ready_replicas == Some(n)
                    && s.applied_replicas == Some(n)
            })
        },
    )
    .await
}

/// UIDs of the fleet's claims, by name.
pub async fn claim_uids(client: &Client, ns: &str) -> std::collections::BTreeMap<String, String> {
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| (c.name_any(), c.uid().unwrap_or_default()))
        .collect()
}

pub async fn member_urls(bed: &TestBed, client: &Client, ns: &str, n: i32) -> Vec<String> {
    fleet_member_urls(bed, client, ns, "beta", n).await
}

pub async fn fleet_member_urls(
    bed: &TestBed,
    client: &Client,
    ns: &str,
    fleet: &str,
    n: i32,
) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{fleet}-{i}")).collect();
    bed.member_urls(client, ns, &names)
        .await
        .expect("member URLs")
}

/// The operator's Lease namespace of test `tag`: one per test bed slot, so test processes
/// running side by side never share a Lease.
pub fn lease_namespace(bed: &TestBed, tag: &str) -> String {
    format!("celld-{tag}-s{}", bed.slot)
}

/// A test namespace with the fleets' ServiceAccount `celld`, and the operator's Lease
/// namespace ([`lease_namespace`]).
pub async fn fleet_namespace(bed: &TestBed, client: &Client, tag: &str) -> TestNamespace {
    let ns = bed.namespace(client, tag).await.unwrap();
    let _ = bed
        .cluster
        .kubectl(&["create", "namespace", &lease_namespace(bed, tag)]);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "celld"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    ns
}

/// The operator of test `tag`: Lease in [`lease_namespace`], its own identity, log and mirror.
pub fn operator_options(
    bed: &TestBed,
    tag: &str,
    ns: &str,
    fault_point: Option<&str>,
) -> OperatorOptions {
    OperatorOptions {
        binary: env!("CARGO_BIN_EXE_celld-operator").into(),
        kubeconfig: bed.kubeconfig().into(),
        operator_namespace: lease_namespace(bed, tag),
        identity: format!("celld-operator-{tag}"),
        work_dir: bed
            .cluster
            .work_dir
            .join(format!("operator-{tag}-{}", std::process::id())),
        fault_point: fault_point.map(str::to_string),
        // Scoped to the test's namespace: the suite's tests run side by side.
        extra_args: vec![format!("--watch-namespaces={ns}")],
        ..Default::default()
    }
}

/// A PersistentFleet of simulator members with `placement`.
pub fn sim_fleet(
    name: &str,
    replicas: i32,
    bucket: &str,
    placement: serde_json::Value,
) -> CelldFleet {
    serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {"profile": "PersistentFleet", "runtimeImage": RUNTIME_IMAGE, "replicas": replicas,
                 "serviceAccountName": "celld",
                 "storage": {"bucket": bucket, "region": "us-east-1", "storageClassName": STORAGE_CLASS, "sizeGiB": 1},
                 "placement": placement,
                 "lifecycle": {"shutdownSeconds": 10, "terminationGraceSeconds": 15},
                 "env": [{"name": "CELLD_READY_FLEET_GATE_MS", "value": "2000"}]}
    }))
    .unwrap()
}

/// The operation that wrote effect `marker` (`<op>/<effect>`) is among the fleet's recent
/// operations, with outcome `Succeeded`, and nothing is open.
pub async fn finished(api: &Api<CelldFleet>, name: &str, marker: &str) -> bool {
    let op = marker.split('/').next().unwrap_or_default();
    let Some(s) = api.get(name).await.ok().and_then(|f| f.status) else {
        return false;
    };
    s.current_operation.is_none()
        && s.recent_operations
            .iter()
            .any(|o| o.id == op && o.outcome == "Succeeded")
}

/// Polls until the fleet's `lastRestartToken` is `token` with nothing open.
pub async fn wait_token_applied(
    api: &Api<CelldFleet>,
    name: &str,
    token: &str,
    secs: u64,
    log: &std::path::Path,
) {
    poll_until(
        &format!("{name} to apply token {token}"),
        secs,
        log,
        || async {
            api.get(name)
                .await
                .ok()
                .and_then(|f| f.status)
                .is_some_and(|s| {
                    s.last_restart_token.as_deref() == Some(token) && s.current_operation.is_none()
                })
        },
    )
    .await
}

/// Accepted deletes of `resource` in `ns` since `audit` was marked, by the operator only (its
/// User-Agent) or by anyone: (name, precondition UID, precondition resourceVersion).
pub fn audited_deletes(
    audit: &celld_testbed::audit::AuditLog,
    ns: &str,
    resource: &str,
    operator_only: bool,
) -> Vec<(String, String, String)> {
    let q = celld_testbed::audit::AuditQuery::writes()
        .verb("delete")
        .resource(resource)
        .namespace(ns)
        .successful();
    audit
        .query(&q)
        .unwrap()
        .into_iter()
        .filter(|e| !operator_only || e.user_agent.starts_with("celld-operator/"))
        .map(|e| {
            let pre = e
                .request_object
                .as_ref()
                .map(|b| b["preconditions"].clone())
                .unwrap_or_default();
            (
                e.name.clone().unwrap_or_default(),
                pre["uid"].as_str().unwrap_or_default().to_string(),
                pre["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}
