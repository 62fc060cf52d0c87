//! Per-namespace watches (docs/design.md "Controller, watches and requeue"): started with the
//! namespace's first fleet and stopped with its last, selected by the fleet label, on StatefulSets,
//! Deployments, ReplicaSets, Pods, PersistentVolumeClaims, Services, NetworkPolicies and
//! PodDisruptionBudgets, so member readiness, deletion, workload rollouts, claim changes and edits
//! of owned infrastructure drive reconciles without polling. An event maps to its fleet by the
//! label's UID; unknown UIDs are ignored. Cluster-wide access is never needed (the fleet Role
//! grants list/watch per namespace); a refused watch retries with backoff while the fleet reports
//! NamespaceAccessDenied from its own reads.
//!
//! Decisions are still made from fresh reads (every guarded write and destructive step needs
//! one anyway); the watches only say *when* to look.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::api::keys::FLEET_UID_LABEL;
use crate::api::CelldFleet;

type FleetIndex = Arc<Mutex<HashMap<String, ObjectRef<CelldFleet>>>>;

/// Fleet index (UID → fleet) and the watches of each namespace.
pub struct Watches {
    client: Client,
    trigger: UnboundedSender<ObjectRef<CelldFleet>>,
    fleets: FleetIndex,
    namespaces: Mutex<HashMap<String, Vec<JoinHandle<()>>>>,
}

impl Watches {
    /// A watch set that sends fleet references to `trigger` (the controller's reconcile_on).
    pub fn new(client: Client, trigger: UnboundedSender<ObjectRef<CelldFleet>>) -> Self {
        Self {
            client,
            trigger,
            fleets: Arc::default(),
            namespaces: Mutex::default(),
        }
    }

    /// Records the fleet (UID → reference) and starts its namespace's watches if needed.
    pub fn track(&self, ns: &str, name: &str, uid: &str) {
        if let Ok(mut f) = self.fleets.lock() {
            f.insert(uid.to_string(), ObjectRef::new(name).within(ns));
        }
        let Ok(mut namespaces) = self.namespaces.lock() else {
            return;
        };
        if namespaces.contains_key(ns) {
            return;
        }
        let handles = vec![
            self.spawn::<Pod>(ns),
            self.spawn::<StatefulSet>(ns),
            self.spawn::<Deployment>(ns),
            self.spawn::<ReplicaSet>(ns),
            self.spawn::<PersistentVolumeClaim>(ns),
            self.spawn::<Service>(ns),
            self.spawn::<NetworkPolicy>(ns),
            self.spawn::<PodDisruptionBudget>(ns),
        ];
        tracing::debug!(namespace = ns, "started the namespace's watches");
        namespaces.insert(ns.to_string(), handles);
    }

    /// Forgets a fleet that is gone; the namespace's watches stop with its last fleet.
    pub fn forget(&self, ns: &str, name: &str) {
        let still_used = match self.fleets.lock() {
            Ok(mut f) => {
                f.retain(|_, r| !(r.name == name && r.namespace.as_deref() == Some(ns)));
                f.values().any(|r| r.namespace.as_deref() == Some(ns))
            }
            Err(_) => true,
        };
        if still_used {
            return;
        }
        if let Some(handles) = self.namespaces.lock().ok().and_then(|mut n| n.remove(ns)) {
            for h in handles {
                h.abort();
            }
            tracing::debug!(namespace = ns, "stopped the namespace's watches");
        }
    }

    /// Namespaces being watched (for tests and metrics).
    pub fn namespaces(&self) -> HashSet<String> {
        self.namespaces
            .lock()
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn spawn<K>(&self, ns: &str) -> JoinHandle<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let fleets = self.fleets.clone();
        let trigger = self.trigger.clone();
        let ns = ns.to_string();
        tokio::spawn(async move {
            let kind = K::kind(&K::DynamicType::default()).to_string();
            let config = watcher::Config::default().labels(FLEET_UID_LABEL);
            let mut events = watcher(api, config)
                .default_backoff()
                .touched_objects()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(obj) => {
                        let target = obj
                            .labels()
                            .get(FLEET_UID_LABEL)
                            .and_then(|uid| fleets.lock().ok()?.get(uid).cloned());
                        if let Some(fleet) = target {
                            if trigger.send(fleet).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(namespace = %ns, kind, error = %e, "watch failed; retrying with backoff")
                    }
                }
            }
        })
    }
}
