//! Child processes that die with the test process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, and test threads end
//! after every test, so each child is spawned by a dedicated thread that lives exactly as long as
//! the child (it waits for it). When the test process exits, that thread goes with it and the
//! kernel sends SIGKILL. The test bed's atexit handler also kills them explicitly.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{Context, Result};

/// Set while the test bed shuts down: children exiting then are expected.
pub static STOPPING: AtomicBool = AtomicBool::new(false);

/// A child owned by its waiter thread.
#[derive(Debug, Clone)]
pub struct Owned {
    /// Process id.
    pub pid: u32,
    status: Arc<Mutex<Option<ExitStatus>>>,
}

impl Owned {
    /// The exit status once the child is gone.
    pub fn exited(&self) -> Option<ExitStatus> {
        *self.status.lock().expect("status lock")
    }

    /// SIGKILL (no-op once it exited).
    pub fn kill(&self) {
        if self.exited().is_none() {
            // SAFETY: plain kill(2) on our own child's pid; the waiter thread has not reaped it.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
        }
    }
}

/// Spawns `cmd` from a dedicated thread with `PR_SET_PDEATHSIG = SIGKILL`.
pub fn spawn_owned(mut cmd: Command, what: &str) -> Result<Owned> {
    // SAFETY: the pre-exec closure only calls the async-signal-safe prctl(2).
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    let status = Arc::new(Mutex::new(None));
    let status_w = status.clone();
    let name = what.to_string();
    std::thread::Builder::new()
        .name(format!("testbed-{what}"))
        .spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id()));
                if let Ok(s) = child.wait() {
                    *status_w.lock().expect("status lock") = Some(s);
                    if !STOPPING.load(Ordering::SeqCst) {
                        eprintln!("celld-testbed: {name} (pid {}) exited: {s}", child.id());
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        })
        .context("spawning a waiter thread")?;
    let pid = rx
        .recv()
        .context("waiter thread vanished")?
        .with_context(|| format!("starting {what}"))?;
    Ok(Owned { pid, status })
}
