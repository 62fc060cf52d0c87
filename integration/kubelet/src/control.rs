//! The fault-control endpoint (HTTP on a loopback address).
//!
//! | Method | Path | Effect |
//! |---|---|---|
//! | GET | `/healthz` | 200 once Nodes are registered and the first Pod list is in, else 503 |
//! | GET | `/info` | work dir, hosts file, image map, Nodes |
//! | GET | `/nodes` | `[{name, zone, zombie}]` |
//! | POST | `/nodes/<node>/zombie` | stop the Node's heartbeats; its processes keep running, its Pods' status and deletions are no longer written |
//! | POST | `/nodes/<node>/back` | heartbeats resume at once; the Node catches up with its Pods |
//! | GET | `/pods` | every live Pod incarnation: namespace, name, uid, node, ip, phase, containers with pid |
//! | POST | `/pods/<ns>/<name>/kill` | SIGKILL the container process group(s) |
//! | POST | `/pods/<ns>/<name>/pause` | SIGSTOP them |
//! | POST | `/pods/<ns>/<name>/resume` | SIGCONT them |
//!
//! Pod actions take `?container=<name>` (default: every container) and `?uid=<uid>` (default: the
//! incarnation that is not terminating, when there are two). They answer
//! `{"signalled": [{"container", "pid"}]}`; 404 when no such Pod or no running process.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::shared::{PodInfo, Shared};

/// A Node as the control endpoint reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// Zone label.
    pub zone: String,
    /// Heartbeats stopped.
    pub zombie: bool,
}

/// `GET /info`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Info {
    /// Work folder.
    pub work_dir: String,
    /// Hosts file given to members as `CELLD_SIM_HOSTS_FILE`.
    pub hosts_file: String,
    /// Image map file.
    pub image_map: Option<String>,
    /// Nodes.
    pub nodes: Vec<NodeReport>,
}

/// One signalled process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Signalled {
    /// Container name.
    pub container: String,
    /// Process (group) id.
    pub pid: i32,
}

/// Answer of a Pod action.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignalAnswer {
    /// What got the signal.
    pub signalled: Vec<Signalled>,
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response")
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response")
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn node_reports(shared: &Shared) -> Vec<NodeReport> {
    let zombies = shared.zombies();
    shared
        .nodes
        .iter()
        .map(|(name, zone)| NodeReport {
            name: name.clone(),
            zone: zone.clone(),
            zombie: zombies.get(name).copied().unwrap_or(false),
        })
        .collect()
}

fn pick_pod(shared: &Shared, ns: &str, name: &str, uid: Option<&str>) -> Option<PodInfo> {
    let mut candidates: Vec<PodInfo> = shared
        .pod_infos()
        .into_iter()
        .filter(|p| p.namespace == ns && p.name == name)
        .filter(|p| uid.is_none_or(|u| p.uid == u))
        .collect();
    candidates.sort_by_key(|p| p.terminating);
    candidates.into_iter().next()
}

fn handle(
    shared: &Shared,
    synced: &watch::Receiver<bool>,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = req.uri().query();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => {
            if *synced.borrow() {
                text(StatusCode::OK, "ok")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "starting")
            }
        }
        (&Method::GET, ["info"]) => json(
            StatusCode::OK,
            &Info {
                work_dir: shared.args.work_dir.display().to_string(),
                hosts_file: shared.args.hosts_path().display().to_string(),
                image_map: shared
                    .args
                    .image_map
                    .as_ref()
                    .map(|p| p.display().to_string()),
                nodes: node_reports(shared),
            },
        ),
        (&Method::GET, ["nodes"]) => json(StatusCode::OK, &node_reports(shared)),
        (&Method::POST, ["nodes", node, action @ ("zombie" | "back")]) => {
            let zombie = *action == "zombie";
            if shared.set_zombie(node, zombie) {
                tracing::warn!(node = %node, zombie, "fault control: node {action}");
                json(StatusCode::OK, &node_reports(shared))
            } else {
                text(StatusCode::NOT_FOUND, "no such node")
            }
        }
        (&Method::GET, ["pods"]) => json(StatusCode::OK, &shared.pod_infos()),
        (&Method::POST, ["pods", ns, name, action @ ("kill" | "pause" | "resume")]) => {
            let signal = match *action {
                "kill" => libc::SIGKILL,
                "pause" => libc::SIGSTOP,
                _ => libc::SIGCONT,
            };
            let uid = query_param(query, "uid");
            let container = query_param(query, "container");
            let Some(pod) = pick_pod(shared, ns, name, uid.as_deref()) else {
                return text(StatusCode::NOT_FOUND, "no such pod on this kubelet");
            };
            let signalled: Vec<Signalled> = pod
                .containers
                .iter()
                .filter(|c| container.as_deref().is_none_or(|n| n == c.name))
                .filter_map(|c| {
                    c.pid.map(|pid| Signalled {
                        container: c.name.clone(),
                        pid,
                    })
                })
                .collect();
            if signalled.is_empty() {
                return text(StatusCode::NOT_FOUND, "no running container process");
            }
            for s in &signalled {
                tracing::warn!(pod = %format!("{ns}/{name}"), container = %s.container, pid = s.pid, "fault control: {action}");
                crate::pods::process::signal_group(s.pid, signal);
            }
            json(StatusCode::OK, &SignalAnswer { signalled })
        }
        _ => text(StatusCode::NOT_FOUND, "unknown route"),
    }
}

/// Binds the endpoint; returns the bound address and the serving task.
pub async fn serve(
    shared: Arc<Shared>,
    synced: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(shared.args.control_addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut shutdown = shared.shutdown.clone();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.changed() => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let shared = shared.clone();
            let synced = synced.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let response = handle(&shared, &synced, &req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, task))
}
