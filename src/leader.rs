//! Leader election on a `coordination.k8s.io/v1` Lease (docs/design.md "Leader Lease"):
//! duration 15 s, renew every 5 s, retry 2 s; a write needs 5 s of it left. Only the holder
//! reconciles. Every acquisition and renewal is a compare-and-swap on the Lease's
//! resourceVersion, so two replicas never both hold it; a holder that cannot renew in time
//! stops issuing and exits non-zero.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;

/// Default Lease name (`--lease-name`).
pub const DEFAULT_LEASE_NAME: &str = "celld-operator";
const DURATION: Duration = Duration::from_secs(15);
const RENEW: Duration = Duration::from_secs(5);
const RETRY: Duration = Duration::from_secs(2);
/// What must be left of the Lease, in this process's conservative view, for it to issue a
/// write: more than any write may take ([`crate::transport::WRITE_TIMEOUT`]), so a write
/// that passed the check lands or is given up before a standby may take over.
pub const MARGIN: Duration = Duration::from_secs(5);

/// Shared view of the leadership of this process.
#[derive(Clone, Default)]
pub struct Leadership {
    leading: Arc<AtomicBool>,
    transitions: Arc<AtomicI64>,
    renewed_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Leadership {
    /// Whether this process holds the Lease with at least [`MARGIN`] left (checked before
    /// each effect and, by the transport, before each write is sent). The view is
    /// conservative: the Lease is counted from the instant its renewal was *sent*, not
    /// answered, so a renewal that took 10 s does not extend it by 10 s.
    pub fn holds(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
            && self
                .renewed_at
                .lock()
                .map(|t| t.is_some_and(|t| t.elapsed() + MARGIN < DURATION))
                .unwrap_or(false)
    }

    /// Tests: as if the Lease was renewed (sent) at `at`.
    #[cfg(test)]
    pub(crate) fn set_held_for_test(&self, at: Instant) {
        self.leading.store(true, Ordering::SeqCst);
        *self.renewed_at.lock().expect("lock") = Some(at);
    }
    /// `leaseTransitions` at acquisition (stamped into journal entries).
    pub fn transitions(&self) -> i64 {
        self.transitions.load(Ordering::SeqCst)
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Acquires and renews the Lease until the process ends; returns only on a lost lease.
pub async fn run(
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    state: Leadership,
) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    // The Lease as last written by us: a renewal is one compare-and-swap PUT on it, and only
    // a conflict (someone else wrote it) costs a fresh GET.
    let mut last: Option<Lease> = None;
    loop {
        // Taken before the request leaves: the Lease the API server records runs from the
        // renewTime we send (stamped after this instant), so our view never outlasts it.
        let sent_at = Instant::now();
        let acquired = try_acquire_or_renew(&api, &name, &identity, &state, &mut last).await;
        match acquired {
            Ok(true) => {
                if !state.leading.swap(true, Ordering::SeqCst) {
                    tracing::info!(
                        identity,
                        transitions = state.transitions(),
                        "acquired the leader Lease"
                    );
                }
                *state.renewed_at.lock().expect("lock") = Some(sent_at);
                tokio::time::sleep(RENEW).await;
            }
            Ok(false) => {
                if state.leading.load(Ordering::SeqCst) {
                    anyhow::bail!("lost the leader Lease to another replica");
                }
                tokio::time::sleep(RETRY).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "leader Lease renewal failed");
                if state.leading.load(Ordering::SeqCst) && !state.holds() {
                    anyhow::bail!("could not renew the leader Lease in time: {e}");
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    state: &Leadership,
    last: &mut Option<Lease>,
) -> Result<bool, kube::Error> {
    if let Some(mut lease) = last.take() {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() == Some(identity) {
            spec.renew_time = Some(now_micro());
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(written) => {
                    *last = Some(written);
                    return Ok(true);
                }
                // Written by someone else since: decide from a fresh read below.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    let Some(mut lease) = api.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: Some(DURATION.as_secs() as i32),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(written) => {
                state.transitions.store(0, Ordering::SeqCst);
                *last = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let ours = spec.holder_identity.as_deref() == Some(identity);
    let expired = spec.renew_time.as_ref().is_none_or(|t| {
        let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        Timestamp::now().duration_since(t.0) > SignedDuration::from_secs(secs)
    });
    if !ours && !expired {
        return Ok(false);
    }
    if !ours {
        spec.holder_identity = Some(identity.into());
        spec.acquire_time = Some(now_micro());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now_micro());
    spec.lease_duration_seconds = Some(DURATION.as_secs() as i32);
    let transitions = i64::from(spec.lease_transitions.unwrap_or(0));
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(written) => {
            state.transitions.store(transitions, Ordering::SeqCst);
            *last = Some(written);
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up on a graceful shutdown: when this identity still holds
/// it, the holder is cleared and the duration set to 1 s, as a compare-and-swap on the read
/// resourceVersion, so a standby takes over at its next retry instead of after 15 s.
pub async fn release(
    client: Client,
    namespace: &str,
    name: &str,
    identity: &str,
) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let Some(mut lease) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    api.replace(name, &PostParams::default(), &lease).await?;
    Ok(true)
}
