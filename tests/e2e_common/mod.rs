//! Helpers shared by the operator's real-cluster suites (`operator_e2e`, `journal_integrity`):
//! the test kubelet, the operator process, fleets, polling, cleanup with journal verification.
//! Each suite is its own test binary, so each has its own copy of the statics below.
#![allow(dead_code)]

use celld_harness::operator::{OperatorOptions, OperatorProcess};
use celld_harness::{cluster, Cluster, TestNamespace};
use celld_operator::api::CelldFleet;
use celld_test_kubelet::launcher::{Options, TestKubelet};
use celld_test_kubelet::nodes::INSTANCE_LABEL;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::path::PathBuf;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

pub const IMAGE_REPO: &str = "celld.test/noprocess";
/// Tests run side by side, each with operators scoped to its own namespace (see [`setup`]);
/// a test whose operator watches every namespace takes this exclusively.
static ISOLATION: LazyLock<tokio::sync::RwLock<()>> =
    LazyLock::new(|| tokio::sync::RwLock::new(()));

/// Held by a test whose operators watch only its namespace: runs beside the others.
pub async fn isolated() -> tokio::sync::RwLockReadGuard<'static, ()> {
    ISOLATION.read().await
}

/// Held by a test whose operator watches every namespace: runs alone.
pub async fn exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    ISOLATION.write().await
}

/// The test running on this thread (each `#[tokio::test]` runs on its own thread), set by
/// [`setup`]: its namespace, and the metrics address of the operators it starts.
struct Current {
    ns: String,
    metrics: String,
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Current>> = const { std::cell::RefCell::new(None) };
}

/// The namespace of the test on this thread.
pub fn test_namespace() -> String {
    CURRENT
        .with(|c| c.borrow().as_ref().map(|c| c.ns.clone()))
        .expect("setup() first")
}

/// The Lease name of this test's operators: one installation per test, so tests that run
/// side by side never contend for one Lease.
pub fn lease_name() -> String {
    format!("celld-operator-{}", test_namespace())
}

/// The work folder of this test's operators (logs, journal mirrors).
pub fn test_dir() -> PathBuf {
    work_dir().join(test_namespace())
}
pub static KUBELET: OnceLock<TestKubelet> = OnceLock::new();

pub fn image(n: u8) -> String {
    format!(
        "{IMAGE_REPO}@sha256:{}",
        format!("{n:x}")
            .repeat(64)
            .chars()
            .take(64)
            .collect::<String>()
    )
}

/// Where the operators of the test on this thread serve /metrics (one at a time).
pub fn metrics_addr() -> String {
    CURRENT
        .with(|c| c.borrow().as_ref().map(|c| c.metrics.clone()))
        .expect("setup() first")
}

/// A loopback address the kernel reports free right now (the operator refuses to start when
/// its address is taken, so a fixed port derived from the pid could collide with a
/// connection's ephemeral port).
pub fn free_loopback_addr() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    probe.local_addr().expect("local address").to_string()
}

/// GET /metrics from the operator under test (plain HTTP/1.1 over loopback).
pub async fn scrape() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(metrics_addr())
        .await
        .expect("metrics endpoint");
    sock.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    sock.read_to_string(&mut out).await.unwrap();
    out
}

pub fn work_dir() -> PathBuf {
    cluster()
        .work_dir
        .join(format!("operator-e2e-{}", std::process::id()))
}

pub fn kubelet() -> &'static TestKubelet {
    KUBELET.get_or_init(|| {
        let c = cluster();
        let binary = celld_test_kubelet::launcher::default_binary()
            .expect("build it: cargo build -p celld-test-kubelet");
        let mut opts = Options::new(
            binary,
            c.work_dir.join("test-kubelet.kubeconfig"),
            work_dir().join("kubelet"),
        );
        opts.node_prefix = kubelet_prefix();
        opts.nodes = 6;
        opts.pod_ip_range = "127.50.0.0/16".into();
        TestKubelet::start(&opts).expect("test kubelet starts")
    })
}

/// The node prefix of this process's test kubelet (also the value of its Nodes' label
/// `celld.test/kubelet`).
pub fn kubelet_prefix() -> String {
    format!("e2e{}", std::process::id() % 10000)
}

/// A fresh namespace whose Pods run on this process's test kubelet only (the namespace's
/// PodNodeSelector annotation), never on the Nodes of another test process.
pub async fn namespace(client: &Client, prefix: &str) -> TestNamespace {
    let selector = format!("{INSTANCE_LABEL}={}", kubelet_prefix());
    TestNamespace::create_on(client, prefix, Some(&selector))
        .await
        .unwrap()
}

/// The operator under test (see `celld_harness::operator`).
pub struct Operator;

impl Operator {
    pub fn start(fault_point: Option<&str>) -> OperatorProcess {
        Self::start_as(fault_point, &cluster().admin_kubeconfig, "celld-e2e")
    }

    /// Starts the operator with `kubeconfig` (e.g. one impersonating the chart's ServiceAccount).
    pub fn start_as(
        fault_point: Option<&str>,
        kubeconfig: &std::path::Path,
        operator_ns: &str,
    ) -> OperatorProcess {
        OperatorProcess::start(&Self::options(
            fault_point,
            kubeconfig,
            operator_ns,
            "celld-operator-e2e",
        ))
    }

    pub fn options(
        fault_point: Option<&str>,
        kubeconfig: &std::path::Path,
        operator_ns: &str,
        identity: &str,
    ) -> OperatorOptions {
        OperatorOptions {
            binary: env!("CARGO_BIN_EXE_celld-operator").into(),
            kubeconfig: kubeconfig.into(),
            operator_namespace: operator_ns.into(),
            identity: identity.into(),
            work_dir: test_dir(),
            metrics_addr: Some(metrics_addr()),
            fault_point: fault_point.map(str::to_string),
            extra_args: vec![
                format!("--lease-name={}", lease_name()),
                format!("--watch-namespaces={}", test_namespace()),
            ],
            ..Default::default()
        }
    }

    /// The usual replica with `tweak` applied to its options (extra flags, no attestation).
    pub fn start_with(tweak: impl FnOnce(&mut OperatorOptions)) -> OperatorProcess {
        let mut opts = Self::options(
            None,
            &cluster().admin_kubeconfig,
            "celld-e2e",
            "celld-operator-e2e",
        );
        tweak(&mut opts);
        OperatorProcess::start(&opts)
    }
}

/// Deletes a test namespace and waits until it is gone, while the operator still runs,
/// so no fleet of this test is left for a later test's operator (failpoints count every
/// fleet's boundaries).
///
/// First, every fleet's journal in the namespace must verify (`celld-operator journal verify`,
/// docs/journal.md "Audit").
pub async fn cleanup(client: &Client, ns: TestNamespace) {
    let fleets = Api::<CelldFleet>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    for f in fleets.items {
        verify_journal(&ns.name, &f.name_any(), None);
    }
    ns.delete_and_wait().await.unwrap();
}

/// `celld-operator journal verify NS/FLEET` passes; with `mirror`, also against the local
/// mirror (`--source both`; the operator owning that mirror must be stopped).
pub fn verify_journal(ns: &str, name: &str, mirror: Option<&std::path::Path>) {
    celld_harness::operator::verify_journal(
        env!("CARGO_BIN_EXE_celld-operator").as_ref(),
        &cluster().admin_kubeconfig,
        ns,
        name,
        mirror,
    );
}

pub async fn setup(prefix: &str) -> (&'static Cluster, Client, TestNamespace) {
    let c = cluster();
    kubelet();
    let client = c.admin_client().await.unwrap();
    let ns = namespace(&client, prefix).await;
    CURRENT.with(|cur| {
        *cur.borrow_mut() = Some(Current {
            ns: ns.name.clone(),
            metrics: free_loopback_addr(),
        })
    });
    c.kubectl(&[
        "create",
        "namespace",
        "celld-e2e",
        "--dry-run=client",
        "-o",
        "yaml",
    ])
    .unwrap();
    let _ = c.kubectl(&["create", "namespace", "celld-e2e"]);
    let sc = celld_harness::repo_root().join("config/test-storageclass.yaml");
    c.kubectl(&["apply", "-f", sc.to_str().unwrap()]).unwrap();
    fleet_service_account(&client, &ns.name).await;
    (c, client, ns)
}

/// Creates the fleets' ServiceAccount `celld` in namespace `ns`.
pub async fn fleet_service_account(client: &Client, ns: &str) {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "celld"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

pub fn fleet(name: &str, profile: &str, replicas: i32, bucket: &str) -> CelldFleet {
    let mut v = json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {"profile": profile, "runtimeImage": image(1), "replicas": replicas, "serviceAccountName": "celld",
                 "storage": {"bucket": bucket, "region": "us-east-1", "sizeGiB": 1},
                 "placement": {"zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "azCount": 3}}
    });
    if profile == "PersistentFleet" {
        v["spec"]["storage"]["storageClassName"] = json!("celld-test-hostpath");
    }
    serde_json::from_value(v).unwrap()
}

pub fn unique_bucket(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Polls until `check` returns Some, or fails with the fleet's conditions.
pub async fn until<T, F, Fut>(
    what: &str,
    secs: u64,
    api: &Api<CelldFleet>,
    name: &str,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            let f = api.get(name).await.ok();
            let conditions = f
                .and_then(|f| f.status)
                .map(|s| {
                    s.conditions
                        .iter()
                        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            panic!(
                "timed out waiting for {what}; conditions: {conditions:#?}\noperator log: {}",
                work_dir().join("*/operator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates `f` and waits until it has `n` ready members.
pub async fn create_ready(api: &Api<CelldFleet>, f: &CelldFleet, n: i32) {
    api.create(&PostParams::default(), f).await.unwrap();
    ready(api, &f.name_any(), n).await;
}

pub async fn ready(api: &Api<CelldFleet>, name: &str, n: i32) {
    until(
        &format!("{name} to have {n} ready members"),
        120,
        api,
        name,
        || async {
            let f = api.get(name).await.ok()?;
            let s = f.status?;
            let settled = s.current_operation.is_none()
                && s.ready_replicas == Some(n)
                && s.applied_replicas == Some(n);
            settled.then_some(())
        },
    )
    .await
}

pub async fn reason(api: &Api<CelldFleet>, name: &str, want: &str) -> String {
    until(
        &format!("{name} to report {want}"),
        60,
        api,
        name,
        || async {
            let f = api.get(name).await.ok()?;
            let c = f
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Blocked")?;
            (c.reason == want).then_some(c.message)
        },
    )
    .await
}

pub async fn claim_uid(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|c| c.uid())
}

/// The Events in `ns` (`None` when the list fails, so a poll tries again).
pub async fn events_in(
    client: &Client,
    ns: &str,
) -> Option<Vec<k8s_openapi::api::events::v1::Event>> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .ok()
        .map(|l| l.items)
}

/// Waits (at most `secs`, reporting fleet `name`'s conditions on timeout, as [`until`]) for an
/// Event in `ns` that `matches`. The operator sends Events after their journal entry is
/// committed, off the reconcile's path (src/events.rs): a check right after a state may come
/// before them.
pub async fn until_event(
    what: &str,
    secs: u64,
    api: &Api<CelldFleet>,
    name: &str,
    client: &Client,
    ns: &str,
    matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) {
    until(what, secs, api, name, || async {
        events_in(client, ns)
            .await?
            .iter()
            .any(&matches)
            .then_some(())
    })
    .await
}

pub use celld_testbed::audit::{AuditEvent, AuditLog};

/// The audit log of the test control plane from now on (see [`AuditLog::since_now`]).
pub fn audit_from_now() -> AuditLog {
    AuditLog::since_now(cluster().work_dir.join("audit/audit.log")).expect("the audit log")
}

/// Sent by the operator (any replica: `celld-operator/<version> (<identity>)`).
pub fn by_operator(e: &AuditEvent) -> bool {
    e.user_agent.starts_with("celld-operator/")
}

/// Accepted requests in namespace `ns` since `log` was marked, in the order they completed.
fn accepted_in(log: &AuditLog, ns: &str) -> Vec<AuditEvent> {
    log.events()
        .expect("the audit log")
        .into_iter()
        .filter(|e| e.succeeded() && e.namespace.as_deref() == Some(ns))
        .collect()
}

/// The StatefulSet controller's Pod deletes and creates in `ns` since `log` was marked, as
/// `("delete"|"create", pod name)` in order: a rolling update shows one member at a time,
/// highest ordinal first, as `delete m-3, create m-3, delete m-2, create m-2, …`.
pub fn rollout_sequence(log: &AuditLog, ns: &str) -> Vec<(String, String)> {
    accepted_in(log, ns)
        .into_iter()
        .filter(|e| {
            e.user_agent.contains("statefulset-controller")
                && e.resource == "pods"
                && e.subresource.is_none()
                && (e.verb == "delete" || e.verb == "create")
        })
        .map(|e| {
            let name = e.name.clone().or_else(|| {
                e.request_object
                    .as_ref()
                    .and_then(|o| o["metadata"]["name"].as_str().map(str::to_string))
            });
            (e.verb, name.unwrap_or_default())
        })
        .fold(Vec::new(), |mut seq, step| {
            // A delete that repeats the one just before it, of the same Pod, is dropped: the
            // controller's Pod informer had not seen the first one yet (seen in CI under load,
            // 2026-12-06), and a second delete of a Pod already terminating changes nothing.
            if !(step.0 == "delete" && seq.last() == Some(&step)) {
                seq.push(step);
            }
            seq
        })
}

/// The order the operator tore a fleet down in, from its accepted deletes and fleet patches
/// in `ns` since `log` was marked: one label per request (`workload`, `claim`,
/// `prerequisite`, `finalizer` for the fleet patch that removed the lifecycle finalizer).
pub fn teardown_sequence(log: &AuditLog, ns: &str) -> Vec<(&'static str, String)> {
    accepted_in(log, ns)
        .into_iter()
        .filter(by_operator)
        .filter_map(|e| {
            let finalizers = e
                .request_object
                .as_ref()
                .and_then(|o| o["metadata"]["finalizers"].as_array().cloned());
            let label = match (e.verb.as_str(), e.resource.as_str()) {
                ("delete", "statefulsets" | "deployments") => "workload",
                ("delete", "persistentvolumeclaims") => "claim",
                ("delete", "services" | "networkpolicies" | "poddisruptionbudgets") => {
                    "prerequisite"
                }
                ("patch" | "update", "celldfleets")
                    if e.subresource.is_none()
                        && finalizers.as_ref().is_some_and(|f| {
                            !f.iter().any(|f| f == "celld.eric.dev/lifecycle-protection")
                        }) =>
                {
                    "finalizer"
                }
                _ => return None,
            };
            Some((
                label,
                format!("{} {}/{}", e.verb, e.resource, e.name.unwrap_or_default()),
            ))
        })
        .collect()
}

/// Asserts the teardown order of a Delete: workload, then claims (`claims` of them), then
/// Services/NetworkPolicy/PDB, then the finalizer, each phase complete before the next starts.
pub fn assert_teardown_order(log: &AuditLog, ns: &str, claims: usize) {
    let seq = teardown_sequence(log, ns);
    let labels: Vec<&str> = seq.iter().map(|(l, _)| *l).collect();
    let mut expected = vec!["workload"];
    expected.extend(std::iter::repeat_n("claim", claims));
    expected.extend(["prerequisite"; 4]);
    expected.push("finalizer");
    assert_eq!(labels, expected, "teardown order: {seq:#?}");
}

// Fleet edits live in the harness (shared with the simulator suites); not every test binary uses them.
#[allow(unused_imports)]
pub use celld_harness::fleet::{request_replacement, set_paused, set_restart_token};
