//! The operator's watches without a line buffer kept by every stream (docs/design.md
//! "Caches and the two passes", **Watch streams**).
//!
//! kube's watch decoder (`Client::request_events`, under kube-runtime's `watcher`) reads each
//! watch body through a `FramedRead` whose buffer starts at 8 KiB and is kept for the life of
//! the stream, used or not. The default `--watch-scope namespace` opens 9 watches per fleet
//! namespace: 900 streams at 1,000 fleets in 100 namespaces, about 7 MiB of the operator's
//! heap in those buffers alone (integration/bench/README.md "where the memory goes"). Almost
//! every one of them is quiet almost always (a bookmark a minute).
//!
//! [`Lines`] holds no buffer between events: an event that ends within the body frame it
//! arrived in (the common case: the API server writes one event per frame) is parsed straight
//! from that frame; a frame's unparsed tail is copied aside only until the next frame
//! completes it, and that copy is freed once parsed. The futures that list and open a watch
//! are boxed, so an idle stream keeps only what it needs to read its body.
//!
//! [`watch`] follows kube-runtime's `watcher` for a list-then-watch and yields the same
//! [`Event`]s and [`watcher::Error`]s, so what comes after it (the backoff, the reflector
//! stores, the triggers) is unchanged:
//! - `Init`, then the list in pages of the config's `page_size` (`InitApply` per object), then
//!   `InitDone`; a list without a resourceVersion is [`watcher::Error::NoResourceVersion`] and
//!   lists again;
//! - a watch from the list's resourceVersion with the config's selectors, server-side timeout
//!   and bookmarks; each object and bookmark moves the resourceVersion on;
//! - a watch that ends (the server's timeout, a closed connection, no byte for the timeout
//!   plus 5 s) resumes from the last resourceVersion without an error; a failed read resumes
//!   the same way after reporting [`watcher::Error::WatchFailed`] (so the backoff applies);
//! - `410 Gone`, as an event or as the answer to opening the watch, lists again from the
//!   start (kube retries the same resourceVersion when the answer to opening is 410; a
//!   version the server no longer has cannot come back, so this lists at once instead).
//!
//! Only the `ListWatch` initial-list strategy is implemented (the operator never asks for
//! streaming lists). `--test-kube-watcher` (hidden, `--local-test`) keeps kube's `watcher`
//! for the benchmark's side-by-side figures.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use http_body_util::BodyExt;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event, ListSemantic};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// How much longer than the watch's server-side timeout a silent stream is trusted before it
/// is taken for dead and resumed (kube's watcher uses the same margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The server-side timeout kube's watcher assumes when none is configured.
const DEFAULT_TIMEOUT_SECS: u32 = 290;

/// The lines of a streamed body, each without its newline; blank lines are skipped.
pub struct Lines<B> {
    body: B,
    /// What is left of the last frame (empty, and holding no frame, between events).
    chunk: Bytes,
    /// The start of a line whose end has not arrived yet (empty, with no capacity, between
    /// events).
    partial: Vec<u8>,
    ended: bool,
}

impl<B> Lines<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<tower::BoxError>,
{
    pub fn new(body: B) -> Self {
        Self {
            body,
            chunk: Bytes::new(),
            partial: Vec::new(),
            ended: false,
        }
    }

    /// The next line; `None` once the body has ended (an unterminated last line is returned
    /// first). A read error is returned as `kube::Error::Service`.
    pub async fn next_line(&mut self) -> Option<Result<Bytes, kube::Error>> {
        loop {
            if let Some(at) = self.chunk.iter().position(|b| *b == b'\n') {
                let mut line = self.chunk.split_to(at + 1);
                line.truncate(at);
                if self.chunk.is_empty() {
                    // Let go of the frame's memory as soon as it is read.
                    self.chunk = Bytes::new();
                }
                let line = if self.partial.is_empty() {
                    line
                } else {
                    let mut whole = std::mem::take(&mut self.partial);
                    whole.extend_from_slice(&line);
                    Bytes::from(whole)
                };
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(Ok(line));
            }
            if !self.chunk.is_empty() {
                self.partial.extend_from_slice(&self.chunk);
                self.chunk = Bytes::new();
            }
            if self.ended {
                let rest = std::mem::take(&mut self.partial);
                if rest.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                return Some(Ok(Bytes::from(rest)));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.chunk = data;
                    }
                }
                Some(Err(e)) => {
                    self.ended = true;
                    self.partial = Vec::new();
                    return Some(Err(kube::Error::Service(e.into())));
                }
                None => self.ended = true,
            }
        }
    }

    /// Bytes held between events (0 when the last event ended its frame).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.chunk.len() + self.partial.capacity()
    }
}

/// One watch event line: the event, or the error the line carries (a `Status` that is not an
/// event, or JSON that parses as neither).
fn parse<K: DeserializeOwned>(line: &[u8]) -> Result<WatchEvent<K>, kube::Error> {
    serde_json::from_slice::<WatchEvent<K>>(line).map_err(|e| {
        match serde_json::from_slice::<Status>(line) {
            Ok(status) if status.code != 0 => kube::Error::Api(status.boxed()),
            _ => kube::Error::SerdeError(e),
        }
    })
}

enum State<K> {
    /// Next: `Init`, then the first page.
    Empty,
    /// Handing out a page's objects; then the next page, or `InitDone` after the last.
    Paging {
        continue_token: Option<String>,
        objects: VecDeque<K>,
        version: Option<String>,
    },
    /// Next: open a watch from `version`.
    Listed { version: String },
    /// Reading a watch's events.
    Watching {
        version: String,
        lines: Lines<kube::client::Body>,
    },
}

struct Watch<K> {
    api: Api<K>,
    client: Client,
    config: watcher::Config,
}

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        let c = &self.config;
        let (resource_version, version_match) = match c.list_semantic {
            ListSemantic::Any => (Some("0".to_string()), Some(VersionMatch::NotOlderThan)),
            ListSemantic::MostRecent => (None, None),
        };
        ListParams {
            label_selector: c.label_selector.clone(),
            field_selector: c.field_selector.clone(),
            resource_version,
            version_match,
            limit: c.page_size,
            continue_token,
            ..Default::default()
        }
    }

    fn watch_params(&self) -> WatchParams {
        let c = &self.config;
        WatchParams {
            label_selector: c.label_selector.clone(),
            field_selector: c.field_selector.clone(),
            timeout: c.timeout,
            bookmarks: c.bookmarks,
            ..Default::default()
        }
    }

    /// Opens a watch from `version` (an error answer is returned as `kube::Error::Api`).
    async fn open(&self, version: &str) -> Result<Lines<kube::client::Body>, kube::Error> {
        let mut request = kube::core::Request::new(self.api.resource_url())
            .watch(&self.watch_params(), version)
            .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("watch");
        // As kube does: a watch stream is not compressed.
        request.headers_mut().insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await?;
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            let body = response.into_body().collect_bytes().await?;
            let answer = match serde_json::from_slice::<Status>(&body) {
                Ok(s) if s.code != 0 => s,
                _ => Status::failure(
                    String::from_utf8_lossy(&body).trim(),
                    "Failed to parse error data",
                )
                .with_code(status.as_u16()),
            };
            return Err(kube::Error::Api(answer.boxed()));
        }
        Ok(Lines::new(response.into_body()))
    }

    /// How long a watch may stay silent before it is taken for dead (`None`: forever).
    fn idle_limit(&self) -> Option<Duration> {
        match self.config.timeout {
            Some(0) => None,
            t => Some(
                Duration::from_secs(u64::from(t.unwrap_or(DEFAULT_TIMEOUT_SECS))) + IDLE_MARGIN,
            ),
        }
    }

    /// One step: what to yield (if anything) and the next state.
    async fn step(&self, state: State<K>) -> (Option<Result<Event<K>, watcher::Error>>, State<K>) {
        match state {
            State::Empty => (
                Some(Ok(Event::Init)),
                State::Paging {
                    continue_token: None,
                    objects: VecDeque::new(),
                    version: None,
                },
            ),
            State::Paging {
                continue_token,
                mut objects,
                version,
            } => {
                if let Some(next) = objects.pop_front() {
                    let state = State::Paging {
                        continue_token,
                        objects,
                        version,
                    };
                    return (Some(Ok(Event::InitApply(next))), state);
                }
                if let (None, Some(version)) = (&continue_token, &version) {
                    let version = version.clone();
                    return (Some(Ok(Event::InitDone)), State::Listed { version });
                }
                let lp = self.list_params(continue_token);
                // Boxed: an idle stream does not keep room for a list in progress.
                match Box::pin(self.api.list(&lp)).await {
                    Ok(list) => {
                        let version = list.metadata.resource_version.filter(|v| !v.is_empty());
                        let continue_token = list.metadata.continue_.filter(|c| !c.is_empty());
                        if version.is_none() && continue_token.is_none() {
                            return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                        }
                        let state = State::Paging {
                            continue_token,
                            objects: list.items.into(),
                            version,
                        };
                        (None, state)
                    }
                    Err(e) => (
                        Some(Err(watcher::Error::InitialListFailed(e))),
                        State::Empty,
                    ),
                }
            }
            State::Listed { version } => match Box::pin(self.open(&version)).await {
                Ok(lines) => (None, State::Watching { version, lines }),
                Err(kube::Error::Api(s)) if s.code == 410 => (
                    Some(Err(watcher::Error::WatchStartFailed(kube::Error::Api(s)))),
                    State::Empty,
                ),
                Err(e) => (
                    Some(Err(watcher::Error::WatchStartFailed(e))),
                    State::Listed { version },
                ),
            },
            State::Watching { version, mut lines } => {
                let next = match self.idle_limit() {
                    None => lines.next_line().await,
                    Some(limit) => match tokio::time::timeout(limit, lines.next_line()).await {
                        Ok(next) => next,
                        Err(_) => {
                            tracing::debug!(
                                kind = K::kind(&Default::default()).as_ref(),
                                "watch silent past its timeout; resuming"
                            );
                            None
                        }
                    },
                };
                match next {
                    None => (None, State::Listed { version }),
                    Some(Err(e)) => (
                        Some(Err(watcher::Error::WatchFailed(e))),
                        State::Listed { version },
                    ),
                    Some(Ok(line)) => self.event(version, lines, &line),
                }
            }
        }
    }

    /// What a watch event line yields, and the next state.
    fn event(
        &self,
        version: String,
        lines: Lines<kube::client::Body>,
        line: &[u8],
    ) -> (Option<Result<Event<K>, watcher::Error>>, State<K>) {
        let (obj, deleted) = match parse::<K>(line) {
            Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => (obj, false),
            Ok(WatchEvent::Deleted(obj)) => (obj, true),
            Ok(WatchEvent::Bookmark(mark)) => {
                let next = State::Watching {
                    version: mark.metadata.resource_version,
                    lines,
                };
                return (None, next);
            }
            Ok(WatchEvent::Error(status)) => {
                // 410 Gone: the version is older than the server keeps; list again.
                let next = if status.code == 410 {
                    State::Empty
                } else {
                    State::Watching { version, lines }
                };
                return (Some(Err(watcher::Error::WatchError(status))), next);
            }
            Err(e) => {
                return (
                    Some(Err(watcher::Error::WatchFailed(e))),
                    State::Watching { version, lines },
                )
            }
        };
        let seen = obj.resource_version().unwrap_or_default();
        if seen.is_empty() {
            return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
        }
        let event = if deleted {
            Event::Delete(obj)
        } else {
            Event::Apply(obj)
        };
        let next = State::Watching {
            version: seen,
            lines,
        };
        (Some(Ok(event)), next)
    }
}

/// Lists and watches `api` as kube-runtime's `watcher(api, config)` does (module docs).
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let client = api.clone().into_client();
    let watch = Watch {
        api,
        client,
        config,
    };
    futures::stream::unfold((watch, State::Empty), |(watch, mut state)| async move {
        loop {
            let (event, next) = watch.step(state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (watch, state)));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http::{Request, Response};
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use k8s_openapi::api::core::v1::Pod;
    use kube::client::Body;
    use tower_test::mock;

    type Frames =
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>;

    /// A body that arrives in these frames.
    fn framed(frames: Vec<&'static str>) -> StreamBody<Frames> {
        let frames: Vec<_> = frames
            .into_iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    async fn line<B>(lines: &mut Lines<B>) -> Option<String>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
        B::Error: Into<tower::BoxError>,
    {
        lines
            .next_line()
            .await
            .map(|l| String::from_utf8(l.unwrap().to_vec()).unwrap())
    }

    #[tokio::test]
    async fn lines_span_frames_and_nothing_is_held_between_events() {
        let mut lines = Lines::new(framed(vec![
            "{\"a\":1}\n",
            "{\"b\":",
            "2}\n{\"c\"",
            ":3}\n\n",
            "\n{\"d\":4}",
        ]));
        assert_eq!(line(&mut lines).await.as_deref(), Some("{\"a\":1}"));
        assert_eq!(
            lines.held(),
            0,
            "an event that ended its frame leaves nothing"
        );
        assert_eq!(line(&mut lines).await.as_deref(), Some("{\"b\":2}"));
        assert!(lines.held() > 0, "the start of the next event is kept");
        assert_eq!(line(&mut lines).await.as_deref(), Some("{\"c\":3}"));
        assert_eq!(
            lines.held(),
            1,
            "the copy of a spread event is freed once parsed; the frame's blank line is left"
        );
        assert_eq!(
            line(&mut lines).await.as_deref(),
            Some("{\"d\":4}"),
            "blank lines are skipped; an unterminated last line is returned at the end"
        );
        assert_eq!(line(&mut lines).await, None);
        assert_eq!(line(&mut lines).await, None, "the end stays the end");
    }

    #[tokio::test]
    async fn a_read_error_ends_the_lines_with_an_error() {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"a\":1}\n{\"b\""))),
            Err(std::io::Error::other("connection reset")),
        ];
        let mut lines = Lines::new(StreamBody::new(futures::stream::iter(frames)));
        assert_eq!(line(&mut lines).await.as_deref(), Some("{\"a\":1}"));
        match lines.next_line().await {
            Some(Err(kube::Error::Service(e))) => assert!(e.to_string().contains("reset")),
            other => panic!("expected the read error, got {other:?}"),
        }
        assert!(lines.next_line().await.is_none());
    }

    fn pod(name: &str, rv: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}})
    }

    fn list(rv: &str, items: Vec<serde_json::Value>) -> Response<Body> {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": rv}, "items": items});
        Response::new(Body::from(body.to_string().into_bytes()))
    }

    fn events(lines: &[serde_json::Value]) -> Response<Body> {
        let mut body = String::new();
        for l in lines {
            body.push_str(&l.to_string());
            body.push('\n');
        }
        Response::new(Body::from(body.into_bytes()))
    }

    fn query(req: &Request<Body>) -> String {
        req.uri().query().unwrap_or_default().to_string()
    }

    fn describe(e: &Result<Event<Pod>, watcher::Error>) -> String {
        match e {
            Ok(Event::Init) => "Init".into(),
            Ok(Event::InitApply(p)) => format!("InitApply {}", p.name_any()),
            Ok(Event::InitDone) => "InitDone".into(),
            Ok(Event::Apply(p)) => format!("Apply {}", p.name_any()),
            Ok(Event::Delete(p)) => format!("Delete {}", p.name_any()),
            Err(watcher::Error::WatchError(s)) => format!("WatchError {}", s.code),
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => {
                format!("WatchStartFailed {}", s.code)
            }
            Err(e) => format!("error {e}"),
        }
    }

    /// Against a mock API server that pins every request: the list's version starts the
    /// watch, objects and bookmarks move it on, a watch that ends resumes from it, `410 Gone`
    /// (as an event, and as the answer to opening a watch) lists again.
    #[tokio::test]
    async fn lists_watches_resumes_and_relists_as_kubes_watcher_does() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<Pod> = Api::namespaced(Client::new(svc, "ns"), "ns");
        let config = watcher::Config::default().timeout(3300).labels("app=x");
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut next = async || handle.next_request().await.expect("a request");
            // The list, then a watch from its version.
            let (req, send) = next().await;
            seen.push(format!("list {}", query(&req)));
            send.send_response(list("10", vec![pod("a", "9")]));
            let (req, send) = next().await;
            assert_eq!(
                req.headers().get(http::header::ACCEPT_ENCODING).unwrap(),
                "identity"
            );
            seen.push(format!("watch {}", query(&req)));
            send.send_response(events(&[
                serde_json::json!({"type": "ADDED", "object": pod("b", "11")}),
                serde_json::json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "15"}}}),
            ]));
            // The body ended: resumed from the bookmark's version.
            let (req, send) = next().await;
            seen.push(format!("watch {}", query(&req)));
            send.send_response(events(&[
                serde_json::json!({"type": "DELETED", "object": pod("a", "16")}),
                serde_json::json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "Expired", "code": 410}}),
            ]));
            // 410: listed again, then the watch is refused with 410 too: listed again.
            let (req, send) = next().await;
            seen.push(format!("list {}", query(&req)));
            send.send_response(list("20", vec![pod("b", "11")]));
            let (req, send) = next().await;
            seen.push(format!("watch {}", query(&req)));
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "reason": "Expired", "code": 410});
            let mut gone = Response::new(Body::from(status.to_string().into_bytes()));
            *gone.status_mut() = http::StatusCode::GONE;
            send.send_response(gone);
            let (req, send) = next().await;
            seen.push(format!("list {}", query(&req)));
            send.send_response(list("30", vec![]));
            let (req, send) = next().await;
            seen.push(format!("watch {}", query(&req)));
            send.send_response(events(&[
                serde_json::json!({"type": "MODIFIED", "object": pod("c", "31")}),
            ]));
            seen
        });
        let got: Vec<String> = watch(api, config)
            .take(13)
            .map(|e| describe(&e))
            .collect()
            .await;
        assert_eq!(
            got,
            [
                "Init",
                "InitApply a",
                "InitDone",
                "Apply b",
                "Delete a",
                "WatchError 410",
                "Init",
                "InitApply b",
                "InitDone",
                "WatchStartFailed 410",
                "Init",
                "InitDone",
                "Apply c",
            ]
        );
        let seen = server.await.unwrap();
        // kube's default config: the most recent list, in pages of 500.
        let expected_list = "&labelSelector=app%3Dx&limit=500";
        let watch_from = |v: &str| {
            format!("watch &watch=true&timeoutSeconds=3300&labelSelector=app%3Dx&allowWatchBookmarks=true&resourceVersion={v}")
        };
        assert_eq!(
            seen,
            [
                format!("list {expected_list}"),
                watch_from("10"),
                watch_from("15"),
                format!("list {expected_list}"),
                watch_from("20"),
                format!("list {expected_list}"),
                watch_from("30"),
            ]
        );
    }

    /// A list in pages: each page's continue token asks for the next; the last page's
    /// version starts the watch.
    #[tokio::test]
    async fn a_list_in_pages_follows_its_continue_tokens() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<Pod> = Api::namespaced(Client::new(svc, "ns"), "ns");
        let config = watcher::Config::default().page_size(1);
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            let (req, send) = handle.next_request().await.unwrap();
            seen.push(query(&req));
            let body = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "5", "continue": "c1"}, "items": [pod("a", "4")]});
            send.send_response(Response::new(Body::from(body.to_string().into_bytes())));
            let (req, send) = handle.next_request().await.unwrap();
            seen.push(query(&req));
            send.send_response(list("6", vec![pod("b", "5")]));
            let (req, send) = handle.next_request().await.unwrap();
            seen.push(query(&req));
            send.send_response(events(&[
                serde_json::json!({"type": "ADDED", "object": pod("c", "7")}),
            ]));
            seen
        });
        let got: Vec<String> = watch(api, config)
            .take(5)
            .map(|e| describe(&e))
            .collect()
            .await;
        assert_eq!(
            got,
            ["Init", "InitApply a", "InitApply b", "InitDone", "Apply c"]
        );
        let seen = server.await.unwrap();
        assert_eq!(seen[0], "&limit=1");
        assert_eq!(seen[1], "&limit=1&continue=c1");
        assert!(seen[2].ends_with("&resourceVersion=6"), "{}", seen[2]);
    }
}
