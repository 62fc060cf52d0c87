//! The object store: s3s-fs on `127.0.0.1:<free port>` (installed by
//! `integration/store/install-s3s.sh`), owned by a thread that never ends so that
//! `PR_SET_PDEATHSIG` kills it with the test process, plus helpers that read the store's backing
//! folder directly (what "the store holds it" means for assertions).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The test store's fixed access key (docs/runtime.md "The member environment").
pub const ACCESS_KEY: &str = "celld-test";
/// The test store's fixed secret key.
pub const SECRET_KEY: &str = "celld-test-secret";

/// A running s3s-fs.
#[derive(Debug)]
pub struct StoreServer {
    /// Root folder: one sub-folder per bucket, objects at `<root>/<bucket>/<key>`.
    pub root: PathBuf,
    /// Where s3s-fs listens (members reach it through the fault proxy).
    pub addr: SocketAddr,
    /// Its process id.
    pub pid: u32,
    /// Its stdout + stderr.
    pub log: PathBuf,
    /// The binary.
    pub binary: PathBuf,
    process: crate::proc::Owned,
}

/// Installs s3s-fs (once per machine, minutes on 2 cores) and returns its path.
/// `CELLD_S3S_FS_BIN` overrides. Fails when it cannot be installed.
pub fn install(repo: &Path) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("CELLD_S3S_FS_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let script = repo.join("integration/store/install-s3s.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed with {}: s3s-fs could not be installed (see its output above)",
            script.display(),
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .with_context(|| format!("{} printed no path", script.display()))?;
    let path = PathBuf::from(path);
    if !path.is_file() {
        bail!(
            "{} named {} but it is missing",
            script.display(),
            path.display()
        );
    }
    Ok(path)
}

/// A port free now and not handed out before in this process: the port is released before
/// s3s-fs binds it, so two test beds starting at the same moment could otherwise be given the
/// same one, and one bed's readiness probe be answered by the other's s3s-fs.
fn free_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
        let port = l.local_addr()?.port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.insert(port) {
            return Ok(port);
        }
    }
}

/// Starts s3s-fs over `root` (created) on 127.0.0.1:<free port> with the test keys and waits
/// until it accepts connections.
pub fn start(binary: &Path, root: &Path, log: &Path) -> Result<StoreServer> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let mut last_err = String::new();
    for _ in 0..3 {
        let port = free_port()?;
        let log_file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone()?))
            .stderr(Stdio::from(log_file));
        let owned = crate::proc::spawn_owned(cmd, "s3s-fs")?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if celld_store_proxy::listening::accepts(addr, Duration::from_millis(200)) {
                return Ok(StoreServer {
                    root: root.to_path_buf(),
                    addr,
                    pid: owned.pid,
                    log: log.to_path_buf(),
                    binary: binary.to_path_buf(),
                    process: owned,
                });
            }
            if let Some(status) = owned.exited() {
                last_err = format!("s3s-fs exited with {status} (log {})", log.display());
                break;
            }
            if Instant::now() > deadline {
                owned.kill();
                last_err = format!(
                    "s3s-fs did not listen on {addr} within 20 s (log {})",
                    log.display()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    bail!("{last_err}")
}

/// Checks an S3 bucket name the way the test bed uses them (3–63 of `[a-z0-9.-]`, starting and
/// ending with a letter or digit).
pub fn valid_bucket_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

impl StoreServer {
    /// Kills s3s-fs (test bed shutdown).
    pub(crate) fn kill(&self) {
        self.process.kill();
    }

    /// The folder of a bucket.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.root.join(bucket)
    }

    /// Every key under `prefix` in `bucket` (sorted), read from the backing folder. s3s-fs's
    /// in-flight temporary files are skipped.
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let base = self.bucket_dir(bucket);
        let mut out = Vec::new();
        let mut stack = vec![base.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".tmp.") {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&base) {
                    let key = rel.to_string_lossy().into_owned();
                    if key.starts_with(prefix) {
                        out.push(key);
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// One object's bytes, if the store holds it.
    pub fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.bucket_dir(bucket).join(key)).ok()
    }

    /// One object parsed as JSON.
    pub fn json(&self, bucket: &str, key: &str) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.object(bucket, key)?).ok()
    }
}
