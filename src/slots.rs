//! The reconcile slots (`--reconcile-concurrency`), served first come, first served
//! (docs/design.md "Reconcile slots").
//!
//! kube-runtime's controller bounds its reconciles itself, but once every slot is busy it
//! parks the reconciles that fall due in a hash set and starts them in the set's iteration
//! order, not in the order they fell due. Under a sustained burst a fleet whose key iterates
//! late waits while fleets triggered after it are served: the bench measured waits of 18–19 s
//! from a fleet's watch event to its reconcile with 8 slots, twice for the same fleets, while
//! a slot's reconcile took under 2 s (integration/bench/README.md).
//!
//! So the operator runs kube's controller without a bound and bounds the reconciles here, with
//! a fair semaphore: a reconcile waits for a slot in the order kube started it, i.e. the order
//! its trigger fell due. It waits before it decides anything, and once it has a slot it takes
//! the fleet's newest copy from the controller's store (the copy kube handed over may have
//! aged while it waited). A reconcile waiting for a slot counts as running for kube, so new
//! triggers of that fleet are held and run after it, as they are behind a running one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::compact_store::CompactFleet;

/// `--reconcile-concurrency` slots and the fleet stores of the controllers they serve.
#[derive(Debug)]
pub struct Slots {
    free: Semaphore,
    /// True once the process stops taking new reconciles.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Each controller's fleet store, by the namespace it watches (`None`: cluster-wide).
    stores: Mutex<HashMap<Option<String>, Store<CompactFleet>>>,
}

impl Slots {
    /// `n` slots (at least one); `stopping` turns true when no new reconcile may start.
    pub fn new(n: usize, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        Slots {
            free: Semaphore::new(n.max(1)),
            stopping,
            stores: Mutex::default(),
        }
    }

    /// No new reconcile may start (a signal, a lost Lease): one that got its slot ends.
    pub fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// The controller watching `scope` (`None`: cluster-wide) keeps its fleets in `store`.
    pub fn add_store(&self, scope: Option<String>, store: Store<CompactFleet>) {
        if let Ok(mut s) = self.stores.lock() {
            s.insert(scope, store);
        }
    }

    /// Waits for a slot, behind every reconcile that asked before; held until dropped.
    pub async fn take(&self) -> Option<SemaphorePermit<'_>> {
        // The semaphore is never closed: an error cannot happen, and would run unbounded.
        self.free.acquire().await.ok()
    }

    /// The newest copy of fleet `ns/name` in the store that holds it (`None`: gone from it).
    pub fn latest(&self, ns: &str, name: &str) -> Option<Arc<CompactFleet>> {
        let stores = self.stores.lock().ok()?;
        let store = stores
            .get(&Some(ns.to_string()))
            .or_else(|| stores.get(&None))?;
        store.get(&ObjectRef::new(name).within(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn slots_are_given_in_the_order_they_were_asked_for() {
        let (_stop, stopping) = tokio::sync::watch::channel(false);
        let slots = Arc::new(Slots::new(2, stopping));
        let held = (slots.take().await, slots.take().await);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for i in 0..6 {
            let (slots, order) = (slots.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _slot = slots.take().await;
                order.lock().unwrap().push(i);
                // Held a moment, so the next waiter is served by this one's release.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            // The test runtime has one thread: the waiter runs until it is queued for a
            // slot before the next one is spawned.
            tokio::task::yield_now().await;
        }
        assert!(order.lock().unwrap().is_empty(), "both slots are held");
        drop(held);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_newest_copy_is_taken_from_the_store_of_the_fleets_namespace() {
        let fleet = |ns: &str, name: &str, generation: i64| {
            let f: crate::api::CelldFleet = serde_json::from_value(serde_json::json!({
                "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
                "metadata": {"name": name, "namespace": ns, "generation": generation},
                "spec": {"profile": "Bucket", "runtimeImage": "img@sha256:1", "replicas": 1,
                         "serviceAccountName": "celld",
                         "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                         "storage": {"bucket": "b", "region": "us-east-1"}}
            }))
            .unwrap();
            CompactFleet::new(f).unwrap()
        };
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let slots = Slots::new(1, stopping);
        assert!(!slots.stopping());
        stop.send(true).unwrap();
        assert!(slots.stopping());
        assert!(slots.latest("ns", "f").is_none(), "no store");
        let (reader, mut writer) = kube::runtime::reflector::store::<CompactFleet>();
        slots.add_store(Some("ns".into()), reader);
        let (all, mut all_writer) = kube::runtime::reflector::store::<CompactFleet>();
        slots.add_store(None, all);
        assert!(slots.latest("ns", "f").is_none(), "not in the store");
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fleet("ns", "f", 1)));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fleet("ns", "f", 2)));
        let got = slots.latest("ns", "f").expect("in its namespace's store");
        assert_eq!(got.fleet().and_then(|f| f.metadata.generation), Some(2));
        // A namespace without a store of its own: the cluster-wide one.
        all_writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fleet("x", "g", 3)));
        assert!(slots.latest("x", "g").is_some());
        assert!(slots.latest("x", "f").is_none());
    }
}
