//! Pod volumes as host folders (processes cannot mount anything, so each volume is a folder and
//! the container learns it through env, see `pods::worker`).
//!
//! | Volume | Host folder |
//! |---|---|
//! | `emptyDir` | `<pod dir>/volumes/<name>`, fresh per Pod incarnation, removed when it ends |
//! | `persistentVolumeClaim`, `ephemeral` | the bound PV's `local.path` / `hostPath.path` (waits until Bound) |
//! | `hostPath` | the path itself |
//! | `configMap`, `secret`, `downwardAPI` | `<pod dir>/volumes/<name>` with one file per key / item, written once at start |
//! | `projected` | as above for its `configMap`, `secret` and `downwardAPI` sources; `serviceAccountToken` (and trust-bundle / certificate) sources are skipped: no token file is written, members never call the API server |
//!
//! Other volume types are not modelled: the Pod stays Pending (`ContainerCreating`) with a message.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    Secret, Volume,
};
use kube::{Api, Client};

/// The host folder of every volume of a Pod incarnation.
#[derive(Debug, Clone, Default)]
pub struct VolumeDirs {
    /// Volume name → host folder.
    pub dirs: HashMap<String, PathBuf>,
    /// Folders owned by this incarnation (removed when it ends): emptyDir and generated ones.
    pub owned: Vec<PathBuf>,
}

fn write_files(dir: &Path, files: BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for (rel, data) in files {
        if rel.split('/').any(|seg| seg == "..") || rel.starts_with('/') {
            return Err(format!("volume item path {rel:?} escapes the volume"));
        }
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, data).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn select_items(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    match items {
        None => Ok(data),
        Some(items) => items
            .iter()
            .map(|i| {
                data.get(&i.key)
                    .map(|v| (i.path.clone(), v.clone()))
                    .ok_or_else(|| format!("key {:?} not found", i.key))
            })
            .collect(),
    }
}

async fn secret_data(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading secret {name}: {e}"))?;
    Ok(secret.map(|s| {
        let mut data: BTreeMap<String, Vec<u8>> = s
            .string_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, v) in s.data.unwrap_or_default() {
            data.insert(k, v.0);
        }
        data
    }))
}

async fn config_map_data(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading configmap {name}: {e}"))?;
    Ok(cm.map(|c| {
        let mut data: BTreeMap<String, Vec<u8>> = c
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, v) in c.binary_data.unwrap_or_default() {
            data.insert(k, v.0);
        }
        data
    }))
}

fn downward_files(
    pod: &Pod,
    facts: &super::env::PodFacts,
    items: &[DownwardAPIVolumeFile],
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut files = BTreeMap::new();
    for item in items {
        let Some(field) = &item.field_ref else {
            return Err(format!(
                "downwardAPI item {}: only fieldRef is modelled",
                item.path
            ));
        };
        let value = match field.field_path.as_str() {
            "metadata.labels" | "metadata.annotations" => {
                let map = if field.field_path == "metadata.labels" {
                    &pod.metadata.labels
                } else {
                    &pod.metadata.annotations
                };
                map.iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={v:?}\n"))
                    .collect::<String>()
            }
            path => {
                let var = k8s_openapi::api::core::v1::EnvVar {
                    name: "X".into(),
                    value: None,
                    value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                        field_ref: Some(field.clone()),
                        ..Default::default()
                    }),
                };
                let container = k8s_openapi::api::core::v1::Container {
                    env: Some(vec![var]),
                    ..Default::default()
                };
                super::env::resolve(&container, pod, facts, &super::env::Sources::default())
                    .map_err(|e| format!("downwardAPI {path}: {e}"))?
                    .get("X")
                    .unwrap_or_default()
                    .to_string()
            }
        };
        files.insert(item.path.clone(), value.into_bytes());
    }
    Ok(files)
}

async fn claim_folder(client: &Client, ns: &str, claim: &str) -> Result<PathBuf, String> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(claim)
        .await
        .map_err(|e| format!("reading claim {claim}: {e}"))?
        .ok_or_else(|| format!("persistentvolumeclaim {claim:?} not found"))?;
    let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
    let (Some("Bound"), Some(pv_name)) = (phase.as_deref(), pv_name) else {
        return Err(format!("persistentvolumeclaim {claim:?} is not bound"));
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await
        .map_err(|e| format!("reading persistentvolume {pv_name}: {e}"))?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .local
        .map(|l| l.path)
        .or(spec.host_path.map(|h| h.path))
        .ok_or_else(|| {
            format!("persistentvolume {pv_name} is neither local nor hostPath (not modelled)")
        })?;
    let path = PathBuf::from(path);
    if !path.is_dir() {
        return Err(format!(
            "persistentvolume {pv_name}: folder {} does not exist",
            path.display()
        ));
    }
    Ok(path)
}

/// Prepares every volume of `pod` under `pod_dir`; an error leaves the Pod in `ContainerCreating`
/// and is retried.
pub async fn prepare(
    client: &Client,
    pod: &Pod,
    facts: &super::env::PodFacts,
    pod_dir: &Path,
) -> Result<VolumeDirs, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mut out = VolumeDirs::default();
    let volumes: Vec<Volume> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in volumes {
        let generated = pod_dir.join("volumes").join(&v.name);
        let dir = if v.empty_dir.is_some() {
            std::fs::create_dir_all(&generated)
                .map_err(|e| format!("creating {}: {e}", generated.display()))?;
            out.owned.push(generated.clone());
            generated
        } else if let Some(pvc) = &v.persistent_volume_claim {
            claim_folder(client, &ns, &pvc.claim_name).await?
        } else if v.ephemeral.is_some() {
            claim_folder(client, &ns, &format!("{pod_name}-{}", v.name)).await?
        } else if let Some(hp) = &v.host_path {
            PathBuf::from(&hp.path)
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let data = match secret_data(client, &ns, &name).await? {
                Some(d) => select_items(d, s.items.as_ref())?,
                None if s.optional.unwrap_or(false) => BTreeMap::new(),
                None => return Err(format!("secret {name:?} not found")),
            };
            write_files(&generated, data)?;
            out.owned.push(generated.clone());
            generated
        } else if let Some(c) = &v.config_map {
            let data = match config_map_data(client, &ns, &c.name).await? {
                Some(d) => select_items(d, c.items.as_ref())?,
                None if c.optional.unwrap_or(false) => BTreeMap::new(),
                None => return Err(format!("configmap {:?} not found", c.name)),
            };
            write_files(&generated, data)?;
            out.owned.push(generated.clone());
            generated
        } else if let Some(d) = &v.downward_api {
            let files = downward_files(pod, facts, d.items.as_deref().unwrap_or_default())?;
            write_files(&generated, files)?;
            out.owned.push(generated.clone());
            generated
        } else if let Some(p) = &v.projected {
            let mut files = BTreeMap::new();
            for source in p.sources.iter().flatten() {
                if let Some(s) = &source.secret {
                    if let Some(d) = secret_data(client, &ns, &s.name).await? {
                        files.extend(select_items(d, s.items.as_ref())?);
                    }
                }
                if let Some(c) = &source.config_map {
                    if let Some(d) = config_map_data(client, &ns, &c.name).await? {
                        files.extend(select_items(d, c.items.as_ref())?);
                    }
                }
                if let Some(d) = &source.downward_api {
                    files.extend(downward_files(
                        pod,
                        facts,
                        d.items.as_deref().unwrap_or_default(),
                    )?);
                }
                // serviceAccountToken, clusterTrustBundle, podCertificate: not written.
            }
            write_files(&generated, files)?;
            out.owned.push(generated.clone());
            generated
        } else {
            return Err(format!(
                "volume {:?}: this volume type is not modelled by the test kubelet",
                v.name
            ));
        };
        out.dirs.insert(v.name.clone(), dir);
    }
    Ok(out)
}

/// Reads the Secrets and ConfigMaps named in `names` (for env resolution); missing ones map to
/// `None`.
pub async fn env_sources(
    client: &Client,
    ns: &str,
    secrets: impl IntoIterator<Item = String>,
    config_maps: impl IntoIterator<Item = String>,
) -> Result<super::env::Sources, String> {
    let lossy = |d: BTreeMap<String, Vec<u8>>| {
        d.into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect::<BTreeMap<_, _>>()
    };
    let mut sources = super::env::Sources::default();
    for name in secrets {
        let data = secret_data(client, ns, &name).await?;
        sources.secrets.insert(name, data.map(lossy));
    }
    for name in config_maps {
        let data = config_map_data(client, ns, &name).await?;
        sources.config_maps.insert(name, data.map(lossy));
    }
    Ok(sources)
}
