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

/// Why a cached pass handed over to a fresh one (the first cause is kept).
#[derive(Debug, Default)]
pub struct Escalation {
    cause: Mutex<Option<String>>,
    /// The pass sent its one permitted request: the fleet's status, guarded by the cached
    /// fleet's resourceVersion (`reconcile::reconcile_pass`).
    status_sent: std::sync::atomic::AtomicBool,
    /// The pass read a copy that this process's own write has replaced
    /// (`crate::own_writes`): what is left of the window. The reconcile then decides nothing
    /// and runs no fresh pass.
    stale: Mutex<Option<std::time::Duration>>,
}

impl Escalation {
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

/// The Event recorder, outside a cached pass; inside one `None`, and the pass escalates
/// (an Event is a request).
pub fn recorder(
    recorder: &Option<kube::runtime::events::Recorder>,
) -> Option<&kube::runtime::events::Recorder> {
    if let Some(esc) = cached() {
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
            let info = crate::transport::RequestInfo::of(
                req.method().as_str(),
                req.uri().path(),
                req.uri().query(),
            );
            let cause = format!("{} {}", info.verb, info.resource);
            tracing::debug!(request = %info, "cached pass: request refused, escalating");
            esc.escalate(|| cause.clone());
            ready(Err(Box::new(Refused(cause))))
        },
    );
    Client::new(service, "default")
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
}
