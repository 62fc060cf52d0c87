//! Pods bound to this kubelet's Nodes: one watch on bound Pods (`spec.nodeName!=`, filtered to
//! our Nodes), one worker per Pod incarnation (UID).

pub mod env;
pub mod probe;
pub mod process;
pub mod status;
pub mod volumes;
pub mod worker;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::{mpsc, watch};

use crate::shared::Shared;
use worker::{PodView, WorkerHandle};

/// Watches Pods and runs their workers until shutdown. `synced` turns true after the first list.
pub async fn run(shared: Arc<Shared>, synced: watch::Sender<bool>) {
    let api = Api::<Pod>::all(shared.client.clone());
    let config = watcher::Config::default().fields("spec.nodeName!=");
    let mut stream = watcher(api, config).default_backoff().boxed();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut listing: Option<HashSet<String>> = None;
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                if *shutdown.borrow() { break; }
            }
            Some(uid) = done_rx.recv() => {
                workers.remove(&uid);
                finished.insert(uid);
            }
            event = stream.next() => {
                let Some(event) = event else { break };
                match event {
                    Err(e) => tracing::warn!(error = %e, "pod watch error (retrying)"),
                    Ok(watcher::Event::Init) => listing = Some(HashSet::new()),
                    Ok(watcher::Event::InitApply(pod)) => {
                        if let (Some(seen), Some(uid)) = (listing.as_mut(), pod.metadata.uid.clone()) {
                            seen.insert(uid);
                        }
                        apply(&shared, &mut workers, &finished, &done_tx, pod);
                    }
                    Ok(watcher::Event::Apply(pod)) => apply(&shared, &mut workers, &finished, &done_tx, pod),
                    Ok(watcher::Event::Delete(pod)) => {
                        if let Some(w) = pod.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                            w.tx.send_replace(PodView::Gone);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(seen) = listing.take() {
                            for (uid, w) in &workers {
                                if !seen.contains(uid) {
                                    w.tx.send_replace(PodView::Gone);
                                }
                            }
                            // UIDs absent from a full list never come back.
                            finished.retain(|u| seen.contains(u));
                        }
                        synced.send_replace(true);
                    }
                }
            }
        }
    }
    // Shutdown: wait (bounded) for the workers to stop their processes.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !workers.is_empty() {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(uid)) => {
                workers.remove(&uid);
            }
            _ => break,
        }
    }
}

fn apply(
    shared: &Arc<Shared>,
    workers: &mut HashMap<String, WorkerHandle>,
    finished: &HashSet<String>,
    done_tx: &mpsc::UnboundedSender<String>,
    pod: Pod,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if !node.is_some_and(|n| shared.owns_node(n)) || finished.contains(&uid) {
        return;
    }
    match workers.get(&uid) {
        Some(w) => {
            w.tx.send_replace(PodView::Present(Arc::new(pod)));
        }
        None => {
            let handle = worker::spawn(shared.clone(), pod, done_tx.clone());
            workers.insert(uid, handle);
        }
    }
}
