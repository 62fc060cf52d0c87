//! A watch-fed store that keeps each object as its compact JSON (docs/design.md "Caches and
//! the two passes", "Memory").
//!
//! kube's reflector store keeps every object as its deserialized Rust value: a StatefulSet
//! of 4.4 KB of JSON takes about 20 KB of heap in 130 allocations, a projected Pod of 2 KB
//! about 9 KB (measured 2026-12-04 on the bench's objects). At 1,000 fleets those values were
//! most of the operator's memory. This store keeps the object's JSON bytes (after the kind's
//! projection) and the one label a lookup filters on, and deserializes an object when a
//! cached pass reads it: a read costs a few microseconds per object, and reads happen in
//! cached passes only (every write is decided by a fresh pass from fresh reads).
//!
//! It applies the watcher's events exactly as kube's reflector writer does: `Apply` and
//! `Delete` change one object; a (re)list (`Init`, `InitApply`…, `InitDone`) builds a new map
//! and swaps it in whole at `InitDone`, which also marks the store ready (first list
//! complete). An object whose bytes do not deserialize (never expected: they were
//! serialized from the same type) reads as a miss, which a cached pass cannot serve from
//! the cache: it escalates to a fresh pass, so such a fault costs requests, never a wrong
//! decision.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::CelldFleet;

/// One stored object.
struct Entry {
    /// Values of the store's label keys (the labels lookups filter on), in their order.
    labels: Box<[Option<Box<str>>]>,
    /// The object's JSON, LZ4-compressed ([`pack`]).
    json: Box<[u8]>,
}

/// Objects by namespace, then by name.
type Objects = HashMap<Box<str>, HashMap<Box<str>, Entry>>;

#[derive(Default)]
struct Inner {
    objects: Objects,
    /// The map being built by a (re)list, swapped in at `InitDone`.
    relist: Option<Objects>,
}

/// The objects of one kind, as JSON, by namespace and name (cheap to clone: the clones share
/// the map). A store fed by one namespace's watch holds that namespace; a store fed by a
/// cluster-wide watch (`--watch-scope cluster`) holds every namespace, and each fleet
/// namespace reads it through a [`CompactStore::scoped`] view.
pub struct CompactStore<K> {
    inner: Arc<RwLock<Inner>>,
    ready: Arc<AtomicBool>,
    /// The labels [`Self::labelled`] can filter on.
    label_keys: &'static [&'static str],
    /// The namespace this view reads (`None`: every namespace the store holds).
    scope: Option<Arc<str>>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for CompactStore<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
            label_keys: self.label_keys,
            scope: self.scope.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> CompactStore<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    /// An empty store, not ready, whose [`Self::labelled`] can filter on `label_keys`.
    pub fn new(label_keys: &'static [&'static str]) -> Self {
        Self {
            inner: Arc::default(),
            ready: Arc::default(),
            label_keys,
            scope: None,
            _kind: PhantomData,
        }
    }

    /// A view of this store that reads namespace `ns` only (it shares the objects, the
    /// readiness and the feed).
    pub fn scoped(&self, ns: &str) -> Self {
        Self {
            scope: Some(ns.into()),
            ..self.clone()
        }
    }

    fn entry(&self, obj: &K) -> Option<(Box<str>, Box<str>, Entry)> {
        let name = obj.meta().name.as_deref()?;
        let ns = obj.meta().namespace.as_deref().unwrap_or_default();
        let json = match serde_json::to_vec(obj) {
            Ok(json) => pack(std::any::type_name::<K>(), &json),
            Err(e) => {
                // Not expected (a value that was just deserialized); the object is left out
                // of the store, so a cached pass that needs it escalates.
                tracing::warn!(name, error = %e, "cached object not serializable; left out of the cache");
                return None;
            }
        };
        let of = obj.meta().labels.as_ref();
        let labels = self
            .label_keys
            .iter()
            .map(|k| of.and_then(|l| l.get(*k)).map(|v| v.as_str().into()))
            .collect();
        Some((ns.into(), name.into(), Entry { labels, json }))
    }

    /// Applies one watcher event (what kube's reflector writer does, with JSON values).
    pub fn apply(&self, event: &watcher::Event<K>) {
        let Ok(mut inner) = self.inner.write() else {
            return;
        };
        match event {
            watcher::Event::Apply(obj) => match self.entry(obj) {
                Some((ns, name, entry)) => {
                    inner.objects.entry(ns).or_default().insert(name, entry);
                }
                // Left out: drop any older copy too, so the cache never serves it.
                None => remove(&mut inner.objects, obj),
            },
            watcher::Event::Delete(obj) => remove(&mut inner.objects, obj),
            watcher::Event::Init => inner.relist = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                if let Some((ns, name, entry)) = self.entry(obj) {
                    inner
                        .relist
                        .get_or_insert_with(HashMap::new)
                        .entry(ns)
                        .or_default()
                        .insert(name, entry);
                }
            }
            watcher::Event::InitDone => {
                let mut fresh = inner.relist.take().unwrap_or_default();
                for names in fresh.values_mut() {
                    names.shrink_to_fit();
                }
                fresh.shrink_to_fit();
                inner.objects = fresh;
                self.ready.store(true, Ordering::Release);
            }
        }
    }

    /// The first list has completed.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Objects stored (in every namespace, whatever the view's scope).
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .map(|i| i.objects.values().map(HashMap::len).sum())
            .unwrap_or(0)
    }

    /// Nothing stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The namespaces this view reads.
    fn in_scope<'a>(&self, objects: &'a Objects) -> Vec<&'a HashMap<Box<str>, Entry>> {
        match self.scope.as_deref() {
            Some(ns) => objects.get(ns).into_iter().collect(),
            None => objects.values().collect(),
        }
    }

    /// The object named `name` in the view's namespace (`None`: not stored, or not readable).
    pub fn get(&self, name: &str) -> Option<K> {
        let inner = self.inner.read().ok()?;
        let entry = self
            .in_scope(&inner.objects)
            .into_iter()
            .find_map(|n| n.get(name))?;
        decode(name, &entry.json)
    }

    /// The objects whose label `key` (one of the store's label keys) is `value`, by name.
    /// `None` if `key` is not one of them or one of the objects is not readable (the caller
    /// must not act on a partial list).
    pub fn labelled(&self, key: &str, value: &str) -> Option<Vec<K>> {
        let at = self.label_keys.iter().position(|k| *k == key)?;
        let inner = self.inner.read().ok()?;
        let mut named: Vec<(&str, &Entry)> = self
            .in_scope(&inner.objects)
            .into_iter()
            .flatten()
            .filter(|(_, e)| e.labels.get(at).and_then(|v| v.as_deref()) == Some(value))
            .map(|(n, e)| (&**n, e))
            .collect();
        // The API server lists by name; so does the cache, so both passes see one order.
        named.sort_unstable_by_key(|(n, _)| *n);
        named.into_iter().map(|(n, e)| decode(n, &e.json)).collect()
    }

    /// Bytes held: the compressed JSON (a gauge's input; keys and map overhead not counted).
    pub fn json_bytes(&self) -> usize {
        self.inner
            .read()
            .map(|i| {
                i.objects
                    .values()
                    .flatten()
                    .map(|(_, e)| e.json.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// Removes `obj` (by namespace and name) and a namespace left empty.
fn remove<K: Resource>(objects: &mut Objects, obj: &K) {
    let (Some(name), ns) = (obj.meta().name.as_deref(), obj.meta().namespace.as_deref()) else {
        return;
    };
    let ns = ns.unwrap_or_default();
    if let Some(names) = objects.get_mut(ns) {
        names.remove(name);
        if names.is_empty() {
            objects.remove(ns);
        }
    }
}

/// Largest JSON an entry may unpack to (an API object is at most about 1.5 MiB; etcd's limit).
const MAX_UNPACKED: usize = 16 << 20;

/// An object's JSON as kept: LZ4 block format with its length first (`lz4_flex`), compressed
/// against its kind's dictionary ([`dictionary`]). Objects of one kind share most of their
/// text (field names, label keys, the operator's rendering), so each compresses to a fraction
/// of its JSON, and unpacks at several hundred MB/s: a cached pass's read of a few objects
/// costs microseconds.
fn pack(kind: &'static str, json: &[u8]) -> Box<[u8]> {
    let dict = dictionary(kind, json);
    lz4_flex::block::compress_prepend_size_with_dict(json, &dict).into_boxed_slice()
}

/// The JSON of a packed entry (`None` if it does not unpack, or would unpack to more than
/// [`MAX_UNPACKED`] bytes).
fn unpack(kind: &'static str, packed: &[u8]) -> Option<Vec<u8>> {
    let size = u32::from_le_bytes(packed.get(..4)?.try_into().ok()?) as usize;
    if size > MAX_UNPACKED {
        return None;
    }
    let dict = dictionary_of(kind)?;
    lz4_flex::block::decompress_size_prepended_with_dict(packed, &dict).ok()
}

type Dictionaries = std::sync::Mutex<HashMap<&'static str, Arc<[u8]>>>;

fn dictionaries() -> &'static Dictionaries {
    static DICTIONARIES: std::sync::OnceLock<Dictionaries> = std::sync::OnceLock::new();
    DICTIONARIES.get_or_init(Dictionaries::default)
}

/// The compression dictionary of `kind`: the JSON of the first object of that kind this
/// process packed (`sample`, if none was packed yet), fixed for the life of the process, so
/// every entry unpacks with the dictionary it was packed with. A poor first sample costs
/// compression, never correctness.
fn dictionary(kind: &'static str, sample: &[u8]) -> Arc<[u8]> {
    let mut d = dictionaries().lock().unwrap_or_else(|p| p.into_inner());
    d.entry(kind).or_insert_with(|| Arc::from(sample)).clone()
}

fn dictionary_of(kind: &'static str) -> Option<Arc<[u8]>> {
    let d = dictionaries().lock().unwrap_or_else(|p| p.into_inner());
    d.get(kind).cloned()
}

fn decode<K: DeserializeOwned>(name: &str, packed: &[u8]) -> Option<K> {
    let Some(json) = unpack(std::any::type_name::<K>(), packed) else {
        tracing::warn!(
            name,
            "cached object does not unpack; read from the API server instead"
        );
        return None;
    };
    match serde_json::from_slice(&json) {
        Ok(obj) => Some(obj),
        Err(e) => {
            tracing::warn!(name, error = %e, "cached object not readable; read from the API server instead");
            None
        }
    }
}

/// The controller's copy of a fleet: its name, namespace, UID and resourceVersion, and the
/// whole fleet as compact JSON (`managedFields` dropped, packed like the stores' entries),
/// decoded when a reconcile starts.
///
/// kube's controller keeps every object it watches in its store for the life of the object;
/// a fleet of about 7.7 KB of JSON (its journal annotation and status included) takes
/// several times that as a Rust value, and 1,000 settled fleets held that value all the time
/// although a fleet is read only when it reconciles. Deserializing this type from the API
/// server's answer reads the full fleet and keeps its JSON, so the watch, the store and the
/// controller's scheduling work on the small metadata only.
#[derive(Clone)]
pub struct CompactFleet {
    metadata: kube::core::ObjectMeta,
    json: Arc<[u8]>,
}

impl CompactFleet {
    /// Keeps `fleet` (less `managedFields`) as JSON.
    pub fn new(mut fleet: CelldFleet) -> Result<Self, serde_json::Error> {
        fleet.metadata.managed_fields = None;
        let json = pack(
            std::any::type_name::<CelldFleet>(),
            &serde_json::to_vec(&fleet)?,
        );
        let m = fleet.metadata;
        Ok(Self {
            metadata: kube::core::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                ..Default::default()
            },
            json: json.into(),
        })
    }

    /// The fleet (`None`, with a warning, if its JSON does not read back: never expected, as
    /// it was written from the same type; the reconcile then reads the fleet afresh).
    pub fn fleet(&self) -> Option<CelldFleet> {
        decode(
            self.metadata.name.as_deref().unwrap_or_default(),
            &self.json,
        )
    }

    /// Bytes held (the compressed JSON).
    pub fn json_bytes(&self) -> usize {
        self.json.len()
    }
}

impl std::fmt::Debug for CompactFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactFleet")
            .field("metadata", &self.metadata)
            .field("json_bytes", &self.json.len())
            .finish()
    }
}

impl<'de> serde::Deserialize<'de> for CompactFleet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let fleet = CelldFleet::deserialize(d)?;
        Self::new(fleet).map_err(serde::de::Error::custom)
    }
}

impl Resource for CompactFleet {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        CelldFleet::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        CelldFleet::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        CelldFleet::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        CelldFleet::plural(dt)
    }
    fn meta(&self) -> &kube::core::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::core::ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    const LABEL: &str = "celld.eric.dev/fleet-uid";
    const KEYS: &[&str] = &[LABEL, "other"];

    fn pod(name: &str, uid_label: Option<&str>, rv: &str) -> Pod {
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), json!("celld"));
        if let Some(u) = uid_label {
            labels.insert(LABEL.into(), json!(u));
            labels.insert("other".into(), json!(format!("{u}-other")));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels},
            "spec": {"nodeName": "n1", "containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "celld", "image": "i", "imageID": "",
                                              "ready": true, "restartCount": 0}]}
        }))
        .unwrap()
    }

    #[test]
    fn an_object_reads_back_equal_to_what_was_stored() {
        let s = CompactStore::<Pod>::new(KEYS);
        let p = pod("a-0", Some("f"), "7");
        s.apply(&watcher::Event::Apply(p.clone()));
        assert_eq!(s.get("a-0"), Some(p));
        // A whole rendered StatefulSet round-trips too (quantities, int-or-string, empty maps).
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "alpha", "namespace": "ns", "labels": {LABEL: "f"},
                         "annotations": {}},
            "spec": {"replicas": 3, "serviceName": "alpha", "selector": {"matchLabels": {"a": "b"}},
                     "updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%", "partition": 0}},
                     "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{
                         "name": "celld", "image": "i", "ports": [{"containerPort": 8080}],
                         "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                         "env": [{"name": "X", "value": ""}]}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}]},
            "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 4}
        }))
        .unwrap();
        let s = CompactStore::<StatefulSet>::new(KEYS);
        s.apply(&watcher::Event::Apply(sts.clone()));
        assert_eq!(s.get("alpha"), Some(sts.clone()));
        // Kept packed: fewer bytes than the JSON (its keys repeat).
        let raw = serde_json::to_vec(&sts).unwrap().len();
        assert!(s.json_bytes() < raw, "{} !< {raw}", s.json_bytes());
    }

    #[test]
    fn a_scoped_view_reads_its_namespace_of_a_cluster_wide_store() {
        let in_ns = |ns: &str, name: &str, uid: &str, rv: &str| {
            let mut p = pod(name, Some(uid), rv);
            p.metadata.namespace = Some(ns.into());
            p
        };
        let all = CompactStore::<Pod>::new(KEYS);
        let (a, b) = (all.scoped("a"), all.scoped("b"));
        all.apply(&watcher::Event::Init);
        all.apply(&watcher::Event::InitApply(in_ns("a", "m-0", "f", "1")));
        all.apply(&watcher::Event::InitApply(in_ns("b", "m-0", "g", "1")));
        all.apply(&watcher::Event::InitApply(in_ns("b", "m-1", "g", "1")));
        assert!(!a.is_ready(), "a view is ready with its store");
        all.apply(&watcher::Event::InitDone);
        assert!(a.is_ready() && b.is_ready());
        // One name in two namespaces: each view reads its own.
        assert_eq!(a.get("m-0"), Some(in_ns("a", "m-0", "f", "1")));
        assert_eq!(b.get("m-0"), Some(in_ns("b", "m-0", "g", "1")));
        assert_eq!(a.get("m-1"), None, "another namespace's object");
        assert!(all.scoped("c").get("m-0").is_none());
        let names = |v: Vec<Pod>| -> Vec<String> {
            v.into_iter()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p.metadata.namespace.unwrap(),
                        p.metadata.name.unwrap()
                    )
                })
                .collect()
        };
        assert_eq!(names(b.labelled(LABEL, "g").unwrap()), ["b/m-0", "b/m-1"]);
        assert!(
            a.labelled(LABEL, "g").unwrap().is_empty(),
            "by namespace first"
        );
        // Events change one namespace's object only.
        all.apply(&watcher::Event::Apply(in_ns("a", "m-0", "f", "2")));
        all.apply(&watcher::Event::Delete(in_ns("b", "m-0", "g", "1")));
        assert_eq!(b.get("m-0"), None);
        assert_eq!(
            a.get("m-0").unwrap().metadata.resource_version.as_deref(),
            Some("2")
        );
        assert_eq!(all.len(), 2, "the count is the store's, every namespace");
        assert_eq!(a.len(), 2);
        // A relist replaces every namespace at once.
        all.apply(&watcher::Event::Init);
        all.apply(&watcher::Event::InitApply(in_ns("b", "m-2", "g", "3")));
        all.apply(&watcher::Event::InitDone);
        assert_eq!(a.get("m-0"), None);
        assert_eq!(names(b.labelled(LABEL, "g").unwrap()), ["b/m-2"]);
    }

    #[test]
    fn events_apply_like_the_reflector() {
        let s = CompactStore::<Pod>::new(KEYS);
        assert!(!s.is_ready(), "not ready before the first list");
        s.apply(&watcher::Event::Init);
        s.apply(&watcher::Event::InitApply(pod("a-1", Some("f"), "1")));
        s.apply(&watcher::Event::InitApply(pod("a-0", Some("f"), "1")));
        s.apply(&watcher::Event::InitApply(pod("b-0", Some("g"), "1")));
        s.apply(&watcher::Event::InitApply(pod("x", None, "1")));
        assert!(!s.is_ready() && s.is_empty(), "a list shows only when done");
        s.apply(&watcher::Event::InitDone);
        assert!(s.is_ready());
        assert_eq!(s.len(), 4);
        let names = |v: Vec<Pod>| -> Vec<String> {
            v.into_iter().map(|p| p.metadata.name.unwrap()).collect()
        };
        assert_eq!(
            names(s.labelled(LABEL, "f").unwrap()),
            ["a-0", "a-1"],
            "by name"
        );
        assert_eq!(names(s.labelled(LABEL, "g").unwrap()), ["b-0"]);
        assert_eq!(
            names(s.labelled("other", "f-other").unwrap()),
            ["a-0", "a-1"]
        );
        assert!(s.labelled(LABEL, "h").unwrap().is_empty());
        assert!(
            s.labelled("unknown", "f").is_none(),
            "only the store's keys"
        );
        // Apply replaces, Delete removes.
        s.apply(&watcher::Event::Apply(pod("a-0", Some("g"), "2")));
        assert_eq!(
            names(s.labelled(LABEL, "f").unwrap()),
            ["a-1"],
            "relabelled"
        );
        assert_eq!(
            s.get("a-0").unwrap().metadata.resource_version.as_deref(),
            Some("2")
        );
        s.apply(&watcher::Event::Delete(pod("a-1", Some("f"), "3")));
        assert_eq!(s.get("a-1"), None);
        // A relist replaces everything at InitDone, and the store stays ready meanwhile.
        s.apply(&watcher::Event::Init);
        s.apply(&watcher::Event::InitApply(pod("c-0", Some("f"), "9")));
        assert!(s.is_ready());
        assert_eq!(s.len(), 3, "the old map serves until the relist is done");
        s.apply(&watcher::Event::InitDone);
        assert_eq!(s.len(), 1);
        assert_eq!(names(s.labelled(LABEL, "f").unwrap()), ["c-0"]);
        assert!(s.get("b-0").is_none());
        assert!(s.json_bytes() > 0);
    }

    #[test]
    fn an_unreadable_entry_is_a_miss_and_fails_a_list() {
        let s = CompactStore::<Pod>::new(KEYS);
        s.apply(&watcher::Event::Apply(pod("a-0", Some("f"), "1")));
        // Entries put in namespace "ns" as they are, past `entry()`'s packing.
        let put = |name: &str, entry: Entry| {
            let mut inner = s.inner.write().unwrap();
            inner
                .objects
                .entry("ns".into())
                .or_default()
                .insert(name.into(), entry);
        };
        put(
            "a-1",
            Entry {
                labels: Box::new([Some("f".into()), None]),
                json: pack(std::any::type_name::<Pod>(), b"{not json"),
            },
        );
        // Bytes that are not LZ4 at all, and a length beyond the bound, are misses too.
        for junk in [
            &b"\x05\x00\x00\x00zz"[..],
            &b"\xff\xff\xff\x7f{}"[..],
            b"{}",
        ] {
            put(
                "a-2",
                Entry {
                    labels: Box::new([None, None]),
                    json: junk.to_vec().into_boxed_slice(),
                },
            );
            assert!(s.get("a-2").is_none(), "{junk:?}");
        }
        assert!(s.get("a-1").is_none());
        assert!(s.get("a-0").is_some());
        assert!(
            s.labelled(LABEL, "f").is_none(),
            "a partial list is no list"
        );
    }

    /// A fleet as the API server sends it: journal annotation, status, managedFields.
    fn fleet_json() -> serde_json::Value {
        json!({
            "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
            "metadata": {"name": "beta", "namespace": "demo", "uid": "f-1",
                         "resourceVersion": "77", "generation": 4,
                         "finalizers": ["celld.eric.dev/lifecycle-protection"],
                         "annotations": {"celld.eric.dev/journal": "{\"v\":1,\"entries\":[]}"},
                         "managedFields": [{"manager": "celld-operator", "operation": "Update"}]},
            "spec": {"profile": "PersistentFleet", "runtimeImage": "img@sha256:1", "replicas": 3,
                     "serviceAccountName": "celld",
                     "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                     "storage": {"bucket": "b", "region": "us-east-1", "sizeGiB": 1}},
            "status": {"replicas": 3, "appliedReplicas": 3, "readyReplicas": 3,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned",
                                       "message": "3 of 3 members are ready",
                                       "lastTransitionTime": "2026-12-03T15:04:06Z"}]}
        })
    }

    #[test]
    fn a_compact_fleet_keeps_the_whole_fleet_and_only_the_keys_in_its_metadata() {
        let full: CelldFleet = serde_json::from_value(fleet_json()).unwrap();
        let compact: CompactFleet = serde_json::from_value(fleet_json()).unwrap();
        // What the controller and its store use.
        let meta = compact.meta();
        assert_eq!(meta.name.as_deref(), Some("beta"));
        assert_eq!(meta.namespace.as_deref(), Some("demo"));
        assert_eq!(meta.uid.as_deref(), Some("f-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("77"));
        assert!(meta.annotations.is_none() && meta.managed_fields.is_none());
        // What a reconcile reads: the whole fleet, less managedFields.
        let mut want = full.clone();
        want.metadata.managed_fields = None;
        assert_eq!(compact.fleet(), Some(want));
        assert_ne!(full.metadata.managed_fields, None, "the input had them");
        assert!(compact.json_bytes() < serde_json::to_vec(&full).unwrap().len());
        // The same resource as CelldFleet, so its watch lists celldfleets.
        assert_eq!(CompactFleet::plural(&()), CelldFleet::plural(&()));
        assert_eq!(CompactFleet::api_version(&()), CelldFleet::api_version(&()));
        assert_eq!(CompactFleet::kind(&()), CelldFleet::kind(&()));
    }

    #[test]
    fn a_fleet_that_is_not_a_fleet_is_refused_as_the_full_type_would_be() {
        let mut bad = fleet_json();
        bad["spec"]["replicas"] = json!("three");
        let err = serde_json::from_value::<CompactFleet>(bad.clone()).unwrap_err();
        let full = serde_json::from_value::<CelldFleet>(bad).unwrap_err();
        assert_eq!(err.to_string(), full.to_string());
    }

    #[test]
    fn a_compact_fleet_whose_json_does_not_read_back_is_a_miss() {
        let mut compact: CompactFleet = serde_json::from_value(fleet_json()).unwrap();
        compact.json = Arc::from(pack(
            std::any::type_name::<CelldFleet>(),
            b"{\"metadata\": 1}",
        ));
        assert_eq!(compact.fleet(), None);
    }

    #[test]
    fn objects_of_a_kind_are_packed_against_a_shared_dictionary() {
        // Services: no other test stores them, so the first one here is the dictionary.
        let svc = |i: u32| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(json!({
                "metadata": {"name": format!("f{i:04}-peers"), "namespace": "bench-s1",
                             "uid": format!("5e1c{i:04}-aaaa-bbbb-cccc-{i:012}"),
                             "resourceVersion": format!("{}", 1000 + i),
                             "labels": {LABEL: format!("uid-{i}"), "app.kubernetes.io/name": "celld",
                                        "app.kubernetes.io/managed-by": "celld-operator"},
                             "ownerReferences": [{"apiVersion": "celld.eric.dev/v1alpha1",
                                 "kind": "CelldFleet", "name": format!("f{i:04}"),
                                 "uid": format!("uid-{i}"), "controller": true}]},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": true,
                         "selector": {LABEL: format!("uid-{i}")},
                         "ports": [{"name": "peer", "port": 7000, "targetPort": 7000, "protocol": "TCP"},
                                   {"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}
            }))
            .unwrap()
        };
        let s = CompactStore::<k8s_openapi::api::core::v1::Service>::new(KEYS);
        let mut raw = 0;
        for i in 0..20 {
            let one = svc(i);
            raw += serde_json::to_vec(&one).unwrap().len();
            s.apply(&watcher::Event::Apply(one));
        }
        for i in 0..20 {
            assert_eq!(
                s.get(&format!("f{i:04}-peers")),
                Some(svc(i)),
                "round trip {i}"
            );
        }
        assert!(
            s.json_bytes() * 4 < raw,
            "20 similar Services: {} packed bytes for {raw} of JSON",
            s.json_bytes()
        );
    }
}
