//! The node: shared state, the startup sequence, membership view and the SIGTERM drain.

use std::collections::HashSet;
use std::fs::File;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use crate::cells::Cells;
use crate::config::{Config, Durability};
use crate::disk::{self, blocking, Fragments, LeaderLog};
use crate::faults::{Faults, ReadyFault, SigtermFault};
use crate::hosts::Hosts;
use crate::lease::{Lease, LeaseError};
use crate::model::{complete_key, now_ms, LeaseRecord, LogInfo, SessionRef};
use crate::removal::{Operation, RemovalPhase};
use crate::store::{Cond, Store, StoreError};
use crate::{api, cells, durability, peer, recovery};

/// Startup or internal failure (any non-zero code other than 3 would do; the brief fixes 7).
pub const EXIT_STARTUP: i32 = 7;

/// Where the process is in its life; strict removal keeps its own state in [`Operation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Recovering predecessor sessions: unready, no ledger traffic.
    Recovering,
    Running,
    /// SIGTERM drain in progress.
    Stopping,
}

pub struct Life {
    pub stage: Stage,
    pub recovered_at: Option<Instant>,
}

pub struct Node {
    pub cfg: Config,
    pub generation: String,
    pub session: String,
    pub disk_incarnation: String,
    pub pid: u32,
    pub hosts: Arc<Hosts>,
    pub faults: Arc<Faults>,
    pub store: Arc<Store>,
    pub lease: Arc<Lease>,
    /// The current session's leader log (PersistentFleet only).
    pub log: Mutex<Option<LeaderLog>>,
    pub fragments: Mutex<Fragments>,
    /// Lease records of every node, refreshed every TTL/3.
    pub members: RwLock<Vec<LeaseRecord>>,
    pub cells: Cells,
    pub life: Mutex<Life>,
    pub removal: Mutex<Option<Operation>>,
    /// Cells being recovered right now (for `/state`).
    pub restoring: AtomicUsize,
    _disk_lock: File,
}

impl Node {
    pub fn me(&self) -> &str {
        &self.cfg.node
    }

    pub fn stage(&self) -> Stage {
        self.life.lock().expect("life").stage
    }

    pub fn removal_phase(&self) -> Option<RemovalPhase> {
        self.removal
            .lock()
            .expect("removal")
            .as_ref()
            .map(|o| o.phase)
    }

    /// Ledger traffic is served only by a recovered node that is neither stopping nor removing.
    pub fn serving(&self) -> bool {
        self.stage() == Stage::Running && self.removal_phase().is_none()
    }

    /// Readiness (health 200): serving and past the first-readiness gate.
    pub fn ready(&self) -> bool {
        if !self.serving() {
            return false;
        }
        let Some(at) = self.life.lock().expect("life").recovered_at else {
            return false;
        };
        let fleet_calm = || {
            let now = now_ms();
            let someone_draining = self
                .members
                .read()
                .expect("members")
                .iter()
                .any(|m| m.node != self.cfg.node && m.live_at(now) && m.draining);
            !someone_draining || at.elapsed() >= self.cfg.ready_gate
        };
        match self.faults.get().ready {
            ReadyFault::Never => false,
            ReadyFault::DelayMs(ms) => at.elapsed() >= Duration::from_millis(ms) && fleet_calm(),
            ReadyFault::Auto => fleet_calm(),
        }
    }

    /// A word for `/sim/info`.
    pub fn phase(&self) -> &'static str {
        if let Some(p) = self.removal_phase() {
            return p.as_str();
        }
        match self.stage() {
            Stage::Recovering => "recovering",
            Stage::Stopping => "stopping",
            Stage::Running if self.ready() => "ready",
            Stage::Running => "gating",
        }
    }

    pub fn unflushed_writes(&self) -> usize {
        self.log
            .lock()
            .expect("log")
            .as_ref()
            .map(|l| l.unflushed().len())
            .unwrap_or(0)
    }

    pub fn follower_fragments(&self) -> usize {
        self.fragments.lock().expect("fragments").entry_count()
    }

    /// The lease record of another node from the membership view, else from the store.
    pub async fn lease_of(&self, node: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let cached = self
            .members
            .read()
            .expect("members")
            .iter()
            .find(|m| m.node == node)
            .cloned();
        if let Some(rec) = cached {
            return Ok(Some(rec));
        }
        Ok(self
            .store
            .get_json::<LeaseRecord>(&crate::model::lease_key(node))
            .await?
            .map(|(r, _)| r))
    }

    pub async fn refresh_members(&self) -> Result<(), StoreError> {
        let keys = self.store.list("nodes/").await?;
        let mut recs = Vec::new();
        for k in keys.iter().filter(|k| k.ends_with(".json")) {
            if let Some((rec, _)) = self.store.get_json::<LeaseRecord>(k).await? {
                recs.push(rec);
            }
        }
        *self.members.write().expect("members") = recs;
        Ok(())
    }
}

fn new_generation() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

static NODE: OnceLock<Arc<Node>> = OnceLock::new();

/// Runs the simulator; returns the exit code for a startup failure (the other exits happen
/// where they are decided: 0 after a drain, 3 on a self-fence).
pub async fn run(cfg: Config) -> i32 {
    let faults = Arc::new(Faults::default());
    if let Some(path) = &cfg.faults_file {
        let parsed = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string())
            })
            .and_then(|v| faults.apply(&v));
        if let Err(e) = parsed {
            eprintln!("celld-sim: CELLD_SIM_FAULTS_FILE {}: {e}", path.display());
            return EXIT_STARTUP;
        }
    }
    tokio::spawn(signal_loop());
    if let Some(pid) = cfg.exit_with_pid {
        tokio::spawn(exit_with(pid));
    }

    let hosts = Arc::new(Hosts::new(cfg.hosts_file.clone()));
    let store = Arc::new(Store::new(&cfg, hosts.clone(), faults.clone()));
    let generation = new_generation();
    let session = format!("{}.{}", cfg.node, &generation[..16]);
    tracing::info!(node = %cfg.node, %generation, %session, durability = cfg.durability.as_str(), "starting");

    if let Err(e) = probe(&store, &cfg, &generation).await {
        eprintln!("celld-sim: store probe failed, refusing to serve: {e}");
        return EXIT_STARTUP;
    }

    let (disk_incarnation, fresh) = match blocking(|| disk::identity(&cfg.watch, &cfg.node)) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("celld-sim: CELLD_WATCH {}: {e}", cfg.watch.display());
            return EXIT_STARTUP;
        }
    };
    tracing::info!(%disk_incarnation, fresh_disk = fresh, "disk");

    let template = LeaseRecord {
        node: cfg.node.clone(),
        addr: cfg.advertise.clone(),
        generation: generation.clone(),
        expires_ms: 0,
        renewed_ms: 0,
        disk_incarnation: disk_incarnation.clone(),
        durability: cfg.durability.as_str().to_string(),
        ownership_index_generation: 0,
        log: LogInfo {
            session: session.clone(),
            followers: vec![],
            pending: vec![],
        },
        load: json!({}),
        draining: false,
        stopped: false,
        control_only: false,
    };
    let deadline = Instant::now() + cfg.store_wait;
    let (lease, prev) = match Lease::acquire(store.clone(), template, cfg.ttl, deadline).await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("celld-sim: cannot take the lease: {e}");
            return EXIT_STARTUP;
        }
    };
    let lease = Arc::new(lease);
    tracing::info!(
        predecessor = prev
            .as_ref()
            .map(|p| p.generation.as_str())
            .unwrap_or("none"),
        expires_ms = lease.confirmed_expires_ms(),
        "lease taken"
    );
    tokio::spawn(lease.clone().renew_loop());
    tokio::spawn(lease.clone().watchdog_loop());

    // A predecessor still running on this disk fences within TTL/3 of our takeover.
    let disk_lock = loop {
        match blocking(|| disk::try_lock(&cfg.watch)) {
            Ok(Some(f)) => break f,
            Ok(None) => {
                tracing::info!("waiting for the disk lock held by a predecessor");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                eprintln!("celld-sim: locking {}: {e}", cfg.watch.display());
                return EXIT_STARTUP;
            }
        }
    };
    let opened = blocking(|| -> std::io::Result<_> {
        let fragments = Fragments::load(&cfg.watch)?;
        let log = match cfg.durability {
            Durability::Fleet => Some(LeaderLog::create(&cfg.watch, &session)?),
            Durability::Bucket => None,
        };
        Ok((fragments, log))
    });
    let (fragments, log) = match opened {
        Ok(v) => v,
        Err(e) => {
            eprintln!("celld-sim: opening {}: {e}", cfg.watch.display());
            return EXIT_STARTUP;
        }
    };

    let public = match tokio::net::TcpListener::bind(cfg.public_addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("celld-sim: binding {}: {e}", cfg.public_addr);
            return EXIT_STARTUP;
        }
    };
    let internal = match tokio::net::TcpListener::bind(cfg.internal_addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("celld-sim: binding {}: {e}", cfg.internal_addr);
            return EXIT_STARTUP;
        }
    };

    let node = Arc::new(Node {
        cfg,
        generation,
        session,
        disk_incarnation,
        pid: std::process::id(),
        hosts,
        faults,
        store,
        lease,
        log: Mutex::new(log),
        fragments: Mutex::new(fragments),
        members: RwLock::new(Vec::new()),
        cells: Cells::default(),
        life: Mutex::new(Life {
            stage: Stage::Recovering,
            recovered_at: None,
        }),
        removal: Mutex::new(None),
        restoring: AtomicUsize::new(0),
        _disk_lock: disk_lock,
    });
    let _ = NODE.set(node.clone());

    tokio::spawn(api::serve_public(node.clone(), public));
    tokio::spawn(api::serve_internal(node.clone(), internal));
    tokio::spawn(members_loop(node.clone()));
    tracing::info!(public = %node.cfg.public_addr, internal = %node.cfg.internal_addr, "listening");

    if let Err(code) = recover_predecessors(&node).await {
        return code;
    }
    {
        let mut life = node.life.lock().expect("life");
        if life.stage == Stage::Recovering {
            life.stage = Stage::Running;
            life.recovered_at = Some(Instant::now());
        }
    }
    tracing::info!("recovered; serving");
    if node.cfg.durability == Durability::Fleet {
        tokio::spawn(durability::flush_loop(node.clone()));
    }
    tokio::spawn(cells::sweep_loop(node.clone()));
    std::future::pending::<i32>().await
}

/// Startup probe (integration/celld-sim/README.md "How it works"): conditional create, rejected
/// create, conditional overwrite, rejected stale overwrite and ranged read under `probe/`.
async fn probe(store: &Store, cfg: &Config, generation: &str) -> Result<(), String> {
    let deadline = Instant::now() + cfg.store_wait;
    loop {
        match probe_once(store, cfg, generation).await {
            Ok(()) => return Ok(()),
            Err(ProbeError::Store(e)) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "store probe: store not reachable yet, retrying");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(ProbeError::Store(e)) => return Err(e.to_string()),
            Err(ProbeError::Ignored(what)) => return Err(what),
        }
    }
}

enum ProbeError {
    Store(StoreError),
    Ignored(String),
}

impl From<StoreError> for ProbeError {
    fn from(e: StoreError) -> Self {
        ProbeError::Store(e)
    }
}

async fn probe_once(store: &Store, cfg: &Config, generation: &str) -> Result<(), ProbeError> {
    let key = format!("probe/{}/{generation}-{}", cfg.node, now_ms());
    let ignored = |what: &str| ProbeError::Ignored(format!("the store ignores {what}"));
    let first = store
        .put(&key, Bytes::from_static(b"probe-1"), Cond::Absent)
        .await
        .map_err(|e| match e {
            StoreError::PreconditionFailed => ignored("If-None-Match on an absent object"),
            e => e.into(),
        })?;
    match store
        .put(&key, Bytes::from_static(b"probe-2"), Cond::Absent)
        .await
    {
        Err(StoreError::PreconditionFailed) => {}
        Ok(_) => return Err(ignored("If-None-Match: * (a second create succeeded)")),
        Err(e) => return Err(e.into()),
    }
    let third = store
        .put(
            &key,
            Bytes::from_static(b"probe-3"),
            Cond::Matches(first.clone()),
        )
        .await
        .map_err(|e| match e {
            StoreError::PreconditionFailed => ignored("If-Match with the current ETag (rejected)"),
            e => e.into(),
        })?;
    if third == first {
        return Err(ignored("ETags (the overwrite kept the old ETag)"));
    }
    match store
        .put(&key, Bytes::from_static(b"probe-4"), Cond::Matches(first))
        .await
    {
        Err(StoreError::PreconditionFailed) => {}
        Ok(_) => return Err(ignored("If-Match (a stale compare-and-swap succeeded)")),
        Err(e) => return Err(e.into()),
    }
    match store.get_range(&key, 2, 4).await {
        Ok(Some(b)) if &b[..] == b"obe" => {}
        Ok(other) => return Err(ignored(&format!("Range reads (got {other:?})"))),
        Err(StoreError::Unexpected { status, .. }) => {
            return Err(ignored(&format!("Range reads (status {status})")))
        }
        Err(e) => return Err(e.into()),
    }
    match store.get(&key).await? {
        Some(o) if &o.body[..] == b"probe-3" => {}
        other => {
            return Err(ignored(&format!(
                "conditional writes (final content {:?})",
                other.map(|o| o.body)
            )))
        }
    }
    let _ = store.delete(&key).await;
    Ok(())
}

/// Recovers every predecessor session (from the lease's `pending` list and any leader log left on
/// this disk) to the store, in up to 4 attempts each bounded by `CELLD_SIM_RECOVERY_ATTEMPT_MS`.
async fn recover_predecessors(node: &Arc<Node>) -> Result<(), i32> {
    let mut sessions: Vec<SessionRef> = node.lease.record().log.pending.clone();
    let local = blocking(|| disk::local_sessions(&node.cfg.watch)).unwrap_or_default();
    for s in local {
        if s != node.session && !sessions.iter().any(|p| p.session == s) {
            sessions.push(SessionRef {
                session: s,
                owner: node.cfg.node.clone(),
                followers: vec![],
            });
        }
    }
    if sessions.is_empty() {
        return Ok(());
    }
    tracing::info!(sessions = ?sessions.iter().map(|s| &s.session).collect::<Vec<_>>(), "recovering predecessor sessions");
    for attempt in 1..=4 {
        let work = async {
            loop {
                match recovery::recover_sessions(node, &sessions).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "predecessor recovery incomplete; staying unready and retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        };
        if tokio::time::timeout(node.cfg.recovery_attempt, work)
            .await
            .is_ok()
        {
            let done: HashSet<String> = sessions.iter().map(|s| s.session.clone()).collect();
            loop {
                match node
                    .lease
                    .update(|r| r.log.pending.retain(|p| !done.contains(&p.session)))
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(LeaseError::Fenced(cause)) => {
                        node.lease.fence(cause, "while recording recovery")
                    }
                    Err(LeaseError::Store(e)) => {
                        tracing::warn!(error = %e, "recording the recovery in the lease failed; retrying");
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
            }
        }
        tracing::error!(attempt, "predecessor recovery attempt timed out");
    }
    eprintln!("celld-sim: predecessor recovery failed 4 times");
    Err(EXIT_STARTUP)
}

/// `CELLD_SIM_EXIT_WITH_PID`: a test harness that dies without cleaning up takes its members
/// with it instead of leaving them renewing leases forever.
async fn exit_with(pid: u32) {
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !proc_dir.exists() {
            eprintln!("celld-sim: process {pid} (CELLD_SIM_EXIT_WITH_PID) is gone; exiting");
            std::process::exit(EXIT_STARTUP);
        }
    }
}

async fn members_loop(node: Arc<Node>) {
    loop {
        if let Err(e) = node.refresh_members().await {
            tracing::debug!(error = %e, "membership refresh failed");
        }
        tokio::time::sleep(node.cfg.ttl / 3).await;
    }
}

async fn signal_loop() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("celld-sim: cannot install signal handlers");
        std::process::exit(EXIT_STARTUP);
    };
    loop {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        let Some(node) = NODE.get().cloned() else {
            // Nothing acknowledged yet and nothing owned: a drained exit.
            eprintln!("celld-sim: signal during startup, exiting 0");
            std::process::exit(0);
        };
        if node.faults.get().sigterm == SigtermFault::Ignore {
            tracing::warn!("SIGTERM ignored (fault sigterm=ignore)");
            continue;
        }
        tokio::spawn(drain_and_exit(node));
    }
}

/// SIGTERM (integration/celld-sim/README.md "How it works"): upload its own unflushed writes,
/// hand owned cells back (release), give up the lease, exit 0, bounded by
/// `CELLD_SHUTDOWN_TOTAL_MS`. Fragments held for other leaders stay on disk (their leaders still
/// hold the data).
async fn drain_and_exit(node: Arc<Node>) {
    {
        let mut life = node.life.lock().expect("life");
        if life.stage == Stage::Stopping {
            return;
        }
        life.stage = Stage::Stopping;
    }
    let terminal = matches!(node.removal_phase(), Some(RemovalPhase::DataSafe));
    tracing::info!(terminal, "SIGTERM: draining");
    let work = async {
        if !terminal {
            if let Err(e) = hand_off(&node).await {
                tracing::warn!(error = %e, "drain incomplete");
            }
        }
        if let Err(e) = node.lease.release().await {
            tracing::warn!(error = %e, "giving up the lease failed");
        }
    };
    if tokio::time::timeout(node.cfg.shutdown_total, work)
        .await
        .is_err()
    {
        tracing::warn!("shutdown deadline passed; exiting anyway");
    }
    eprintln!("celld-sim: drained, exit 0");
    std::process::exit(0);
}

/// Uploads this node's own log, marks its session complete and releases every owned cell.
/// Shared by the SIGTERM drain and strict removal.
pub async fn hand_off(node: &Arc<Node>) -> Result<(), String> {
    let cells_held = node.cells.quiesce().await;
    durability::flush_all(node)
        .await
        .map_err(|e| e.to_string())?;
    node.store
        .put_json(
            &complete_key(&node.session),
            &json!({"session": node.session, "by": node.cfg.node, "at_ms": now_ms()}),
            Cond::None,
        )
        .await
        .map_err(|e| e.to_string())?;
    peer::drop_session_everywhere(node, &node.session).await;
    cells::release_all(node, cells_held)
        .await
        .map_err(|e| e.to_string())
}
