//! The operator under test as a child process (killed when dropped), for real-cluster
//! suites and crash drills.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The logs of the operators each test thread started, newest last: the panic hook prints
/// them for the thread that failed, so a failure in CI shows the operator's view.
static STARTED_LOGS: Mutex<Option<HashMap<ThreadId, Vec<PathBuf>>>> = Mutex::new(None);

fn remember_log(log: &Path) {
    if let Ok(mut logs) = STARTED_LOGS.lock() {
        let entry = logs
            .get_or_insert_with(HashMap::new)
            .entry(std::thread::current().id())
            .or_default();
        if !entry.iter().any(|l| l == log) {
            entry.push(log.to_path_buf());
        }
    }
}

/// The logs of the operators the current thread started, and the last `tail` lines of the
/// newest one (empty when it started none).
pub fn started_logs_text(tail: usize) -> String {
    let logs = STARTED_LOGS
        .lock()
        .ok()
        .and_then(|l| l.as_ref()?.get(&std::thread::current().id()).cloned())
        .unwrap_or_default();
    let Some(newest) = logs.last() else {
        return String::new();
    };
    let mut out = String::from("operator logs of this test:\n");
    for log in &logs {
        out.push_str(&format!("  {}\n", log.display()));
    }
    let text = std::fs::read_to_string(newest).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    out.push_str(&format!(
        "last {} lines of {}:\n",
        tail.min(lines.len()),
        newest.display()
    ));
    for line in &lines[lines.len().saturating_sub(tail)..] {
        out.push_str(&format!("  | {line}\n"));
    }
    out
}

/// How to start one operator replica.
#[derive(Clone, Debug, Default)]
pub struct OperatorOptions {
    /// The `celld-operator` binary (`env!("CARGO_BIN_EXE_celld-operator")` in the root package).
    pub binary: PathBuf,
    /// Kubeconfig it authenticates with (admin, or one impersonating a ServiceAccount).
    pub kubeconfig: PathBuf,
    /// `--operator-namespace` (its Lease lives there).
    pub operator_namespace: String,
    /// `POD_NAME`: the identity stamped into journal entries.
    pub identity: String,
    /// Folder for its log and journal mirror (`<dir>/<identity>/…`).
    pub work_dir: PathBuf,
    /// `--metrics-bind-address`, if any.
    pub metrics_addr: Option<String>,
    /// `--fault-point=NAME[:N]`, if any.
    pub fault_point: Option<String>,
    /// `--health-bind-address` (`/livez`, `/readyz`); off when `None`.
    pub health_addr: Option<String>,
    /// Leave out `--network-policy-enforced` (the IsolationUnverified gate).
    pub without_network_policy_attestation: bool,
    /// Further `run` flags, e.g. `--operation-deadline=20s`.
    pub extra_args: Vec<String>,
}

/// A running operator replica.
pub struct OperatorProcess {
    child: Child,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts `celld-operator run --local-test --network-policy-enforced` with `opts`
    /// (without the attestation when `opts.without_network_policy_attestation`).
    pub fn start(opts: &OperatorOptions) -> Self {
        let dir = opts.work_dir.join(&opts.identity);
        std::fs::create_dir_all(&dir).expect("operator work dir");
        let log = dir.join("operator.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("operator log");
        let mut cmd = Command::new(&opts.binary);
        cmd.env("KUBECONFIG", &opts.kubeconfig)
            .env("POD_NAME", &opts.identity)
            .env("RUST_LOG", "info,celld_operator=debug")
            .args(["run", "--local-test", "--log-format", "plain"])
            .args([
                "--operator-namespace",
                &opts.operator_namespace,
                "--health-bind-address",
                opts.health_addr.as_deref().unwrap_or("0"),
            ])
            .arg("--journal-dir")
            .arg(dir.join("journal"))
            .stdout(Stdio::from(file.try_clone().expect("log handle")))
            .stderr(Stdio::from(file));
        if let Some(addr) = &opts.metrics_addr {
            cmd.arg(format!("--metrics-bind-address={addr}"));
        }
        if let Some(fp) = &opts.fault_point {
            cmd.arg(format!("--fault-point={fp}"));
        }
        if !opts.without_network_policy_attestation {
            cmd.arg("--network-policy-enforced");
        }
        cmd.args(&opts.extra_args);
        remember_log(&log);
        OperatorProcess {
            child: cmd.spawn().expect("operator starts"),
            log,
        }
    }

    /// Waits for the process to exit (e.g. at a failpoint) and returns its exit code.
    pub async fn exited(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait on the operator") {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "operator did not exit; log: {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit code (a graceful stop).
    pub async fn terminate(&mut self, within: Duration) -> i32 {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
        self.exited(within).await
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Whether the process is stopped (state `T` in /proc/PID/stat).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            })
            .is_some_and(|state| state == "T")
    }

    /// Where the log is.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `<binary> journal verify NS/NAME` against the cluster of `kubeconfig` (and the local
/// mirror under `mirror` too, `--source both`, when given) and fails the test with its output
/// unless the chain verifies.
pub fn verify_journal(
    binary: &Path,
    kubeconfig: &Path,
    ns: &str,
    name: &str,
    mirror: Option<&Path>,
) {
    let mut cmd = Command::new(binary);
    cmd.env("KUBECONFIG", kubeconfig)
        .args(["journal", "verify", &format!("{ns}/{name}")]);
    if let Some(dir) = mirror {
        cmd.args(["--source", "both", "--journal-dir"]).arg(dir);
    }
    let out = cmd.output().expect("journal verify runs");
    assert!(
        out.status.success(),
        "journal verify {ns}/{name} (mirror {mirror:?}): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
