//! Identity snapshots (docs/design.md "Oracles"): Pod UIDs and IPs, claim UIDs and the PV bound to
//! each claim, taken before and after a scenario, so a test can prove what was kept and what is
//! fresh.

use std::collections::BTreeMap;

use anyhow::Result;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::{Api, Client};

/// One Pod incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// UID.
    pub uid: String,
    /// Pod IP, once assigned.
    pub ip: Option<String>,
    /// Node.
    pub node: Option<String>,
    /// Being deleted.
    pub terminating: bool,
}

/// One claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdentity {
    /// UID.
    pub uid: String,
    /// Bound PV name (`spec.volumeName`).
    pub volume: Option<String>,
    /// Being deleted.
    pub terminating: bool,
}

/// Pods (by name) and claims (by name) of one namespace at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentitySnapshot {
    /// Pods matching the selector.
    pub pods: BTreeMap<String, PodIdentity>,
    /// Every claim in the namespace.
    pub claims: BTreeMap<String, ClaimIdentity>,
}

impl IdentitySnapshot {
    /// Reads the Pods matching `label_selector` (empty: all) and every claim of `ns`.
    pub async fn capture(client: &Client, ns: &str, label_selector: &str) -> Result<Self> {
        let mut lp = ListParams::default();
        if !label_selector.is_empty() {
            lp = lp.labels(label_selector);
        }
        let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await?;
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        Ok(Self {
            pods: pods
                .items
                .into_iter()
                .map(|p| {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let id = PodIdentity {
                        uid: p.metadata.uid.clone().unwrap_or_default(),
                        ip: p.status.as_ref().and_then(|s| s.pod_ip.clone()),
                        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        terminating: p.metadata.deletion_timestamp.is_some(),
                    };
                    (name, id)
                })
                .collect(),
            claims: claims
                .items
                .into_iter()
                .map(|c| {
                    let name = c.metadata.name.clone().unwrap_or_default();
                    let id = ClaimIdentity {
                        uid: c.metadata.uid.clone().unwrap_or_default(),
                        volume: c.spec.as_ref().and_then(|s| s.volume_name.clone()),
                        terminating: c.metadata.deletion_timestamp.is_some(),
                    };
                    (name, id)
                })
                .collect(),
        })
    }

    /// Claim name → bound PV name.
    pub fn volumes(&self) -> BTreeMap<String, String> {
        self.claims
            .iter()
            .filter_map(|(n, c)| c.volume.clone().map(|v| (n.clone(), v)))
            .collect()
    }

    /// Compares with a later snapshot.
    pub fn diff(&self, after: &IdentitySnapshot) -> IdentityDiff {
        let mut d = IdentityDiff::default();
        for (name, before) in &self.pods {
            match after.pods.get(name) {
                Some(a) if a.uid == before.uid => d.pods_kept.push(name.clone()),
                Some(_) => d.pods_replaced.push(name.clone()),
                None => d.pods_gone.push(name.clone()),
            }
        }
        d.pods_new = after
            .pods
            .keys()
            .filter(|n| !self.pods.contains_key(*n))
            .cloned()
            .collect();
        for (name, before) in &self.claims {
            match after.claims.get(name) {
                Some(a) if a.uid == before.uid => d.claims_kept.push(name.clone()),
                Some(_) => d.claims_replaced.push(name.clone()),
                None => d.claims_gone.push(name.clone()),
            }
            match (
                before.volume.as_ref(),
                after.claims.get(name).and_then(|a| a.volume.as_ref()),
            ) {
                (Some(b), Some(a)) if a == b => d.volumes_kept.push(b.clone()),
                (Some(b), _) => d.volumes_replaced.push(b.clone()),
                _ => {}
            }
        }
        d.claims_new = after
            .claims
            .keys()
            .filter(|n| !self.claims.contains_key(*n))
            .cloned()
            .collect();
        d
    }
}

/// What changed between two snapshots (names are Pod / claim names; volumes are PV names of
/// the earlier snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityDiff {
    /// Same name, same UID.
    pub pods_kept: Vec<String>,
    /// Same name, new UID (a new incarnation).
    pub pods_replaced: Vec<String>,
    /// No longer present.
    pub pods_gone: Vec<String>,
    /// Only in the later snapshot.
    pub pods_new: Vec<String>,
    /// Same name, same UID.
    pub claims_kept: Vec<String>,
    /// Same name, new UID (the disk is fresh).
    pub claims_replaced: Vec<String>,
    /// No longer present.
    pub claims_gone: Vec<String>,
    /// Only in the later snapshot.
    pub claims_new: Vec<String>,
    /// PVs still bound to the same claim name.
    pub volumes_kept: Vec<String>,
    /// PVs no longer bound to their claim name.
    pub volumes_replaced: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodIdentity {
        PodIdentity {
            uid: uid.into(),
            ip: None,
            node: None,
            terminating: false,
        }
    }

    fn claim(uid: &str, pv: &str) -> ClaimIdentity {
        ClaimIdentity {
            uid: uid.into(),
            volume: Some(pv.into()),
            terminating: false,
        }
    }

    #[test]
    fn diff_names_kept_and_fresh_identities() {
        let before = IdentitySnapshot {
            pods: [("a".into(), pod("1")), ("b".into(), pod("2"))].into(),
            claims: [
                ("data-a".into(), claim("c1", "pv1")),
                ("data-b".into(), claim("c2", "pv2")),
            ]
            .into(),
        };
        let after = IdentitySnapshot {
            pods: [("a".into(), pod("1")), ("b".into(), pod("3"))].into(),
            claims: [
                ("data-a".into(), claim("c1", "pv1")),
                ("data-b".into(), claim("c4", "pv4")),
            ]
            .into(),
        };
        let d = before.diff(&after);
        assert_eq!(d.pods_kept, vec!["a"]);
        assert_eq!(d.pods_replaced, vec!["b"]);
        assert_eq!(d.claims_kept, vec!["data-a"]);
        assert_eq!(d.claims_replaced, vec!["data-b"]);
        assert_eq!(d.volumes_kept, vec!["pv1"]);
        assert_eq!(d.volumes_replaced, vec!["pv2"]);
        assert!(d.pods_gone.is_empty() && d.pods_new.is_empty());
    }
}
