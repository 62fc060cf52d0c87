//! Per-namespace watches and caches (docs/design.md "Controller, watches and requeue",
//! "Caches and the two passes"): started with the namespace's first fleet and stopped with
//! its last, selected by the fleet label, on StatefulSets, Deployments, ReplicaSets, Pods,
//! PersistentVolumeClaims, Services, NetworkPolicies and PodDisruptionBudgets, so member
//! readiness, deletion, workload rollouts, claim changes and edits of owned infrastructure
//! drive reconciles without polling. An event maps to its fleet by the label's UID; unknown
//! UIDs are ignored. Cluster-wide access is never needed (the fleet Role grants list/watch per
//! namespace); a refused watch retries with backoff while the fleet reports
//! NamespaceAccessDenied from its own reads.
//!
//! With `--watch-scope cluster` ([`WatchScope::Cluster`]) the labelled kinds are watched once
//! across the cluster instead, started with the first fleet and kept; each namespace reads
//! those shared stores through views of its own namespace ([`CompactStore::scoped`]), and only
//! its ServiceAccount watch is its own.
//!
//! Each watch but the ReplicaSets' feeds a reflector store ([`NsCache`]) that a reconcile's
//! cached pass reads (`crate::pass`); the store is updated before the event triggers the
//! reconcile, so the object that caused a reconcile is never older in the cache than in the
//! event. ReplicaSets are watched for their metadata only (they only say *when* to look).
//! `managedFields` are dropped from cached objects (nothing reads them), and a cached Pod
//! keeps only the part of its spec the reconciler reads ([`project_pod`]). Only labelled objects are cached: a by-name read that misses the cache is
//! sent to the API server (a foreign object has no fleet label).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::FutureExt;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::api::keys::{FLEET_UID_LABEL, REPLACEMENT_FLEET_LABEL};
use crate::api::{CelldFleet, CelldStorageReservation};
use crate::compact_store::CompactStore;

/// Server-side timeout of every watch, in seconds: a watch is one request until the API
/// server ends it, so this sets the at-rest request rate of the watches (each re-opens every
/// 55 minutes, resuming from its last resourceVersion). The API server sends a bookmark
/// about once a minute, so a quiet watch is never taken for a dead one.
pub const WATCH_TIMEOUT_SECS: u32 = 3300;

/// Objects per page of a cluster-wide watch's list (at start and after a watch expires). A
/// page is held deserialized, whole objects before projection, while its objects are
/// packed into the store, and every cluster-wide kind lists at once at start: with kube's
/// default of 500 a page of Pods is several MB of heap, and the small entries packed
/// meanwhile pin it in glibc's arenas after it is freed. 100 keeps a page below 1 MB of
/// JSON; 3,000 Pods list in 30 requests.
pub const CLUSTER_LIST_PAGE: u32 = 100;

/// The settings of a watch of labelled objects in `ns` (`None`: cluster-wide, listed in
/// pages of `page` objects).
fn labelled_config(ns: Option<&str>, page: u32) -> watcher::Config {
    let config = watch_config().labels(FLEET_UID_LABEL);
    match ns {
        Some(_) => config,
        None => config.page_size(page),
    }
}

/// The watch settings of every watch the operator opens (bookmarks on, [`WATCH_TIMEOUT_SECS`]).
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECS)
}

type FleetIndex = Arc<Mutex<HashMap<String, ObjectRef<CelldFleet>>>>;

/// Where the watches of the fleets' labelled objects look (`--watch-scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchScope {
    /// Each fleet namespace has its own 9 watches, started with its first fleet and stopped
    /// with its last; the fleet Role of each namespace is all they need.
    #[default]
    Namespace,
    /// One label-selected watch per kind across the cluster (8 in all, started with the first
    /// fleet and kept), plus one ServiceAccount watch per fleet namespace. Needs cluster-wide
    /// get/list/watch of those kinds (the chart's `watchScope: cluster`); writes still need
    /// each namespace's fleet Role.
    Cluster,
}

/// The watch-fed stores of the fleets' labelled objects: one namespace's, or (cluster scope)
/// every namespace's, read through [`LabelledStores::scoped`] views.
#[derive(Clone)]
struct LabelledStores {
    pods: CompactStore<Pod>,
    statefulsets: CompactStore<StatefulSet>,
    deployments: CompactStore<Deployment>,
    claims: CompactStore<PersistentVolumeClaim>,
    services: CompactStore<Service>,
    network_policies: CompactStore<NetworkPolicy>,
    pdbs: CompactStore<PodDisruptionBudget>,
}

impl LabelledStores {
    fn scoped(&self, ns: &str) -> Self {
        Self {
            pods: self.pods.scoped(ns),
            statefulsets: self.statefulsets.scoped(ns),
            deployments: self.deployments.scoped(ns),
            claims: self.claims.scoped(ns),
            services: self.services.scoped(ns),
            network_policies: self.network_policies.scoped(ns),
            pdbs: self.pdbs.scoped(ns),
        }
    }

    /// Objects held (every namespace the stores hold).
    fn len(&self) -> usize {
        self.pods.len()
            + self.statefulsets.len()
            + self.deployments.len()
            + self.claims.len()
            + self.services.len()
            + self.network_policies.len()
            + self.pdbs.len()
    }

    /// Bytes of packed JSON held.
    fn json_bytes(&self) -> usize {
        self.pods.json_bytes()
            + self.statefulsets.json_bytes()
            + self.deployments.json_bytes()
            + self.claims.json_bytes()
            + self.services.json_bytes()
            + self.network_policies.json_bytes()
            + self.pdbs.json_bytes()
    }
}

/// The cluster-wide watches of `--watch-scope cluster`: kept for the life of the process.
struct Shared {
    stores: LabelledStores,
    _handles: Vec<JoinHandle<()>>,
}

/// The watch-client shard of the cluster-wide watches (a name no namespace can have).
const CLUSTER_SHARD: &str = "*cluster*";

/// The watch-fed stores of one namespace (labelled objects only).
#[derive(Clone)]
pub struct NsCache {
    /// Pods.
    pub pods: CompactStore<Pod>,
    /// StatefulSets.
    pub statefulsets: CompactStore<StatefulSet>,
    /// Deployments.
    pub deployments: CompactStore<Deployment>,
    /// PersistentVolumeClaims.
    pub claims: CompactStore<PersistentVolumeClaim>,
    /// Services.
    pub services: CompactStore<Service>,
    /// NetworkPolicies.
    pub network_policies: CompactStore<NetworkPolicy>,
    /// PodDisruptionBudgets.
    pub pdbs: CompactStore<PodDisruptionBudget>,
    /// ServiceAccounts (metadata only, unlabelled: every one in the namespace).
    pub service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    /// StorageClasses (cluster-wide, shared by every namespace).
    pub storage_classes: Store<StorageClass>,
    /// Storage reservations (cluster-wide, shared by every namespace).
    pub reservations: Store<CelldStorageReservation>,
}

impl NsCache {
    /// Every store has completed its first list (a store that has not, e.g. because its
    /// watch is refused, is not read: the pass escalates to fresh reads).
    pub fn ready(&self) -> bool {
        fn ready<K: kube::runtime::reflector::Lookup + Clone + 'static>(s: &Store<K>) -> bool
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok())
        }
        self.pods.is_ready()
            && self.statefulsets.is_ready()
            && self.deployments.is_ready()
            && self.claims.is_ready()
            && self.services.is_ready()
            && self.network_policies.is_ready()
            && self.pdbs.is_ready()
            && ready(&self.service_accounts)
            && ready(&self.storage_classes)
            && ready(&self.reservations)
    }

    fn labelled(&self) -> LabelledStores {
        LabelledStores {
            pods: self.pods.clone(),
            statefulsets: self.statefulsets.clone(),
            deployments: self.deployments.clone(),
            claims: self.claims.clone(),
            services: self.services.clone(),
            network_policies: self.network_policies.clone(),
            pdbs: self.pdbs.clone(),
        }
    }
}

/// A kind the operator watches: every bound a watch and a store need, once.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<T> Watched for T where
    T: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// A kind with a store in [`NsCache`].
pub trait Cached:
    Watched + serde::Serialize + Resource<Scope = k8s_openapi::NamespaceResourceScope>
{
    /// This kind's store.
    fn store(cache: &NsCache) -> &CompactStore<Self>;

    /// Trims an object before it is stored to what a cached pass reads: `managedFields`
    /// always (nothing reads them), more for kinds with a [`project_pod`]-like projection.
    fn project(&mut self) {
        self.meta_mut().managed_fields = None;
    }
}

macro_rules! cached {
    ($($kind:ty => $field:ident),* $(,)?) => {
        $(impl Cached for $kind {
            fn store(cache: &NsCache) -> &CompactStore<Self> {
                &cache.$field
            }
        })*
    };
}
cached!(
    StatefulSet => statefulsets,
    Deployment => deployments,
    PersistentVolumeClaim => claims,
    Service => services,
    NetworkPolicy => network_policies,
    PodDisruptionBudget => pdbs,
);

impl Cached for Pod {
    fn store(cache: &NsCache) -> &CompactStore<Self> {
        &cache.pods
    }

    fn project(&mut self) {
        project_pod(self);
    }
}

/// A cached Pod keeps its metadata (`managedFields` aside), its status, and of its spec only
/// what the reconciler reads from a Pod: `nodeName` (placed or not), the claim-backed volumes
/// (which claim a member mounts), `schedulingGates` and `nodeSelector` (the Bucket zone gate).
/// Containers, probes, environment, tolerations, affinity and the rest are dropped: they are
/// most of a Pod's size, they come from the workload's template (cached whole), and every
/// write to a Pod is made by a fresh pass from a fresh read. Tested by
/// `a_projected_pod_keeps_what_the_reconciler_reads`.
pub fn project_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name,
            node_selector: spec.node_selector,
            scheduling_gates: spec.scheduling_gates,
            volumes: spec.volumes.map(|vs| {
                vs.into_iter()
                    .filter(|v| v.persistent_volume_claim.is_some())
                    .map(|v| k8s_openapi::api::core::v1::Volume {
                        name: v.name,
                        persistent_volume_claim: v.persistent_volume_claim,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        });
    }
}

struct Namespace {
    cache: NsCache,
    handles: Vec<JoinHandle<()>>,
}

/// Fleet index (UID → fleet) and the watches and caches of each namespace.
pub struct Watches {
    client: Client,
    trigger: UnboundedSender<ObjectRef<CelldFleet>>,
    fleets: FleetIndex,
    namespaces: Mutex<HashMap<String, Namespace>>,
    /// Cluster-wide stores, started with the first namespace.
    cluster: Mutex<Option<ClusterStores>>,
    /// Feed the stores (off with `--test-fresh-reads`: the watches only trigger, and the
    /// stores stay empty and never ready, as before the caches).
    stores: bool,
    /// HTTP/2 clients shared by the namespaces' watches (none: each watch uses `client`, one
    /// HTTP/1.1 connection per watch).
    watch_clients: Option<Arc<crate::watch_clients::WatchClients>>,
    /// Per namespace or cluster-wide watches of the labelled objects.
    scope: WatchScope,
    /// The cluster-wide stores of `WatchScope::Cluster`, started with the first fleet.
    shared: Mutex<Option<Shared>>,
    /// `--watch-namespaces`: a cluster-wide store keeps only objects of these (`None`: all).
    only: Option<Arc<HashSet<String>>>,
    /// Objects per page of a cluster-wide list.
    list_page: u32,
    /// kube-runtime's `watcher` instead of [`crate::watch_stream::watch`]
    /// (`--test-kube-watcher`).
    kube_watcher: bool,
}

#[derive(Clone)]
struct ClusterStores {
    storage_classes: Store<StorageClass>,
    reservations: Store<CelldStorageReservation>,
}

impl Watches {
    /// A watch set that sends fleet references to `trigger` (the controller's reconcile_on).
    pub fn new(client: Client, trigger: UnboundedSender<ObjectRef<CelldFleet>>) -> Self {
        Self {
            client,
            trigger,
            fleets: Arc::default(),
            namespaces: Mutex::default(),
            cluster: Mutex::default(),
            stores: true,
            watch_clients: None,
            scope: WatchScope::Namespace,
            shared: Mutex::default(),
            only: None,
            list_page: CLUSTER_LIST_PAGE,
            kube_watcher: false,
        }
    }

    /// Watches through kube-runtime's `watcher` (`--test-kube-watcher`: the design before
    /// [`crate::watch_stream`], for the benchmark's side-by-side figures).
    pub fn with_kube_watcher(mut self, kube: bool) -> Self {
        self.kube_watcher = kube;
        self
    }

    /// Objects per page of a cluster-wide list (`--test-cluster-list-page`).
    pub fn with_list_page(mut self, page: u32) -> Self {
        self.list_page = page;
        self
    }

    /// A cluster-wide store keeps the objects of `namespaces` only (`--watch-namespaces`;
    /// empty: every namespace).
    pub fn within(mut self, namespaces: &[String]) -> Self {
        self.only =
            (!namespaces.is_empty()).then(|| Arc::new(namespaces.iter().cloned().collect()));
        self
    }

    /// Watches the labelled objects per namespace or cluster-wide.
    pub fn with_scope(mut self, scope: WatchScope) -> Self {
        self.scope = scope;
        self
    }

    /// The namespaces' watches go through these shared HTTP/2 clients.
    pub fn with_watch_clients(mut self, clients: crate::watch_clients::WatchClients) -> Self {
        self.watch_clients = Some(Arc::new(clients));
        self
    }

    /// HTTP/2 connections carrying namespace watches (0 when every watch has its own).
    pub fn watch_connections(&self) -> usize {
        self.watch_clients.as_ref().map_or(0, |c| c.connections())
    }

    /// Watches that only trigger reconciles and keep no objects (`--test-fresh-reads`).
    pub fn without_stores(mut self) -> Self {
        self.stores = false;
        self
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
        let Some(cluster) = self.cluster_stores() else {
            return;
        };
        let labelled = match self.scope {
            WatchScope::Namespace => None,
            WatchScope::Cluster => match self.shared_stores() {
                Some(shared) => Some(shared.scoped(ns)),
                None => return,
            },
        };
        let client = &self.watch_client(ns);
        let mut handles = Vec::new();
        let labelled = match labelled {
            Some(view) => view,
            None => self.labelled_stores(client, Some(ns), &mut handles),
        };
        let cache = NsCache {
            pods: labelled.pods,
            statefulsets: labelled.statefulsets,
            deployments: labelled.deployments,
            claims: labelled.claims,
            services: labelled.services,
            network_policies: labelled.network_policies,
            pdbs: labelled.pdbs,
            service_accounts: self.service_accounts(client, ns, &mut handles),
            storage_classes: cluster.storage_classes,
            reservations: cluster.reservations,
        };
        tracing::debug!(namespace = ns, scope = ?self.scope, "started the namespace's watches");
        namespaces.insert(ns.to_string(), Namespace { cache, handles });
    }

    /// The namespace's caches, once every store has completed its first list.
    pub fn cache(&self, ns: &str) -> Option<NsCache> {
        let namespaces = self.namespaces.lock().ok()?;
        let cache = &namespaces.get(ns)?.cache;
        cache.ready().then(|| cache.clone())
    }

    /// Objects cached in every namespace (a gauge).
    pub fn cached_objects(&self) -> usize {
        let (per_namespace, accounts) = self
            .namespaces
            .lock()
            .map(|n| {
                n.values().fold((0, 0), |(o, a), n| {
                    (
                        o + n.cache.labelled().len(),
                        a + n.cache.service_accounts.len(),
                    )
                })
            })
            .unwrap_or((0, 0));
        // Each namespace's view of shared stores would count every namespace's objects.
        self.shared_len().map_or(per_namespace, |(len, _)| len) + accounts
    }

    /// Bytes of JSON held by the compact stores (a gauge).
    pub fn cached_bytes(&self) -> usize {
        if let Some((_, bytes)) = self.shared_len() {
            return bytes;
        }
        self.namespaces
            .lock()
            .map(|n| n.values().map(|n| n.cache.labelled().json_bytes()).sum())
            .unwrap_or(0)
    }

    /// Objects and bytes of the cluster-wide stores, if they run.
    fn shared_len(&self) -> Option<(usize, usize)> {
        let shared = self.shared.lock().ok()?;
        let s = &shared.as_ref()?.stores;
        Some((s.len(), s.json_bytes()))
    }

    /// The client of `shard`'s watches: an HTTP/2 shard when there are any, else the main
    /// client.
    fn watch_client(&self, shard: &str) -> Client {
        match self.watch_clients.as_ref().map(|c| c.client_for(shard)) {
            Some(Ok(client)) => client,
            Some(Err(e)) => {
                // Watched over HTTP/1.1 like before: slower to scale, not wrong.
                tracing::warn!(shard, error = %e, "no HTTP/2 watch client; using the main client");
                self.client.clone()
            }
            None => self.client.clone(),
        }
    }

    /// The cluster-wide labelled stores (`WatchScope::Cluster`), started on first use and kept
    /// for the life of the process.
    fn shared_stores(&self) -> Option<LabelledStores> {
        let mut shared = self.shared.lock().ok()?;
        if let Some(s) = shared.as_ref() {
            return Some(s.stores.clone());
        }
        let client = self.watch_client(CLUSTER_SHARD);
        let mut handles = Vec::new();
        let stores = self.labelled_stores(&client, None, &mut handles);
        tracing::info!(
            "started the cluster-wide watches of the fleets' objects (--watch-scope cluster)"
        );
        *shared = Some(Shared {
            stores: stores.clone(),
            _handles: handles,
        });
        Some(stores)
    }

    /// The watches of the fleets' labelled objects (and the ReplicaSets' metadata) in `ns`, or
    /// across the cluster (`None`).
    fn labelled_stores(
        &self,
        client: &Client,
        ns: Option<&str>,
        handles: &mut Vec<JoinHandle<()>>,
    ) -> LabelledStores {
        let stores = LabelledStores {
            pods: self.reflect::<Pod>(client, ns, handles),
            statefulsets: self.reflect::<StatefulSet>(client, ns, handles),
            deployments: self.reflect::<Deployment>(client, ns, handles),
            claims: self.reflect::<PersistentVolumeClaim>(client, ns, handles),
            services: self.reflect::<Service>(client, ns, handles),
            network_policies: self.reflect::<NetworkPolicy>(client, ns, handles),
            pdbs: self.reflect::<PodDisruptionBudget>(client, ns, handles),
        };
        handles.push(self.metadata_only::<ReplicaSet>(client, ns));
        stores
    }

    /// Waits (at most `limit`) until every watched namespace's stores have their first
    /// list, so the first reconciles after a start can run from the caches.
    pub async fn wait_ready(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let all = self
                .namespaces
                .lock()
                .map(|n| n.values().all(|n| n.cache.ready()))
                .unwrap_or(true);
            if all {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
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
        if let Some(gone) = self.namespaces.lock().ok().and_then(|mut n| n.remove(ns)) {
            for h in gone.handles {
                h.abort();
            }
            if let Some(c) = self.watch_clients.as_ref() {
                c.release(ns);
            }
            tracing::debug!(namespace = ns, "stopped the namespace's watches");
        }
    }

    /// Whether fleet `ns/name` is tracked (known and not found gone).
    pub fn tracks(&self, ns: &str, name: &str) -> bool {
        self.fleets.lock().is_ok_and(|f| {
            f.values()
                .any(|r| r.name == name && r.namespace.as_deref() == Some(ns))
        })
    }

    /// Namespaces being watched (for tests and metrics).
    pub fn namespaces(&self) -> HashSet<String> {
        self.namespaces
            .lock()
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The cluster-wide stores (StorageClasses, reservations), started on first use and
    /// kept for the life of the process (one watch each; nothing they hold triggers).
    fn cluster_stores(&self) -> Option<ClusterStores> {
        let mut cluster = self.cluster.lock().ok()?;
        if let Some(c) = cluster.as_ref() {
            return Some(c.clone());
        }
        fn cluster_store<K: Watched>(client: &Client, feed: bool, kube: bool) -> Store<K> {
            let (reader, writer) = reflector::store();
            if !feed {
                return reader;
            }
            let events = open(kube, Api::<K>::all(client.clone()), watch_config())
                .default_backoff()
                .modify(|o: &mut K| o.meta_mut().managed_fields = None)
                .reflect(writer)
                .touched_objects();
            drain(K::kind(&()).to_string(), events);
            reader
        }
        let stores = ClusterStores {
            storage_classes: cluster_store(&self.client, self.stores, self.kube_watcher),
            reservations: cluster_store(&self.client, self.stores, self.kube_watcher),
        };
        *cluster = Some(stores.clone());
        Some(stores)
    }

    /// The namespace's ServiceAccounts, metadata only (they carry no fleet label).
    fn service_accounts(
        &self,
        client: &Client,
        ns: &str,
        handles: &mut Vec<JoinHandle<()>>,
    ) -> Store<PartialObjectMeta<ServiceAccount>> {
        let api: Api<PartialObjectMeta<ServiceAccount>> = Api::namespaced(client.clone(), ns);
        let (reader, writer) = reflector::store();
        if !self.stores {
            return reader;
        }
        let events = open(self.kube_watcher, api, watch_config())
            .default_backoff()
            .modify(|o: &mut PartialObjectMeta<ServiceAccount>| o.metadata.managed_fields = None)
            .reflect(writer);
        handles.push(drain(format!("ServiceAccount in {ns}"), events));
        reader
    }

    /// A watch (of `ns`, or cluster-wide) that feeds a store and triggers the fleet named by
    /// each touched object's label.
    fn reflect<K: Cached>(
        &self,
        client: &Client,
        ns: Option<&str>,
        handles: &mut Vec<JoinHandle<()>>,
    ) -> CompactStore<K> {
        let (api, store) = match ns {
            Some(ns) => (
                Api::<K>::namespaced(client.clone(), ns),
                CompactStore::new(&[FLEET_UID_LABEL, REPLACEMENT_FLEET_LABEL]).scoped(ns),
            ),
            None => (
                Api::<K>::all(client.clone()),
                CompactStore::new(&[FLEET_UID_LABEL, REPLACEMENT_FLEET_LABEL]),
            ),
        };
        let config = labelled_config(ns, self.list_page);
        let kind = K::kind(&()).to_string();
        if !self.stores {
            let events = open(self.kube_watcher, api, config)
                .default_backoff()
                .touched_objects();
            handles.push(self.forward(ns, kind, events));
            return store;
        }
        let feed = store.clone();
        let only = self.only.clone().filter(|_| ns.is_none());
        let events = open(self.kube_watcher, api, config)
            .default_backoff()
            .modify(K::project)
            .map(move |event| {
                if let Ok(e) = &event {
                    if only
                        .as_deref()
                        .is_none_or(|only| watched_namespace(e, only))
                    {
                        feed.apply(e);
                    }
                }
                event
            })
            .touched_objects();
        handles.push(self.forward(ns, kind, events));
        store
    }

    /// A metadata-only watch (of `ns`, or cluster-wide) that only triggers.
    fn metadata_only<K>(&self, client: &Client, ns: Option<&str>) -> JoinHandle<()>
    where
        K: Watched + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        let api: Api<PartialObjectMeta<K>> = match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let config = labelled_config(ns, self.list_page);
        let events = open(self.kube_watcher, api, config)
            .default_backoff()
            .touched_objects();
        self.forward(ns, K::kind(&()).to_string(), events)
    }

    fn forward<O, S>(&self, ns: Option<&str>, kind: String, events: S) -> JoinHandle<()>
    where
        O: Resource,
        S: futures::Stream<Item = Result<O, watcher::Error>> + Send + 'static,
    {
        let fleets = self.fleets.clone();
        let trigger = self.trigger.clone();
        let cluster_wide = ns.is_none();
        let ns = ns.unwrap_or("(all)").to_string();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let mut refusal_reported = false;
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
                    Err(e) if cluster_wide && !refusal_reported && refused(&e) => {
                        // Without it every pass reads fresh: correct, but never at rest.
                        refusal_reported = true;
                        tracing::error!(kind, error = %e, "the cluster-wide watch is refused: --watch-scope cluster needs cluster-wide get, list and watch of this kind (chart value watchScope: cluster grants it); every reconcile reads from the API server until it is granted");
                    }
                    Err(e) => {
                        tracing::debug!(namespace = %ns, kind, error = %e, "watch failed; retrying with backoff")
                    }
                }
            }
        })
    }
}

/// The list-then-watch of `api`: [`crate::watch_stream::watch`], or kube-runtime's `watcher`
/// with `kube` (`--test-kube-watcher`).
fn open<K>(
    kube: bool,
    api: Api<K>,
    config: watcher::Config,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    if kube {
        watcher(api, config).boxed()
    } else {
        crate::watch_stream::watch(api, config).boxed()
    }
}

/// Whether a cluster-wide watch's event is about an object in one of `only` (`Init` and
/// `InitDone` are about the whole list).
fn watched_namespace<K: Resource>(event: &watcher::Event<K>, only: &HashSet<String>) -> bool {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => o
            .meta()
            .namespace
            .as_deref()
            .is_some_and(|ns| only.contains(ns)),
        watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

/// A watch error that is the API server refusing access (403).
fn refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => {
            matches!(e, kube::Error::Api(s) if s.code == 403)
        }
        watcher::Error::WatchError(s) => s.code == 403,
        watcher::Error::NoResourceVersion => false,
    }
}

/// Runs a store-feeding watch that triggers nothing, logging its failures (it retries with
/// backoff).
fn drain<T, S>(what: String, events: S) -> JoinHandle<()>
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(e) = events.next().await {
            if let Err(e) = e {
                tracing::debug!(watch = %what, error = %e, "watch failed; retrying with backoff");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A member Pod as a StatefulSet creates it and a kubelet reports it.
    fn member_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "alpha-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "labels": {FLEET_UID_LABEL: "f-uid", "controller-revision-hash": "alpha-5d"},
                "annotations": {"celld.eric.dev/restart-token": "t-1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "alpha",
                                     "uid": "s-uid", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "node-2",
                "nodeSelector": {"topology.kubernetes.io/zone": "a"},
                "schedulingGates": [{"name": "celld.eric.dev/zone"}],
                "containers": [{"name": "celld", "image": "img@sha256:1",
                                "env": [{"name": "CELLD_NODE", "value": "alpha-1"}],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-alpha-1"}},
                    {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
                ]
            },
            "status": {
                "phase": "Running", "podIP": "127.60.0.9",
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "celld", "image": "img@sha256:1", "imageID": "", "ready": true,
                                       "restartCount": 2,
                                       "lastState": {"terminated": {"exitCode": 3}}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_projected_pod_keeps_what_the_reconciler_reads() {
        let full = member_pod();
        let mut cached = full.clone();
        Pod::project(&mut cached);
        let (f, c) = (full.spec.as_ref().unwrap(), cached.spec.as_ref().unwrap());
        assert_eq!(c.node_name, f.node_name);
        assert_eq!(c.node_selector, f.node_selector);
        assert_eq!(c.scheduling_gates, f.scheduling_gates);
        let claims = |s: &k8s_openapi::api::core::v1::PodSpec| -> Vec<String> {
            s.volumes
                .iter()
                .flatten()
                .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
                .collect()
        };
        assert_eq!(claims(c), vec!["data-alpha-1".to_string()]);
        assert_eq!(claims(c), claims(f));
        assert_eq!(cached.status, full.status, "the status is kept whole");
        let mut meta = full.metadata.clone();
        meta.managed_fields = None;
        assert_eq!(cached.metadata, meta, "metadata is kept but managedFields");
        // What is dropped is dropped.
        assert!(c.containers.is_empty() && c.tolerations.is_none());
        assert_eq!(c.volumes.as_ref().map(Vec::len), Some(1));
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(
            size(&cached) < size(&full),
            "{} !< {}",
            size(&cached),
            size(&full)
        );
    }
}
