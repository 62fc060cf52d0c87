//! Failpoints (docs/design.md "Failpoints"): with `--local-test --fault-point=NAME[:N]`
//! the process exits with code 3 the N-th time it reaches NAME, so crash drills can kill
//! the manager exactly at a boundary between decision, journal and effect.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::cli::FaultPoint;

static ARMED: OnceLock<(FaultPoint, AtomicU32)> = OnceLock::new();

/// Arms one failpoint for the life of the process (called once at startup).
pub fn arm(point: FaultPoint) {
    let _ = ARMED.set((point, AtomicU32::new(0)));
}

/// Marks a boundary; exits with code 3 when it is the armed one and its count is reached.
/// A cached pass (`crate::pass`) never counts a failpoint: reaching one means the reconcile
/// is about to act, so the pass escalates and the fresh pass reaches it instead. Inside a
/// planning pass's open decision (`crate::pass::decision`, an operation it may carry out
/// itself) the failpoint counts as in a fresh pass.
pub fn reach(name: &str) {
    if let Some(esc) = crate::pass::cached() {
        if !esc.deciding() {
            esc.escalate(|| format!("failpoint {name}"));
            return;
        }
    }
    if let Some((point, count)) = ARMED.get() {
        if point.name == name && count.fetch_add(1, Ordering::SeqCst) + 1 == point.nth {
            if point.stop {
                tracing::error!(
                    failpoint = name,
                    nth = point.nth,
                    "failpoint reached: stopping (SIGSTOP) until continued"
                );
                eprintln!(
                    "celld-operator: failpoint {name}:{} reached, stopping until SIGCONT",
                    point.nth
                );
                // SAFETY: raise(2) with a valid signal number has no memory effects.
                unsafe {
                    libc::raise(libc::SIGSTOP);
                }
                tracing::warn!(failpoint = name, "continued after a stop at the failpoint");
                return;
            }
            tracing::error!(
                failpoint = name,
                nth = point.nth,
                "failpoint reached: exiting with code 3"
            );
            eprintln!(
                "celld-operator: failpoint {name}:{} reached, exiting with code 3",
                point.nth
            );
            std::process::exit(3);
        }
    }
}
