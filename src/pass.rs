//! The two passes of a reconcile (docs/design.md "Caches and the two passes").
//!
//! A reconcile first runs as a **cached pass**: the fleet is the controller's cached copy,
//! Pods, workloads, claims, Services, NetworkPolicies and PDBs come from the namespace's
//! watch-fed stores (`crate::watches`), and its API client sends nothing: every request it
//! is asked to make, read or write, is refused and recorded as the pass's *escalation
//! cause*. Failpoints, Events and member `/state` calls are refused the same way. A cached
//! pass that finishes without an escalation is the whole reconcile: it found nothing to do
//! and sent zero requests (a settled fleet at its resync, or an event that changed nothing
//! the operator acts on).
//!
//! A cached pass that escalates is thrown away and the reconcile is run again as a **fresh
//! pass**, from fresh reads, exactly as a reconcile ran before the caches: every decision
//! that journals an entry or writes anything is taken from fresh reads, and every guarded
//! write carries its precondition. A stale cache can therefore cost a fresh pass (it looked
//! like there was work) or a short delay (it looked like there was none, until the watch
//! event that brings the cache up to date triggers the next reconcile), never a wrong write.
//!
//! The pass must leave no trace outside the process's memory, and only traces that a fresh
//! pass would leave the same way: it cannot write (its client refuses), it does not count
//! failpoints, and the few in-memory records a reconcile keeps are written only where a
//! cached pass reaches them with the same facts a fresh one would (see `Run::cached`).

use std::sync::{Arc, Mutex};

use futures::future::{ready, Ready};
use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use tower::BoxError;

/// Why a cached pass handed over to a fresh one (the first cause is kept), and what a
/// *planning* cached pass was permitted to do (docs/design.md "Cache-planned operations").
#[derive(Debug, Default)]
pub struct Escalation {
    cause: Mutex<Option<String>>,
    /// The pass may decide and carry out the operations of [`plannable`] kinds from the
    /// caches ([`planning_client`]); otherwise it writes nothing (the rule before).
    planning: bool,
    /// Depth of the open decisions ([`decision`]): inside one, the pass's failpoints count,
    /// its effect boundary is crossed and its re-reads go to the API server.
    deciding: std::sync::atomic::AtomicU32,
    /// Depth of the open write permits ([`permit`]): the planning client sends a write only
    /// inside one.
    permits: std::sync::atomic::AtomicU32,
    /// The pass sent a write under a permit.
    wrote: std::sync::atomic::AtomicBool,
    /// The pass sent its one permitted request: the fleet's status, guarded by the cached
    /// fleet's resourceVersion (`reconcile::reconcile_pass`).
    status_sent: std::sync::atomic::AtomicBool,
    /// The pass read a copy that this process's own write has replaced
    /// (`crate::own_writes`): what is left of the window. The reconcile then decides nothing
    /// and runs no fresh pass.
    stale: Mutex<Option<std::time::Duration>>,
}

impl Escalation {
    /// A cached pass that may decide and carry out operations of [`plannable`] kinds.
    pub fn planning() -> Self {
        Self {
            planning: true,
            ..Self::default()
        }
    }

    /// Whether the pass may plan ([`Escalation::planning`]).
    pub fn may_plan(&self) -> bool {
        self.planning
    }

    /// Inside an open decision ([`decision`]).
    pub fn deciding(&self) -> bool {
        self.deciding.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Inside an open write permit ([`permit`]).
    pub fn permitted(&self) -> bool {
        self.permits.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Whether the pass sent a write under a permit.
    pub fn wrote(&self) -> bool {
        self.wrote.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records `cause` unless an earlier one is recorded.
    pub fn escalate(&self, cause: impl FnOnce() -> String) {
        if let Ok(mut c) = self.cause.lock() {
            if c.is_none() {
                *c = Some(cause());
            }
        }
    }

    /// The first cause, if the pass escalated.
    pub fn cause(&self) -> Option<String> {
        self.cause.lock().ok().and_then(|c| c.clone())
    }

    /// Whether the pass has escalated.
    pub fn escalated(&self) -> bool {
        self.cause.lock().map(|c| c.is_some()).unwrap_or(true)
    }

    /// Records that the pass sent the fleet's status.
    pub fn status_sent(&self) {
        self.status_sent
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ends the pass on a copy older than this process's own write, `left` of the window to
    /// go (the first such copy is kept, as the escalation cause `own write not yet seen`).
    pub fn stale_copy(&self, what: &str, left: std::time::Duration) {
        if let Ok(mut s) = self.stale.lock() {
            if s.is_none() && !self.escalated() {
                *s = Some(left);
            }
        }
        self.escalate(|| format!("own write not yet seen ({what})"));
    }

    /// The pass ended on a copy older than this process's own write: what is left of the window.
    pub fn stale_for(&self) -> Option<std::time::Duration> {
        self.stale.lock().ok().and_then(|s| *s)
    }

    /// Whether the pass sent the fleet's status.
    pub fn sent_status(&self) -> bool {
        self.status_sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

tokio::task_local! {
    static CACHED: Arc<Escalation>;
}

/// Runs `fut` as a cached pass: [`cached`] returns `esc` inside it.
pub async fn scope<F: std::future::Future>(esc: Arc<Escalation>, fut: F) -> F::Output {
    CACHED.scope(esc, fut).await
}

/// The running cached pass's escalation record (`None` in a fresh pass or outside a
/// reconcile).
pub fn cached() -> Option<Arc<Escalation>> {
    CACHED.try_with(Arc::clone).ok()
}

/// Operation kinds a planning cached pass may decide and carry out from the caches: those
/// whose only effect is one guarded write of the workload's replicas or template (not the
/// strict ones, which [`plannable`]'s caller excludes; not Provision, whose effect is a
/// create; never a replacement or a deletion, whose steps are destructive).
pub fn plannable(kind: journal::OperationKind) -> bool {
    use journal::OperationKind as K;
    matches!(kind, K::Scale | K::Restart | K::Upgrade | K::TemplateUpdate)
}

/// Leaves its decision (or permit) when dropped.
#[must_use]
pub struct Scope {
    esc: Arc<Escalation>,
    permit: bool,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let counter = if self.permit {
            &self.esc.permits
        } else {
            &self.esc.deciding
        };
        counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Opens a decision of the running planning cached pass (`None` outside one, or in a pass
/// that may not plan): until the returned scope is dropped, failpoints count, the effect
/// boundary is crossed and re-reads go to the API server, as in a fresh pass.
pub fn decision() -> Option<Scope> {
    let esc = cached().filter(|e| e.planning)?;
    esc.deciding
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Some(Scope { esc, permit: false })
}

/// Opens a write permit of the running planning cached pass (`None` once it has escalated):
/// until the returned scope is dropped, [`planning_client`] sends writes (and the Event
/// recorder is handed out).
pub fn permit() -> Option<Scope> {
    // A pass that has escalated writes nothing more: the fresh pass decides again.
    let esc = cached().filter(|e| e.planning && !e.escalated())?;
    esc.permits
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Some(Scope { esc, permit: true })
}

/// The Event recorder, outside a cached pass or under a planning pass's write permit
/// (the Events of the entries it appends); otherwise, inside a cached pass, `None`, and the
/// pass escalates (an Event is a request).
pub fn recorder<R>(recorder: &Option<R>) -> Option<&R> {
    if let Some(esc) = cached() {
        if esc.planning && esc.permitted() {
            return recorder.as_ref();
        }
        if recorder.is_some() {
            esc.escalate(|| "create events".into());
        }
        return None;
    }
    recorder.as_ref()
}

/// The error every request of a cached pass gets.
#[derive(Debug, thiserror::Error)]
#[error(
    "not sent: a cached pass sends no request ({0}); the reconcile runs again from fresh reads"
)]
pub struct Refused(pub String);

/// The cached pass's client: it answers every request with [`Refused`] and records the
/// request (`verb resource`, as the audit log names it) as the escalation cause.
pub fn refusing_client(esc: Arc<Escalation>) -> Client {
    let service = tower::service_fn(
        move |req: Request<Body>| -> Ready<Result<Response<Body>, BoxError>> {
            ready(Err(Box::new(refuse(&esc, &req))))
        },
    );
    Client::new(service, "default")
}

/// Refuses `req` in a cached pass: records it (`verb resource`, as the audit log names it)
/// as the escalation cause and returns the error the pass's request gets.
fn refuse(esc: &Escalation, req: &Request<Body>) -> Refused {
    let info = crate::transport::RequestInfo::of(
        req.method().as_str(),
        req.uri().path(),
        req.uri().query(),
    );
    let cause = format!("{} {}", info.verb, info.resource);
    tracing::debug!(request = %info, planning = esc.planning, "cached pass: request refused, escalating");
    esc.escalate(|| cause.clone());
    Refused(cause)
}

/// A planning cached pass's client: reads (GET, which includes lists) go to `inner` as they
/// are; a write goes to `inner` only under a [`permit`] (and marks the pass as one that
/// wrote); any other write is answered with [`Refused`] and recorded as the escalation
/// cause, as [`refusing_client`] does.
pub fn planning_client(esc: Arc<Escalation>, inner: Client) -> Client {
    let namespace = inner.default_namespace().to_string();
    let service = tower::service_fn(move |req: Request<Body>| {
        let inner = inner.clone();
        let esc = esc.clone();
        async move {
            if req.method() != http::Method::GET {
                if !esc.permitted() {
                    return Err::<Response<Body>, BoxError>(Box::new(refuse(&esc, &req)));
                }
                esc.wrote.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            inner
                .send(req)
                .await
                .map_err(|e| -> BoxError { Box::new(e) })
        }
    });
    Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;

    #[tokio::test]
    async fn the_refusing_client_sends_nothing_and_keeps_the_first_cause() {
        let esc = Arc::new(Escalation::default());
        let client = refusing_client(esc.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
        let err = pods.get_opt("p").await.unwrap_err();
        assert!(err.to_string().contains("not sent"), "{err}");
        let _ = pods.delete("p", &Default::default()).await.unwrap_err();
        assert_eq!(esc.cause().as_deref(), Some("get pods"));
    }

    #[tokio::test]
    async fn the_scope_is_seen_only_inside_the_pass() {
        assert!(cached().is_none());
        let esc = Arc::new(Escalation::default());
        scope(esc.clone(), async {
            let inner = cached().expect("inside the pass");
            inner.escalate(|| "failpoint before-intent".into());
        })
        .await;
        assert!(cached().is_none());
        assert_eq!(esc.cause().as_deref(), Some("failpoint before-intent"));
    }

    #[tokio::test]
    async fn the_planning_client_sends_reads_and_only_permitted_writes() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let esc = Arc::new(Escalation::planning());
        let client = planning_client(esc.clone(), Client::new(svc, "ns"));
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "ns"}});
                send.send_response(Response::new(Body::from(pod.to_string().into_bytes())));
            }
            seen
        });
        let pods: Api<Pod> = Api::namespaced(client, "ns");
        scope(esc.clone(), async {
            pods.get_opt("p").await.expect("a read is sent");
            assert!(!esc.wrote());
            {
                let _permit = permit().expect("a planning pass");
                assert!(esc.permitted());
                pods.delete("p", &Default::default())
                    .await
                    .expect("a permitted write is sent");
            }
            assert!(!esc.permitted(), "the permit ends with its scope");
            let refused = pods.delete("p", &Default::default()).await.unwrap_err();
            assert!(refused.to_string().contains("not sent"), "{refused}");
            // Once escalated, the pass gets no permit: the fresh pass decides again.
            assert!(permit().is_none());
            let _ = pods.delete("p", &Default::default()).await.unwrap_err();
        })
        .await;
        drop(pods);
        let seen = server.await.unwrap();
        assert_eq!(
            seen,
            [
                "GET /api/v1/namespaces/ns/pods/p",
                "DELETE /api/v1/namespaces/ns/pods/p"
            ]
        );
        assert_eq!(esc.cause().as_deref(), Some("delete pods"));
        assert!(esc.wrote());
        // A pass that may not plan gets no permit or decision.
        let plain = Arc::new(Escalation::default());
        scope(plain, async {
            assert!(permit().is_none() && decision().is_none());
        })
        .await;
    }
}
