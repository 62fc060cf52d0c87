//! A small test bed for the simulator: a real s3s-fs store, in-process fault proxies, a hosts
//! file, and simulator processes on distinct loopback addresses. Logs stay on disk and their
//! tails are printed when a test fails.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use celld_sim::http::{self, ClientResponse, Limits};
use celld_store_proxy::Proxy;
use hyper::Method;
use serde_json::Value;

pub const BUCKET: &str = "celld-test";
pub const STORE_NAME: &str = "minio.celld-test-store.svc";

/// The s3s-fs binary, installed by `integration/store/install-s3s.sh` (built once per machine).
/// Fails the test loudly when it cannot be installed: a skipped tier proves nothing.
pub fn s3s_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/install-s3s.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "installing s3s-fs with {} failed ({}); the simulator tests need the real store",
            script.display(),
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(
            text.lines()
                .last()
                .expect("install script prints the path")
                .trim(),
        );
        assert!(path.is_file(), "s3s-fs binary {} missing", path.display());
        path
    })
    .clone()
}

/// A port free now and not handed out before in this process. The port is released before its
/// server binds it, so two beds started at the same moment could be given the same port, one
/// test's readiness probe answered by the other test's s3s-fs, gone when that test ended: the
/// likely cause of a first request once met with "connection refused" although the probe had
/// connected, with the bed's own s3s-fs log empty (it had not yet reached its bind). It was met
/// again with ports never handed out twice (CI, 2026-12-07): the other way a probe connects
/// before s3s-fs listens is a connection to itself, which `wait_tcp` now rejects.
fn free_port(ip: Ipv4Addr) -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = StdListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

fn wait_tcp(addr: SocketAddr, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !celld_store_proxy::listening::accepts(addr, Duration::from_millis(200)) {
        assert!(Instant::now() < deadline, "{addr} did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A third octet range per test in this process, mixed with the pid so concurrent test binaries
/// do not collide.
fn next_subnet() -> (u8, u8) {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let b = 100 + (std::process::id() % 100) as u8;
    (b, NEXT.fetch_add(1, Ordering::SeqCst))
}

pub struct Member {
    pub name: String,
    pub ip: Ipv4Addr,
    pub watch: PathBuf,
    pub env: BTreeMap<String, String>,
    pub child: Option<Child>,
    pub log: PathBuf,
    pub starts: u32,
}

impl Member {
    pub fn url(&self) -> String {
        format!("http://{}:8080", self.ip)
    }

    pub fn internal(&self) -> SocketAddr {
        SocketAddr::new(self.ip.into(), 8081)
    }

    pub fn public(&self) -> SocketAddr {
        SocketAddr::new(self.ip.into(), 8080)
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        self.starts += 1;
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        use std::io::Write;
        writeln!(log, "===== start #{} =====", self.starts).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_celld-sim"))
            .env_clear()
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn celld-sim");
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig} {}", self.name);
    }

    pub fn sigkill(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    pub fn wipe_disk(&self) {
        assert!(
            self.child.is_none(),
            "wipe {} only while it is down",
            self.name
        );
        fs::remove_dir_all(&self.watch).unwrap();
        fs::create_dir_all(&self.watch).unwrap();
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn health(&self) -> Option<u16> {
        get(self.public(), "/.well-known/celld/health")
            .await
            .ok()
            .map(|r| r.status)
    }

    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.health().await == Some(200) {
                return;
            }
            assert!(
                self.running(),
                "{} exited while waiting for readiness",
                self.name
            );
            assert!(
                Instant::now() < deadline,
                "{} not ready within {timeout:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn state(&self) -> Value {
        let r = get(self.internal(), "/state").await.expect("/state");
        assert_eq!(r.status, 200, "/state answered {}", r.status);
        serde_json::from_slice(&r.body).expect("/state JSON")
    }

    pub async fn info(&self) -> Value {
        let r = get(self.internal(), "/sim/info").await.expect("/sim/info");
        serde_json::from_slice(&r.body).expect("/sim/info JSON")
    }

    pub async fn set_faults(&self, patch: &str) -> ClientResponse {
        call(
            self.internal(),
            Method::PUT,
            "/sim/faults",
            Some("application/json"),
            patch,
        )
        .await
        .expect("PUT /sim/faults")
    }

    pub async fn remove_disk(
        &self,
        operation_id: &str,
        generation: &str,
    ) -> Result<ClientResponse, http::ClientError> {
        let body =
            serde_json::json!({"operation_id": operation_id, "expected_generation": generation})
                .to_string();
        call(
            self.internal(),
            Method::POST,
            "/shutdown?mode=remove-disk",
            Some("application/json"),
            &body,
        )
        .await
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Result<ClientResponse, http::ClientError> {
    let headers: Vec<(&str, String)> = content_type
        .map(|c| vec![("content-type", c.to_string())])
        .unwrap_or_default();
    http::call(
        addr,
        &addr.to_string(),
        method,
        path,
        &headers,
        Bytes::from(body.to_string()),
        Limits {
            connect: Duration::from_secs(1),
            total: Duration::from_secs(5),
            max_body: 4 << 20,
        },
    )
    .await
}

pub async fn get(addr: SocketAddr, path: &str) -> Result<ClientResponse, http::ClientError> {
    call(addr, Method::GET, path, None, "").await
}

pub struct StoreServer {
    child: Child,
    pub root: PathBuf,
    pub addr: SocketAddr,
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StoreServer {
    /// The object at `key` as s3s-fs keeps it on disk.
    pub fn object_path(&self, key: &str) -> PathBuf {
        self.root.join(BUCKET).join(key)
    }

    pub fn object_exists(&self, key: &str) -> bool {
        self.object_path(key).is_file()
    }

    /// Every key under a prefix (walks s3s-fs's folder).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            let Ok(rd) = fs::read_dir(dir) else { return };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else if let Ok(rel) = p.strip_prefix(base) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        let base = self.root.join(BUCKET);
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out.retain(|k| k.starts_with(prefix));
        out.sort();
        out
    }
}

/// Options of one test bed.
pub struct BedOptions {
    pub durability: &'static str,
    pub members: usize,
    pub ttl_ms: u64,
    pub flush_ms: u64,
    pub shutdown_ms: u64,
    /// Members (by index) that reach the store through their own proxy, so one member can be
    /// partitioned from the store alone.
    pub isolated_store: Vec<usize>,
}

impl Default for BedOptions {
    fn default() -> Self {
        BedOptions {
            durability: "fleet",
            members: 3,
            ttl_ms: 3000,
            flush_ms: 1000,
            shutdown_ms: 10_000,
            isolated_store: vec![],
        }
    }
}

pub struct Bed {
    pub dir: PathBuf,
    pub store: StoreServer,
    /// The proxy every member uses, on `<subnet>.250:9000`.
    pub proxy: Proxy,
    /// Per-member proxies for `isolated_store` members.
    pub member_proxies: BTreeMap<usize, Proxy>,
    pub members: Vec<Member>,
    subnet: (u8, u8),
    keep: bool,
}

pub fn peer_name(name: &str) -> String {
    format!("{name}.sim-peers.testbed.svc")
}

impl Bed {
    pub async fn new(test: &str, opts: BedOptions) -> Bed {
        let bin = s3s_binary();
        let dir = std::env::temp_dir().join(format!(
            "celld-sim-{test}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        fs::create_dir_all(&dir).unwrap();
        let root = dir.join("store");
        fs::create_dir_all(root.join(BUCKET)).unwrap();
        let port = free_port(Ipv4Addr::LOCALHOST);
        let store_log = fs::File::create(dir.join("s3s-fs.log")).unwrap();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "celld-test",
                "--secret-key",
                "celld-test-secret",
            ])
            .arg(&root)
            .stdout(store_log.try_clone().unwrap())
            .stderr(store_log)
            .spawn()
            .expect("start s3s-fs");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let store = StoreServer { child, root, addr };
        wait_tcp(addr, Duration::from_secs(10));

        let subnet = next_subnet();
        let ip = |last: u8| Ipv4Addr::new(127, subnet.0, subnet.1, last);
        let proxy = Proxy::start(
            SocketAddr::new(ip(250).into(), 9000),
            addr,
            SocketAddr::new(ip(250).into(), 9001),
        )
        .await
        .expect("proxy");
        let mut member_proxies = BTreeMap::new();
        for &i in &opts.isolated_store {
            let pip = ip(200 + i as u8);
            let p = Proxy::start(
                SocketAddr::new(pip.into(), 9000),
                addr,
                SocketAddr::new(pip.into(), 9001),
            )
            .await
            .expect("member proxy");
            member_proxies.insert(i, p);
        }

        let mut members = Vec::new();
        for i in 0..opts.members {
            let name = format!("sim-{i}");
            let mip = ip(10 + i as u8);
            let watch = dir.join(format!("disk-{i}"));
            fs::create_dir_all(&watch).unwrap();
            let hosts = if member_proxies.contains_key(&i) {
                dir.join(format!("hosts-{i}"))
            } else {
                dir.join("hosts")
            };
            let fleet = opts.durability == "fleet";
            let node = if fleet {
                name.clone()
            } else {
                // Bucket members are their Pod UID.
                format!("uid-{}", uuid::Uuid::new_v4())
            };
            let advertise = if fleet {
                format!("{}:8081", peer_name(&name))
            } else {
                format!("{mip}:8081")
            };
            let env: BTreeMap<String, String> = [
                ("POD_IP", mip.to_string()),
                ("CELLD_NODE", node),
                ("CELLD_ADVERTISE", advertise),
                ("CELLD_BUCKET", format!("s3://{BUCKET}")),
                ("AWS_REGION", "us-east-1".into()),
                ("CELLD_DURABILITY", opts.durability.into()),
                ("CELLD_ADDR", "0.0.0.0:8080".into()),
                ("CELLD_INTERNAL_ADDR", "0.0.0.0:8081".into()),
                ("CELLD_WATCH", watch.display().to_string()),
                ("CELLD_TTL_MS", opts.ttl_ms.to_string()),
                ("CELLD_SHUTDOWN_TOTAL_MS", opts.shutdown_ms.to_string()),
                ("CELLD_TOKIO_THREADS", "2".into()),
                ("CELLD_READY_FLEET_GATE_MS", "2000".into()),
                ("S3_ENDPOINT", format!("http://{STORE_NAME}:9000")),
                ("AWS_ALLOW_HTTP", "true".into()),
                ("AWS_ACCESS_KEY_ID", "celld-test".into()),
                ("AWS_SECRET_ACCESS_KEY", "celld-test-secret".into()),
                ("CELLD_SIM_HOSTS_FILE", hosts.display().to_string()),
                ("CELLD_SIM_FLUSH_MS", opts.flush_ms.to_string()),
                ("CELLD_SIM_STORE_WAIT_MS", "10000".into()),
                (
                    "CELLD_SIM_LOCK_DIR",
                    dir.join("cas-locks").display().to_string(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            members.push(Member {
                name,
                ip: mip,
                watch,
                env,
                child: None,
                log: dir.join(format!("sim-{i}.log")),
                starts: 0,
            });
        }
        let bed = Bed {
            dir,
            store,
            proxy,
            member_proxies,
            members,
            subnet,
            keep: false,
        };
        bed.write_hosts();
        bed
    }

    /// The hosts files: peer names of every member, and the store name mapped to the shared
    /// proxy (or to the member's own proxy for isolated members).
    pub fn write_hosts(&self) {
        let mut peers = String::from("# written by the simulator tests\n");
        for m in &self.members {
            peers.push_str(&format!("{} {}\n", m.ip, peer_name(&m.name)));
        }
        let shared = format!("{}{} {STORE_NAME}\n", peers, self.proxy.listen_addr.ip());
        fs::write(self.dir.join("hosts"), shared).unwrap();
        for (i, p) in &self.member_proxies {
            let own = format!("{}{} {STORE_NAME}\n", peers, p.listen_addr.ip());
            fs::write(self.dir.join(format!("hosts-{i}")), own).unwrap();
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.url()).collect()
    }

    pub fn urls_of(&self, which: &[usize]) -> Vec<String> {
        which.iter().map(|&i| self.members[i].url()).collect()
    }

    pub fn start_all(&mut self) {
        for m in &mut self.members {
            m.start();
        }
    }

    pub async fn wait_all_ready(&mut self, timeout: Duration) {
        for m in &mut self.members {
            m.wait_ready(timeout).await;
        }
    }

    /// Sets a proxy's mode through its HTTP control endpoint (as the test bed would).
    pub async fn set_proxy_mode(proxy: &Proxy, mode: &str) {
        let r = call(
            proxy.control_addr,
            Method::PUT,
            "/mode",
            Some("text/plain"),
            mode,
        )
        .await
        .expect("proxy control");
        assert_eq!(
            r.status,
            200,
            "proxy control: {}",
            String::from_utf8_lossy(&r.body)
        );
    }

    /// Marks the test as passed: the bed's folder is removed on drop.
    pub fn passed(&mut self) {
        self.keep = false;
    }

    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking()
            || self.keep
            || std::env::var_os("CELLD_SIM_TEST_KEEP").is_some()
        {
            eprintln!("\n==== test bed kept at {} ====", self.dir.display());
            for m in &self.members {
                let text = m.log_text();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                eprintln!(
                    "---- {} ({}) last {} lines ----",
                    m.name,
                    m.log.display(),
                    tail.len()
                );
                for l in tail {
                    eprintln!("{l}");
                }
            }
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
        let _ = self.subnet;
    }
}
