//! Per-namespace Pod watchers (behavior.md §1 "Watches", "Mapping"): started with the
//! namespace's first fleet, selected by the fleet label, so member readiness, deletion and
//! self-fencing drive reconciles without polling. An event maps to its fleet by the label's
//! UID; unknown UIDs are ignored. Cluster-wide Pod access is never needed (the fleet Role
//! grants list/watch per namespace); a refused watch just retries with backoff while the
//! fleet reports NamespaceAccessDenied.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::keys::FLEET_UID_LABEL;
use crate::api::CelldFleet;

/// Fleet index and the namespaces being watched.
pub struct PodWatch {
    client: Client,
    trigger: UnboundedSender<ObjectRef<CelldFleet>>,
    fleets: Arc<Mutex<HashMap<String, ObjectRef<CelldFleet>>>>,
    namespaces: Mutex<HashSet<String>>,
}

impl PodWatch {
    /// A watch set that sends fleet references to `trigger` (the controller's reconcile_on).
    pub fn new(client: Client, trigger: UnboundedSender<ObjectRef<CelldFleet>>) -> Self {
        Self {
            client,
            trigger,
            fleets: Arc::default(),
            namespaces: Mutex::default(),
        }
    }

    /// Records the fleet (UID → reference) and starts its namespace's watcher if needed.
    pub fn track(&self, ns: &str, name: &str, uid: &str) {
        if let Ok(mut f) = self.fleets.lock() {
            f.insert(uid.to_string(), ObjectRef::new(name).within(ns));
        }
        let first = self
            .namespaces
            .lock()
            .map(|mut n| n.insert(ns.to_string()))
            .unwrap_or(false);
        if !first {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let fleets = self.fleets.clone();
        let trigger = self.trigger.clone();
        let ns = ns.to_string();
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(FLEET_UID_LABEL);
            let mut events = watcher(api, config)
                .default_backoff()
                .touched_objects()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(pod) => {
                        let target = pod
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
                        tracing::debug!(namespace = %ns, error = %e, "Pod watch failed; retrying with backoff")
                    }
                }
            }
        });
    }
}
