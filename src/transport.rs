//! The operator's HTTP transport, one tower layer between kube's typed API and the wire
//! (docs/operations.md "Requests, timeouts, retries and stale leaders"):
//!
//! - **Lease guard.** A write (POST, PUT, PATCH, DELETE) other than to the leader Lease is not
//!   sent unless this process holds the Lease with [`crate::leader::MARGIN`] to spare. The
//!   reconciler checks the Lease before each effect too; this check is the last one before
//!   the bytes leave, so it also covers writes that are not journaled (status, Events, the
//!   zone gate, prerequisites) and a process that was stopped between its check and its send.
//! - **Timeouts.** A write must answer within [`WRITE_TIMEOUT`], shorter than the Lease
//!   margin, so a write that passed the guard either lands or is given up while the Lease is
//!   still ours; reads within [`READ_TIMEOUT`]; watches are bounded by kube's read timeout.
//! - **Retries of reads only.** kube's default retry layer (429, 503, 504 retried up to 15
//!   times with backoff up to 1000 s, writes included) is off: a write retried on its own
//!   could land long after the Lease that allowed it expired. A GET answered 429, 503 or 504
//!   is retried here at most [`READ_RETRIES`] times within a few seconds; a failed write
//!   ends the reconcile and the next one decides again from fresh reads.
//! - **Fault injection** (`--test-api-fault`, needs `--local-test`): the N-th request
//!   matching a filter gets one [`FaultKind`], below the read retries, so a drill sees what
//!   the retries hide and what they turn a fault into.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use kube::client::{Body, DynBody};
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::leader::Leadership;

/// A write must answer within this long (below the Lease margin of 5 s).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(4);
/// A read (GET of one object or a list) must answer within this long.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a GET answered 429, 503 or 504 is tried again.
pub const READ_RETRIES: u32 = 3;
/// The longest wait before a retried read, whatever `Retry-After` asks.
const MAX_READ_DELAY: Duration = Duration::from_secs(2);

/// What one request is, as the API server's audit log would name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `other`.
    pub verb: &'static str,
    /// Plural resource, with `/subresource` (e.g. `statefulsets/scale`).
    pub resource: String,
    /// Namespace, when the path names one.
    pub namespace: Option<String>,
    /// Object name, when the path names one.
    pub name: Option<String>,
}

impl RequestInfo {
    /// Classifies `method path?query`.
    pub fn of(method: &str, path: &str, query: Option<&str>) -> Self {
        let (verb, resource) = crate::metrics::classify(method, path, query);
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segs.first() {
            Some(&"api") => segs.get(2..).unwrap_or(&[]),
            Some(&"apis") => segs.get(3..).unwrap_or(&[]),
            _ => &[],
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
            ["namespaces", ns] => (Some(ns.to_string()), rest),
            other => (None, other),
        };
        let name = rest.get(1).map(|s| s.to_string());
        RequestInfo {
            verb,
            resource,
            namespace,
            name,
        }
    }

    fn is_write(&self) -> bool {
        matches!(self.verb, "create" | "update" | "patch" | "delete")
    }

    fn is_lease(&self) -> bool {
        self.resource == "leases"
    }
}

impl std::fmt::Display for RequestInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => write!(f, " {ns}/{n}"),
            (Some(ns), None) => write!(f, " {ns}/"),
            (None, Some(n)) => write!(f, " {n}"),
            (None, None) => Ok(()),
        }
    }
}

/// One kind of injected API fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Counts and logs the matching requests; injects nothing (a drill's clean run).
    None,
    /// The request is never sent; the client sees a timeout.
    TimeoutBefore,
    /// The request is sent and answered (committed); the client sees a timeout.
    LostResponse,
    /// The request is not sent; the client sees 409 Conflict.
    Conflict,
    /// The request is not sent; the client sees 429 with `Retry-After: 1`.
    Throttle,
    /// The request is not sent; the client sees 503.
    Unavailable,
    /// The request is not sent; the connection is reset.
    Reset,
}

impl FaultKind {
    /// Every kind that injects something, in the order drills sweep them.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::TimeoutBefore,
        FaultKind::LostResponse,
        FaultKind::Conflict,
        FaultKind::Throttle,
        FaultKind::Unavailable,
        FaultKind::Reset,
    ];

    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::TimeoutBefore => "timeout-before",
            FaultKind::LostResponse => "lost-response",
            FaultKind::Conflict => "conflict",
            FaultKind::Throttle => "throttle",
            FaultKind::Unavailable => "unavailable",
            FaultKind::Reset => "reset",
        }
    }

    /// The API server's answer a fault stands in for, when it is one (the request is not sent).
    fn synthetic(self) -> Option<(StatusCode, &'static str, &'static str)> {
        Some(match self {
            FaultKind::Conflict => (
                StatusCode::CONFLICT,
                "Conflict",
                "injected conflict: the object has been modified; please apply your changes to the latest version and try again",
            ),
            FaultKind::Throttle => (
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "injected throttle: too many requests, please try again later",
            ),
            FaultKind::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "injected unavailable: the server is currently unable to handle the request",
            ),
            _ => return None,
        })
    }

    fn parse(s: &str) -> Option<Self> {
        [FaultKind::None]
            .into_iter()
            .chain(FaultKind::ALL)
            .find(|k| k.as_str() == s)
    }
}

/// `--test-api-fault=KIND@N[:VERB[:RESOURCE[:NAMESPACE]]]`: inject KIND into the N-th
/// request matching the filter (`*` or an empty field matches anything; VERB may be
/// `write` for any of create/update/patch/delete, or `read` for get/list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// What to inject.
    pub kind: FaultKind,
    /// The 1-based index among matching requests.
    pub nth: u64,
    /// Verb filter.
    pub verb: Option<String>,
    /// Resource filter (exact, e.g. `statefulsets` or `celldfleets/status`).
    pub resource: Option<String>,
    /// Namespace filter.
    pub namespace: Option<String>,
}

impl FaultSpec {
    /// Parses the flag value.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (kind, rest) = s
            .split_once('@')
            .ok_or_else(|| format!("{s:?}: expected KIND@N[:VERB[:RESOURCE[:NAMESPACE]]]"))?;
        let kind = FaultKind::parse(kind).ok_or_else(|| {
            format!(
                "unknown fault kind {kind:?}; known: none, {}",
                FaultKind::ALL.map(FaultKind::as_str).join(", ")
            )
        })?;
        let mut fields = rest.split(':');
        let nth = fields.next().unwrap_or_default();
        let nth: u64 = nth
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{nth:?} is not a 1-based request index"))?;
        let field = |f: Option<&str>| f.filter(|v| !v.is_empty() && *v != "*").map(String::from);
        let verb = field(fields.next());
        let resource = field(fields.next());
        let namespace = field(fields.next());
        if fields.next().is_some() {
            return Err(format!("{s:?}: too many ':' fields"));
        }
        if let Some(v) = &verb {
            let known = [
                "write", "read", "get", "list", "watch", "create", "update", "patch", "delete",
            ];
            if !known.contains(&v.as_str()) {
                return Err(format!("unknown verb {v:?}; known: {}", known.join(", ")));
            }
        }
        Ok(FaultSpec {
            kind,
            nth,
            verb,
            resource,
            namespace,
        })
    }

    fn matches(&self, r: &RequestInfo) -> bool {
        let verb = match self.verb.as_deref() {
            None => true,
            Some("write") => r.is_write(),
            Some("read") => matches!(r.verb, "get" | "list"),
            Some(v) => r.verb == v,
        };
        verb && self.resource.as_ref().is_none_or(|x| *x == r.resource)
            && self
                .namespace
                .as_ref()
                .is_none_or(|x| r.namespace.as_deref() == Some(x.as_str()))
    }
}

/// The transport's settings.
#[derive(Clone, Default)]
pub struct TransportOptions {
    /// Writes are sent only while this holds the Lease (none: CLI commands, tests).
    pub leadership: Option<Leadership>,
    /// `--test-api-fault`.
    pub fault: Option<FaultSpec>,
    /// Test clusters only: leave the Lease guard out, so a drill can show that a write sent
    /// by a deposed leader is refused by the API server (the fence), not only by the guard.
    pub skip_lease_guard: bool,
    /// Where each answered request's time is recorded
    /// (`celld_operator_api_request_duration_seconds`; none: CLI commands, tests).
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// The layer (see the module documentation).
#[derive(Clone)]
pub struct TransportLayer {
    opts: Arc<TransportOptions>,
    matched: Arc<AtomicU64>,
}

impl TransportLayer {
    /// A layer with `opts`.
    pub fn new(opts: TransportOptions) -> Self {
        TransportLayer {
            opts: Arc::new(opts),
            matched: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<S> Layer<S> for TransportLayer {
    type Service = Transport<S>;
    fn layer(&self, inner: S) -> Transport<S> {
        Transport {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            opts: self.opts.clone(),
            matched: self.matched.clone(),
        }
    }
}

/// The service [`TransportLayer`] builds.
pub struct Transport<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    opts: Arc<TransportOptions>,
    matched: Arc<AtomicU64>,
}

impl<S> Clone for Transport<S> {
    fn clone(&self) -> Self {
        Transport {
            inner: self.inner.clone(),
            opts: self.opts.clone(),
            matched: self.matched.clone(),
        }
    }
}

type Resp = Response<Box<DynBody>>;

fn io_error(kind: std::io::ErrorKind, msg: String) -> BoxError {
    Box::new(std::io::Error::new(kind, msg))
}

fn status_response(code: StatusCode, reason: &str, message: &str) -> Resp {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
    .to_string();
    let mut resp = Response::new(Box::new(http_body_util::BodyExt::map_err(
        http_body_util::Full::new(Bytes::from(body)),
        |e: std::convert::Infallible| -> BoxError { match e {} },
    )) as Box<DynBody>);
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if code == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert("Retry-After", http::HeaderValue::from_static("1"));
    }
    resp
}

fn retry_delay(resp: &Resp, attempt: u32) -> Duration {
    let server = resp
        .headers()
        .get("Retry-After")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let backoff = Duration::from_millis(100 << attempt.min(4));
    server.unwrap_or(backoff).min(MAX_READ_DELAY)
}

fn copy_request(req: &Request<Body>) -> Option<Request<Body>> {
    let body = req.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

impl<S> Service<Request<Body>> for Transport<S>
where
    S: Service<Request<Body>, Response = Resp, Error = BoxError> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Resp, BoxError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        // Readiness of the inner service is awaited per attempt, under its lock.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            // Polled by the task that sent the request (kube's client buffer hands this
            // future back to it), so a reconcile's scope sees its own requests.
            let sent = crate::reaction::sent();
            let info = RequestInfo::of(req.method().as_str(), req.uri().path(), req.uri().query());
            let answer = this.with_read_retries(&info, req).await;
            crate::reaction::answered(sent, &info);
            answer
        })
    }
}

impl<S> Transport<S>
where
    S: Service<Request<Body>, Response = Resp, Error = BoxError> + Send + 'static,
    S::Future: Send + 'static,
{
    /// Sends `req`; a GET answered 429, 503 or 504 is tried again (at most [`READ_RETRIES`]).
    async fn with_read_retries(
        &self,
        info: &RequestInfo,
        req: Request<Body>,
    ) -> Result<Resp, BoxError> {
        let retry_reads = matches!(info.verb, "get" | "list");
        let mut attempt = 0;
        let mut req = req;
        loop {
            let again = if retry_reads && attempt < READ_RETRIES {
                copy_request(&req)
            } else {
                None
            };
            let resp = self.attempt(info, req).await?;
            let retryable = matches!(
                resp.status(),
                StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            );
            match again {
                Some(next) if retryable => {
                    let delay = retry_delay(&resp, attempt);
                    tracing::debug!(request = %info, status = resp.status().as_u16(), ?delay, "retrying a read");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                    req = next;
                }
                _ => return Ok(resp),
            }
        }
    }

    /// One attempt: Lease guard, fault injection, timeout, send.
    async fn attempt(&self, info: &RequestInfo, req: Request<Body>) -> Result<Resp, BoxError> {
        if info.is_write() && !info.is_lease() && !self.opts.skip_lease_guard {
            if let Some(l) = &self.opts.leadership {
                if !l.holds() {
                    tracing::error!(request = %info, "not sent: the leader Lease is not held with the margin to spare");
                    return Err(io_error(
                        std::io::ErrorKind::PermissionDenied,
                        format!("{info} not sent: this replica does not hold the leader Lease with 5 s to spare"),
                    ));
                }
            }
        }
        let fault = self.fault_for(info);
        let limit = match info.verb {
            "watch" => None,
            "get" | "list" => Some(READ_TIMEOUT),
            _ => Some(WRITE_TIMEOUT),
        };
        let timed_out = |limit: Duration| {
            io_error(
                std::io::ErrorKind::TimedOut,
                format!("{info}: no answer within {limit:?}"),
            )
        };
        if let Some((code, reason, message)) = fault.and_then(FaultKind::synthetic) {
            return Ok(status_response(code, reason, message));
        }
        match fault {
            Some(FaultKind::TimeoutBefore) => {
                return Err(io_error(
                    std::io::ErrorKind::TimedOut,
                    format!("{info}: injected timeout-before (not sent)"),
                ))
            }
            Some(FaultKind::Reset) => {
                return Err(io_error(
                    std::io::ErrorKind::ConnectionReset,
                    format!(
                        "{info}: injected reset (connection dropped before the request was sent)"
                    ),
                ))
            }
            _ => {}
        }
        let sent = async {
            let mut inner = self.inner.lock().await;
            inner.ready().await?;
            let fut = inner.call(req);
            drop(inner);
            fut.await
        };
        let started = std::time::Instant::now();
        let resp = match limit {
            Some(limit) => tokio::time::timeout(limit, sent)
                .await
                .map_err(|_| timed_out(limit))??,
            None => sent.await?,
        };
        // A watch's answer is its stream's start, not a request's time.
        if let (Some(m), true) = (&self.opts.metrics, limit.is_some()) {
            m.api_request_duration(info.verb, started.elapsed());
        }
        if fault == Some(FaultKind::LostResponse) {
            return Err(io_error(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{info}: injected lost-response (sent and answered {}, answer dropped)",
                    resp.status().as_u16()
                ),
            ));
        }
        Ok(resp)
    }

    /// The fault for this request, if it is the armed one (logged either way when counted).
    fn fault_for(&self, info: &RequestInfo) -> Option<FaultKind> {
        let spec = self.opts.fault.as_ref()?;
        if !spec.matches(info) {
            return None;
        }
        let n = self.matched.fetch_add(1, Ordering::SeqCst) + 1;
        if spec.kind == FaultKind::None || n != spec.nth {
            tracing::info!(index = n, request = %info, "api request counted");
            return None;
        }
        tracing::warn!(index = n, request = %info, fault = spec.kind.as_str(), "api fault injected");
        eprintln!(
            "celld-operator: api fault {} injected at matching request #{n}: {info}",
            spec.kind.as_str()
        );
        Some(spec.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_test::mock;

    fn request(method: &str, path: &str) -> Request<Body> {
        let mut req = Request::new(Body::from(b"{}".to_vec()));
        *req.method_mut() = method.parse().unwrap();
        *req.uri_mut() = path.parse().unwrap();
        req
    }

    fn err_of(r: Result<Resp, BoxError>) -> String {
        match r {
            Ok(resp) => panic!("expected an error, got {}", resp.status()),
            Err(e) => e.to_string(),
        }
    }

    fn ok() -> Resp {
        status_response(StatusCode::OK, "", "")
    }

    type MockHandle = mock::Handle<Request<Body>, Resp>;

    fn transport(
        opts: TransportOptions,
    ) -> (Transport<mock::Mock<Request<Body>, Resp>>, MockHandle) {
        let (svc, handle) = mock::pair::<Request<Body>, Resp>();
        (TransportLayer::new(opts).layer(svc), handle)
    }

    fn with_fault(spec: &str) -> TransportOptions {
        TransportOptions {
            fault: Some(FaultSpec::parse(spec).unwrap()),
            ..Default::default()
        }
    }

    const STS: &str = "/apis/apps/v1/namespaces/ns/statefulsets/f";
    const PODS: &str = "/api/v1/namespaces/ns/pods";

    /// Answers the next request on `handle` with `resp`, returning `method path`.
    async fn answer(handle: &mut MockHandle, resp: Resp) -> String {
        let (req, send) = handle
            .next_request()
            .await
            .expect("a request reaches the wire");
        send.send_response(resp);
        format!("{} {}", req.method(), req.uri().path())
    }

    /// The transport's future is polled by the task that sent the request, through kube's
    /// client and its buffer: a reconcile's scope counts its own requests
    /// (`celld_operator_reaction_pass_requests`); requests of other tasks are not counted.
    #[tokio::test]
    async fn a_reconciles_requests_are_counted_through_kubes_client() {
        let (t, mut handle) = transport(TransportOptions::default());
        let client = kube::Client::new(t, "ns");
        let metrics = crate::metrics::Metrics::default();
        let sts: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
            kube::Api::namespaced(client, "ns");
        let answering = tokio::spawn(async move {
            for _ in 0..3 {
                answer(
                    &mut handle,
                    status_response(StatusCode::NOT_FOUND, "NotFound", "not found"),
                )
                .await;
            }
        });
        // One request from another task, outside any reconcile.
        let other = sts.clone();
        tokio::spawn(async move { other.get_opt("elsewhere").await })
            .await
            .unwrap()
            .unwrap();
        crate::reaction::scope(None, async {
            assert!(sts.get_opt("f").await.unwrap().is_none());
            assert!(sts.get_opt("g").await.unwrap().is_none());
            crate::reaction::wrote(&metrics, "ns/f");
        })
        .await;
        answering.await.unwrap();
        let text = metrics.encode();
        assert!(
            text.contains("celld_operator_reaction_pass_requests_sum 2.0"),
            "{text}"
        );
    }

    #[test]
    fn specs_parse_and_refuse_clearly() {
        let s = FaultSpec::parse("lost-response@2:write:statefulsets:ns").unwrap();
        assert_eq!(s.kind, FaultKind::LostResponse);
        assert_eq!(s.nth, 2);
        assert_eq!(s.verb.as_deref(), Some("write"));
        assert_eq!(s.resource.as_deref(), Some("statefulsets"));
        assert_eq!(s.namespace.as_deref(), Some("ns"));
        let s = FaultSpec::parse("conflict@1:*:*:ns").unwrap();
        assert_eq!((s.verb, s.resource), (None, None));
        assert!(FaultSpec::parse("explode@1")
            .unwrap_err()
            .contains("known: none, timeout-before"));
        assert!(FaultSpec::parse("conflict@0")
            .unwrap_err()
            .contains("1-based"));
        assert!(FaultSpec::parse("conflict").unwrap_err().contains("KIND@N"));
        assert!(FaultSpec::parse("conflict@1:frob")
            .unwrap_err()
            .contains("unknown verb"));
        assert!(FaultSpec::parse("conflict@1:a:b:c:d").is_err());
    }

    #[test]
    fn requests_are_named_as_the_audit_log_names_them() {
        let r = RequestInfo::of("PUT", STS, None);
        assert_eq!(r.to_string(), "update statefulsets ns/f");
        let r = RequestInfo::of("GET", PODS, Some("labelSelector=a"));
        assert_eq!(
            (r.verb, r.namespace.as_deref(), r.name),
            ("list", Some("ns"), None)
        );
        let r = RequestInfo::of("GET", "/api/v1/namespaces/ns", None);
        assert_eq!(
            (r.resource.as_str(), r.namespace.as_deref()),
            ("namespaces", Some("ns"))
        );
        let r = RequestInfo::of(
            "DELETE",
            "/api/v1/namespaces/ns/persistentvolumeclaims/data-f-0",
            None,
        );
        assert_eq!(r.to_string(), "delete persistentvolumeclaims ns/data-f-0");
    }

    #[tokio::test]
    async fn lost_response_sends_the_request_and_reports_a_timeout() {
        let (mut t, mut handle) = transport(with_fault("lost-response@1:write"));
        let call = tokio::spawn(t.call(request("PUT", STS)));
        assert_eq!(answer(&mut handle, ok()).await, format!("PUT {STS}"));
        let err = err_of(call.await.unwrap());
        assert!(
            err.contains("injected lost-response (sent and answered 200"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn faults_before_sending_never_reach_the_wire() {
        for (kind, want) in [
            ("timeout-before", Err("injected timeout-before")),
            ("reset", Err("injected reset")),
            ("conflict", Ok(409)),
        ] {
            let (mut t, mut handle) = transport(with_fault(&format!("{kind}@1:write")));
            let got = t.call(request("PUT", STS)).await;
            match (want, got) {
                (Err(w), Err(e)) => assert!(e.to_string().contains(w), "{kind}: {e}"),
                (Ok(code), Ok(r)) => assert_eq!(r.status().as_u16(), code, "{kind}"),
                (w, g) => panic!("{kind}: want {w:?}, got {:?}", g.map(|r| r.status())),
            }
            // Nothing was sent: the next request is the first the mock sees.
            let next = tokio::spawn(t.call(request("GET", STS)));
            assert_eq!(
                answer(&mut handle, ok()).await,
                format!("GET {STS}"),
                "{kind}"
            );
            assert_eq!(next.await.unwrap().unwrap().status(), StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn only_the_nth_matching_request_is_faulted() {
        let (mut t, mut handle) = transport(with_fault("conflict@2:update:statefulsets:ns"));
        // A read and a write elsewhere do not count.
        for (m, p) in [
            ("GET", STS),
            ("PUT", "/apis/apps/v1/namespaces/other/statefulsets/f"),
        ] {
            let c = tokio::spawn(t.call(request(m, p)));
            answer(&mut handle, ok()).await;
            assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
        }
        // First matching write goes through, the second is faulted, the third goes through.
        let c = tokio::spawn(t.call(request("PUT", STS)));
        answer(&mut handle, ok()).await;
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(
            t.call(request("PUT", STS)).await.unwrap().status(),
            StatusCode::CONFLICT
        );
        let c = tokio::spawn(t.call(request("PUT", STS)));
        answer(&mut handle, ok()).await;
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_read_is_retried_but_a_throttled_write_is_not() {
        // The read: the injected 429 never reached the wire; the retry is the first request sent.
        let (mut t, mut handle) = transport(with_fault("throttle@1:get"));
        let c = tokio::spawn(t.call(request("GET", STS)));
        assert_eq!(answer(&mut handle, ok()).await, format!("GET {STS}"));
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
        // A real 503 on a read is retried too, at most READ_RETRIES times.
        let c = tokio::spawn(t.call(request("GET", STS)));
        for _ in 0..=READ_RETRIES {
            answer(
                &mut handle,
                status_response(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", ""),
            )
            .await;
        }
        assert_eq!(
            c.await.unwrap().unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // The write: the 429 is the answer, nothing is sent again.
        let (mut t, mut handle) = transport(with_fault("throttle@1:write"));
        let r = t.call(request("PATCH", STS)).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let c = tokio::spawn(t.call(request("GET", STS)));
        assert_eq!(answer(&mut handle, ok()).await, format!("GET {STS}"));
        c.await.unwrap().unwrap();
        // A real 503 on a write is returned as it is.
        let c = tokio::spawn(t.call(request("PUT", STS)));
        answer(
            &mut handle,
            status_response(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", ""),
        )
        .await;
        assert_eq!(
            c.await.unwrap().unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_without_an_answer_times_out_below_the_lease_margin() {
        assert!(WRITE_TIMEOUT < crate::leader::MARGIN);
        let (mut t, mut handle) = transport(TransportOptions::default());
        let c = tokio::spawn(t.call(request("PUT", STS)));
        let (_req, _send) = handle.next_request().await.unwrap();
        let err = err_of(c.await.unwrap());
        assert!(err.contains("no answer within 4s"), "{err}");
    }

    #[tokio::test]
    async fn a_replica_without_the_lease_sends_no_write_but_renews_and_reads() {
        let leadership = Leadership::default();
        let (mut t, mut handle) = transport(TransportOptions {
            leadership: Some(leadership.clone()),
            ..Default::default()
        });
        for (m, p) in [
            ("PUT", STS),
            (
                "PATCH",
                "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
            ),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events"),
            ("DELETE", "/api/v1/namespaces/ns/pods/f-0"),
        ] {
            let err = err_of(t.call(request(m, p)).await);
            assert!(err.contains("not sent"), "{m} {p}: {err}");
        }
        for (m, p) in [
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/sys/leases/celld-operator",
            ),
            ("GET", STS),
        ] {
            let c = tokio::spawn(t.call(request(m, p)));
            assert_eq!(answer(&mut handle, ok()).await, format!("{m} {p}"));
            c.await.unwrap().unwrap();
        }
        // Holding it, writes go out.
        leadership.set_held_for_test(std::time::Instant::now());
        let c = tokio::spawn(t.call(request("PUT", STS)));
        assert_eq!(answer(&mut handle, ok()).await, format!("PUT {STS}"));
        c.await.unwrap().unwrap();
        // Renewed 11 s ago: less than the 5 s margin is left of the 15 s Lease.
        leadership.set_held_for_test(std::time::Instant::now() - Duration::from_secs(11));
        assert!(t.call(request("PUT", STS)).await.is_err());
    }
}
