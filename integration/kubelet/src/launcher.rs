//! Starting a test kubelet from a test: [`TestKubelet::start`] runs the binary as a child process
//! with `--exit-on-stdin-eof` (so it dies with the test process, killing its containers), waits
//! until its control endpoint is healthy and returns a [`ControlClient`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::ControlClient;

/// Where the `celld-test-kubelet` binary is: `$CELLD_TEST_KUBELET_BIN`, else next to the running
/// test executable's folder (`target/<profile>/celld-test-kubelet`, present after
/// `cargo build -p celld-test-kubelet`; this crate's own tests use `CARGO_BIN_EXE_…` instead).
pub fn default_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("CELLD_TEST_KUBELET_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or("no target folder above the test executable")?;
    let candidate = profile_dir.join("celld-test-kubelet");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(format!(
            "{} not found: run `cargo build -p celld-test-kubelet` first or set CELLD_TEST_KUBELET_BIN",
            candidate.display()
        ))
    }
}

/// How to start a test kubelet.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `celld-test-kubelet` binary.
    pub binary: PathBuf,
    /// Kubeconfig (the cluster's `test-kubelet.kubeconfig`).
    pub kubeconfig: PathBuf,
    /// Work dir (created).
    pub work_dir: PathBuf,
    /// Node name prefix (distinct per instance).
    pub node_prefix: String,
    /// Number of Nodes.
    pub nodes: usize,
    /// Zones.
    pub zones: Vec<String>,
    /// Image map file.
    pub image_map: Option<PathBuf>,
    /// Pod IP range (distinct per instance).
    pub pod_ip_range: String,
    /// Store IP for the hosts file.
    pub store_ip: String,
    /// Node taints.
    pub node_taints: Vec<String>,
    /// Extra flags.
    pub extra_args: Vec<String>,
}

impl Options {
    /// Defaults for a kubelet under `work_dir`.
    pub fn new(
        binary: impl Into<PathBuf>,
        kubeconfig: impl Into<PathBuf>,
        work_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            binary: binary.into(),
            kubeconfig: kubeconfig.into(),
            work_dir: work_dir.into(),
            node_prefix: "celld-node".into(),
            nodes: 3,
            zones: vec![
                "us-east-1a".into(),
                "us-east-1b".into(),
                "us-east-1c".into(),
            ],
            image_map: None,
            pod_ip_range: "127.1.0.0/16".into(),
            store_ip: "127.0.0.1".into(),
            node_taints: Vec::new(),
            extra_args: Vec::new(),
        }
    }
}

/// A running test kubelet. Dropping it closes its stdin: it kills its containers and exits.
pub struct TestKubelet {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Control client.
    pub control: ControlClient,
    /// Work dir.
    pub work_dir: PathBuf,
    /// The kubelet's own log (stdout + stderr).
    pub log: PathBuf,
}

impl TestKubelet {
    /// Starts the kubelet and waits (up to 60 s) until it is healthy.
    pub fn start(opts: &Options) -> Result<Self, String> {
        std::fs::create_dir_all(&opts.work_dir)
            .map_err(|e| format!("creating {}: {e}", opts.work_dir.display()))?;
        let addr_file = opts.work_dir.join("control-addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = opts.work_dir.join("kubelet.log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&opts.binary);
        cmd.arg("--kubeconfig")
            .arg(&opts.kubeconfig)
            .arg("--work-dir")
            .arg(&opts.work_dir)
            .arg("--nodes")
            .arg(opts.nodes.to_string())
            .arg("--node-prefix")
            .arg(&opts.node_prefix)
            .arg("--zones")
            .arg(opts.zones.join(","))
            .arg("--pod-ip-range")
            .arg(&opts.pod_ip_range)
            .arg("--store-ip")
            .arg(&opts.store_ip)
            .arg("--control-addr")
            .arg("127.0.0.1:0")
            .arg("--exit-on-stdin-eof");
        if let Some(map) = &opts.image_map {
            cmd.arg("--image-map").arg(map);
        }
        for t in &opts.node_taints {
            cmd.arg("--node-taint").arg(t);
        }
        cmd.args(&opts.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err));
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", opts.binary.display()))?;
        let stdin = child.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr: SocketAddr = loop {
            if let Ok(text) = std::fs::read_to_string(&addr_file) {
                if let Ok(addr) = text.trim().parse() {
                    break addr;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "test kubelet exited with {status}; log: {}",
                    log.display()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!(
                    "test kubelet did not bind its control endpoint; log: {}",
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let control = ControlClient::new(addr);
        loop {
            if healthy_blocking(addr) {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "test kubelet exited with {status}; log: {}",
                    log.display()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(format!(
                    "test kubelet not healthy after 60s; log: {}",
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self {
            child,
            stdin,
            control,
            work_dir: opts.work_dir.clone(),
            log,
        })
    }

    /// The hosts file path.
    pub fn hosts_file(&self) -> PathBuf {
        self.work_dir.join("hosts")
    }

    /// A Pod incarnation's folder (`logs/`, `volumes/`) under the work dir.
    pub fn pod_dir(&self, ns: &str, name: &str, uid: &str) -> PathBuf {
        self.work_dir
            .join("pods")
            .join(format!("{ns}_{name}_{uid}"))
    }

    /// Stops the kubelet (its containers are killed) and waits for it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// `GET /healthz` without an async runtime (tests call `start` from inside one).
fn healthy_blocking(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: kubelet\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
