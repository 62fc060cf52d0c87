//! Node registration and heartbeats.
//!
//! Each Node is created (or adopted, when a Node of that name exists) with the topology labels and
//! a large capacity, then kept alive the way a kubelet does: its Lease in `kube-node-lease` is
//! renewed every `--heartbeat-seconds` (lease duration = 4 periods) and its status (Ready and the
//! pressure conditions, with `lastHeartbeatTime`) is patched every 6 periods and whenever it comes
//! back from zombie mode. A zombie Node gets neither, so the real node-lifecycle controller marks it
//! NotReady/unreachable while its processes keep running.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;

use crate::shared::Shared;

/// Label carrying the kubelet instance (its node prefix) on Nodes and provisioned PVs.
pub const INSTANCE_LABEL: &str = "celld.test/kubelet";

/// Parses `key=value:Effect` or `key:Effect`.
pub fn parse_taint(s: &str) -> Result<Taint, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {s:?}: expected key[=value]:Effect"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(format!("taint {s:?}: unknown effect {effect:?}"));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("taint {s:?}: empty key"));
    }
    Ok(Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}

fn node_object(shared: &Shared, name: &str, zone: &str) -> Node {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("topology.kubernetes.io/zone", zone),
        ("topology.kubernetes.io/region", shared.args.region.as_str()),
        (INSTANCE_LABEL, shared.args.node_prefix.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let taints: Vec<Taint> = shared
        .args
        .node_taints
        .iter()
        .filter_map(|t| parse_taint(t).ok())
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

fn node_status(shared: &Shared, name: &str, ready_since: Timestamp, now: Timestamp) -> NodeStatus {
    let q = |s: &str| Quantity(s.to_string());
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", q("64")),
        ("memory", q("256Gi")),
        ("ephemeral-storage", q("1Ti")),
        ("pods", q(&shared.args.max_pods.to_string())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(ready_since)),
    };
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            ),
        ]),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: 0 }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".into(),
            boot_id: String::new(),
            container_runtime_version: "celld-test://0.1".into(),
            kernel_version: "loopback".into(),
            kube_proxy_version: String::new(),
            kubelet_version: "v1.34.4".into(),
            machine_id: String::new(),
            operating_system: "linux".into(),
            os_image: "celld-test-kubelet (local processes)".into(),
            system_uuid: String::new(),
            swap: None,
        }),
        ..NodeStatus::default()
    }
}

/// Creates or adopts every Node and reports it Ready once.
pub async fn register(shared: &Shared) -> anyhow::Result<()> {
    let api = Api::<Node>::all(shared.client.clone());
    let now = Timestamp::now();
    for (name, zone) in &shared.nodes {
        let node = node_object(shared, name, zone);
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => tracing::info!(node = %name, %zone, "registered node"),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let patch = serde_json::json!({
                    "metadata": {"labels": node.metadata.labels},
                    "spec": {"taints": node.spec.as_ref().and_then(|s| s.taints.clone()), "unschedulable": null},
                });
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tracing::info!(node = %name, %zone, "adopted existing node");
            }
            Err(e) => return Err(e.into()),
        }
        patch_status(shared, name, now).await?;
        renew_lease(shared, name).await?;
    }
    Ok(())
}

async fn patch_status(shared: &Shared, name: &str, ready_since: Timestamp) -> kube::Result<()> {
    let status = node_status(shared, name, ready_since, Timestamp::now());
    Api::<Node>::all(shared.client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?;
    Ok(())
}

async fn renew_lease(shared: &Shared, name: &str) -> kube::Result<()> {
    let api = Api::<Lease>::namespaced(shared.client.clone(), "kube-node-lease");
    let duration = (shared.args.heartbeat_seconds * 4) as i32;
    let spec = LeaseSpec {
        holder_identity: Some(name.to_string()),
        lease_duration_seconds: Some(duration),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..LeaseSpec::default()
    };
    let patch = serde_json::json!({ "spec": spec });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let node = Api::<Node>::all(shared.client.clone()).get(name).await?;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.to_string(),
                        uid: node.metadata.uid.unwrap_or_default(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Heartbeats for one Node until shutdown.
pub async fn heartbeat(shared: Arc<Shared>, name: String) {
    let period = Duration::from_secs(shared.args.heartbeat_seconds.max(1));
    let mut zombie_rx = shared.zombie_tx.subscribe();
    let mut shutdown = shared.shutdown.clone();
    let mut ready_since = Timestamp::now();
    let mut beats: u64 = 0;
    let mut was_zombie = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = zombie_rx.changed() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        if shared.is_zombie(&name) {
            if !was_zombie {
                tracing::warn!(node = %name, "zombie: heartbeats stopped");
            }
            was_zombie = true;
            continue;
        }
        let force_status = was_zombie;
        if was_zombie {
            tracing::info!(node = %name, "node back: heartbeats resumed");
            ready_since = Timestamp::now();
            was_zombie = false;
        }
        beats += 1;
        if let Err(e) = renew_lease(&shared, &name).await {
            tracing::warn!(node = %name, error = %e, "renewing node lease");
        }
        if force_status || beats.is_multiple_of(6) {
            if let Err(e) = patch_status(&shared, &name, ready_since).await {
                tracing::warn!(node = %name, error = %e, "updating node status");
            }
        }
    }
}

/// Deletes the Nodes and their Leases (on exit, unless `--keep-nodes-on-exit`).
pub async fn deregister(shared: &Shared) {
    let nodes = Api::<Node>::all(shared.client.clone());
    let leases = Api::<Lease>::namespaced(shared.client.clone(), "kube-node-lease");
    for (name, _) in &shared.nodes {
        if let Err(e) = nodes.delete(name, &DeleteParams::default()).await {
            tracing::warn!(node = %name, error = %e, "deleting node");
        }
        let _ = leases.delete(name, &DeleteParams::default()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_with_and_without_value() {
        let t = parse_taint("celld.test/reserved=kt:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("celld.test/reserved", Some("kt"), "NoSchedule")
        );
        let t = parse_taint("dedicated:NoExecute").unwrap();
        assert_eq!((t.key.as_str(), t.value), ("dedicated", None));
        assert!(parse_taint("k=v:Sometimes").is_err());
        assert!(parse_taint("novalue").is_err());
    }
}
