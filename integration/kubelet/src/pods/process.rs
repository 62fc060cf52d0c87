//! Container processes: each runs in its own process group, with a cleared environment, its
//! output appended to a log file, and `PR_SET_PDEATHSIG` so it dies with the kubelet.
//!
//! Every started process group is recorded under `<work-dir>/run/pgids/<pgid>` (with the process
//! start time from `/proc`), so a kubelet that was killed hard leaves nothing running: the next
//! kubelet on the same work dir kills the recorded groups at startup ([`kill_recorded_groups`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// What to run for one container start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Program path (or a name looked up on `PATH`).
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Log file (stdout and stderr, appended).
    pub log: PathBuf,
}

/// A running container process (the leader of its own process group).
#[derive(Debug)]
pub struct Running {
    /// The child handle (waited on by the container's exit watcher).
    pub child: Child,
    /// Pid = process group id.
    pub pgid: i32,
}

fn record_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("run/pgids")
}

/// The start time of a process (field 22 of `/proc/<pid>/stat`), to tell a recycled pid apart.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.split_whitespace().nth(19).map(str::to_string)
}

/// Starts a container process.
pub fn spawn(work_dir: &Path, launch: &Launch) -> std::io::Result<Running> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&launch.log)?;
    writeln!(
        log,
        "=== celld-test-kubelet: starting {} {:?} at {} ===",
        launch.program.display(),
        launch.args,
        k8s_openapi::jiff::Timestamp::now()
    )?;
    let err_log = log.try_clone()?;
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err_log))
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let dir = record_dir(work_dir);
    if std::fs::create_dir_all(&dir).is_ok() {
        if let Some(start) = start_time(pgid) {
            let _ = std::fs::write(dir.join(pgid.to_string()), start);
        }
    }
    Ok(Running { child, pgid })
}

/// Sends `signal` to a whole process group (no-op for pgid ≤ 1).
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid addresses the process group.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// After a container's leader exited: kills what is left of its group (as a container runtime
/// tears down the whole container) and forgets the record.
pub fn reap_group(work_dir: &Path, pgid: i32) {
    signal_group(pgid, libc::SIGKILL);
    let _ = std::fs::remove_file(record_dir(work_dir).join(pgid.to_string()));
}

/// Kills the process groups a previous kubelet on this work dir left running.
pub fn kill_recorded_groups(work_dir: &Path) -> usize {
    let dir = record_dir(work_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let recorded = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Ok(pgid) = name.parse::<i32>() {
            if start_time(pgid).is_some_and(|t| t == recorded.trim()) {
                signal_group(pgid, libc::SIGKILL);
                killed += 1;
            }
        }
        let _ = std::fs::remove_file(entry.path());
    }
    killed
}

/// The container exit code as Kubernetes reports it: the code, or 128 + signal.
pub fn exit_code(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}
