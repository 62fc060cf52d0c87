//! What the bench sees of one fleet, timestamped on arrival with the bench's monotonic clock:
//! watches on the fleet, its workload (StatefulSet or Deployment) and its Pods fold into one
//! view, and every change of interest becomes a [`Mark`] on the timeline.
//!
//! "Settled" is the operator's "rolled out" (docs/design.md "Terms") seen from outside: the
//! workload's `status.observedGeneration ≥ metadata.generation`, `status.replicas ==
//! updatedReplicas == readyReplicas == spec.replicas` (and for a StatefulSet `currentRevision ==
//! updateRevision`), and exactly `spec.replicas` fleet Pods exist, none terminating, all Ready.
//!
//! [`Timeline`] follows the only fleet of a namespace (figures 1 and 2); [`FleetTimelines`]
//! follows chosen fleets among many (the scale bed's reaction under load), with one watch per
//! kind and namespace, routed by the fleet UID label.

use std::collections::{HashMap, HashSet};
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
    /// The fleet's `spec.maintenance.restartToken` changed (not marked when first seen).
    FleetToken(String),
    /// The fleet's status turned settled at this many members (current generation observed,
    /// no open operation, Ready, ready == applied == spec.replicas).
    FleetSettled(i32),
    /// The workload's spec changed without a replica change (a template write: restart,
    /// upgrade, template update), seen as a new `metadata.generation`.
    WorkloadTemplate,
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

/// What the view keeps of the fleet object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetObs {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.maintenance.restartToken`.
    pub token: Option<String>,
    /// [`crate::bed::fleet_settled`] at `spec.replicas`.
    pub settled: bool,
    /// `status.lastRestartToken`.
    pub last_token: Option<String>,
}

impl FleetObs {
    fn of(f: &CelldFleet) -> Self {
        FleetObs {
            replicas: f.spec.replicas,
            token: f
                .spec
                .maintenance
                .as_ref()
                .and_then(|m| m.restart_token.clone()),
            settled: crate::bed::fleet_settled(f, f.spec.replicas),
            last_token: f.status.as_ref().and_then(|s| s.last_restart_token.clone()),
        }
    }
}

/// Observations from the watch tasks.
enum Obs {
    Fleet(Option<FleetObs>),
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
    fleet: Option<FleetObs>,
    /// `(spec.replicas, rolled out, metadata.generation)`.
    workload: Option<(i32, bool, i64)>,
    /// Pod UID → (terminating, ready).
    pods: HashMap<String, (bool, bool)>,
    settled: bool,
}

impl View {
    fn apply(&mut self, obs: Obs, at: Instant, out: &mut Vec<Stamped>) {
        let mut mark = |m| out.push(Stamped { at, mark: m });
        match obs {
            Obs::Fleet(f) => {
                if let Some(new) = &f {
                    let old = self.fleet.as_ref();
                    if old.map(|o| o.replicas) != Some(new.replicas) {
                        mark(Mark::FleetReplicas(new.replicas));
                    }
                    if let Some(o) = old {
                        if o.token != new.token {
                            mark(Mark::FleetToken(new.token.clone().unwrap_or_default()));
                        }
                    }
                    if new.settled && !old.is_some_and(|o| o.settled) {
                        mark(Mark::FleetSettled(new.replicas));
                    }
                }
                self.fleet = f;
            }
            // "Rolled out" is the operator's own definition (docs/design.md "Terms"): the bench
            // times when that predicate turns true, not an approximation of it.
            Obs::StatefulSet(s) => {
                let generation = s.as_ref().and_then(|s| s.metadata.generation);
                let w = s.map(|s| LiveWorkload::StatefulSet(Box::new(s)));
                self.set_workload(
                    w.map(|w| (w.replicas(), w.rolled_out(), generation.unwrap_or(0))),
                    &mut mark,
                );
            }
            Obs::Deployment(d) => {
                let generation = d.as_ref().and_then(|d| d.metadata.generation);
                let w = d.map(|d| LiveWorkload::Deployment(Box::new(d)));
                self.set_workload(
                    w.map(|w| (w.replicas(), w.rolled_out(), generation.unwrap_or(0))),
                    &mut mark,
                );
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
        let settled = self.workload.is_some_and(|(replicas, rolled_out, _)| {
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

    fn set_workload(&mut self, w: Option<(i32, bool, i64)>, mark: &mut impl FnMut(Mark)) {
        match (self.workload, w) {
            (None, Some((r, _, _))) => mark(Mark::WorkloadCreated(r)),
            (Some((from, _, _)), Some((to, _, _))) if from != to => {
                mark(Mark::WorkloadReplicas { from, to })
            }
            (Some((from, _, old)), Some((to, _, new))) if from == to && new > old => {
                mark(Mark::WorkloadTemplate)
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
            |f| Obs::Fleet(f.map(|f| FleetObs::of(&f))),
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

/// One followed fleet of [`FleetTimelines`].
#[derive(Default)]
struct Track {
    namespace: String,
    view: View,
    marks: Vec<Stamped>,
}

/// An observation routed to a fleet by its UID, or a namespace's Pod relist.
enum Routed {
    One(String, Box<Obs>),
    /// `(fleet UID, Pod UID)` of every fleet Pod a relist of `namespace` returned.
    Relisted {
        namespace: String,
        pods: Vec<(String, String)>,
    },
}

/// Chosen StatefulSet fleets among many (the scale bed's active fleets), each with its own view
/// and marks; one watch per kind and namespace (fleets, StatefulSets and Pods with the fleet
/// UID label), routed by fleet UID. Events of fleets not followed are dropped.
pub struct FleetTimelines {
    tracks: Arc<Mutex<HashMap<String, Track>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl FleetTimelines {
    /// Starts following `fleets`, given as `(namespace, fleet UID)`.
    pub fn start(client: &Client, fleets: &[(String, String)]) -> Self {
        let tracks: HashMap<String, Track> = fleets
            .iter()
            .map(|(ns, uid)| {
                (
                    uid.clone(),
                    Track {
                        namespace: ns.clone(),
                        ..Track::default()
                    },
                )
            })
            .collect();
        let namespaces: HashSet<&String> = fleets.iter().map(|(ns, _)| ns).collect();
        let tracks = Arc::new(Mutex::new(tracks));
        let (tx, mut rx) = unbounded_channel::<(Instant, Routed)>();
        let mut tasks = Vec::new();
        let labelled = watcher::Config::default().labels(FLEET_UID_LABEL);
        for ns in namespaces {
            tasks.push(watch_keyed::<CelldFleet>(
                Api::namespaced(client.clone(), ns),
                watcher::Config::default(),
                tx.clone(),
                |f, deleted| {
                    let uid = f.uid()?;
                    Some((uid, Obs::Fleet((!deleted).then(|| FleetObs::of(f)))))
                },
            ));
            tasks.push(watch_keyed::<StatefulSet>(
                Api::namespaced(client.clone(), ns),
                labelled.clone(),
                tx.clone(),
                |s, deleted| {
                    let uid = s.labels().get(FLEET_UID_LABEL)?.clone();
                    Some((uid, Obs::StatefulSet((!deleted).then(|| s.clone()))))
                },
            ));
            tasks.push(watch_pods_keyed(
                Api::namespaced(client.clone(), ns),
                ns.clone(),
                labelled.clone(),
                tx.clone(),
            ));
        }
        let sink = tracks.clone();
        tasks.push(tokio::spawn(async move {
            while let Some((at, routed)) = rx.recv().await {
                let Ok(mut tracks) = sink.lock() else {
                    return;
                };
                match routed {
                    Routed::One(uid, obs) => {
                        if let Some(t) = tracks.get_mut(&uid) {
                            let mut out = Vec::new();
                            t.view.apply(*obs, at, &mut out);
                            t.marks.extend(out);
                        }
                    }
                    Routed::Relisted { namespace, pods } => {
                        for (uid, t) in tracks.iter_mut().filter(|(_, t)| t.namespace == namespace)
                        {
                            let live = pods
                                .iter()
                                .filter(|(f, _)| f == uid)
                                .map(|(_, p)| p.clone())
                                .collect();
                            let mut out = Vec::new();
                            t.view.apply(Obs::PodsRelisted(live), at, &mut out);
                            t.marks.extend(out);
                        }
                    }
                }
            }
        }));
        FleetTimelines { tracks, tasks }
    }

    /// Marks of fleet `uid` from index `from` on.
    pub fn marks_since(&self, uid: &str, from: usize) -> Vec<Stamped> {
        self.tracks
            .lock()
            .ok()
            .and_then(|t| {
                t.get(uid)
                    .map(|t| t.marks.get(from..).unwrap_or(&[]).to_vec())
            })
            .unwrap_or_default()
    }

    /// How many marks fleet `uid` has so far.
    pub fn marks_len(&self, uid: &str) -> usize {
        self.tracks
            .lock()
            .ok()
            .and_then(|t| t.get(uid).map(|t| t.marks.len()))
            .unwrap_or(0)
    }

    /// The fleet object as last seen.
    pub fn fleet(&self, uid: &str) -> Option<FleetObs> {
        self.tracks
            .lock()
            .ok()
            .and_then(|t| t.get(uid).and_then(|t| t.view.fleet.clone()))
    }
}

impl Drop for FleetTimelines {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Watches every object of a kind in a namespace; `key(obj, deleted)` routes it to a fleet.
fn watch_keyed<K>(
    api: Api<K>,
    config: watcher::Config,
    tx: UnboundedSender<(Instant, Routed)>,
    key: impl Fn(&K, bool) -> Option<(String, Obs)> + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let routed = match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) => key(&o, false),
                Ok(Event::Delete(o)) => key(&o, true),
                Ok(_) => continue,
                Err(e) => {
                    eprintln!("  (bench watch error, retrying: {e})");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            };
            let Some((uid, obs)) = routed else {
                continue;
            };
            if tx.send((at, Routed::One(uid, Box::new(obs)))).is_err() {
                return;
            }
        }
    })
}

/// Watches the fleet Pods of a namespace; a relist drops Pods that vanished meanwhile.
fn watch_pods_keyed(
    api: Api<Pod>,
    namespace: String,
    config: watcher::Config,
    tx: UnboundedSender<(Instant, Routed)>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).boxed();
        let mut listed: Vec<(String, String)> = Vec::new();
        let fleet_of = |p: &Pod| p.labels().get(FLEET_UID_LABEL).cloned();
        while let Some(event) = events.next().await {
            let at = Instant::now();
            let routed = match event {
                Ok(Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(Event::InitApply(p)) => {
                    let Some(fleet) = fleet_of(&p) else { continue };
                    listed.push((fleet.clone(), p.uid().unwrap_or_default()));
                    Routed::One(
                        fleet,
                        Box::new(Obs::Pod {
                            uid: p.uid().unwrap_or_default(),
                            state: Some(pod_state(&p)),
                        }),
                    )
                }
                Ok(Event::InitDone) => Routed::Relisted {
                    namespace: namespace.clone(),
                    pods: std::mem::take(&mut listed),
                },
                Ok(Event::Apply(p)) => {
                    let Some(fleet) = fleet_of(&p) else { continue };
                    Routed::One(
                        fleet,
                        Box::new(Obs::Pod {
                            uid: p.uid().unwrap_or_default(),
                            state: Some(pod_state(&p)),
                        }),
                    )
                }
                Ok(Event::Delete(p)) => {
                    let Some(fleet) = fleet_of(&p) else { continue };
                    Routed::One(
                        fleet,
                        Box::new(Obs::Pod {
                            uid: p.uid().unwrap_or_default(),
                            state: None,
                        }),
                    )
                }
                Err(e) => {
                    eprintln!("  (bench Pod watch error, retrying: {e})");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            };
            if tx.send((at, routed)).is_err() {
                return;
            }
        }
    })
}

/// The first mark matching `request` → the first mark at or after it matching `write` (ms).
pub fn request_to_write(
    marks: &[Stamped],
    request: impl Fn(&Mark) -> bool,
    write: impl Fn(&Mark) -> bool,
) -> Option<f64> {
    let req = marks.iter().find(|m| request(&m.mark))?;
    let w = marks.iter().find(|m| m.at >= req.at && write(&m.mark))?;
    Some(ms(req.at, w.at))
}

/// What a queued contraction `n+1 → n` (asked for while the growth `n → n+1` rolled out)
/// shows: the last time the workload became settled at `n+1` after the growth write → the
/// decrease `n+1 → n` written. `Err(())` when the decrease was written but no settle at `n+1`
/// was seen before it (not sampled, counted); `Ok(None)` when either write is missing.
#[allow(clippy::result_unit_err)]
pub fn settled_to_decrease(marks: &[Stamped], n: i32) -> Result<Option<f64>, ()> {
    let Some(grown) = marks
        .iter()
        .find(|m| m.mark == Mark::WorkloadReplicas { from: n, to: n + 1 })
    else {
        return Ok(None);
    };
    let Some(decrease) = marks
        .iter()
        .find(|m| m.at >= grown.at && m.mark == Mark::WorkloadReplicas { from: n + 1, to: n })
    else {
        return Ok(None);
    };
    match marks
        .iter()
        .rfind(|m| m.at >= grown.at && m.at <= decrease.at && m.mark == Mark::Settled(n + 1))
    {
        Some(s) => Ok(Some(ms(s.at, decrease.at))),
        None => Err(()),
    }
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
    fn reaction_samples_pair_each_request_or_settle_with_the_next_write() {
        let t = Instant::now();
        let marks = vec![
            at(t, 0, Mark::FleetReplicas(4)),
            at(t, 150, Mark::WorkloadReplicas { from: 3, to: 4 }),
            at(t, 200, Mark::FleetReplicas(3)),
            at(t, 900, Mark::Settled(4)),
            at(t, 1250, Mark::WorkloadReplicas { from: 4, to: 3 }),
            at(t, 1300, Mark::FleetToken("b".into())),
            at(t, 1340, Mark::WorkloadTemplate),
        ];
        let growth = request_to_write(
            &marks,
            |m| matches!(m, Mark::FleetReplicas(4)),
            |m| matches!(m, Mark::WorkloadReplicas { from, to } if to > from),
        );
        assert_eq!(growth, Some(150.0));
        assert_eq!(settled_to_decrease(&marks, 3), Ok(Some(350.0)));
        let restart = request_to_write(
            &marks,
            |m| matches!(m, Mark::FleetToken(_)),
            |m| *m == Mark::WorkloadTemplate,
        );
        assert_eq!(restart, Some(40.0));
        let unseen: Vec<Stamped> = marks
            .iter()
            .filter(|m| m.mark != Mark::Settled(4))
            .cloned()
            .collect();
        assert_eq!(settled_to_decrease(&unseen, 3), Err(()));
        assert_eq!(settled_to_decrease(&marks[..3], 3), Ok(None));
    }

    #[test]
    fn the_view_marks_tokens_templates_and_fleet_settles() {
        let t = Instant::now();
        let mut v = View::default();
        let mut out = Vec::new();
        let fleet = |token: &str, settled: bool| {
            Obs::Fleet(Some(FleetObs {
                replicas: 3,
                token: Some(token.into()),
                settled,
                last_token: None,
            }))
        };
        v.apply(fleet("a", true), t, &mut out);
        assert_eq!(
            out.iter().map(|s| s.mark.clone()).collect::<Vec<_>>(),
            vec![Mark::FleetReplicas(3), Mark::FleetSettled(3)],
            "a token first seen is not a change"
        );
        out.clear();
        v.apply(fleet("b", false), t, &mut out);
        assert_eq!(
            out.last().map(|s| s.mark.clone()),
            Some(Mark::FleetToken("b".into()))
        );
        v.workload = Some((3, true, 4));
        out.clear();
        v.set_workload(Some((3, false, 5)), &mut |m| {
            out.push(Stamped { at: t, mark: m })
        });
        assert_eq!(
            out.last().map(|s| s.mark.clone()),
            Some(Mark::WorkloadTemplate)
        );
        out.clear();
        v.set_workload(Some((4, false, 6)), &mut |m| {
            out.push(Stamped { at: t, mark: m })
        });
        assert_eq!(
            out.last().map(|s| s.mark.clone()),
            Some(Mark::WorkloadReplicas { from: 3, to: 4 })
        );
    }

    #[test]
    fn the_view_marks_a_settle_only_when_pods_and_rollout_agree() {
        let t = Instant::now();
        let mut v = View {
            workload: Some((2, true, 1)),
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
