//! Reconcile slots (docs/design.md "Reconcile slots"): at most `--reconcile-concurrency`
//! reconciles send requests to the API server at the same time, and the ones waiting for a
//! slot are served decisive work first.
//!
//! - **Taken at the first request.** A reconcile runs without a slot until it sends its first
//!   request (the transport calls [`enter`] before each request; the reconcile is marked with
//!   [`scope`]). A reconcile that decides everything from the caches and sends nothing, the
//!   common case, never waits and never holds one. Once taken, the slot is held until the
//!   reconcile ends, whatever else it sends.
//! - **Two classes.** A reconcile whose first request is a fleet status write
//!   ([`Class::Status`]: display only, decisions never read it) waits behind a reconcile whose
//!   first request is anything else ([`Class::Decisive`]: a journal append, a guarded read or
//!   write, a fresh pass's reads). In a burst, a member that turned ready is reacted to before
//!   the status writes of fleets that only report progress.
//! - **No starvation.** While both classes wait, every fourth slot handed on goes to the
//!   oldest status waiter ([`DECISIVE_RUN`]).
//!
//! Before this, kube-runtime's controller held one of 8 slots for every reconcile from its
//! start, first come first served (`--test-fifo-slots` keeps that for the bench).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// What a reconcile waits for a slot to do: its first request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Anything but a status write: a journal append, a guarded read or write, reads.
    Decisive,
    /// A write of the fleet's status subresource.
    Status,
}

impl Class {
    /// The class of a request the audit log would name `verb resource`.
    pub fn of(info: &crate::transport::RequestInfo) -> Class {
        if info.is_write() && info.resource == "celldfleets/status" {
            Class::Status
        } else {
            Class::Decisive
        }
    }

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Class::Decisive => "decisive",
            Class::Status => "status",
        }
    }
}

/// Decisive waiters served in a row while a status waiter waits, before it gets one.
pub const DECISIVE_RUN: u32 = 3;

/// The slots and their two queues of waiters.
#[derive(Debug)]
pub struct Slots {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    decisive: VecDeque<oneshot::Sender<Slot>>,
    status: VecDeque<oneshot::Sender<Slot>>,
    /// Decisive waiters served in a row while status waiters waited.
    run: u32,
}

impl State {
    fn next_waiter(&mut self) -> Option<oneshot::Sender<Slot>> {
        let status_first =
            !self.status.is_empty() && (self.decisive.is_empty() || self.run >= DECISIVE_RUN);
        if status_first {
            self.run = 0;
            return self.status.pop_front();
        }
        let next = self.decisive.pop_front()?;
        if !self.status.is_empty() {
            self.run += 1;
        }
        Some(next)
    }
}

/// A held slot; dropping it hands it to the next waiter (or frees it).
#[derive(Debug)]
pub struct Slot {
    slots: Option<Arc<Slots>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl Slots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                free: n.max(1),
                decisive: VecDeque::new(),
                status: VecDeque::new(),
                run: 0,
            }),
        })
    }

    /// Waits for a slot, served by `class` (module docs).
    pub async fn acquire(self: &Arc<Self>, class: Class) -> Slot {
        let rx = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.free > 0 {
                st.free -= 1;
                return Slot {
                    slots: Some(self.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            match class {
                Class::Decisive => st.decisive.push_back(tx),
                Class::Status => st.status.push_back(tx),
            }
            rx
        };
        // The sender is only dropped unsent by `release`, which sends on it instead; a
        // dropped `Slots` (not while a reconcile runs) leaves the caller without a bound.
        rx.await.unwrap_or(Slot { slots: None })
    }

    /// Hands a released slot to the next waiter still waiting, or frees it.
    fn release(self: &Arc<Self>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(tx) = st.next_waiter() {
            match tx.send(Slot {
                slots: Some(self.clone()),
            }) {
                Ok(()) => return,
                // That waiter is gone: its copy must not hand the slot on again.
                Err(mut unsent) => unsent.slots = None,
            }
        }
        st.free += 1;
    }

    /// Waiters by class (decisive, status).
    pub fn waiting(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.decisive.len(), st.status.len())
    }
}

/// What one reconcile holds: its slot once its first request took it.
pub struct Holder {
    slots: Arc<Slots>,
    slot: tokio::sync::OnceCell<Slot>,
    on_wait: Box<dyn Fn(Class, Duration) + Send + Sync>,
}

tokio::task_local! {
    static HELD: Arc<Holder>;
}

/// Runs reconcile `fut` taking a slot of `slots` at its first request (`None`: no bound here,
/// kube-runtime's own concurrency bounds the reconciles). `on_wait` is told how long the
/// first request waited, and in which class.
pub async fn scope<F: std::future::Future>(
    slots: Option<Arc<Slots>>,
    on_wait: impl Fn(Class, Duration) + Send + Sync + 'static,
    fut: F,
) -> F::Output {
    match slots {
        None => fut.await,
        Some(slots) => {
            let holder = Arc::new(Holder {
                slots,
                slot: tokio::sync::OnceCell::new(),
                on_wait: Box::new(on_wait),
            });
            HELD.scope(holder, fut).await
        }
    }
}

/// Called before each request: inside a reconcile's [`scope`] without a slot yet, waits for
/// one in the request's class. Elsewhere (watches, the Lease) returns at once.
pub async fn enter(info: &crate::transport::RequestInfo) {
    let Ok(holder) = HELD.try_with(Arc::clone) else {
        return;
    };
    if holder.slot.initialized() {
        return;
    }
    holder
        .slot
        .get_or_init(|| async {
            let class = Class::of(info);
            let started = Instant::now();
            let slot = holder.slots.acquire(class).await;
            (holder.on_wait)(class, started.elapsed());
            slot
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::RequestInfo;

    fn get() -> RequestInfo {
        RequestInfo::of("GET", "/apis/apps/v1/namespaces/ns/statefulsets/f", None)
    }
    fn status() -> RequestInfo {
        RequestInfo::of(
            "PATCH",
            "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
            None,
        )
    }

    #[test]
    fn only_a_fleet_status_write_is_the_status_class() {
        assert_eq!(Class::of(&status()), Class::Status);
        assert_eq!(Class::of(&get()), Class::Decisive);
        let append = RequestInfo::of(
            "PATCH",
            "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
            None,
        );
        assert_eq!(Class::of(&append), Class::Decisive);
        let read_status = RequestInfo::of(
            "GET",
            "/apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status",
            None,
        );
        assert_eq!(Class::of(&read_status), Class::Decisive);
    }

    /// Queues `class` waiters in order; returns the order in which they got the one slot.
    async fn served(classes: &[Class]) -> Vec<usize> {
        let slots = Slots::new(1);
        let first = slots.acquire(Class::Decisive).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, class) in classes.iter().copied().enumerate() {
            let waiter = slots.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let slot = waiter.acquire(class).await;
                order.lock().unwrap().push(i);
                drop(slot);
            }));
            // Each waiter is queued before the next one starts.
            while {
                let (d, s) = slots.waiting();
                d + s < i + 1
            } {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(slots.waiting(), (0, 0));
        order
    }

    #[tokio::test]
    async fn decisive_waiters_go_first_and_status_waiters_are_not_starved() {
        use Class::*;
        // Status waiters queued first still come after decisive ones...
        assert_eq!(served(&[Status, Decisive, Decisive]).await, vec![1, 2, 0]);
        // ... but at most DECISIVE_RUN decisive ones in a row pass a waiting status one.
        assert_eq!(
            served(&[Status, Status, Decisive, Decisive, Decisive, Decisive, Decisive]).await,
            vec![2, 3, 4, 0, 5, 6, 1]
        );
        // Within a class, first come first served.
        assert_eq!(served(&[Status, Status, Status]).await, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_does_not_lose_the_slot() {
        let slots = Slots::new(1);
        let held = slots.acquire(Class::Decisive).await;
        // A waiter that is dropped before its slot comes.
        let gone = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(Class::Decisive).await }
        });
        while slots.waiting() != (1, 0) {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        // The slot is free again: taken at once, and a second one must wait.
        let again = tokio::time::timeout(Duration::from_secs(5), slots.acquire(Class::Status))
            .await
            .expect("the slot was handed back");
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(Class::Decisive).await }
        });
        while slots.waiting() != (1, 0) {
            tokio::task::yield_now().await;
        }
        drop(again);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("handed on")
            .unwrap();
        assert_eq!(slots.waiting(), (0, 0));
    }

    #[tokio::test]
    async fn a_reconcile_takes_one_slot_at_its_first_request_and_keeps_it() {
        let slots = Slots::new(1);
        let waits = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let waits = waits.clone();
            move |class: Class, _: Duration| waits.lock().unwrap().push(class)
        };
        // Outside a reconcile: never waits, even with no slot free.
        let other = slots.acquire(Class::Decisive).await;
        tokio::time::timeout(Duration::from_secs(5), enter(&get()))
            .await
            .expect("not bounded");
        drop(other);
        scope(Some(slots.clone()), record.clone(), async {
            // No request yet: no slot taken.
            assert_eq!(slots.waiting(), (0, 0));
            let free =
                tokio::time::timeout(Duration::from_millis(50), slots.acquire(Class::Status))
                    .await
                    .expect("free before the first request");
            drop(free);
            enter(&status()).await;
            enter(&get()).await;
            enter(&get()).await;
            // Held: another reconcile's request waits.
            let other =
                tokio::time::timeout(Duration::from_millis(50), slots.acquire(Class::Decisive))
                    .await;
            assert!(other.is_err(), "the reconcile holds the only slot");
        })
        .await;
        assert_eq!(
            *waits.lock().unwrap(),
            vec![Class::Status],
            "one wait, in the first request's class"
        );
        // Released when the reconcile ended.
        tokio::time::timeout(Duration::from_secs(5), slots.acquire(Class::Decisive))
            .await
            .expect("released at the end");
    }
}
