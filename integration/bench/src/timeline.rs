//! What the bench sees of one fleet, timestamped on arrival with the bench's monotonic clock:
//! watches on the fleet, its workload (StatefulSet or Deployment) and its Pods fold into one
//! view, and every change of interest becomes a [`Mark`] on the timeline.
//!
//! "Settled" is the operator's "rolled out" (docs/design.md "Terms") seen from outside: the
//! workload's `status.observedGeneration ≥ metadata.generation`, `status.replicas ==
//! updatedReplicas == readyReplicas == spec.replicas` (and for a StatefulSet `currentRevision ==
//! updateRevision`), and exactly `spec.replicas` fleet Pods exist, none terminating, all Ready.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use celld_operator::api::keys::FLEET_UID_LABEL;
use celld_operator::api::CelldFleet;
use celld_operator::reconcile::workload::LiveWorkload;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::task::JoinHandle;

/// A change seen through the watches.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// The fleet's `spec.replicas` is first seen, or changed.
    FleetReplicas(i32),
    /// The workload appeared with `spec.replicas`.
    WorkloadCreated(i32),
    /// The workload's `spec.replicas` changed.
    WorkloadReplicas { from: i32, to: i32 },
    /// The workload became settled at this many replicas.
    Settled(i32),
}

/// A mark and when the bench saw it.
#[derive(Debug, Clone)]
pub struct Stamped {
    /// Arrival time of the watch event that caused it.
    pub at: Instant,
    /// What changed.
    pub mark: Mark,
}

/// Observations from the watch tasks.
enum Obs {
    Fleet(Option<i32>),
    StatefulSet(Option<StatefulSet>),
    Deployment(Option<Deployment>),
    Pod {
        uid: String,
        state: Option<(bool, bool)>,
    },
    PodsRelisted(Vec<String>),
}

#[derive(Default)]
struct View {
    fleet_replicas: Option<i32>,
    /// `(spec.replicas, rolled out)`.
    workload: Option<(i32, bool)>,
    /// Pod UID → (terminating, ready).
    pods: HashMap<String, (bool, bool)>,
    settled: bool,
}

impl View {
    fn apply(&mut self, obs: Obs, at: Instant, out: &mut Vec<Stamped>) {
        let mut mark = |m| out.push(Stamped { at, mark: m });
        match obs {
            Obs::Fleet(r) => {
                if r.is_some() && r != self.fleet_replicas {
                    mark(Mark::FleetReplicas(r.unwrap_or(0)));
                }
                self.fleet_replicas = r;
            }
            // "Rolled out" is the operator's own definition (docs/design.md "Terms"): the bench
            // times when that predicate turns true, not an approximation of it.
            Obs::StatefulSet(s) => {
                let w = s.map(|s| LiveWorkload::StatefulSet(Box::new(s)));
                self.set_workload(w.map(|w| (w.replicas(), w.rolled_out())), &mut mark);
            }
            Obs::Deployment(d) => {
                let w = d.map(|d| LiveWorkload::Deployment(Box::new(d)));
                self.set_workload(w.map(|w| (w.replicas(), w.rolled_out())), &mut mark);
            }
            Obs::Pod { uid, state } => match state {
                Some(s) => {
                    self.pods.insert(uid, s);
                }
                None => {
                    self.pods.remove(&uid);
                }
            },
            Obs::PodsRelisted(live) => self.pods.retain(|uid, _| live.contains(uid)),
        }
        let settled = self.workload.is_some_and(|(replicas, rolled_out)| {
            rolled_out
                && self.pods.len() == replicas as usize
                && self
                    .pods
                    .values()
                    .all(|(terminating, ready)| !terminating && *ready)
        });
        if settled && !self.settled {
            mark(Mark::Settled(self.workload.map_or(0, |w| w.0)));
        }
        self.settled = settled;
    }

    fn set_workload(&mut self, w: Option<(i32, bool)>, mark: &mut impl FnMut(Mark)) {
        match (self.workload, w) {
            (None, Some((r, _))) => mark(Mark::WorkloadCreated(r)),
            (Some((from, _)), Some((to, _))) if from != to => {
                mark(Mark::WorkloadReplicas { from, to })
            }
            _ => {}
        }
        self.workload = w;
    }
}

fn pod_state(p: &Pod) -> (bool, bool) {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (p.metadata.deletion_timestamp.is_some(), ready)
}

/// The timeline of one fleet (the only fleet in its namespace).
pub struct Timeline {
    marks: Arc<Mutex<Vec<Stamped>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Timeline {
    /// Starts the watches in `ns` for fleet `name`.
    pub fn start(client: &Client, ns: &str, name: &str) -> Self {
        let (tx, mut rx) = unbounded_channel::<(Instant, Obs)>();
        let marks: Arc<Mutex<Vec<Stamped>>> = Arc::default();
        let mut tasks = Vec::new();
        let by_name = format!("metadata.name={name}");
        let labelled = watcher::Config::default().labels(FLEET_UID_LABEL);
        let named = watcher::Config::default().fields(&by_name);
        tasks.push(watch::<CelldFleet>(
            Api::namespaced(client.clone(), ns),
            named.clone(),
            tx.clone(),
            |f| Obs::Fleet(f.map(|f| f.spec.replicas)),
        ));
        tasks.push(watch::<StatefulSet>(
            Api::namespaced(client.clone(), ns),
            named.clone(),
            tx.clone(),
            Obs::StatefulSet,
        ));
        tasks.push(watch::<Deployment>(
            Api::namespaced(client.clone(), ns),
            named,
            tx.clone(),
            Obs::Deployment,
        ));
        tasks.push(watch_pods(
            Api::namespaced(client.clone(), ns),
            labelled,
            tx,
        ));
        let sink = marks.clone();
        tasks.push(tokio::spawn(async move {
            let mut view = View::default();
            while let Some((at, obs)) = rx.recv().await {
                let mut out = Vec::new();
                view.apply(obs, at, &mut out);
                if !out.is_empty() {
                    if let Ok(mut m) = sink.lock() {
                        m.extend(out);
                    }
                }
            }
        }));
        Timeline { marks, tasks }
    }

    /// Marks seen so far.
    pub fn marks(&self) -> Vec<Stamped> {
        self.marks.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Watches one named object; `Some(obj)` on apply, `None` on delete.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    tx: UnboundedSender<(Instant, Obs)>,
    to_obs: impl Fn(Option<K>) -> Obs + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let obs = match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) => to_obs(Some(o)),
                Ok(Event::Delete(_)) => to_obs(None),
                Ok(_) => continue,
                Err(e) => {
                    eprintln!("  (bench watch error, retrying: {e})");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            };
            if tx.send((at, obs)).is_err() {
                return;
            }
        }
    })
}

/// Watches the fleet's Pods; a relist drops Pods that vanished while the watch was down.
fn watch_pods(
    api: Api<Pod>,
    config: watcher::Config,
    tx: UnboundedSender<(Instant, Obs)>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).boxed();
        let mut listed: Vec<String> = Vec::new();
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let obs = match event {
                Ok(Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(Event::InitApply(p)) => {
                    listed.push(p.uid().unwrap_or_default());
                    Obs::Pod {
                        uid: p.uid().unwrap_or_default(),
                        state: Some(pod_state(&p)),
                    }
                }
                Ok(Event::InitDone) => Obs::PodsRelisted(std::mem::take(&mut listed)),
                Ok(Event::Apply(p)) => Obs::Pod {
                    uid: p.uid().unwrap_or_default(),
                    state: Some(pod_state(&p)),
                },
                Ok(Event::Delete(p)) => Obs::Pod {
                    uid: p.uid().unwrap_or_default(),
                    state: None,
                },
                Err(e) => {
                    eprintln!("  (bench Pod watch error, retrying: {e})");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            };
            if tx.send((at, obs)).is_err() {
                return;
            }
        }
    })
}

/// Latency samples (milliseconds) derived from a window of the timeline.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    /// Settled at `n` → the workload's `spec.replicas` changes `n → n-1` (the next member's
    /// removal), for every step of a contraction but the first.
    pub settled_to_next_removal: Vec<f64>,
    /// Steps whose settle was not seen before the next write (the operator was faster than
    /// the bench's view, or the view never settled): counted, not sampled.
    pub unobserved_settles: usize,
    /// The fleet's `spec.replicas` change seen → the workload's first change seen.
    pub fleet_to_workload: Vec<f64>,
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Fleet change → first workload replica write after it (growth, or the first step of a
/// contraction), within `marks`.
pub fn fleet_to_workload(marks: &[Stamped]) -> Option<f64> {
    let fleet = marks
        .iter()
        .find(|m| matches!(m.mark, Mark::FleetReplicas(_)))?;
    let write = marks.iter().find(|m| {
        m.at >= fleet.at
            && matches!(
                m.mark,
                Mark::WorkloadReplicas { .. } | Mark::WorkloadCreated(_)
            )
    })?;
    Some(ms(fleet.at, write.at))
}

/// The contraction samples in `marks` (one contraction's window).
pub fn contraction(marks: &[Stamped]) -> Latencies {
    let mut l = Latencies::default();
    if let Some(first) = fleet_to_workload(marks) {
        l.fleet_to_workload.push(first);
    }
    let writes: Vec<(Instant, i32, i32)> = marks
        .iter()
        .filter_map(|m| match m.mark {
            Mark::WorkloadReplicas { from, to } if to < from => Some((m.at, from, to)),
            _ => None,
        })
        .collect();
    for pair in writes.windows(2) {
        let ((prev_at, _, prev_to), (next_at, next_from, _)) = (pair[0], pair[1]);
        if next_from != prev_to {
            continue;
        }
        // The last time the workload became settled at the previous target before the next write.
        let settle = marks
            .iter()
            .rfind(|m| m.at >= prev_at && m.at <= next_at && m.mark == Mark::Settled(prev_to));
        match settle {
            Some(s) => l.settled_to_next_removal.push(ms(s.at, next_at)),
            None => l.unobserved_settles += 1,
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64, mark: Mark) -> Stamped {
        Stamped {
            at: base + Duration::from_millis(ms),
            mark,
        }
    }

    #[test]
    fn contraction_samples_run_from_the_last_settle_to_the_next_write() {
        let t = Instant::now();
        let marks = vec![
            at(t, 0, Mark::FleetReplicas(1)),
            at(t, 300, Mark::WorkloadReplicas { from: 4, to: 3 }),
            at(t, 900, Mark::Settled(3)),
            at(t, 1400, Mark::WorkloadReplicas { from: 3, to: 2 }),
            // settled never seen at 2 before the next write
            at(t, 2000, Mark::WorkloadReplicas { from: 2, to: 1 }),
            at(t, 2600, Mark::Settled(1)),
        ];
        let l = contraction(&marks);
        assert_eq!(l.fleet_to_workload, vec![300.0]);
        assert_eq!(l.settled_to_next_removal, vec![500.0]);
        assert_eq!(l.unobserved_settles, 1);
    }

    #[test]
    fn the_view_marks_a_settle_only_when_pods_and_rollout_agree() {
        let t = Instant::now();
        let mut v = View {
            workload: Some((2, true)),
            ..View::default()
        };
        let mut out = Vec::new();
        v.apply(
            Obs::Pod {
                uid: "a".into(),
                state: Some((false, true)),
            },
            t,
            &mut out,
        );
        assert!(out.is_empty(), "one Pod of two");
        v.apply(
            Obs::Pod {
                uid: "b".into(),
                state: Some((true, true)),
            },
            t,
            &mut out,
        );
        assert!(out.is_empty(), "a terminating Pod is not a settled member");
        v.apply(
            Obs::Pod {
                uid: "b".into(),
                state: Some((false, true)),
            },
            t,
            &mut out,
        );
        assert_eq!(out.last().map(|s| s.mark.clone()), Some(Mark::Settled(2)));
    }
}
