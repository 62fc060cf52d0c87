//! The reads of one fresh pass (docs/design.md "Caches and the two passes", "Reads of a
//! fresh pass").
//!
//! A fresh pass used to send a GET or a LIST every time its planning code asked for an
//! object: the workload four times, the member claims once per member and per step, the
//! fleet's Pods once per step, about 30 serial requests for one operation step. Under a
//! burst of operations that held each reconcile slot for 0.3–0.5 s. Now each planning read
//! (`Run::workload`, `Run::pods`, `Run::claim_at`, …) is sent **once per pass between two
//! writes to its kind**: the answer is kept in this record, with the plural resource it was
//! read from, and handed out again. **Every write the pass sends forgets what was read of the
//! written resource** (the pass's client tells it, [`observing_client`]): a Pod deleted
//! forgets the Pods, a workload write the workload, but a journal append or a status patch
//! (`celldfleets`) forgets nothing the pass reads through the record, since it changes none
//! of it. Every effect boundary (`Run::before_effect`, and after member requests, which the
//! client does not see) forgets everything. So a read that follows a write to its kind, or an
//! effect, goes to the API server again. With `--test-forget-all-on-write` (hidden) every
//! write forgets everything, the design before.
//!
//! What this does not change:
//! - every answer handed out is a fresh read of this pass, never a cached (watch) copy, and
//!   no older than the pass's last write to its kind or its last effect;
//! - the read of a write's own target right before the write (the guarded write's re-read:
//!   `Run::reread_workload`, `Run::reread`, `drive::GuardReads`, direct `Api` reads in the write
//!   paths) always goes to the API server, and every write still carries its precondition;
//! - a cached pass reads its stores as before, and `--test-fresh-reads` keeps no record
//!   (the design before the caches, for the benchmark's side-by-side figures).
//!
//! A member found in a labelled list of this pass answers a read by name of the same kind
//! (a claim at a member's name, a member Pod), as a GET in the same pass would have; a name
//! not in the list is asked of the API server (a foreign object has no fleet label).
//!
//! Apart from the planning reads, the record keeps what the pass **last saw** of its workload
//! and its member Pods for the status it writes at its end (docs/design.md "The status of a
//! fresh pass"): a write of the pass forgets what it last saw of the written resource
//! (`pods`, `statefulsets`, …) but not of the others, and the workload's own write leaves its
//! answer as the last seen. The status is display only (no decision reads it), so it may show
//! what the pass read before its writes to other kinds, as a cached pass's status shows the
//! stores; a pass that saw nothing of a kind, or wrote it since, reads it again.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::Request;
use kube::client::Body;
use kube::Client;
use tower::BoxError;

/// A kept answer and the plural resource it was read from.
struct Kept {
    resource: String,
    value: Arc<dyn Any + Send + Sync>,
}

/// What one fresh pass has read since its last write to each kind.
pub struct PassReads {
    entries: Mutex<HashMap<String, Kept>>,
    /// What the pass last saw, by plural resource, for its status; not emptied by
    /// [`PassReads::forget_all`], only by a write to the same resource ([`PassReads::wrote`]).
    seen: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
    /// A write forgets only what was read of its own kind (and what was last seen of it);
    /// `false` (`--test-forget-all-on-write`): every write forgets every answer and the
    /// status reads again, the design before.
    scoped: bool,
    reused: AtomicU64,
    forgotten: AtomicU64,
}

impl Default for PassReads {
    fn default() -> Self {
        Self::new(true)
    }
}

impl PassReads {
    /// An empty record; `scoped`: see the field.
    pub fn new(scoped: bool) -> Self {
        PassReads {
            entries: Mutex::default(),
            seen: Mutex::default(),
            scoped,
            reused: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
        }
    }

    /// The answer kept under `key`, if it is of type `T`.
    pub fn get<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        let found = self
            .entries
            .lock()
            .ok()?
            .get(key)
            .and_then(|v| v.value.downcast_ref::<T>().cloned());
        if found.is_some() {
            self.reused.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// The first of the list kept under `list_key` that `matches`, if the list is kept
    /// (`None`: no such list; `Some(None)`: the list holds no match).
    pub fn find_in<T: Clone + 'static>(
        &self,
        list_key: &str,
        matches: impl Fn(&T) -> bool,
    ) -> Option<Option<T>> {
        let entries = self.entries.lock().ok()?;
        let list = entries.get(list_key)?.value.downcast_ref::<Vec<T>>()?;
        let found = list.iter().find(|o| matches(o)).cloned();
        if found.is_some() {
            self.reused.fetch_add(1, Ordering::Relaxed);
        }
        Some(found)
    }

    /// Keeps `value`, read from `resource` (plural, e.g. `pods`), under `key` until the
    /// pass writes that resource or reaches an effect boundary.
    pub fn put<T: Send + Sync + 'static>(&self, resource: &str, key: String, value: T) {
        if let Ok(mut e) = self.entries.lock() {
            e.insert(
                key,
                Kept {
                    resource: resource.to_string(),
                    value: Arc::new(value),
                },
            );
        }
    }

    /// The pass is about to write `resource`, or has: forgets what it read of it and what
    /// it last saw of it (unscoped: every answer).
    pub fn wrote(&self, resource: &str) {
        if !self.scoped {
            self.forget_all();
        } else if let Ok(mut e) = self.entries.lock() {
            let before = e.len();
            e.retain(|_, kept| kept.resource != resource);
            if e.len() != before {
                self.forgotten.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Ok(mut s) = self.seen.lock() {
            s.remove(resource);
        }
    }

    /// Forgets every answer (an effect boundary: a member request may change anything).
    pub fn forget_all(&self) {
        if let Ok(mut e) = self.entries.lock() {
            if !e.is_empty() {
                self.forgotten.fetch_add(1, Ordering::Relaxed);
            }
            e.clear();
        }
    }

    /// Records `value` as what the pass last saw of `resource` (plural, e.g. `pods`).
    pub fn saw<T: Send + Sync + 'static>(&self, resource: &str, value: T) {
        if !self.scoped {
            return;
        }
        if let Ok(mut s) = self.seen.lock() {
            s.insert(resource.to_string(), Arc::new(value));
        }
    }

    /// What the pass last saw of `resource`, if it is of type `T` and the pass has not
    /// written that resource since.
    pub fn last_seen<T: Clone + 'static>(&self, resource: &str) -> Option<T> {
        let found = self
            .seen
            .lock()
            .ok()?
            .get(resource)
            .and_then(|v| v.downcast_ref::<T>().cloned());
        if found.is_some() {
            self.reused.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Reads answered from this record instead of the API server.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// How often a write emptied a non-empty record.
    pub fn forgotten(&self) -> u64 {
        self.forgotten.load(Ordering::Relaxed)
    }
}

/// The plural resource a request sent by a pass writes, when it makes the pass's kept reads
/// stale: everything but a GET (a read or a watch) and an Event's creation (no pass reads
/// Events). A subresource counts as its resource (`pods/eviction` writes `pods`).
fn invalidates(method: &http::Method, path: &str, query: Option<&str>) -> Option<String> {
    if method == http::Method::GET {
        return None;
    }
    let info = crate::transport::RequestInfo::of(method.as_str(), path, query);
    let resource = info.resource.split('/').next().unwrap_or_default();
    (resource != "events").then(|| resource.to_string())
}

/// `inner` for one fresh pass: every request goes to `inner` unchanged (its errors come
/// back as `inner`'s, so the pass sees what it would have seen), and every write tells
/// `reads` ([`PassReads::wrote`]) before it is sent and again once it is answered.
pub fn observing_client(inner: Client, reads: Arc<PassReads>) -> Client {
    let namespace = inner.default_namespace().to_string();
    let service = tower::service_fn(move |req: Request<Body>| {
        let inner = inner.clone();
        let reads = reads.clone();
        async move {
            let writes = invalidates(req.method(), req.uri().path(), req.uri().query());
            if let Some(resource) = &writes {
                reads.wrote(resource);
            }
            let answer = inner.send(req).await;
            if let Some(resource) = &writes {
                reads.wrote(resource);
            }
            answer.map_err(|e| -> BoxError { Box::new(e) })
        }
    });
    Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use tower_test::mock;

    fn pod_json(name: &str) -> String {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}})
            .to_string()
    }

    #[test]
    fn kept_reads_are_handed_out_until_forgotten() {
        let reads = PassReads::default();
        reads.put("pods", "Pod/a".into(), Some(7_i32));
        assert_eq!(reads.get::<Option<i32>>("Pod/a"), Some(Some(7)));
        assert_eq!(
            reads.get::<Option<String>>("Pod/a"),
            None,
            "another type is not handed out"
        );
        reads.put("pods", "Pod?l".into(), vec![1_i32, 2, 3]);
        assert_eq!(reads.find_in::<i32>("Pod?l", |v| *v == 2), Some(Some(2)));
        assert_eq!(reads.find_in::<i32>("Pod?l", |v| *v == 9), Some(None));
        assert_eq!(reads.find_in::<i32>("Pod?other", |_| true), None);
        assert_eq!(reads.reused(), 2);
        reads.put("statefulsets", "StatefulSet/f".into(), 3_i32);
        // A write forgets what was read of its own kind only.
        reads.wrote("celldfleets");
        assert_eq!(reads.get::<Option<i32>>("Pod/a"), Some(Some(7)));
        assert_eq!(reads.forgotten(), 0, "nothing of that kind was kept");
        reads.wrote("pods");
        assert_eq!(reads.get::<Option<i32>>("Pod/a"), None);
        assert_eq!(reads.find_in::<i32>("Pod?l", |_| true), None);
        assert_eq!(reads.get::<i32>("StatefulSet/f"), Some(3));
        assert_eq!(reads.forgotten(), 1);
        // An effect boundary forgets everything.
        reads.forget_all();
        assert_eq!(reads.get::<i32>("StatefulSet/f"), None);
        assert_eq!(reads.forgotten(), 2);
        reads.forget_all();
        assert_eq!(reads.forgotten(), 2, "an empty record forgets nothing");

        // `--test-forget-all-on-write`: any write forgets everything, nothing is last seen.
        let unscoped = PassReads::new(false);
        unscoped.put("pods", "Pod/a".into(), 1_i32);
        unscoped.saw("pods", 1_i32);
        assert_eq!(unscoped.last_seen::<i32>("pods"), None);
        unscoped.wrote("celldfleets");
        assert_eq!(unscoped.get::<i32>("Pod/a"), None);
    }

    #[test]
    fn every_write_but_an_events_invalidates() {
        let m = |s: &str| s.parse::<http::Method>().unwrap();
        let pods = "/api/v1/namespaces/ns/pods/p";
        assert_eq!(invalidates(&m("GET"), pods, None), None);
        assert_eq!(
            invalidates(
                &m("GET"),
                "/api/v1/namespaces/ns/pods",
                Some("labelSelector=a%3Db")
            ),
            None
        );
        for verb in ["POST", "PUT", "PATCH", "DELETE"] {
            assert_eq!(
                invalidates(&m(verb), pods, None).as_deref(),
                Some("pods"),
                "{verb}"
            );
        }
        assert_eq!(
            invalidates(&m("POST"), "/api/v1/namespaces/ns/pods/p/eviction", None).as_deref(),
            Some("pods"),
            "a subresource counts as its resource"
        );
        assert_eq!(
            invalidates(
                &m("PATCH"),
                "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
                None
            )
            .as_deref(),
            Some("celldfleets")
        );
        assert_eq!(
            invalidates(
                &m("POST"),
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                None
            ),
            None
        );
    }

    #[test]
    fn what_was_last_seen_outlives_other_writes_but_not_its_own() {
        let reads = PassReads::default();
        reads.saw("pods", vec![1_i32, 2]);
        reads.saw("statefulsets", Some(7_i32));
        reads.put("pods", "Pod/a".into(), 1_i32);
        reads.forget_all();
        assert_eq!(
            reads.get::<i32>("Pod/a"),
            None,
            "planning reads are forgotten"
        );
        assert_eq!(reads.last_seen::<Vec<i32>>("pods"), Some(vec![1, 2]));
        assert_eq!(
            reads.last_seen::<Option<String>>("statefulsets"),
            None,
            "another type"
        );
        reads.wrote("celldfleets");
        assert_eq!(reads.last_seen::<Vec<i32>>("pods"), Some(vec![1, 2]));
        reads.wrote("pods");
        assert_eq!(reads.last_seen::<Vec<i32>>("pods"), None);
        assert_eq!(
            reads.last_seen::<Option<i32>>("statefulsets"),
            Some(Some(7))
        );
    }

    /// Through a real kube `Client` (its buffer and error mapping): reads pass through and
    /// are answered as sent, a write forgets what was read of its kind before it goes out,
    /// and an API error comes back as the same `kube::Error::Api`.
    #[tokio::test]
    async fn the_observing_client_forgets_on_writes_and_passes_answers_through() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let inner = Client::new(svc, "ns");
        let reads = Arc::new(PassReads::default());
        let client = observing_client(inner, reads.clone());
        let pods: Api<Pod> = Api::namespaced(client, "ns");
        reads.put("pods", "Pod/a".into(), 1_i32);
        reads.put("statefulsets", "StatefulSet/f".into(), 5_i32);
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), "GET");
            send.send_response(Response::new(Body::from(pod_json("a").into_bytes())));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), "DELETE");
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "conflict", "reason": "Conflict", "code": 409});
            let mut resp = Response::new(Body::from(status.to_string().into_bytes()));
            *resp.status_mut() = http::StatusCode::CONFLICT;
            send.send_response(resp);
        });
        let got = pods.get("a").await.unwrap();
        assert_eq!(got.metadata.name.as_deref(), Some("a"));
        assert_eq!(
            reads.get::<i32>("Pod/a"),
            Some(1),
            "a read keeps the record"
        );
        reads.saw("pods", 1_i32);
        reads.saw("statefulsets", 2_i32);
        let err = pods.delete("a", &Default::default()).await.unwrap_err();
        match err {
            kube::Error::Api(s) => assert_eq!(s.code, 409),
            other => panic!("expected the API's 409, got {other:?}"),
        }
        assert_eq!(
            reads.get::<i32>("Pod/a"),
            None,
            "a write forgets what was read of its kind"
        );
        assert_eq!(
            reads.get::<i32>("StatefulSet/f"),
            Some(5),
            "and keeps what was read of another"
        );
        assert_eq!(
            reads.last_seen::<i32>("pods"),
            None,
            "a write forgets what was last seen of its resource"
        );
        assert_eq!(
            reads.last_seen::<i32>("statefulsets"),
            Some(2),
            "but not of another"
        );
        server.await.unwrap();
    }
}
