//! The live workload `<f>`: a StatefulSet or a Deployment, read fresh and written with
//! its resourceVersion (compare-and-swap).

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams, Preconditions, PropagationPolicy};
use kube::Client;

use crate::api::keys::EFFECT_ANNOTATION;
use crate::render::Workload;

/// The workload as the API server holds it.
#[derive(Clone, Debug)]
pub enum LiveWorkload {
    /// A StatefulSet.
    StatefulSet(Box<StatefulSet>),
    /// A Deployment.
    Deployment(Box<Deployment>),
}

impl LiveWorkload {
    /// Metadata.
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Self::StatefulSet(s) => &s.metadata,
            Self::Deployment(d) => &d.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::StatefulSet(s) => &mut s.metadata,
            Self::Deployment(d) => &mut d.metadata,
        }
    }
    /// `celld.eric.dev/effect`.
    pub fn marker(&self) -> Option<&str> {
        self.meta()
            .annotations
            .as_ref()?
            .get(EFFECT_ANNOTATION)
            .map(String::as_str)
    }
    /// Owned: fleet label with this UID, no owner references, not deleting (docs/design.md
    /// "Terms").
    pub fn owned_by(&self, fleet_uid: &str) -> bool {
        let owned = match self {
            Self::StatefulSet(s) => super::owned(s.as_ref(), fleet_uid),
            Self::Deployment(d) => super::owned(d.as_ref(), fleet_uid),
        };
        owned && self.meta().deletion_timestamp.is_none()
    }
    /// `spec.replicas` (Kubernetes defaults it to 1).
    pub fn replicas(&self) -> i32 {
        match self {
            Self::StatefulSet(s) => s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            Self::Deployment(d) => d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        }
    }
    /// Sets `spec.replicas`.
    pub fn set_replicas(&mut self, n: i32) {
        match self {
            Self::StatefulSet(s) => s.spec.get_or_insert_with(Default::default).replicas = Some(n),
            Self::Deployment(d) => d.spec.get_or_insert_with(Default::default).replicas = Some(n),
        }
    }
    /// The Pod template.
    pub fn template(&self) -> Option<&PodTemplateSpec> {
        match self {
            Self::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
            Self::Deployment(d) => d.spec.as_ref().map(|s| &s.template),
        }
    }
    /// Replaces the operator-owned fields with the rendering's (template and rollout
    /// strategy; immutable StatefulSet fields are rendered identically and left alone).
    pub fn take_owned_fields(&mut self, rendered: &Workload) {
        match (self, rendered) {
            (Self::StatefulSet(live), Workload::StatefulSet(want)) => {
                let (l, w) = (
                    live.spec.get_or_insert_with(Default::default),
                    want.spec.clone().unwrap_or_default(),
                );
                l.template = w.template;
                l.update_strategy = w.update_strategy;
                l.persistent_volume_claim_retention_policy =
                    w.persistent_volume_claim_retention_policy;
            }
            (Self::Deployment(live), Workload::Deployment(want)) => {
                let (l, w) = (
                    live.spec.get_or_insert_with(Default::default),
                    want.spec.clone().unwrap_or_default(),
                );
                l.template = w.template;
                l.strategy = w.strategy;
            }
            _ => {}
        }
    }
    /// Sets the effect marker in the workload's metadata (never the template).
    pub fn set_marker(&mut self, effect: &str) {
        self.meta_mut()
            .annotations
            .get_or_insert_with(Default::default)
            .insert(EFFECT_ANNOTATION.into(), effect.into());
    }
    /// Sets the fence annotation (see [`crate::api::keys::FENCE_ANNOTATION`]).
    pub fn set_fence(&mut self, value: &str) {
        self.meta_mut()
            .annotations
            .get_or_insert_with(Default::default)
            .insert(crate::api::keys::FENCE_ANNOTATION.into(), value.into());
    }
    /// Rolled out (docs/design.md "Terms") at `replicas`.
    pub fn rolled_out(&self) -> bool {
        let generation = self.meta().generation.unwrap_or(0);
        match self {
            Self::StatefulSet(s) => {
                let want = self.replicas();
                let Some(st) = s.status.as_ref() else {
                    return false;
                };
                st.observed_generation.unwrap_or(0) >= generation
                    && st.replicas == want
                    && st.updated_replicas.unwrap_or(0) == want
                    && st.ready_replicas.unwrap_or(0) == want
                    && st.current_revision.is_some()
                    && st.current_revision == st.update_revision
            }
            Self::Deployment(d) => {
                let want = self.replicas();
                let Some(st) = d.status.as_ref() else {
                    return false;
                };
                st.observed_generation.unwrap_or(0) >= generation
                    && st.replicas.unwrap_or(0) == want
                    && st.updated_replicas.unwrap_or(0) == want
                    && st.ready_replicas.unwrap_or(0) == want
            }
        }
    }
    /// The workload controller has observed the current spec.
    pub fn observed_current(&self) -> bool {
        let generation = self.meta().generation.unwrap_or(0);
        let observed = match self {
            Self::StatefulSet(s) => s.status.as_ref().and_then(|s| s.observed_generation),
            Self::Deployment(d) => d.status.as_ref().and_then(|s| s.observed_generation),
        };
        observed.unwrap_or(0) >= generation
    }
    /// `status.readyReplicas`, or 0 while the status is stale.
    pub fn ready_replicas(&self) -> i32 {
        if !self.observed_current() {
            return 0;
        }
        match self {
            Self::StatefulSet(s) => s
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
            Self::Deployment(d) => d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
        }
    }
}

/// Fresh GET of `<f>` of the kind the fleet uses.
pub async fn get(
    client: &Client,
    ns: &str,
    name: &str,
    statefulset: bool,
) -> Result<Option<LiveWorkload>, kube::Error> {
    Ok(if statefulset {
        Api::<StatefulSet>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .map(|s| LiveWorkload::StatefulSet(Box::new(s)))
    } else {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .map(|d| LiveWorkload::Deployment(Box::new(d)))
    })
}

/// Creates the rendered workload with the effect marker.
pub async fn create(
    client: &Client,
    ns: &str,
    mut rendered: Workload,
    marker: &str,
) -> Result<LiveWorkload, kube::Error> {
    let pp = PostParams::default();
    match &mut rendered {
        Workload::StatefulSet(s) => {
            s.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(EFFECT_ANNOTATION.into(), marker.into());
            let created = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .create(&pp, s)
                .await?;
            Ok(LiveWorkload::StatefulSet(Box::new(created)))
        }
        Workload::Deployment(d) => {
            d.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(EFFECT_ANNOTATION.into(), marker.into());
            let created = Api::<Deployment>::namespaced(client.clone(), ns)
                .create(&pp, d)
                .await?;
            Ok(LiveWorkload::Deployment(Box::new(created)))
        }
    }
}

/// Full update carrying the read resourceVersion (a conflict is a 409, never retried here).
pub async fn replace(
    client: &Client,
    ns: &str,
    live: &LiveWorkload,
) -> Result<LiveWorkload, kube::Error> {
    let pp = PostParams::default();
    let name = live.meta().name.clone().unwrap_or_default();
    Ok(match live {
        LiveWorkload::StatefulSet(s) => LiveWorkload::StatefulSet(Box::new(
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .replace(&name, &pp, s)
                .await?,
        )),
        LiveWorkload::Deployment(d) => LiveWorkload::Deployment(Box::new(
            Api::<Deployment>::namespaced(client.clone(), ns)
                .replace(&name, &pp, d)
                .await?,
        )),
    })
}

/// A person's repair (`journal adopt`): the workload as read, with its effect marker set to
/// `marker` (or removed), written back with the read resourceVersion; nothing else changes.
pub async fn set_marker_guarded(
    client: &Client,
    ns: &str,
    live: &LiveWorkload,
    marker: Option<&str>,
) -> Result<LiveWorkload, kube::Error> {
    let mut w = live.clone();
    match marker {
        Some(m) => w.set_marker(m),
        None => {
            if let Some(a) = w.meta_mut().annotations.as_mut() {
                a.remove(EFFECT_ANNOTATION);
            }
        }
    }
    replace(client, ns, &w).await
}

/// Foreground delete with UID and resourceVersion preconditions.
pub async fn delete(client: &Client, ns: &str, live: &LiveWorkload) -> Result<(), kube::Error> {
    let m = live.meta();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    let name = m.name.clone().unwrap_or_default();
    match live {
        LiveWorkload::StatefulSet(_) => {
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .delete(&name, &dp)
                .await?;
        }
        LiveWorkload::Deployment(_) => {
            Api::<Deployment>::namespaced(client.clone(), ns)
                .delete(&name, &dp)
                .await?;
        }
    }
    Ok(())
}
