//! Real-cluster tests of the test kubelet (integration/kubelet/README.md "Tests"): one kubelet per
//! test binary, started once and shared; every test has its own namespace.
//!
//! The kubelet's Nodes carry a taint and a per-run instance label so that only these tests' Pods
//! land on them; the last Node is reserved for the zombie test (other tests keep off it).
//! Members are `tests/fixtures/member.sh` (python3 http.server) and `/bin/sh`, not the celld
//! simulator.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use celld_harness::{cluster, TestNamespace};
use celld_test_kubelet::client::ControlClient;
use celld_test_kubelet::launcher::{Options, TestKubelet};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NODES: usize = 4;
const TAINT_KEY: &str = "celld.test/kubelet-test";

struct Bed {
    kubelet: TestKubelet,
    prefix: String,
}

static BED: OnceLock<Bed> = OnceLock::new();

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The shared kubelet (started on first use).
fn bed() -> &'static Bed {
    BED.get_or_init(|| {
        let c = cluster();
        let prefix = format!("kt-{}", std::process::id());
        let work_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kubelet-{prefix}"));
        let _ = std::fs::remove_dir_all(&work_dir);
        let mut opts = Options::new(
            env!("CARGO_BIN_EXE_celld-test-kubelet"),
            c.work_dir.join("test-kubelet.kubeconfig"),
            &work_dir,
        );
        opts.node_prefix = prefix.clone();
        opts.nodes = NODES;
        opts.image_map = Some(fixtures().join("images.map"));
        opts.pod_ip_range = "127.77.0.0/16".into();
        opts.store_ip = "127.0.0.2".into();
        opts.node_taints = vec![format!("{TAINT_KEY}={prefix}:NoSchedule")];
        opts.extra_args = vec!["--backoff-initial-ms".into(), "2000".into()];
        let kubelet = TestKubelet::start(&opts).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "test kubelet: log {}, work dir {}",
            kubelet.log.display(),
            kubelet.work_dir.display()
        );
        Bed { kubelet, prefix }
    })
}

impl Bed {
    fn control(&self) -> &ControlClient {
        &self.kubelet.control
    }

    fn zombie_node(&self) -> String {
        format!("{}-{}", self.prefix, NODES - 1)
    }

    fn nodes(&self) -> Vec<String> {
        (0..NODES).map(|i| format!("{}-{i}", self.prefix)).collect()
    }

    fn log_hint(&self) -> String {
        format!(
            "(kubelet log: {}, work dir: {})",
            self.kubelet.log.display(),
            self.kubelet.work_dir.display()
        )
    }

    /// Scheduling constraints every test Pod carries: tolerate our taint, run on our Nodes, and
    /// keep off the zombie test's Node unless `node` pins the Pod there.
    fn placement(&self, node: Option<&str>) -> serde_json::Value {
        let host_rule = match node {
            Some(n) => json!({"key": "kubernetes.io/hostname", "operator": "In", "values": [n]}),
            None => {
                json!({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [self.zombie_node()]})
            }
        };
        json!({
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "celld.test/kubelet", "operator": "In", "values": [self.prefix.clone()]},
                    host_rule,
                ]}]}}},
        })
    }
}

async fn setup(prefix: &str) -> (&'static Bed, Client, TestNamespace) {
    let bed = tokio::task::spawn_blocking(bed).await.expect("bed");
    let client = cluster().admin_client().await.expect("admin client");
    let ns = TestNamespace::create(&client, prefix)
        .await
        .expect("namespace");
    (bed, client, ns)
}

/// Polls `f` every 250 ms until it yields a value; panics after `timeout`.
async fn eventually<T, F, Fut>(bed: &Bed, what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!(
                "timed out after {timeout:?} waiting for: {what} {}",
                bed.log_hint()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn pod_object(bed: &Bed, name: &str, node: Option<&str>, spec: serde_json::Value) -> Pod {
    let mut full = bed.placement(node);
    for (k, v) in spec.as_object().expect("spec object") {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": full,
    }))
    .expect("pod json")
}

fn member_env() -> serde_json::Value {
    json!([
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "CELLD_WATCH", "value": "/work"},
    ])
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn is_ready(pod: &Pod) -> bool {
    condition(pod, "Ready").as_deref() == Some("True")
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

async fn ready_pod(bed: &Bed, pods: &Api<Pod>, name: &str) -> Pod {
    eventually(
        bed,
        &format!("pod {name} Ready"),
        Duration::from_secs(60),
        || async { pods.get_opt(name).await.ok().flatten().filter(is_ready) },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_across_zones_and_stay_ready_for_over_a_minute() {
    let (bed, client, ns) = setup("kt-nodes").await;
    let nodes_api = Api::<Node>::all(client.clone());
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
    let watched: Vec<String> = bed
        .nodes()
        .into_iter()
        .filter(|n| *n != bed.zombie_node())
        .collect();
    let mut zones = std::collections::BTreeSet::new();
    for name in bed.nodes() {
        let node = nodes_api.get(&name).await.expect("node registered");
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("kubernetes.io/hostname"), Some(&name));
        assert_eq!(
            labels.get("kubernetes.io/os").map(String::as_str),
            Some("linux")
        );
        assert!(labels.contains_key("topology.kubernetes.io/region"));
        zones.insert(labels["topology.kubernetes.io/zone"].clone());
        let alloc = node.status.unwrap().allocatable.unwrap();
        for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
            assert!(alloc.contains_key(r), "allocatable {r}");
        }
    }
    assert_eq!(zones.len(), 3, "nodes spread over three zones: {zones:?}");
    let start = Instant::now();
    let mut checks = 0;
    while start.elapsed() < Duration::from_secs(65) {
        for name in &watched {
            let node = nodes_api.get(name).await.expect("node");
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone());
            assert_eq!(
                ready.as_deref(),
                Some("True"),
                "node {name} Ready after {:?} {}",
                start.elapsed(),
                bed.log_hint()
            );
            let lifecycle_taints: Vec<String> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.key)
                .filter(|k| k.starts_with("node.kubernetes.io/"))
                .collect();
            assert!(
                lifecycle_taints.is_empty(),
                "node {name} tainted by the node-lifecycle controller: {lifecycle_taints:?}"
            );
            let lease = leases.get(name).await.expect("node lease");
            let renewed = lease.spec.unwrap().renew_time.expect("renewTime").0;
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
            assert!(age.as_secs() < 25, "lease of {name} renewed {age:?} ago");
        }
        checks += 1;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(checks >= 12);
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_runs_on_provisioned_volumes_and_keeps_data_across_pod_recreation() {
    let (bed, client, ns) = setup("kt-sts").await;
    let n = ns.name.clone();
    let class_name = format!("{n}-hostpath");
    let classes = Api::<StorageClass>::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class_name},
        "provisioner": "hostpath.csi.k8s.io",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let services = Api::<Service>::namespaced(client.clone(), &n);
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "m-peers"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": "m"},
                 "ports": [{"name": "http", "port": 8080}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let mut pod_spec = bed.placement(None);
    pod_spec["terminationGracePeriodSeconds"] = json!(10);
    pod_spec["containers"] = json!([{
        "name": "member",
        "image": "celld.test/member:1.0@sha256:0123456789abcdef",
        "env": member_env(),
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1, "failureThreshold": 2},
        "volumeMounts": [{"name": "data", "mountPath": "/work"}],
    }]);
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "m"},
        "spec": {
            "replicas": 3,
            "serviceName": "m-peers",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "m"}},
            "template": {"metadata": {"labels": {"app": "m"}}, "spec": pod_spec},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOncePod"], "storageClassName": class_name,
                         "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .unwrap();
    let sets = Api::<StatefulSet>::namespaced(client.clone(), &n);
    sets.create(&PostParams::default(), &sts).await.unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &n);
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &n);
    let volumes = Api::<PersistentVolume>::all(client.clone());

    eventually(
        bed,
        "statefulset 3/3 ready",
        Duration::from_secs(90),
        || async {
            let s = sets.get("m").await.ok()?;
            (s.status?.ready_replicas == Some(3)).then_some(())
        },
    )
    .await;

    // Claims: handed to our provisioner by the PV controller, bound to pvc-<uid> over a folder.
    let mut folders = Vec::new();
    for i in 0..3 {
        let claim = claims.get(&format!("data-m-{i}")).await.unwrap();
        let ann = claim.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            ann.get("volume.kubernetes.io/storage-provisioner")
                .map(String::as_str),
            Some("hostpath.csi.k8s.io")
        );
        assert_eq!(
            ann.get("volume.beta.kubernetes.io/storage-provisioner")
                .map(String::as_str),
            Some("hostpath.csi.k8s.io")
        );
        let node = ann
            .get("volume.kubernetes.io/selected-node")
            .cloned()
            .expect("selected-node");
        assert_eq!(
            claim.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Bound")
        );
        let uid = claim.metadata.uid.clone().unwrap();
        let pv_name = claim.spec.as_ref().unwrap().volume_name.clone().unwrap();
        assert_eq!(pv_name, format!("pvc-{uid}"));
        let pv = volumes.get(&pv_name).await.unwrap();
        let spec = pv.spec.clone().unwrap();
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(uid.as_str()));
        assert_eq!(
            spec.storage_class_name.as_deref(),
            Some(class_name.as_str())
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        let affinity = serde_json::to_value(spec.node_affinity.unwrap()).unwrap();
        assert_eq!(
            affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0],
            json!(node)
        );
        let pod = pods.get(&format!("m-{i}")).await.unwrap();
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(node.as_str()));
        let folder = PathBuf::from(spec.local.unwrap().path);
        assert!(folder.is_dir(), "PV folder {} exists", folder.display());
        assert!(
            folder.join("starts.log").is_file(),
            "member wrote into its PVC folder"
        );
        folders.push((pv_name, folder));
    }

    // A file in member 1's disk survives deletion and recreation of its Pod.
    let old = pods.get("m-1").await.unwrap();
    let (old_uid, old_ip) = (old.metadata.uid.clone().unwrap(), pod_ip(&old));
    let hosts_name = format!("m-1.m-peers.{n}.svc");
    let hosts = std::fs::read_to_string(bed.kubelet.hosts_file()).unwrap();
    assert!(
        hosts.contains(&format!("{old_ip} {hosts_name} {hosts_name}.cluster.local")),
        "hosts file maps {hosts_name} to {old_ip}:\n{hosts}"
    );
    let folder = folders[1].1.clone();
    std::fs::write(folder.join("kept.txt"), "written before recreation").unwrap();
    let deleted_at = Instant::now();
    pods.delete("m-1", &DeleteParams::default()).await.unwrap();
    let new = eventually(
        bed,
        "m-1 recreated and Ready",
        Duration::from_secs(60),
        || async {
            pods.get_opt("m-1")
                .await
                .ok()
                .flatten()
                .filter(|p| p.metadata.uid.as_deref() != Some(old_uid.as_str()) && is_ready(p))
        },
    )
    .await;
    let new_ip = pod_ip(&new);
    eprintln!(
        "m-1 recreated in {:?}: {old_ip} -> {new_ip}",
        deleted_at.elapsed()
    );
    assert_ne!(new_ip, old_ip, "a recreated Pod gets a new IP");
    assert!(new_ip.starts_with("127.77."), "{new_ip}");
    let sigterms = std::fs::read_to_string(folder.join("sigterm.log")).unwrap_or_default();
    assert_eq!(
        sigterms.lines().count(),
        1,
        "the old member got SIGTERM once: {sigterms:?}"
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("starts.log"))
            .unwrap()
            .lines()
            .count(),
        2
    );
    let served = celld_test_kubelet::http::request(
        format!("{new_ip}:8080").parse().unwrap(),
        "GET",
        "/kept.txt",
        &[],
        None,
        Duration::from_secs(2),
    )
    .await
    .expect("new member serves its disk");
    assert_eq!(served.status, 200);
    assert_eq!(&served.body[..], b"written before recreation");
    eventually(
        bed,
        "hosts file resolves the new IP",
        Duration::from_secs(5),
        || async {
            let hosts = std::fs::read_to_string(bed.kubelet.hosts_file()).ok()?;
            (hosts.contains(&format!("{new_ip} {hosts_name} "))
                && !hosts.contains(&format!("{old_ip} ")))
            .then_some(())
        },
    )
    .await;
    let info = bed
        .control()
        .pod(&n, "m-1")
        .await
        .unwrap()
        .expect("control lists m-1");
    assert_eq!(info.ip.map(|i| i.to_string()), Some(new_ip.clone()));
    assert!(info.containers[0].pid.is_some());

    // Reclaim Delete: after the StatefulSet and the claim go, PV and folder go.
    sets.delete("m", &DeleteParams::default()).await.unwrap();
    eventually(
        bed,
        "statefulset pods gone",
        Duration::from_secs(60),
        || async {
            let left = pods.list(&Default::default()).await.ok()?;
            left.items.is_empty().then_some(())
        },
    )
    .await;
    claims
        .delete("data-m-2", &DeleteParams::default())
        .await
        .unwrap();
    let (pv2, folder2) = folders[2].clone();
    eventually(
        bed,
        "PV of data-m-2 reclaimed",
        Duration::from_secs(60),
        || async {
            let gone = volumes.get_opt(&pv2).await.ok()?.is_none();
            (gone && !folder2.exists()).then_some(())
        },
    )
    .await;
    assert!(folders[1].1.is_dir(), "other members' disks are kept");
    for c in ["data-m-0", "data-m-1"] {
        claims.delete(c, &DeleteParams::default()).await.unwrap();
    }
    eventually(
        bed,
        "remaining PVs reclaimed",
        Duration::from_secs(60),
        || async {
            for (pv, folder) in &folders[..2] {
                if volumes.get_opt(pv).await.ok()?.is_some() || folder.exists() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .unwrap();
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_is_resolved_and_mounts_are_mapped_to_host_folders() {
    let (bed, client, ns) = setup("kt-env").await;
    let n = ns.name.clone();
    let secrets = Api::<Secret>::namespaced(client.clone(), &n);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "stringData": {"key": "s3cr3t"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &n);
    let pod = pod_object(
        bed,
        "env",
        None,
        json!({
            "containers": [{
                "name": "c", "image": "celld.test/shell:any",
                "command": ["sh", "-c", "env > \"$CELLD_WATCH/env.txt\"; echo \"$1\" > \"$CELLD_WATCH/arg.txt\"; exec sleep 600", "sh", "$(CELLD_ADVERTISE)"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "CELLD_NODE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "CELLD_ADVERTISE", "value": "$(POD_IP):8081"},
                    {"name": "ESCAPED", "value": "$$(POD_IP)"},
                    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "key"}}},
                    {"name": "CELLD_WATCH", "value": "/work"},
                    {"name": "FAULTS", "value": "/work/faults.json"},
                ],
                "volumeMounts": [{"name": "data", "mountPath": "/work"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = ready_pod(bed, &pods, "env").await;
    let ip = pod_ip(&pod);
    let dir = bed
        .kubelet
        .pod_dir(&n, "env", pod.metadata.uid.as_deref().unwrap());
    let data = dir.join("volumes/data");
    let env_text = eventually(bed, "env.txt written", Duration::from_secs(10), || async {
        std::fs::read_to_string(data.join("env.txt"))
            .ok()
            .filter(|t| t.contains("KEY="))
    })
    .await;
    let env: std::collections::HashMap<&str, &str> =
        env_text.lines().filter_map(|l| l.split_once('=')).collect();
    let data_s = data.display().to_string();
    assert_eq!(env["POD_IP"], ip);
    assert_eq!(env["CELLD_NODE"], "env");
    assert_eq!(env["POD_UID"], pod.metadata.uid.as_deref().unwrap());
    assert_eq!(env["POD_NS"], n);
    assert_eq!(
        env["NODE"],
        pod.spec.as_ref().unwrap().node_name.as_deref().unwrap()
    );
    assert_eq!(env["CELLD_ADVERTISE"], format!("{ip}:8081"));
    assert_eq!(env["ESCAPED"], "$(POD_IP)");
    assert_eq!(env["KEY"], "s3cr3t");
    assert_eq!(
        env["CELLD_WATCH"], data_s,
        "a value equal to a mountPath becomes the host folder"
    );
    assert_eq!(
        env["FAULTS"],
        format!("{data_s}/faults.json"),
        "a value under a mountPath is rewritten too"
    );
    assert_eq!(env["CELLD_TEST_MOUNT_WORK"], data_s);
    assert_eq!(
        env["CELLD_SIM_HOSTS_FILE"],
        bed.kubelet.hosts_file().display().to_string()
    );
    assert_eq!(
        std::fs::read_to_string(data.join("arg.txt"))
            .unwrap()
            .trim(),
        format!("{ip}:8081"),
        "$(VAR) expanded in args"
    );
    // kube-api-access (projected): a folder with ca.crt and namespace, no token.
    let sa_dir = env["CELLD_TEST_MOUNT_VAR_RUN_SECRETS_KUBERNETES_IO_SERVICEACCOUNT"];
    assert_eq!(
        std::fs::read_to_string(Path::new(sa_dir).join("namespace")).unwrap(),
        n
    );

    // A missing secret holds the container in CreateContainerConfigError.
    let broken = pod_object(
        bed,
        "broken",
        None,
        json!({
            "containers": [{"name": "c", "image": "celld.test/shell", "command": ["sleep", "600"],
                "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "key"}}}]}],
        }),
    );
    pods.create(&PostParams::default(), &broken).await.unwrap();
    eventually(
        bed,
        "CreateContainerConfigError",
        Duration::from_secs(30),
        || async {
            let p = pods.get("broken").await.ok()?;
            let reason = p.status?.container_statuses?[0]
                .state
                .as_ref()?
                .waiting
                .as_ref()?
                .reason
                .clone()?;
            (reason == "CreateContainerConfigError").then_some(())
        },
    )
    .await;
    pods.delete("env", &DeleteParams::default()).await.unwrap();
    eventually(
        bed,
        "env pod gone and its emptyDir removed",
        Duration::from_secs(30),
        || async { (pods.get_opt("env").await.ok()?.is_none() && !data.exists()).then_some(()) },
    )
    .await;
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_image_waits_with_err_image_pull_and_noprocess_is_ready_at_once() {
    let (bed, client, ns) = setup("kt-image").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let pod = pod_object(
        bed,
        "unmapped",
        None,
        json!({
            "containers": [{"name": "c", "image": "registry.example/not-mapped:1.0"}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let message = eventually(bed, "ErrImagePull", Duration::from_secs(30), || async {
        let p = pods.get("unmapped").await.ok()?;
        let status = p.status?;
        let waiting = status.container_statuses?[0]
            .state
            .as_ref()?
            .waiting
            .clone()?;
        (waiting.reason.as_deref() == Some("ErrImagePull")
            && status.phase.as_deref() == Some("Pending"))
        .then_some(waiting.message.unwrap_or_default())
    })
    .await;
    assert!(
        message.contains("registry.example/not-mapped:1.0"),
        "{message}"
    );
    let p = pods.get("unmapped").await.unwrap();
    assert_eq!(condition(&p, "Ready").as_deref(), Some("False"));

    let quiet = pod_object(
        bed,
        "quiet",
        None,
        json!({
            "containers": [{"name": "c", "image": "celld.test/noprocess:bench"}],
        }),
    );
    let created = Instant::now();
    pods.create(&PostParams::default(), &quiet).await.unwrap();
    let p = ready_pod(bed, &pods, "quiet").await;
    eprintln!("no-process pod Ready {:?} after create", created.elapsed());
    assert!(pod_ip(&p).starts_with("127.77."));
    let info = bed.control().pod(&ns.name, "quiet").await.unwrap().unwrap();
    assert_eq!(info.containers[0].pid, None);
    pods.delete("quiet", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        bed,
        "no-process pod deleted",
        Duration::from_secs(20),
        || async { pods.get_opt("quiet").await.ok()?.is_none().then_some(()) },
    )
    .await;
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_3_shows_in_last_state_with_restarts_and_crash_loop_back_off() {
    let (bed, client, ns) = setup("kt-exit").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let pod = pod_object(
        bed,
        "fencer",
        None,
        json!({
            "containers": [{"name": "celld", "image": "celld.test/shell",
                "command": ["sh", "-c", "echo 'SELF-FENCE: node_lease_watchdog_fence'; sleep 1; exit 3"]}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let saw_crash_loop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let status = eventually(
        bed,
        "restartCount >= 2 with lastState exit 3 and CrashLoopBackOff seen",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let saw = saw_crash_loop.clone();
            async move {
                use std::sync::atomic::Ordering;
                let p = pods.get("fencer").await.ok()?;
                let cs = p.status?.container_statuses?.into_iter().next()?;
                if cs
                    .state
                    .as_ref()?
                    .waiting
                    .as_ref()
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
                {
                    saw.store(true, Ordering::SeqCst);
                }
                let code = cs.last_state.as_ref()?.terminated.as_ref()?.exit_code;
                (code == 3 && cs.restart_count >= 2 && saw.load(Ordering::SeqCst)).then_some(cs)
            }
        },
    )
    .await;
    assert_eq!(
        status
            .last_state
            .unwrap()
            .terminated
            .unwrap()
            .reason
            .as_deref(),
        Some("Error")
    );
    let info = bed
        .control()
        .pod(&ns.name, "fencer")
        .await
        .unwrap()
        .unwrap();
    let log = info.dir.join("logs/celld.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.matches("SELF-FENCE:").count() >= 2,
        "log {} keeps every run",
        log.display()
    );
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_sends_sigterm_then_sigkill_after_the_grace_period() {
    let (bed, client, ns) = setup("kt-grace").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let host_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("grace-{}", ns.name));
    std::fs::create_dir_all(&host_dir).unwrap();
    let pod = pod_object(
        bed,
        "stubborn",
        None,
        json!({
            "terminationGracePeriodSeconds": 3,
            "containers": [{"name": "c", "image": "celld.test/shell",
                "command": ["sh", "-c", "trap 'echo TERM >> \"$CELLD_TEST_MOUNT_OUT/term.log\"' TERM; while :; do sleep 0.2; done"],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
            "volumes": [{"name": "out", "hostPath": {"path": host_dir.display().to_string()}}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    ready_pod(bed, &pods, "stubborn").await;
    let pid = bed
        .control()
        .pod(&ns.name, "stubborn")
        .await
        .unwrap()
        .unwrap()
        .containers[0]
        .pid
        .unwrap();
    let started = Instant::now();
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        bed,
        "stubborn pod deleted",
        Duration::from_secs(30),
        || async { pods.get_opt("stubborn").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2500),
        "deletion waited for the grace period: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "deletion confirmed soon after SIGKILL: {took:?}"
    );
    assert_eq!(
        std::fs::read_to_string(host_dir.join("term.log"))
            .unwrap()
            .trim(),
        "TERM"
    );
    assert!(!pid_alive(pid), "process {pid} was killed");
    let _ = std::fs::remove_dir_all(&host_dir);
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_restarts_a_member_and_pause_makes_it_unready_until_resumed() {
    let (bed, client, ns) = setup("kt-faults").await;
    let n = ns.name.clone();
    let pods = Api::<Pod>::namespaced(client.clone(), &n);
    let pod = pod_object(
        bed,
        "victim",
        None,
        json!({
            "containers": [{"name": "member", "image": "celld.test/member", "env": member_env(),
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/work"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let before = ready_pod(bed, &pods, "victim").await;
    let answer = bed.control().kill(&n, "victim", None).await.unwrap();
    let pid = answer.signalled[0].pid;
    let after = eventually(
        bed,
        "killed member restarted and Ready",
        Duration::from_secs(30),
        || async {
            let p = pods.get("victim").await.ok()?;
            let cs = p.status.as_ref()?.container_statuses.as_ref()?[0].clone();
            let code = cs.last_state.as_ref()?.terminated.as_ref()?.exit_code;
            (cs.restart_count == 1 && code == 137 && is_ready(&p)).then_some(p)
        },
    )
    .await;
    assert_eq!(
        pod_ip(&after),
        pod_ip(&before),
        "a container restart keeps the Pod IP"
    );
    assert!(!pid_alive(pid));
    bed.control().pause(&n, "victim", None).await.unwrap();
    eventually(
        bed,
        "paused member unready",
        Duration::from_secs(20),
        || async {
            let p = pods.get("victim").await.ok()?;
            (condition(&p, "Ready").as_deref() == Some("False")).then_some(())
        },
    )
    .await;
    bed.control().resume(&n, "victim", None).await.unwrap();
    ready_pod(bed, &pods, "victim").await;
    let p = pods.get("victim").await.unwrap();
    assert_eq!(
        p.status.unwrap().container_statuses.unwrap()[0].restart_count,
        1,
        "pause is not a restart"
    );
    ns.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_node_keeps_its_process_and_the_pod_terminating_until_it_comes_back() {
    let (bed, client, ns) = setup("kt-zombie").await;
    let n = ns.name.clone();
    let node = bed.zombie_node();
    let pods = Api::<Pod>::namespaced(client.clone(), &n);
    let pod = pod_object(
        bed,
        "walker",
        Some(&node),
        json!({
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "member", "image": "celld.test/member", "env": member_env(),
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/work"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        }),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ready = ready_pod(bed, &pods, "walker").await;
    let ip = pod_ip(&ready);
    let pid = bed
        .control()
        .pod(&n, "walker")
        .await
        .unwrap()
        .unwrap()
        .containers[0]
        .pid
        .unwrap();
    let nodes = bed.control().zombie(&node).await.unwrap();
    assert!(nodes.iter().any(|r| r.name == node && r.zombie));
    pods.delete("walker", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = pods
        .get("walker")
        .await
        .expect("pod still exists while its node is a zombie");
    assert!(
        p.metadata.deletion_timestamp.is_some(),
        "pod is Terminating"
    );
    assert!(
        pid_alive(pid),
        "the member process keeps running on a zombie node"
    );
    let served = celld_test_kubelet::http::request(
        format!("{ip}:8080").parse().unwrap(),
        "GET",
        "/starts.log",
        &[],
        None,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        served.is_ok_and(|a| a.status == 200),
        "the zombie member still answers"
    );
    // The real node-lifecycle controller notices the missing heartbeats.
    let nodes_api = Api::<Node>::all(client.clone());
    let node_ready = |n: Node| {
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
    };
    let zombie_since = Instant::now();
    eventually(
        bed,
        "zombie node marked NotReady/Unknown",
        Duration::from_secs(90),
        || async {
            let n = nodes_api.get(&node).await.ok()?;
            let unreachable = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable"));
            (node_ready(n).as_deref() == Some("Unknown") && unreachable).then_some(())
        },
    )
    .await;
    eprintln!(
        "zombie node went Unknown after {:?}",
        zombie_since.elapsed()
    );
    let p = pods
        .get("walker")
        .await
        .expect("pod still exists on the unreachable node");
    assert!(p.metadata.deletion_timestamp.is_some());
    assert!(pid_alive(pid), "the member process still runs");
    bed.control().node_back(&node).await.unwrap();
    eventually(
        bed,
        "pod deleted after node back",
        Duration::from_secs(30),
        || async { pods.get_opt("walker").await.ok()?.is_none().then_some(()) },
    )
    .await;
    assert!(!pid_alive(pid), "process stopped once the node came back");
    eventually(bed, "node Ready again", Duration::from_secs(30), || async {
        let n = nodes_api.get(&node).await.ok()?;
        (node_ready(n).as_deref() == Some("True")).then_some(())
    })
    .await;
    ns.delete().await.unwrap();
}
