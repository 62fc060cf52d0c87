//! The reads of one fresh pass (docs/design.md "Caches and the two passes", "Reads of a
//! fresh pass").
//!
//! A fresh pass used to send a GET or a LIST every time its planning code asked for an
//! object: the workload four times, the member claims once per member and per step, the
//! fleet's Pods once per step, about 30 serial requests for one operation step. Under a
//! burst of operations that held each reconcile slot for 0.3–0.5 s. Now each planning read
//! (`Run::workload`, `Run::pods`, `Run::claim_at`, …) is sent **once per pass between two
//! writes**: the answer is kept in this record and handed out again, and **every write the
//! pass sends forgets all of it** (the pass's client tells it, [`observing_client`]), and so
//! does every effect boundary (`Run::before_effect`, and after member requests, which the
//! client does not see), so a read that follows a write or an effect of the pass goes to the
//! API server again.
//!
//! What this does not change:
//! - every answer handed out is a fresh read of this pass, never a cached (watch) copy;
//! - the read of a write's own target right before the write (the guarded write's re-read:
//!   `Run::reread_workload`, `Run::reread_claim_at`, direct `Api` reads in the write
//!   paths) always goes to the API server, and every write still carries its precondition;
//! - a cached pass reads its stores as before, and `--test-fresh-reads` keeps no record
//!   (the design before the caches, for the benchmark's side-by-side figures).
//!
//! A member found in a labelled list of this pass answers a read by name of the same kind
//! (a claim at a member's name, a member Pod), as a GET in the same pass would have; a name
//! not in the list is asked of the API server (a foreign object has no fleet label).

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::Request;
use kube::client::Body;
use kube::Client;
use tower::BoxError;

/// What one fresh pass has read since its last write.
#[derive(Default)]
pub struct PassReads {
    entries: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
    reused: AtomicU64,
    forgotten: AtomicU64,
}

impl PassReads {
    /// The answer kept under `key`, if it is of type `T`.
    pub fn get<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        let found = self
            .entries
            .lock()
            .ok()?
            .get(key)
            .and_then(|v| v.downcast_ref::<T>().cloned());
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
        let list = entries.get(list_key)?.downcast_ref::<Vec<T>>()?;
        let found = list.iter().find(|o| matches(o)).cloned();
        if found.is_some() {
            self.reused.fetch_add(1, Ordering::Relaxed);
        }
        Some(found)
    }

    /// Keeps `value` under `key` until the pass's next write.
    pub fn put<T: Send + Sync + 'static>(&self, key: String, value: T) {
        if let Ok(mut e) = self.entries.lock() {
            e.insert(key, Arc::new(value));
        }
    }

    /// Forgets every answer (the pass is about to write, or has written).
    pub fn forget_all(&self) {
        if let Ok(mut e) = self.entries.lock() {
            if !e.is_empty() {
                self.forgotten.fetch_add(1, Ordering::Relaxed);
            }
            e.clear();
        }
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

/// Whether a request sent by a pass makes its kept reads stale: everything but a GET
/// (a read or a watch) and an Event's creation (no pass reads Events).
fn invalidates(method: &http::Method, path: &str, query: Option<&str>) -> bool {
    if method == http::Method::GET {
        return false;
    }
    let info = crate::transport::RequestInfo::of(method.as_str(), path, query);
    info.resource != "events"
}

/// `inner` for one fresh pass: every request goes to `inner` unchanged (its errors come
/// back as `inner`'s, so the pass sees what it would have seen), and every write
/// empties `reads` before it is sent and again once it is answered.
pub fn observing_client(inner: Client, reads: Arc<PassReads>) -> Client {
    let namespace = inner.default_namespace().to_string();
    let service = tower::service_fn(move |req: Request<Body>| {
        let inner = inner.clone();
        let reads = reads.clone();
        async move {
            let writes = invalidates(req.method(), req.uri().path(), req.uri().query());
            if writes {
                reads.forget_all();
            }
            let answer = inner.send(req).await;
            if writes {
                reads.forget_all();
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
        reads.put("Pod/a".into(), Some(7_i32));
        assert_eq!(reads.get::<Option<i32>>("Pod/a"), Some(Some(7)));
        assert_eq!(
            reads.get::<Option<String>>("Pod/a"),
            None,
            "another type is not handed out"
        );
        reads.put("Pod?l".into(), vec![1_i32, 2, 3]);
        assert_eq!(reads.find_in::<i32>("Pod?l", |v| *v == 2), Some(Some(2)));
        assert_eq!(reads.find_in::<i32>("Pod?l", |v| *v == 9), Some(None));
        assert_eq!(reads.find_in::<i32>("Pod?other", |_| true), None);
        assert_eq!(reads.reused(), 2);
        reads.forget_all();
        assert_eq!(reads.get::<Option<i32>>("Pod/a"), None);
        assert_eq!(reads.find_in::<i32>("Pod?l", |_| true), None);
        assert_eq!(reads.forgotten(), 1);
        reads.forget_all();
        assert_eq!(reads.forgotten(), 1, "an empty record forgets nothing");
    }

    #[test]
    fn every_write_but_an_events_invalidates() {
        let m = |s: &str| s.parse::<http::Method>().unwrap();
        let pods = "/api/v1/namespaces/ns/pods/p";
        assert!(!invalidates(&m("GET"), pods, None));
        assert!(!invalidates(
            &m("GET"),
            "/api/v1/namespaces/ns/pods",
            Some("labelSelector=a%3Db")
        ));
        for verb in ["POST", "PUT", "PATCH", "DELETE"] {
            assert!(invalidates(&m(verb), pods, None), "{verb}");
        }
        assert!(invalidates(
            &m("PATCH"),
            "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
            None
        ));
        assert!(!invalidates(
            &m("POST"),
            "/apis/events.k8s.io/v1/namespaces/ns/events",
            None
        ));
    }

    /// Through a real kube `Client` (its buffer and error mapping): reads pass through and
    /// are answered as sent, a write empties the record before it goes out, and an API
    /// error comes back as the same `kube::Error::Api`.
    #[tokio::test]
    async fn the_observing_client_forgets_on_writes_and_passes_answers_through() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let inner = Client::new(svc, "ns");
        let reads = Arc::new(PassReads::default());
        let client = observing_client(inner, reads.clone());
        let pods: Api<Pod> = Api::namespaced(client, "ns");
        reads.put("Pod/a".into(), 1_i32);
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
        let err = pods.delete("a", &Default::default()).await.unwrap_err();
        match err {
            kube::Error::Api(s) => assert_eq!(s.code, 409),
            other => panic!("expected the API's 409, got {other:?}"),
        }
        assert_eq!(
            reads.get::<i32>("Pod/a"),
            None,
            "a write empties the record"
        );
        server.await.unwrap();
    }
}
