//! Volume provisioner for StorageClasses with provisioner `hostpath.csi.k8s.io`.
//!
//! It works like an external provisioner next to the real PV controller:
//! 1. the scheduler puts `volume.kubernetes.io/selected-node` on a WaitForFirstConsumer claim;
//! 2. the PV controller marks the claim for the class's provisioner
//!    (`volume.kubernetes.io/storage-provisioner`);
//! 3. for claims whose selected node is one of ours, this provisioner creates the folder
//!    `<work-dir>/volumes/<node>/pvc-<claim uid>` and the PV `pvc-<claim uid>` (a `local` volume
//!    over that folder, node affinity to the selected node, `claimRef` with the claim UID,
//!    capacity = the request, the class's reclaim policy and mount options, annotation
//!    `pv.kubernetes.io/provisioned-by`);
//! 4. the PV controller binds claim and volume.
//!
//! Reclaim `Delete`: when one of our PVs is `Released`, its folder is removed (the member's disk
//! is lost, as it should be) and the PV deleted with a UID precondition.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::mpsc;

use crate::nodes::INSTANCE_LABEL;
use crate::shared::Shared;

/// The provisioner name this kubelet serves.
pub const PROVISIONER: &str = "hostpath.csi.k8s.io";
/// Set by the scheduler on WaitForFirstConsumer claims.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set by the PV controller to hand a claim to an external provisioner.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The deprecated form of [`STORAGE_PROVISIONER`], also set by the PV controller.
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Names the provisioner on a PV; the PV controller leaves deletion to us because of it.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

enum Recheck {
    Claim(String, String),
    Volume(String),
}

/// The folder of a provisioned volume.
pub fn volume_dir(work_dir: &Path, node: &str, pv_name: &str) -> PathBuf {
    work_dir.join("volumes").join(node).join(pv_name)
}

/// The PV this provisioner creates for `claim` on `node`, or why it does not.
pub fn volume_for(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    folder: &Path,
    instance: &str,
) -> Result<PersistentVolume, String> {
    let uid = claim.metadata.uid.clone().ok_or("claim without uid")?;
    let spec = claim.spec.clone().unwrap_or_default();
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
        .ok_or("claim requests no storage")?;
    let annotations: BTreeMap<String, String> =
        [(PROVISIONED_BY.to_string(), PROVISIONER.to_string())].into();
    let labels: BTreeMap<String, String> =
        [(INSTANCE_LABEL.to_string(), instance.to_string())].into();
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pvc-{uid}")),
            annotations: Some(annotations),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some([("storage".to_string(), storage)].into()),
            access_modes: spec.access_modes.clone(),
            volume_mode: spec.volume_mode.clone(),
            storage_class_name: class.metadata.name.clone(),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            mount_options: class.mount_options.clone(),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: Some(uid),
                ..ObjectReference::default()
            }),
            local: Some(LocalVolumeSource {
                path: folder.display().to_string(),
                fs_type: None,
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

/// The node a claim waits to be provisioned on by us, if any.
fn wanted_node<'a>(shared: &Shared, claim: &'a PersistentVolumeClaim) -> Option<&'a str> {
    if claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = claim.spec.as_ref()?;
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return None;
    }
    if claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p != "Pending")
    {
        return None;
    }
    let ann = claim.metadata.annotations.as_ref()?;
    let handed_to_us = ann.get(STORAGE_PROVISIONER).map(String::as_str) == Some(PROVISIONER)
        || ann.get(BETA_STORAGE_PROVISIONER).map(String::as_str) == Some(PROVISIONER);
    let node = ann.get(SELECTED_NODE)?;
    (handed_to_us && shared.owns_node(node)).then_some(node.as_str())
}

async fn provision(shared: &Shared, claim: &PersistentVolumeClaim) -> Result<(), String> {
    let Some(node) = wanted_node(shared, claim) else {
        return Ok(());
    };
    let class_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .ok_or("claim without storageClassName")?;
    let class = Api::<StorageClass>::all(shared.client.clone())
        .get(&class_name)
        .await
        .map_err(|e| format!("reading storageclass {class_name}: {e}"))?;
    if class.provisioner != PROVISIONER {
        return Ok(());
    }
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = format!("pvc-{uid}");
    let folder = volume_dir(&shared.args.work_dir, node, &pv_name);
    std::fs::create_dir_all(&folder).map_err(|e| format!("creating {}: {e}", folder.display()))?;
    let pv = volume_for(claim, &class, node, &folder, &shared.args.node_prefix)?;
    match Api::<PersistentVolume>::all(shared.client.clone())
        .create(&PostParams::default(), &pv)
        .await
    {
        Ok(_) => {
            tracing::info!(claim = %format!("{}/{}", claim.metadata.namespace.as_deref().unwrap_or_default(), claim.metadata.name.as_deref().unwrap_or_default()), pv = %pv_name, %node, folder = %folder.display(), "provisioned volume");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("creating persistentvolume {pv_name}: {e}")),
    }
}

fn ours(shared: &Shared, pv: &PersistentVolume) -> bool {
    let labels = pv.metadata.labels.as_ref();
    let ann = pv.metadata.annotations.as_ref();
    labels.and_then(|l| l.get(INSTANCE_LABEL)) == Some(&shared.args.node_prefix)
        && ann.and_then(|a| a.get(PROVISIONED_BY)).map(String::as_str) == Some(PROVISIONER)
}

async fn reclaim(shared: &Shared, pv: &PersistentVolume) -> Result<(), String> {
    if !ours(shared, pv) || pv.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let spec = pv.spec.as_ref();
    let policy = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    if phase != Some("Released") || policy != Some("Delete") {
        return Ok(());
    }
    let name = pv.metadata.name.clone().unwrap_or_default();
    if let Some(path) = spec
        .and_then(|s| s.local.as_ref())
        .map(|l| PathBuf::from(&l.path))
    {
        // Only ever remove folders this kubelet made.
        if path.starts_with(shared.args.work_dir.join("volumes")) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("removing {}: {e}", path.display())),
            }
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pv.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<PersistentVolume>::all(shared.client.clone())
        .delete(&name, &params)
        .await
    {
        Ok(_) => {
            tracing::info!(pv = %name, "reclaimed volume (folder removed, PV deleted)");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(format!("deleting persistentvolume {name}: {e}")),
    }
}

fn retry_later(tx: &mpsc::UnboundedSender<Recheck>, what: Recheck, error: String) {
    tracing::warn!(%error, "provisioner: retrying in 2s");
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = tx.send(what);
    });
}

/// Runs the provisioner until shutdown.
pub async fn run(shared: Arc<Shared>) {
    let claims_api = Api::<PersistentVolumeClaim>::all(shared.client.clone());
    let volumes_api = Api::<PersistentVolume>::all(shared.client.clone());
    let mut claims = watcher(claims_api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let selector = format!("{INSTANCE_LABEL}={}", shared.args.node_prefix);
    let mut volumes = watcher(
        volumes_api.clone(),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let (tx, mut rx) = mpsc::unbounded_channel::<Recheck>();
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.changed() => if *shutdown.borrow() { return },
            Some(claim) = claims.next() => match claim {
                Ok(claim) => if let Err(e) = provision(&shared, &claim).await {
                    let key = Recheck::Claim(claim.metadata.namespace.clone().unwrap_or_default(), claim.metadata.name.clone().unwrap_or_default());
                    retry_later(&tx, key, e);
                },
                Err(e) => tracing::warn!(error = %e, "claim watch error (retrying)"),
            },
            Some(pv) = volumes.next() => match pv {
                Ok(pv) => if let Err(e) = reclaim(&shared, &pv).await {
                    retry_later(&tx, Recheck::Volume(pv.metadata.name.clone().unwrap_or_default()), e);
                },
                Err(e) => tracing::warn!(error = %e, "volume watch error (retrying)"),
            },
            Some(recheck) = rx.recv() => match recheck {
                Recheck::Claim(ns, name) => {
                    let api = Api::<PersistentVolumeClaim>::namespaced(shared.client.clone(), &ns);
                    if let Ok(Some(claim)) = api.get_opt(&name).await {
                        if let Err(e) = provision(&shared, &claim).await {
                            retry_later(&tx, Recheck::Claim(ns, name), e);
                        }
                    }
                }
                Recheck::Volume(name) => {
                    if let Ok(Some(pv)) = volumes_api.get_opt(&name).await {
                        if let Err(e) = reclaim(&shared, &pv).await {
                            retry_later(&tx, Recheck::Volume(name), e);
                        }
                    }
                }
            },
        }
    }
}
