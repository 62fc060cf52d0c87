//! One Pod incarnation (one Pod UID): sandbox (IP, folders, volumes), container processes,
//! restarts with back-off, probes, status, graceful deletion.
//!
//! The worker reads the latest Pod from a watch channel fed by the dispatcher. While its Node is a
//! zombie the worker behaves like a kubelet cut off from the API server: it keeps supervising its
//! processes (exits, restarts, probes) but does not look at Pod changes, does not write status and
//! does not confirm deletions. When the Node comes back it catches up with the latest Pod.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::Api;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::env::{self, ConfigError, EnvList, PodFacts};
use super::probe::{self, ProbeKind, ProbeResult, ProbeTracker};
use super::process::{self, Launch};
use super::status::{self, ConditionClock, ContainerView, State, StatusInput, Termination};
use super::volumes::{self, VolumeDirs};
use crate::images::{ImageMap, ImageTarget};
use crate::shared::{ContainerInfo, PodInfo, Shared};

/// What the dispatcher knows about the Pod.
#[derive(Debug, Clone)]
pub enum PodView {
    /// The latest object.
    Present(Arc<Pod>),
    /// The Pod is no longer in the API (deleted, or missing from a relist).
    Gone,
}

/// Something that happened to a container.
#[derive(Debug)]
pub enum Event {
    /// The container's process exited.
    Exited {
        /// Container index.
        container: usize,
        /// Which start of it.
        start_seq: u64,
        /// Exit code (128 + signal).
        exit_code: i32,
        /// When.
        at: Timestamp,
    },
    /// A probe result.
    Probe(ProbeResult),
}

/// The kubelet never waits less than this for a container to stop (as the real one).
const MIN_GRACE: Duration = Duration::from_secs(2);
/// A container that ran this long has its crash-loop back-off reset.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);

struct Ctr {
    spec: Container,
    state: State,
    last: Option<Termination>,
    restart_count: i32,
    ever_started: bool,
    start_seq: u64,
    pgid: Option<i32>,
    started_instant: Option<Instant>,
    started_at: Option<Timestamp>,
    container_id: Option<String>,
    image_id: String,
    next_start: Option<Instant>,
    crashes: u32,
    pull_failures: u32,
    config_failures: u32,
    term_sent: bool,
    kill_at: Option<Instant>,
    readiness: Option<ProbeTracker>,
    liveness: Option<ProbeTracker>,
    probers: Vec<JoinHandle<()>>,
}

impl Ctr {
    fn running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    fn ready(&self) -> bool {
        self.running() && self.readiness.as_ref().is_none_or(|t| t.passing)
    }

    fn stop_probers(&mut self) {
        for p in self.probers.drain(..) {
            p.abort();
        }
    }

    fn view(&self) -> ContainerView {
        ContainerView {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            image_id: self.image_id.clone(),
            state: self.state.clone(),
            last: self.last.clone(),
            restart_count: self.restart_count,
            ready: self.ready(),
            container_id: self.container_id.clone(),
        }
    }
}

fn backoff(n: u32, initial: Duration, max: Duration) -> Duration {
    if n == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32
        .checked_shl(n.saturating_sub(1).min(20))
        .unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

/// Is `a` at least as new as `b` (resourceVersions compared as numbers when both are)?
fn not_older(a: &Pod, b: &Pod) -> bool {
    let rv = |p: &Pod| {
        p.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (rv(a), rv(b)) {
        (Some(x), Some(y)) => x >= y,
        _ => true,
    }
}

/// The folder of a Pod incarnation: `<work-dir>/pods/<ns>_<name>_<uid>`.
pub fn pod_dir(work_dir: &std::path::Path, pod: &Pod) -> PathBuf {
    work_dir.join("pods").join(format!(
        "{}_{}_{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    ))
}

/// A running worker as the dispatcher holds it.
pub struct WorkerHandle {
    /// Feeds the worker the latest Pod.
    pub tx: watch::Sender<PodView>,
}

/// Starts the worker of one Pod incarnation; it reports its UID on `done` when it ends.
pub fn spawn(shared: Arc<Shared>, pod: Pod, done: mpsc::UnboundedSender<String>) -> WorkerHandle {
    let pod = Arc::new(pod);
    let (tx, rx) = watch::channel(PodView::Present(pod.clone()));
    let worker = Worker::new(shared, pod, rx);
    tokio::spawn(async move {
        let uid = worker.uid.clone();
        worker.run().await;
        let _ = done.send(uid);
    });
    WorkerHandle { tx }
}

struct Worker {
    shared: Arc<Shared>,
    uid: String,
    ns: String,
    name: String,
    node: String,
    pod: Arc<Pod>,
    rx: watch::Receiver<PodView>,
    rx_open: bool,
    gone: bool,
    /// Terminal when the kubelet found it (after a restart): never run, only confirm deletion.
    frozen: bool,
    /// Set when the Pod has init containers: they are not modelled, so nothing runs.
    not_initialized: Option<String>,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: mpsc::UnboundedReceiver<Event>,
    dir: PathBuf,
    ip: Option<Ipv4Addr>,
    ip_held: bool,
    volumes: Option<VolumeDirs>,
    setup_retry_at: Instant,
    containers: Vec<Ctr>,
    clock: ConditionClock,
    start_time: Timestamp,
    terminating: bool,
    finished: bool,
    status_retry_at: Option<Instant>,
    confirm_retry_at: Option<Instant>,
    info: Arc<Mutex<PodInfo>>,
}

enum Wake {
    Pod,
    PodClosed,
    Event(Event),
    Other,
}

impl Worker {
    fn new(shared: Arc<Shared>, pod: Arc<Pod>, rx: watch::Receiver<PodView>) -> Self {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let meta = &pod.metadata;
        let uid = meta.uid.clone().unwrap_or_default();
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let node = spec.node_name.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let frozen = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let not_initialized = spec
            .init_containers
            .as_ref()
            .is_some_and(|c| !c.is_empty())
            .then(|| "init containers are not modelled by the test kubelet".to_string());
        let mut clock = ConditionClock::default();
        clock.seed(status.conditions.as_deref().unwrap_or_default());
        let previous = status.container_statuses.clone().unwrap_or_default();
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                // A Pod adopted after a kubelet restart keeps its restart count.
                let prev = previous.iter().find(|s| s.name == c.name);
                let ever_started = prev.is_some_and(|s| {
                    s.state
                        .as_ref()
                        .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
                        || s.last_state
                            .as_ref()
                            .is_some_and(|st| st.terminated.is_some())
                });
                Ctr {
                    spec: c.clone(),
                    state: State::Waiting {
                        reason: if not_initialized.is_some() {
                            "PodInitializing"
                        } else {
                            "ContainerCreating"
                        }
                        .into(),
                        message: not_initialized.clone(),
                    },
                    last: None,
                    restart_count: prev.map_or(0, |s| s.restart_count),
                    ever_started,
                    start_seq: 0,
                    pgid: None,
                    started_instant: None,
                    started_at: None,
                    container_id: None,
                    image_id: String::new(),
                    next_start: None,
                    crashes: 0,
                    pull_failures: 0,
                    config_failures: 0,
                    term_sent: false,
                    kill_at: None,
                    readiness: None,
                    liveness: None,
                    probers: Vec::new(),
                }
            })
            .collect();
        let dir = pod_dir(&shared.args.work_dir, &pod);
        let info = Arc::new(Mutex::new(PodInfo {
            namespace: ns.clone(),
            name: name.clone(),
            uid: uid.clone(),
            node: node.clone(),
            ip: None,
            phase: "Pending".into(),
            terminating: false,
            dir: dir.clone(),
            containers: Vec::new(),
        }));
        Self {
            start_time: status.start_time.map_or_else(Timestamp::now, |t| t.0),
            shared,
            uid,
            ns,
            name,
            node,
            pod,
            rx,
            rx_open: true,
            gone: false,
            frozen,
            not_initialized,
            events_tx,
            events_rx,
            dir,
            ip: None,
            ip_held: false,
            volumes: None,
            setup_retry_at: Instant::now(),
            containers,
            clock,
            terminating: false,
            finished: frozen,
            status_retry_at: None,
            confirm_retry_at: None,
            info,
        }
    }

    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.shared.client.clone(), &self.ns)
    }

    fn policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    async fn run(mut self) {
        self.shared
            .pods
            .lock()
            .expect("pods lock")
            .insert(self.uid.clone(), self.info.clone());
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), uid = %self.uid, node = %self.node, "pod worker started");
        loop {
            if *self.shared.shutdown.borrow() {
                self.kill_for_shutdown().await;
                break;
            }
            let zombie = self.shared.is_zombie(&self.node);
            if !zombie {
                self.absorb();
            }
            let now = Instant::now();
            if self.volumes.is_none()
                && !self.terminating
                && !self.frozen
                && self.not_initialized.is_none()
                && !zombie
                && now >= self.setup_retry_at
            {
                self.setup().await;
            }
            if self.volumes.is_some() && !self.finished {
                self.drive().await;
                self.finish_if_completed();
            }
            self.update_info();
            if !zombie && !self.frozen {
                self.sync_status().await;
            }
            if self.terminating && self.all_stopped() && !zombie && self.confirm_deletion().await {
                break;
            }
            self.wait().await;
        }
        self.cleanup();
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), uid = %self.uid, "pod worker finished");
    }

    /// Takes in the latest Pod view (never while the node is a zombie).
    fn absorb(&mut self) {
        if !self.rx_open {
            return;
        }
        let view = self.rx.borrow_and_update().clone();
        match view {
            PodView::Gone => {
                if !self.gone {
                    tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "pod removed from the API; stopping its containers");
                    self.gone = true;
                    self.begin_termination(MIN_GRACE);
                }
            }
            PodView::Present(p) => {
                if not_older(&p, &self.pod) {
                    self.pod = p;
                }
                if self.pod.metadata.deletion_timestamp.is_some() {
                    let grace = self
                        .pod
                        .metadata
                        .deletion_grace_period_seconds
                        .or_else(|| {
                            self.pod
                                .spec
                                .as_ref()
                                .and_then(|s| s.termination_grace_period_seconds)
                        })
                        .unwrap_or(30);
                    let grace = Duration::from_secs(grace.max(0) as u64).max(MIN_GRACE);
                    self.begin_termination(grace);
                }
            }
        }
    }

    fn begin_termination(&mut self, grace: Duration) {
        if !self.terminating {
            tracing::info!(pod = %format!("{}/{}", self.ns, self.name), grace_s = grace.as_secs(), "terminating pod");
        }
        self.terminating = true;
        for i in 0..self.containers.len() {
            self.containers[i].next_start = None;
            if self.containers[i].running() {
                self.stop_container(i, grace);
            }
        }
    }

    /// SIGTERM now (once), SIGKILL when `grace` has passed (a later, shorter grace wins).
    fn stop_container(&mut self, i: usize, grace: Duration) {
        let c = &mut self.containers[i];
        c.stop_probers();
        let deadline = Instant::now() + grace;
        c.kill_at = Some(c.kill_at.map_or(deadline, |k| k.min(deadline)));
        match c.pgid {
            Some(pgid) if !c.term_sent => {
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, pid = pgid, "SIGTERM");
                process::signal_group(pgid, libc::SIGTERM);
                c.term_sent = true;
            }
            Some(_) => {}
            None => {
                // No process (no-process mode): it stops at once.
                let at = Timestamp::now();
                let _ = self.events_tx.send(Event::Exited {
                    container: i,
                    start_seq: c.start_seq,
                    exit_code: 0,
                    at,
                });
            }
        }
    }

    async fn setup(&mut self) {
        if self.ip.is_none() {
            let previous = self
                .pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
            let ip = self.shared.take_ip(previous);
            match ip {
                Some(ip) => {
                    self.ip = Some(ip);
                    self.ip_held = true;
                }
                None => {
                    self.set_waiting_all("ContainerCreating", Some("no free pod IP".into()));
                    self.setup_retry_at = Instant::now() + Duration::from_secs(2);
                    return;
                }
            }
        }
        if let Err(e) = std::fs::create_dir_all(self.dir.join("logs")) {
            self.set_waiting_all(
                "ContainerCreating",
                Some(format!("creating {}: {e}", self.dir.display())),
            );
            self.setup_retry_at = Instant::now() + Duration::from_secs(2);
            return;
        }
        match volumes::prepare(&self.shared.client, &self.pod, &self.facts(), &self.dir).await {
            Ok(v) => {
                self.volumes = Some(v);
                self.publish_host();
                let now = Instant::now();
                for c in &mut self.containers {
                    c.next_start = Some(now);
                }
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), ip = ?self.ip, dir = %self.dir.display(), "sandbox ready");
            }
            Err(e) => {
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), reason = %e, "volumes not ready");
                self.set_waiting_all("ContainerCreating", Some(e));
                self.setup_retry_at = Instant::now() + Duration::from_secs(1);
            }
        }
    }

    fn set_waiting_all(&mut self, reason: &str, message: Option<String>) {
        for c in &mut self.containers {
            c.state = State::Waiting {
                reason: reason.into(),
                message: message.clone(),
            };
        }
    }

    fn publish_host(&self) {
        let spec = self.pod.spec.as_ref();
        let (Some(host), Some(sub), Some(ip)) = (
            spec.and_then(|s| s.hostname.clone()),
            spec.and_then(|s| s.subdomain.clone()),
            self.ip,
        ) else {
            return;
        };
        let created = self
            .pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second());
        self.shared.set_host(
            &self.uid,
            format!("{host}.{sub}.{}.svc", self.ns),
            ip,
            created,
        );
    }

    fn facts(&self) -> PodFacts {
        PodFacts {
            pod_ip: self.ip.map(|i| i.to_string()).unwrap_or_default(),
            host_ip: "127.0.0.1".into(),
        }
    }

    async fn drive(&mut self) {
        let now = Instant::now();
        for i in 0..self.containers.len() {
            let c = &mut self.containers[i];
            if c.running() {
                if let (Some(kill_at), Some(pgid)) = (c.kill_at, c.pgid) {
                    if now >= kill_at {
                        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, pid = pgid, "grace period over: SIGKILL");
                        process::signal_group(pgid, libc::SIGKILL);
                        c.kill_at = None;
                    }
                }
                continue;
            }
            if self.terminating {
                continue;
            }
            if c.next_start.is_some_and(|at| now >= at) {
                self.start_container(i).await;
            }
        }
    }

    fn finish_if_completed(&mut self) {
        if self.terminating || self.finished {
            return;
        }
        let idle = self
            .containers
            .iter()
            .all(|c| !c.running() && c.next_start.is_none());
        let views: Vec<ContainerView> = self.containers.iter().map(Ctr::view).collect();
        let phase = status::phase(&self.policy(), &views, false);
        if idle && (phase == "Succeeded" || phase == "Failed") {
            tracing::info!(pod = %format!("{}/{}", self.ns, self.name), %phase, "pod completed");
            self.finished = true;
            self.release_sandbox();
        }
    }

    fn release_sandbox(&mut self) {
        if self.ip_held {
            if let Some(ip) = self.ip {
                self.shared.ips.lock().expect("ips lock").release(ip);
            }
            self.ip_held = false;
        }
        self.shared.remove_host(&self.uid);
    }

    async fn start_container(&mut self, i: usize) {
        let (initial, max) = self.shared.args.backoff();
        let map = ImageMap::load(self.shared.args.image_map.as_deref());
        let image = self.containers[i].spec.image.clone().unwrap_or_default();
        let target = match &map {
            Ok(m) => m.resolve(&image),
            Err(_) => None,
        };
        let c = &mut self.containers[i];
        c.next_start = None;
        let Some(target) = target else {
            c.pull_failures += 1;
            let why = match &map {
                Ok(_) => format!(
                    "image {image:?} is not in the test kubelet's image map ({})",
                    self.shared
                        .args
                        .image_map
                        .as_ref()
                        .map_or("none given".into(), |p| p.display().to_string())
                ),
                Err(e) => e.clone(),
            };
            c.state = State::Waiting {
                reason: "ErrImagePull".into(),
                message: Some(why),
            };
            c.next_start = Some(Instant::now() + backoff(c.pull_failures, initial, max));
            return;
        };
        c.pull_failures = 0;
        let program = match target {
            ImageTarget::NoProcess => {
                self.mark_started(i, None, "celld-test://noprocess".into());
                return;
            }
            ImageTarget::Program(p) => p,
        };
        let launch = match self.launch_of(i, &program).await {
            Ok(l) => l,
            Err(e) => {
                let c = &mut self.containers[i];
                c.config_failures += 1;
                c.state = State::Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message: Some(e.0),
                };
                c.next_start =
                    Some(Instant::now() + backoff(c.config_failures, Duration::from_secs(1), max));
                return;
            }
        };
        self.containers[i].config_failures = 0;
        let image_id = format!("celld-test://{}", program.display());
        match process::spawn(&self.shared.args.work_dir, &launch) {
            Ok(running) => {
                let pgid = running.pgid;
                self.mark_started(i, Some(pgid), image_id);
                let c = &self.containers[i];
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, pid = pgid, ip = ?self.ip, restarts = c.restart_count, log = %launch.log.display(), "container started");
                let tx = self.events_tx.clone();
                let seq = c.start_seq;
                let mut child = running.child;
                tokio::spawn(async move {
                    let code = match child.wait().await {
                        Ok(status) => process::exit_code(&status),
                        Err(_) => -1,
                    };
                    let _ = tx.send(Event::Exited {
                        container: i,
                        start_seq: seq,
                        exit_code: code,
                        at: Timestamp::now(),
                    });
                });
                self.start_probers(i, &launch);
            }
            Err(e) => {
                let c = &mut self.containers[i];
                tracing::warn!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, error = %e, "start failed");
                // A failed start counts as a start, as a created-but-failed container does.
                if c.ever_started {
                    c.restart_count += 1;
                }
                c.ever_started = true;
                let term = Termination {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: Some(format!("starting {}: {e}", launch.program.display())),
                    started_at: None,
                    finished_at: Timestamp::now(),
                    container_id: None,
                };
                c.image_id = image_id;
                self.after_exit(i, term);
            }
        }
    }

    fn mark_started(&mut self, i: usize, pgid: Option<i32>, image_id: String) {
        let c = &mut self.containers[i];
        if c.ever_started {
            c.restart_count += 1;
        }
        c.ever_started = true;
        c.start_seq += 1;
        c.pgid = pgid;
        c.term_sent = false;
        c.kill_at = None;
        let now = Timestamp::now();
        c.started_at = Some(now);
        c.started_instant = Some(Instant::now());
        c.state = State::Running { started_at: now };
        c.image_id = image_id;
        c.container_id = Some(format!(
            "celld-test://{}/{}/{}",
            self.uid, c.spec.name, c.start_seq
        ));
        c.readiness = c
            .spec
            .readiness_probe
            .as_ref()
            .filter(|_| pgid.is_some())
            .map(|p| ProbeTracker::new(ProbeKind::Readiness, probe::Timing::of(p)));
        c.liveness = c
            .spec
            .liveness_probe
            .as_ref()
            .filter(|_| pgid.is_some())
            .map(|p| ProbeTracker::new(ProbeKind::Liveness, probe::Timing::of(p)));
    }

    fn start_probers(&mut self, i: usize, launch: &Launch) {
        let ip = IpAddr::V4(self.ip.unwrap_or(Ipv4Addr::LOCALHOST));
        let c = &mut self.containers[i];
        for (kind, p) in [
            (ProbeKind::Readiness, c.spec.readiness_probe.clone()),
            (ProbeKind::Liveness, c.spec.liveness_probe.clone()),
        ] {
            let Some(p) = p else { continue };
            let check = probe::check_of(&p, &c.spec, ip, &launch.env, launch.cwd.clone());
            let tag = ProbeResult {
                container: i,
                start_seq: c.start_seq,
                kind,
                success: false,
            };
            c.probers.push(probe::spawn_prober(
                check,
                probe::Timing::of(&p),
                tag,
                self.events_tx.clone(),
            ));
        }
    }

    /// Env, mounts, program and arguments of one container start.
    async fn launch_of(&self, i: usize, program: &std::path::Path) -> Result<Launch, ConfigError> {
        let spec = &self.containers[i].spec;
        let (secrets, config_maps) = env::referenced_sources(spec);
        let sources = volumes::env_sources(&self.shared.client, &self.ns, secrets, config_maps)
            .await
            .map_err(ConfigError)?;
        let container_env = env::resolve(spec, &self.pod, &self.facts(), &sources)?;
        let volumes = self.volumes.as_ref().expect("sandbox ready");
        let mut mounts: Vec<(String, String)> = Vec::new();
        for vm in spec.volume_mounts.iter().flatten() {
            let base = volumes
                .dirs
                .get(&vm.name)
                .ok_or_else(|| ConfigError(format!("volumeMount {:?}: no such volume", vm.name)))?;
            let sub = vm
                .sub_path
                .clone()
                .or_else(|| {
                    vm.sub_path_expr
                        .as_ref()
                        .map(|e| env::expand(e, |n| container_env.get(n).map(str::to_string)))
                })
                .filter(|s| !s.is_empty());
            let host = match sub {
                Some(sub) => {
                    if sub.split('/').any(|s| s == "..") {
                        return Err(ConfigError(format!("subPath {sub:?} escapes the volume")));
                    }
                    let p = base.join(sub);
                    std::fs::create_dir_all(&p)
                        .map_err(|e| ConfigError(format!("creating {}: {e}", p.display())))?;
                    p
                }
                None => base.clone(),
            };
            mounts.push((vm.mount_path.clone(), host.display().to_string()));
        }
        let mut container_env = container_env;
        container_env.map_values(|v| env::rewrite_mount_path(v, &mounts));
        let pod_spec = self.pod.spec.as_ref();
        let hostname = pod_spec
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name.clone());
        let mut env = EnvList::default();
        env.set(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
            }),
        );
        env.set("HOSTNAME", hostname);
        env.set("HOME", self.dir.display().to_string());
        for (k, v) in container_env.vars() {
            env.set(k, v.clone());
        }
        for (mount_path, host) in &mounts {
            env.set(&env::mount_env_name(mount_path), host.clone());
        }
        env.set(
            "CELLD_SIM_HOSTS_FILE",
            self.shared.args.hosts_path().display().to_string(),
        );
        let expand = |s: &String| {
            env::rewrite_mount_path(&env::expand(s, |n| env.get(n).map(str::to_string)), &mounts)
        };
        let command: Vec<String> = spec.command.iter().flatten().map(expand).collect();
        let args: Vec<String> = spec.args.iter().flatten().map(expand).collect();
        let (program, args) = match command.split_first() {
            Some((first, rest)) => (
                PathBuf::from(first),
                rest.iter().cloned().chain(args).collect(),
            ),
            None => (program.to_path_buf(), args),
        };
        let cwd = spec
            .working_dir
            .as_ref()
            .map(|w| PathBuf::from(env::rewrite_mount_path(w, &mounts)))
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| self.dir.clone());
        Ok(Launch {
            program,
            args,
            env: env.vars().to_vec(),
            cwd,
            log: self.dir.join("logs").join(format!("{}.log", spec.name)),
        })
    }

    fn handle_event(&mut self, event: Event) {
        match event {
            Event::Exited {
                container,
                start_seq,
                exit_code,
                at,
            } => {
                let Some(c) = self.containers.get_mut(container) else {
                    return;
                };
                if c.start_seq != start_seq || !c.running() {
                    return;
                }
                if let Some(pgid) = c.pgid.take() {
                    process::reap_group(&self.shared.args.work_dir, pgid);
                }
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, exit_code, "container exited");
                let term = Termination::exited(exit_code, c.started_at, at, c.container_id.clone());
                self.after_exit(container, term);
            }
            Event::Probe(r) => {
                let Some(c) = self.containers.get_mut(r.container) else {
                    return;
                };
                if c.start_seq != r.start_seq || !c.running() {
                    return;
                }
                match r.kind {
                    ProbeKind::Readiness => {
                        if let Some(t) = &mut c.readiness {
                            if t.observe(r.success) {
                                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, ready = t.passing, "readiness changed");
                            }
                        }
                    }
                    ProbeKind::Liveness => {
                        let failed = c
                            .liveness
                            .as_mut()
                            .is_some_and(|t| t.observe(r.success) && !t.passing);
                        if failed && !self.terminating {
                            tracing::info!(pod = %format!("{}/{}", self.ns, self.name), container = %c.spec.name, "liveness probe failed: restarting");
                            let grace = self
                                .pod
                                .spec
                                .as_ref()
                                .and_then(|s| s.termination_grace_period_seconds)
                                .unwrap_or(30);
                            self.stop_container(
                                r.container,
                                Duration::from_secs(grace.max(0) as u64).max(MIN_GRACE),
                            );
                        }
                    }
                }
            }
        }
    }

    /// Records a finished run and schedules the restart the restart policy asks for.
    fn after_exit(&mut self, i: usize, term: Termination) {
        let (initial, max) = self.shared.args.backoff();
        let policy = self.policy();
        let terminating = self.terminating;
        let (ns, name, uid) = (self.ns.clone(), self.name.clone(), self.uid.clone());
        let c = &mut self.containers[i];
        c.stop_probers();
        c.pgid = None;
        c.kill_at = None;
        c.readiness = None;
        c.liveness = None;
        let restart = !terminating
            && match policy.as_str() {
                "Never" => false,
                "OnFailure" => term.exit_code != 0,
                _ => true,
            };
        if !restart {
            c.state = State::Terminated(term);
            return;
        }
        if c.started_instant
            .is_some_and(|s| s.elapsed() >= BACKOFF_RESET_AFTER)
        {
            c.crashes = 0;
        }
        let delay = backoff(c.crashes, initial, max);
        c.crashes += 1;
        c.last = Some(term.clone());
        c.state = if delay.is_zero() {
            State::Terminated(term)
        } else {
            State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!(
                    "back-off {}s restarting failed container={} pod={name}_{ns}({uid})",
                    delay.as_secs(),
                    c.spec.name
                )),
            }
        };
        c.next_start = Some(Instant::now() + delay);
    }

    fn all_stopped(&self) -> bool {
        self.containers.iter().all(|c| !c.running())
    }

    fn status_input_terminal(&self) -> bool {
        self.terminating && self.all_stopped()
    }

    fn update_info(&self) {
        let views: Vec<ContainerView> = self.containers.iter().map(Ctr::view).collect();
        let phase = status::phase(&self.policy(), &views, self.status_input_terminal());
        let mut info = self.info.lock().expect("pod info lock");
        info.ip = self.ip;
        info.phase = phase.to_string();
        info.terminating = self.terminating;
        info.containers = self
            .containers
            .iter()
            .map(|c| ContainerInfo {
                name: c.spec.name.clone(),
                pid: c.pgid,
                state: match &c.state {
                    State::Running { .. } => "running".into(),
                    State::Waiting { reason, .. } => format!("waiting:{reason}"),
                    State::Terminated(t) => format!("terminated:{}", t.exit_code),
                },
                restart_count: c.restart_count,
                ready: c.ready(),
            })
            .collect();
    }

    async fn sync_status(&mut self) {
        if self.gone {
            return;
        }
        let now = Timestamp::now();
        let views: Vec<ContainerView> = self.containers.iter().map(Ctr::view).collect();
        let pod = self.pod.clone();
        let existing = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let gates: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.readiness_gates.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.condition_type)
            .collect();
        let policy = self.policy();
        let input = StatusInput {
            restart_policy: &policy,
            containers: &views,
            existing_conditions: &existing,
            readiness_gates: &gates,
            pod_ip: self.ip.map(|i| i.to_string()),
            start_time: self.start_time,
            sandbox_ready: self.volumes.is_some(),
            terminal: self.status_input_terminal(),
            not_initialized: self.not_initialized.clone(),
        };
        let desired = status::build(&input, &mut self.clock, now);
        let desired = serde_json::to_value(&desired).unwrap_or_default();
        let actual = serde_json::to_value(&pod.status).unwrap_or_default();
        if status::json_subset(&desired, &actual) {
            return;
        }
        if self.status_retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let body = serde_json::json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": desired,
        });
        match self
            .api()
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(p) => {
                self.status_retry_at = None;
                if p.metadata.uid.as_deref() == Some(self.uid.as_str()) {
                    self.pod = Arc::new(p);
                }
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Someone else wrote the Pod: decide again from a fresh read.
                if let Ok(Some(p)) = self.api().get_opt(&self.name).await {
                    if p.metadata.uid.as_deref() == Some(self.uid.as_str()) {
                        self.pod = Arc::new(p);
                    }
                }
                self.status_retry_at = Some(Instant::now() + Duration::from_millis(100));
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", self.ns, self.name), error = %e, "writing pod status");
                self.status_retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }

    /// Deletes the Pod for good (grace 0, UID precondition). True when it is gone.
    async fn confirm_deletion(&mut self) -> bool {
        if self.gone {
            return true;
        }
        if self.confirm_retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api().delete(&self.name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "deletion confirmed");
                true
            }
            // 404: already gone; 409: the name now belongs to another incarnation.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", self.ns, self.name), error = %e, "confirming deletion");
                self.confirm_retry_at = Some(Instant::now() + Duration::from_secs(1));
                false
            }
        }
    }

    fn next_deadline(&self) -> Instant {
        let mut next = Instant::now() + Duration::from_secs(30);
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = next.min(t);
            }
        };
        if self.volumes.is_none()
            && !self.terminating
            && !self.frozen
            && self.not_initialized.is_none()
        {
            consider(Some(self.setup_retry_at));
        }
        for c in &self.containers {
            if c.running() {
                consider(c.kill_at);
            } else if !self.terminating && !self.finished {
                consider(c.next_start);
            }
        }
        consider(self.status_retry_at);
        consider(self.confirm_retry_at);
        next
    }

    async fn wait(&mut self) {
        let deadline = self.next_deadline();
        let mut zombie_rx = self.shared.zombie_tx.subscribe();
        let mut shutdown = self.shared.shutdown.clone();
        let rx_open = self.rx_open;
        let wake = tokio::select! {
            r = self.rx.changed(), if rx_open => if r.is_ok() { Wake::Pod } else { Wake::PodClosed },
            ev = self.events_rx.recv() => ev.map_or(Wake::Other, Wake::Event),
            _ = zombie_rx.changed() => Wake::Other,
            _ = shutdown.changed() => Wake::Other,
            _ = tokio::time::sleep_until(deadline) => Wake::Other,
        };
        match wake {
            Wake::Event(ev) => self.handle_event(ev),
            Wake::PodClosed => self.rx_open = false,
            Wake::Pod | Wake::Other => {}
        }
        while let Ok(ev) = self.events_rx.try_recv() {
            self.handle_event(ev);
        }
    }

    /// Kubelet exit: SIGTERM every container, SIGKILL what is left after a second.
    async fn kill_for_shutdown(&mut self) {
        self.terminating = true;
        for i in 0..self.containers.len() {
            if self.containers[i].running() {
                self.stop_container(i, Duration::from_secs(1));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.all_stopped() {
            match tokio::time::timeout_at(deadline, self.events_rx.recv()).await {
                Ok(Some(ev)) => self.handle_event(ev),
                _ => break,
            }
        }
        for c in &mut self.containers {
            if let Some(pgid) = c.pgid.take() {
                process::reap_group(&self.shared.args.work_dir, pgid);
            }
        }
    }

    fn cleanup(&mut self) {
        for c in &mut self.containers {
            c.stop_probers();
            if let Some(pgid) = c.pgid.take() {
                process::reap_group(&self.shared.args.work_dir, pgid);
            }
        }
        self.release_sandbox();
        if !*self.shared.shutdown.borrow() {
            // emptyDir and generated volumes die with the incarnation; logs stay for inspection.
            for dir in self.volumes.iter().flat_map(|v| v.owned.iter()) {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        self.shared
            .pods
            .lock()
            .expect("pods lock")
            .remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_loop_back_off_doubles_up_to_the_cap() {
        let (i, m) = (Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(backoff(0, i, m), Duration::ZERO);
        assert_eq!(backoff(1, i, m), Duration::from_secs(10));
        assert_eq!(backoff(2, i, m), Duration::from_secs(20));
        assert_eq!(backoff(5, i, m), Duration::from_secs(160));
        assert_eq!(backoff(6, i, m), Duration::from_secs(300));
        assert_eq!(backoff(60, i, m), Duration::from_secs(300));
    }
}
