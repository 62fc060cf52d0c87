//! The S3 lease `nodes/<node>.json` and self-fencing (docs/runtime.md "Process, health and
//! self-fencing").
//!
//! Created with `If-None-Match: *`; a restart under the same node takes it over by
//! compare-and-swap; renewed every `CELLD_TTL_MS / 3` by compare-and-swap. Every write of the
//! record is a renewal. A lost compare-and-swap or an expiry that passes without a confirmed
//! renewal ends the process with a `SELF-FENCE:` line and exit code 3.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::Mutex;

use crate::model::{lease_key, now_ms, LeaseRecord, SessionRef};
use crate::store::{Cond, Store, StoreError};

pub const EXIT_SELF_FENCE: i32 = 3;

/// Why a node fenced itself; the names are the runtime's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceCause {
    /// Renewal did not succeed before the published expiry.
    Watchdog,
    /// The record is gone.
    RecordMissing,
    /// The record was replaced (another process took the node over).
    RecordMismatch,
}

impl FenceCause {
    pub fn as_str(self) -> &'static str {
        match self {
            FenceCause::Watchdog => "node_lease_watchdog_fence",
            FenceCause::RecordMissing => "node_lease_record_missing_fence",
            FenceCause::RecordMismatch => "node_lease_record_mismatch_fence",
        }
    }
}

#[derive(Debug, Error)]
pub enum LeaseError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("lease lost: {}", .0.as_str())]
    Fenced(FenceCause),
}

pub struct Lease {
    store: Arc<Store>,
    key: String,
    node: String,
    generation: String,
    ttl: Duration,
    state: Mutex<(LeaseRecord, String)>,
    written: std::sync::Mutex<LeaseRecord>,
    confirmed_expires_ms: AtomicU64,
    /// After a drained exit began the lease is given up on purpose: no fencing any more.
    released: AtomicBool,
}

impl Lease {
    /// Creates the record, or takes it over from a predecessor of the same node by
    /// compare-and-swap. The predecessor's sessions become `log.pending` of the new record, so
    /// they stay known until recovered even if this process dies too. Returns the predecessor's
    /// record.
    pub async fn acquire(
        store: Arc<Store>,
        template: LeaseRecord,
        ttl: Duration,
        deadline: std::time::Instant,
    ) -> Result<(Lease, Option<LeaseRecord>), StoreError> {
        let key = lease_key(&template.node);
        loop {
            let attempt = async {
                let current = store.get_json::<LeaseRecord>(&key).await?;
                let mut rec = template.clone();
                rec.expires_ms = now_ms() + ttl.as_millis() as u64;
                rec.renewed_ms = now_ms();
                let (cond, prev) = match current {
                    None => (Cond::Absent, None),
                    Some((prev, etag)) => {
                        let mut pending: Vec<SessionRef> = Vec::new();
                        for s in prev.sessions() {
                            if !pending.iter().any(|p| p.session == s.session) {
                                pending.push(s);
                            }
                        }
                        rec.log.pending = pending;
                        rec.ownership_index_generation = prev.ownership_index_generation + 1;
                        (Cond::Matches(etag), Some(prev))
                    }
                };
                let etag = store.put_checked(&key, &rec, cond).await?;
                Ok::<_, StoreError>((rec, etag, prev))
            };
            match attempt.await {
                Ok((rec, etag, prev)) => {
                    let lease = Lease {
                        store,
                        key,
                        node: rec.node.clone(),
                        generation: rec.generation.clone(),
                        ttl,
                        confirmed_expires_ms: AtomicU64::new(rec.expires_ms),
                        written: std::sync::Mutex::new(rec.clone()),
                        state: Mutex::new((rec, etag)),
                        released: AtomicBool::new(false),
                    };
                    return Ok((lease, prev));
                }
                // A predecessor renewed between our read and our write: read again; our next
                // compare-and-swap wins and fences it.
                Err(StoreError::PreconditionFailed) => continue,
                Err(e) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "lease: store not reachable yet, retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    /// The last record this process wrote successfully.
    pub fn record(&self) -> LeaseRecord {
        self.written.lock().expect("lease snapshot").clone()
    }

    pub fn confirmed_expires_ms(&self) -> u64 {
        self.confirmed_expires_ms.load(Ordering::SeqCst)
    }

    /// May this node acknowledge a write now? Only while its lease is confirmed for a while yet:
    /// nobody takes over its cells before the published expiry.
    pub fn valid_for_ack(&self) -> bool {
        now_ms() + 200 < self.confirmed_expires_ms()
    }

    /// Changes the record by compare-and-swap (also renewing it).
    pub async fn update(&self, change: impl FnOnce(&mut LeaseRecord)) -> Result<(), LeaseError> {
        let mut guard = self.state.lock().await;
        let mut rec = guard.0.clone();
        change(&mut rec);
        for _ in 0..3 {
            rec.renewed_ms = now_ms();
            rec.expires_ms = rec.renewed_ms + self.ttl.as_millis() as u64;
            match self
                .store
                .put_checked(&self.key, &rec, Cond::Matches(guard.1.clone()))
                .await
            {
                Ok(etag) => {
                    self.confirmed_expires_ms
                        .fetch_max(rec.expires_ms, Ordering::SeqCst);
                    *self.written.lock().expect("lease snapshot") = rec.clone();
                    *guard = (rec, etag);
                    return Ok(());
                }
                Err(StoreError::PreconditionFailed) => {
                    match self.store.get_json::<LeaseRecord>(&self.key).await? {
                        None => return Err(LeaseError::Fenced(FenceCause::RecordMissing)),
                        Some((cur, _)) if cur.generation != self.generation => {
                            return Err(LeaseError::Fenced(FenceCause::RecordMismatch))
                        }
                        // Our own earlier write landed though its answer was lost: adopt its
                        // ETag and write the intended record again.
                        Some((_, etag)) => guard.1 = etag,
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(LeaseError::Store(StoreError::PreconditionFailed))
    }

    /// Gives the lease up on a drained exit: expiry now, `stopped`, and no more fencing.
    pub async fn release(&self) -> Result<(), LeaseError> {
        self.released.store(true, Ordering::SeqCst);
        let mut guard = self.state.lock().await;
        let mut rec = guard.0.clone();
        rec.stopped = true;
        rec.expires_ms = now_ms();
        let etag = self
            .store
            .put_json(&self.key, &rec, Cond::Matches(guard.1.clone()))
            .await?;
        *self.written.lock().expect("lease snapshot") = rec.clone();
        *guard = (rec, etag);
        Ok(())
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Ends the process: the runtime's self-fence. Leaves the store untouched.
    pub fn fence(&self, cause: FenceCause, detail: &str) -> ! {
        let line = format!(
            "SELF-FENCE: {}: node={} generation={} {detail}",
            cause.as_str(),
            self.node,
            self.generation
        );
        // On stderr with every other log line, as one whole line.
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        let _ = err.flush();
        std::process::exit(EXIT_SELF_FENCE);
    }

    /// Renews every TTL/3 (faster after a failure) and fences on a lost record.
    pub async fn renew_loop(self: Arc<Self>) {
        let period = self.ttl / 3;
        let mut wait = period;
        loop {
            tokio::time::sleep(wait).await;
            if self.is_released() {
                return;
            }
            match self.update(|_| {}).await {
                Ok(()) => wait = period,
                Err(LeaseError::Fenced(cause)) => {
                    if self.is_released() {
                        return;
                    }
                    self.fence(cause, "renewal compare-and-swap lost")
                }
                Err(LeaseError::Store(e)) => {
                    tracing::warn!(error = %e, expires_ms = self.confirmed_expires_ms(), "lease renewal failed; retrying until expiry");
                    wait = Duration::from_millis(200).min(period);
                }
            }
        }
    }

    /// Fences once the confirmed expiry passes, even if a renewal call hangs.
    pub async fn watchdog_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if self.is_released() {
                return;
            }
            let expires = self.confirmed_expires_ms();
            if now_ms() >= expires {
                self.fence(
                    FenceCause::Watchdog,
                    &format!("lease expired at {expires} without a confirmed renewal"),
                );
            }
        }
    }
}
