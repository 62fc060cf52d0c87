//! The test bed launcher (docs/design.md "Test bed"): one call gives a test the whole local
//! environment the operator runs against.
//!
//! [`TestBed::get`] (blocking) or [`TestBed::shared`] (async) starts it once per test process
//! (a `OnceLock`; every test of the binary shares it, each with its own namespace and bucket):
//!
//! 1. the control plane (`celld_harness::cluster()`: kube-apiserver, controller-manager,
//!    scheduler, etcd on 127.0.0.1, CRDs installed);
//! 2. `cargo build -p celld-sim -p celld-test-kubelet` (see `bins.rs`), the simulator copied into
//!    the bed's folder so a rebuild during a run does not change running members;
//! 3. s3s-fs (installed by `integration/store/install-s3s.sh`, fails loudly otherwise) on
//!    `127.0.0.1:<free port>`, keys `celld-test` / `celld-test-secret`, root `<slot>/store`;
//! 4. the fault proxy (in process) on `<store ip>:9000`, control API on `<store ip>:9001`;
//!    the kubelet's hosts file maps `minio.celld-test-store.svc` to the store IP;
//! 5. one test kubelet: `general` Nodes over us-east-1a/b/c plus one reserved Node
//!    (tainted `celld.test/testbed-reserved=true:NoSchedule`, for node-level faults), image map
//!    `registry.celld.test/celld` (any tag or digest) → `celld-sim`,
//!    `celld.test/noprocess` → no process;
//! 6. the StorageClass `celld-test-hostpath` (provisioner `hostpath.csi.k8s.io`, reclaim
//!    Delete, WaitForFirstConsumer) if missing.
//!
//! Concurrent test processes do not clash: each takes a free *slot* `k` (a `flock` on
//! `<cluster work dir>/testbed/slot-<k>.lock`, held until the process and every child it started
//! are gone), which fixes its folder (`<cluster work dir>/testbed/slot-<k>/`), its Pod IP range
//! (`127.<30+k>.0.0/16`), its store IP (`127.29.<k>.2`) and its Node names
//! (`bed<k>-<random>-<i>`, label `celld.test/testbed-slot=<k>`).
//!
//! Everything it started dies with the test process: the kubelet exits when its stdin closes
//! (killing every member), s3s-fs has `PR_SET_PDEATHSIG`, the proxy is in process, members get
//! `CELLD_SIM_EXIT_WITH_PID` (hand-written sets) and the kubelet's own `PR_SET_PDEATHSIG`; an
//! atexit handler also stops the kubelet (so its Nodes are deregistered) and s3s-fs explicitly.

pub mod audit;
mod bins;
pub mod identity;
pub mod member;
pub mod pods;
mod proc;
pub mod sampler;
pub mod simset;
pub mod store;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use celld_harness::{Cluster, TestNamespace};
use celld_store_proxy::{Mode, Proxy};
use celld_test_kubelet::client::ControlClient;
use celld_test_kubelet::launcher::{Options, TestKubelet};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

pub use audit::{AuditLog, AuditQuery};
pub use identity::{IdentityDiff, IdentitySnapshot};
pub use member::{member_url, Member};
pub use sampler::{Expect, Sampler, SamplerReport};
pub use simset::SimSet;
pub use store::{StoreServer, ACCESS_KEY, SECRET_KEY};

/// The store's service name members dial (docs/runtime.md "The member environment").
pub const STORE_HOST: &str = "minio.celld-test-store.svc";
/// The store port members dial.
pub const STORE_PORT: u16 = 9000;
/// `S3_ENDPOINT` under `--local-test`.
pub const STORE_ENDPOINT: &str = "http://minio.celld-test-store.svc:9000";
/// The test StorageClass.
pub const STORAGE_CLASS: &str = "celld-test-hostpath";
/// Its provisioner (the one the operator accepts under `--local-test`).
pub const PROVISIONER: &str = "hostpath.csi.k8s.io";
/// The repository mapped to the simulator (every tag and digest).
pub const RUNTIME_REPOSITORY: &str = "registry.celld.test/celld";
/// A runtime image reference that runs the simulator.
pub const RUNTIME_IMAGE: &str =
    "registry.celld.test/celld@sha256:0000000000000000000000000000000000000000000000000000000000000001";
/// The no-process image (Running and Ready at once, no process).
pub const NO_PROCESS_IMAGE: &str = "celld.test/noprocess";
/// The zones of the general Nodes (round-robin).
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
/// Taint key (value `true`, effect NoSchedule) and label of the reserved Node.
pub const RESERVED_TAINT_KEY: &str = "celld.test/testbed-reserved";
/// Label carrying the slot on every Node of a bed.
pub const SLOT_LABEL: &str = "celld.test/testbed-slot";
/// Label the kubelet puts on its Nodes (value: the node prefix).
pub use celld_test_kubelet::nodes::INSTANCE_LABEL as KUBELET_LABEL;
/// Default number of general Nodes (`CELLD_TESTBED_NODES` overrides).
pub const DEFAULT_GENERAL_NODES: usize = 6;
const MAX_SLOTS: u32 = 8;

/// The running test bed. See the crate documentation.
pub struct TestBed {
    /// The control plane.
    pub cluster: &'static Cluster,
    /// This process's slot.
    pub slot: u32,
    /// `<cluster work dir>/testbed/slot-<k>`.
    pub work_dir: PathBuf,
    /// Node name prefix (`bed<k>-<random>`), also the `celld.test/kubelet` label value.
    pub node_prefix: String,
    /// General Nodes: (name, zone).
    pub general_nodes: Vec<(String, String)>,
    /// The reserved Node (tainted; only Pods that tolerate it run there).
    pub reserved_node: String,
    /// Pod IP range.
    pub pod_ip_range: String,
    /// Where `minio.celld-test-store.svc` resolves for members.
    pub store_ip: Ipv4Addr,
    /// The S3 server.
    pub store: StoreServer,
    /// The fault proxy's listener (`<store ip>:9000`).
    pub proxy_addr: SocketAddr,
    /// The fault proxy's control API (`GET/PUT /mode`).
    pub proxy_control_addr: SocketAddr,
    /// The kubelet's control client (zombie node, kill, pause, Pod list).
    pub kubelet: ControlClient,
    /// The kubelet's log.
    pub kubelet_log: PathBuf,
    /// The kubelet's work dir (Pod folders with member logs under `pods/`).
    pub kubelet_work_dir: PathBuf,
    /// The hosts file members resolve names with.
    pub hosts_file: PathBuf,
    /// The kubelet's image map.
    pub image_map: PathBuf,
    /// The simulator binary members run (a copy owned by the bed).
    pub sim_binary: PathBuf,
    /// The kubelet binary.
    pub kubelet_binary: PathBuf,
    proxy: Proxy,
    kubelet_proc: Mutex<Option<TestKubelet>>,
    _runtime: tokio::runtime::Runtime,
    store_lock: tokio::sync::RwLock<()>,
    reserved_lock: tokio::sync::Mutex<()>,
}

static BED: OnceLock<std::result::Result<TestBed, String>> = OnceLock::new();

impl TestBed {
    /// The test bed, started on first use (blocking; safe from any thread or runtime). Panics
    /// with the reason and the log locations if it cannot start.
    pub fn get() -> &'static TestBed {
        let result = BED.get_or_init(|| {
            // A thread of its own: start-up blocks on a private runtime and must not run inside
            // the caller's.
            let started = std::thread::Builder::new()
                .name("testbed-init".into())
                .spawn(|| init().map_err(|e| format!("{e:#}")))
                .expect("spawning the test bed init thread")
                .join();
            let result = match started {
                Ok(r) => r,
                Err(panic) => Err(panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "test bed start-up panicked".into())),
            };
            if result.is_ok() {
                install_exit_hooks();
            }
            result
        });
        match result {
            Ok(bed) => bed,
            Err(e) => panic!("the test bed could not start: {e}"),
        }
    }

    /// [`TestBed::get`] from async code (runs the start-up on a blocking thread).
    pub async fn shared() -> &'static TestBed {
        tokio::task::spawn_blocking(TestBed::get)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// The admin kubeconfig (system:masters).
    pub fn kubeconfig(&self) -> &Path {
        &self.cluster.admin_kubeconfig
    }

    /// An admin client (create one per test: a client belongs to the runtime it was made on).
    pub async fn client(&self) -> Result<Client> {
        self.cluster.admin_client().await
    }

    /// A fresh namespace `<prefix>-<random>` for one test. Its Pods run on this bed's Nodes
    /// only (the namespace's PodNodeSelector annotation), never on another test process's.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create_on(client, prefix, Some(&self.node_selector())).await
    }

    /// The node selector (`key=value`) that matches this bed's Nodes and no others.
    pub fn node_selector(&self) -> String {
        format!("{KUBELET_LABEL}={}", self.node_prefix)
    }

    /// Creates bucket `name` (a folder under the store root; idempotent) and returns the name.
    pub fn bucket(&self, name: &str) -> Result<String> {
        if !store::valid_bucket_name(name) {
            bail!("{name:?} is not a valid bucket name (3–63 of [a-z0-9.-])");
        }
        let dir = self.store.bucket_dir(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(name.to_string())
    }

    /// Creates a bucket `<prefix>-<random>` and returns its name.
    pub fn unique_bucket(&self, prefix: &str) -> Result<String> {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        self.bucket(&format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ))
    }

    /// The fault proxy's current mode.
    pub fn store_mode(&self) -> Mode {
        self.proxy.mode()
    }

    /// Sets the fault proxy's mode for every member of every test: hold
    /// [`TestBed::store_exclusive`] while the mode is not `ok`.
    pub fn set_store_mode(&self, mode: Mode) {
        eprintln!("celld-testbed: store proxy mode {mode}");
        self.proxy.set_mode(mode);
    }

    /// Partitions every member from the store (black hole: connections hang).
    pub fn partition_store(&self) {
        self.set_store_mode(Mode::Blackhole);
    }

    /// Restores the store path.
    pub fn restore_store(&self) {
        self.set_store_mode(Mode::Ok);
    }

    /// Shared access to the store path: tests that need the store healthy hold this; a test
    /// that changes the proxy mode takes [`TestBed::store_exclusive`] and waits for them.
    pub async fn store_shared(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.store_lock.read().await
    }

    /// Exclusive access to the store path (proxy faults hit every member of every test).
    /// Dropping the guard does not restore the mode: call [`TestBed::restore_store`].
    pub async fn store_exclusive(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.store_lock.write().await
    }

    /// Exclusive use of the reserved Node (zombie and other node-level faults).
    pub async fn reserved_node_exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reserved_lock.lock().await
    }

    /// Names of the general Nodes.
    pub fn general_node_names(&self) -> Vec<String> {
        self.general_nodes.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A reader of audit events from now on (the exactly-once oracle).
    pub fn audit(&self) -> AuditLog {
        AuditLog::since_now(self.audit_log_path()).expect("the audit log exists")
    }

    /// `<cluster work dir>/audit/audit.log`.
    pub fn audit_log_path(&self) -> PathBuf {
        self.cluster.work_dir.join("audit/audit.log")
    }

    /// Fresh Pod IPs of `names` as ledger URLs (`http://<ip>:8080`); fails if a Pod is missing
    /// or has no IP.
    pub async fn member_urls(
        &self,
        client: &Client,
        ns: &str,
        names: &[String],
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for n in names {
            let p = pods::get(client, ns, n)
                .await
                .ok_or_else(|| anyhow!("Pod {ns}/{n} not found"))?;
            let ip = pods::pod_ip(&p).ok_or_else(|| anyhow!("Pod {ns}/{n} has no IP"))?;
            out.push(member_url(ip));
        }
        Ok(out)
    }

    /// The member behind a Pod (fresh read of its IP).
    pub async fn member(&self, client: &Client, ns: &str, name: &str) -> Result<Member> {
        let p = pods::get(client, ns, name)
            .await
            .ok_or_else(|| anyhow!("Pod {ns}/{name} not found"))?;
        pods::member(&p).ok_or_else(|| anyhow!("Pod {ns}/{name} has no IP"))
    }

    /// Identity snapshot of `ns` (Pods matching `selector`, every claim).
    pub async fn identity(
        &self,
        client: &Client,
        ns: &str,
        selector: &str,
    ) -> Result<IdentitySnapshot> {
        IdentitySnapshot::capture(client, ns, selector).await
    }

    /// Starts the one-member-down sampler on the caller's runtime.
    pub fn sampler(
        &self,
        client: &Client,
        ns: &str,
        expect: Expect,
        allowed_down: usize,
    ) -> Sampler {
        Sampler::start(client.clone(), ns, expect, allowed_down)
    }

    /// The hosts file as name → IP.
    pub fn hosts(&self) -> BTreeMap<String, IpAddr> {
        let text = std::fs::read_to_string(&self.hosts_file).unwrap_or_default();
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut parts = line.split_whitespace();
            let Some(Ok(ip)) = parts.next().map(str::parse::<IpAddr>) else {
                continue;
            };
            for name in parts {
                out.insert(name.to_string(), ip);
            }
        }
        out
    }

    /// A Pod incarnation's folder in the kubelet work dir.
    pub fn pod_dir(&self, ns: &str, name: &str, uid: &str) -> PathBuf {
        self.kubelet_work_dir
            .join("pods")
            .join(format!("{ns}_{name}_{uid}"))
    }

    /// A container's log (every run of it, appended).
    pub fn container_log(&self, ns: &str, name: &str, uid: &str, container: &str) -> PathBuf {
        self.pod_dir(ns, name, uid)
            .join("logs")
            .join(format!("{container}.log"))
    }

    /// Where every component's log is (printed when a test fails).
    pub fn log_locations(&self) -> String {
        let mut s = celld_harness::log_locations(&self.cluster.work_dir);
        s.push_str(&format!(
            "  test bed (slot {}): {}\n  test kubelet: {}\n  member logs: {}/pods/<ns>_<pod>_<uid>/logs/<container>.log\n  hosts file: {}\n  s3s-fs: {} (root {})\n  store proxy: in process, {} → {} (control {}), mode {}\n",
            self.slot,
            self.work_dir.display(),
            self.kubelet_log.display(),
            self.kubelet_work_dir.display(),
            self.hosts_file.display(),
            self.store.log.display(),
            self.store.root.display(),
            self.proxy_addr,
            self.store.addr,
            self.proxy_control_addr,
            self.proxy.mode(),
        ));
        s
    }

    /// Polls `f` until it yields a value; on timeout the error names `what` and the logs.
    pub async fn eventually<T, F, Fut>(&self, what: &str, timeout: Duration, f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        pods::eventually(what, timeout, &self.log_locations(), f).await
    }

    /// Waits until the named Pods are Ready (see [`pods::wait_ready`]).
    pub async fn wait_ready(
        &self,
        client: &Client,
        ns: &str,
        names: &[String],
        not_uids: &[(String, String)],
        timeout: Duration,
    ) -> Result<Vec<k8s_openapi::api::core::v1::Pod>> {
        pods::wait_ready(client, ns, names, not_uids, timeout, &self.log_locations()).await
    }

    /// Stops the kubelet (killing every member, deregistering its Nodes) and s3s-fs. Called
    /// at process exit; the bed is unusable afterwards.
    fn stop(&self) {
        proc::STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(kubelet) = self.kubelet_proc.lock().ok().and_then(|mut k| k.take()) {
            drop(kubelet);
        }
        self.store.kill();
    }
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(bed)) = BED.get() {
        bed.stop();
    }
}

fn install_exit_hooks() {
    // SAFETY: registering a plain extern "C" function.
    unsafe {
        libc::atexit(stop_at_exit);
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if let Some(Ok(bed)) = BED.get() {
            eprintln!("{}", bed.log_locations());
        }
    }));
}

/// Takes the first free slot; the lock fd is deliberately leaked without `O_CLOEXEC`, so
/// children (the kubelet and its members, s3s-fs) hold the slot until they are gone too.
fn acquire_slot(base: &Path) -> Result<u32> {
    use std::os::unix::ffi::OsStrExt;
    for k in 0..MAX_SLOTS {
        let path = base.join(format!("slot-{k}.lock"));
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
        // SAFETY: open(2)/flock(2)/close(2) on a path we own.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o644) };
        if fd < 0 {
            bail!(
                "opening {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(k);
        }
        // SAFETY: as above.
        unsafe { libc::close(fd) };
    }
    bail!(
        "all {MAX_SLOTS} test bed slots under {} are taken by other test processes",
        base.display()
    )
}

fn copy_binary(from: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let dest = dir.join(name);
    std::fs::copy(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(dest)
}

fn init() -> Result<TestBed> {
    let cluster = celld_harness::cluster();
    let repo = celld_harness::repo_root();
    let bins = bins::build(&repo)?;
    let s3s_bin = store::install(&repo)?;

    let base = cluster.work_dir.join("testbed");
    std::fs::create_dir_all(&base)?;
    let slot = acquire_slot(&base)?;
    let work_dir = base.join(format!("slot-{slot}"));
    std::fs::create_dir_all(work_dir.join("logs"))?;
    let sim_binary = copy_binary(&bins.sim, &work_dir.join("bin"), "celld-sim")?;

    // A fresh store per run (the slot is ours; buckets of earlier runs are gone).
    let store_root = work_dir.join("store");
    let _ = std::fs::remove_dir_all(&store_root);
    let store = store::start(&s3s_bin, &store_root, &work_dir.join("logs/s3s-fs.log"))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("testbed-rt")
        .enable_all()
        .build()?;
    let store_ip = Ipv4Addr::new(127, 29, slot as u8, 2);
    let proxy = runtime
        .block_on(Proxy::start(
            SocketAddr::from((store_ip, STORE_PORT)),
            store.addr,
            SocketAddr::from((store_ip, STORE_PORT + 1)),
        ))
        .with_context(|| format!("starting the store fault proxy on {store_ip}:{STORE_PORT}"))?;

    let image_map = work_dir.join("images.map");
    std::fs::write(
        &image_map,
        format!(
            "# written by celld-testbed\n{RUNTIME_REPOSITORY} = {}\n{NO_PROCESS_IMAGE} = @noprocess\n",
            sim_binary.display()
        ),
    )?;

    let general = std::env::var("CELLD_TESTBED_NODES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(DEFAULT_GENERAL_NODES);
    let node_prefix = format!(
        "bed{slot}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..4]
    );
    let nodes: Vec<(String, String)> = (0..=general)
        .map(|i| {
            (
                format!("{node_prefix}-{i}"),
                ZONES[i % ZONES.len()].to_string(),
            )
        })
        .collect();
    let reserved_node = nodes[general].0.clone();
    let general_nodes = nodes[..general].to_vec();

    runtime.block_on(async {
        let client = cluster.admin_client().await?;
        delete_stale_objects(&client, slot).await?;
        ensure_storage_class(&client).await
    })?;

    // The kubelet work dir is reused per slot: its `run/` (process groups of a hard-killed
    // earlier run, killed at start; the Pod IP cursor) stays, Pod folders and disks of the
    // previous run go.
    let kubelet_work_dir = work_dir.join("kubelet");
    for old in ["pods", "volumes"] {
        let _ = std::fs::remove_dir_all(kubelet_work_dir.join(old));
    }
    let pod_ip_range = format!("127.{}.0.0/16", 30 + slot);
    let mut opts = Options::new(
        &bins.kubelet,
        cluster.work_dir.join("test-kubelet.kubeconfig"),
        &kubelet_work_dir,
    );
    opts.node_prefix = node_prefix.clone();
    opts.nodes = nodes.len();
    opts.zones = ZONES.iter().map(|z| z.to_string()).collect();
    opts.image_map = Some(image_map.clone());
    opts.pod_ip_range = pod_ip_range.clone();
    opts.store_ip = store_ip.to_string();
    opts.extra_args = vec![
        "--backoff-initial-ms".into(),
        "1000".into(),
        "--backoff-max-ms".into(),
        "10000".into(),
    ];
    let kubelet = TestKubelet::start(&opts).map_err(|e| anyhow!("{e}"))?;
    let control = kubelet.control.clone();
    let kubelet_log = kubelet.log.clone();
    let hosts_file = kubelet.hosts_file();

    runtime.block_on(async {
        let client = cluster.admin_client().await?;
        label_nodes(&client, slot, &nodes, &reserved_node).await?;
        warn_about_foreign_nodes(&client, &node_prefix).await
    })?;

    let bed = TestBed {
        cluster,
        slot,
        work_dir,
        node_prefix,
        general_nodes,
        reserved_node,
        pod_ip_range,
        store_ip,
        proxy_addr: proxy.listen_addr,
        proxy_control_addr: proxy.control_addr,
        store,
        kubelet: control,
        kubelet_log,
        kubelet_work_dir,
        hosts_file,
        image_map,
        sim_binary,
        kubelet_binary: bins.kubelet,
        proxy,
        kubelet_proc: Mutex::new(Some(kubelet)),
        _runtime: runtime,
        store_lock: tokio::sync::RwLock::new(()),
        reserved_lock: tokio::sync::Mutex::new(()),
    };
    eprintln!(
        "celld-testbed: up (slot {}, nodes {}-0..{}, reserved {}, Pod IPs {}, store {} via {})\n{}",
        bed.slot,
        bed.node_prefix,
        general - 1,
        bed.reserved_node,
        bed.pod_ip_range,
        bed.store.addr,
        bed.proxy_addr,
        bed.log_locations()
    );
    Ok(bed)
}

/// Nodes of this slot left by a test process that was killed hard (its kubelet could not
/// deregister them), and Released PVs of earlier kubelets of this slot (their provisioner is
/// gone, so reclaim Delete would never happen).
async fn delete_stale_objects(client: &Client, slot: u32) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    let stale = api
        .list(&ListParams::default().labels(&format!("{SLOT_LABEL}={slot}")))
        .await?;
    for n in stale.items {
        let name = n.metadata.name.unwrap_or_default();
        eprintln!("celld-testbed: deleting stale Node {name} of slot {slot}");
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let prefix = format!("bed{slot}-");
    for pv in pvs
        .list(&ListParams::default().labels(KUBELET_LABEL))
        .await?
        .items
    {
        let of_slot = pv
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(KUBELET_LABEL))
            .is_some_and(|v| v.starts_with(&prefix));
        let released = pv
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Released" || p == "Failed");
        if of_slot && released {
            let name = pv.metadata.name.unwrap_or_default();
            eprintln!("celld-testbed: deleting stale PV {name} of slot {slot}");
            let _ = pvs.delete(&name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

async fn ensure_storage_class(client: &Client) -> Result<()> {
    let api = Api::<StorageClass>::all(client.clone());
    let check = |sc: &StorageClass| -> Result<()> {
        if sc.provisioner != PROVISIONER
            || sc.reclaim_policy.as_deref().unwrap_or("Delete") != "Delete"
            || sc.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer")
        {
            bail!(
                "StorageClass {STORAGE_CLASS} exists with provisioner {}, reclaimPolicy {:?}, volumeBindingMode {:?}; the test bed needs {PROVISIONER}, Delete, WaitForFirstConsumer",
                sc.provisioner,
                sc.reclaim_policy,
                sc.volume_binding_mode
            );
        }
        Ok(())
    };
    if let Some(sc) = api.get_opt(STORAGE_CLASS).await? {
        return check(&sc);
    }
    let sc: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?;
    match api.create(&PostParams::default(), &sc).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => check(&api.get(STORAGE_CLASS).await?),
        Err(e) => Err(e.into()),
    }
}

async fn label_nodes(
    client: &Client,
    slot: u32,
    nodes: &[(String, String)],
    reserved: &str,
) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    for (name, _) in nodes {
        let mut labels = serde_json::json!({ SLOT_LABEL: slot.to_string() });
        if name == reserved {
            labels[RESERVED_TAINT_KEY] = "true".into();
            let node = api.get(name).await?;
            let mut taints = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != RESERVED_TAINT_KEY)
                .map(|t| serde_json::to_value(t).expect("taint"))
                .collect::<Vec<_>>();
            taints.push(
                serde_json::json!({"key": RESERVED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}),
            );
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"metadata": {"labels": labels}, "spec": {"taints": taints}}),
                ),
            )
            .await
            .with_context(|| format!("tainting the reserved Node {name}"))?;
        } else {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
            )
            .await
            .with_context(|| format!("labelling Node {name}"))?;
        }
    }
    Ok(())
}

/// Other schedulable, untainted Nodes in the same zones (another test bed, `make demo`) can
/// receive Pods that carry no node selector, such as an operator's fleet members: say so.
async fn warn_about_foreign_nodes(client: &Client, prefix: &str) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let foreign: Vec<String> = nodes
        .items
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            let ours = labels.get(KUBELET_LABEL).map(String::as_str) == Some(prefix);
            let schedulable = n.spec.as_ref().is_none_or(|s| {
                !s.unschedulable.unwrap_or(false)
                    && s.taints.as_ref().is_none_or(|ts| {
                        ts.iter()
                            .all(|t| t.effect != "NoSchedule" && t.effect != "NoExecute")
                    })
            });
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            !ours && schedulable && ready
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    if !foreign.is_empty() {
        eprintln!(
            "celld-testbed: note: other schedulable Nodes exist ({}); Pods of this bed's namespaces run on its own Nodes only (label {KUBELET_LABEL}={prefix}), Pods of namespaces it did not create may run anywhere.",
            foreign.join(", ")
        );
    }
    Ok(())
}
