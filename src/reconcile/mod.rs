//! One reconcile of one fleet (docs/design.md "Reconcile order"): read → plan → one guarded effect,
//! with every member-changing decision journaled before it is carried out.
//!
//! This build covers Provision, Scale (growth in runs, contraction one member at a time,
//! claims retained), rolling Restart/Upgrade/TemplateUpdate, Delete, and the strict
//! operations (Retire contractions and coordinated restarts, `strict.rs`, driven from their
//! own step table), member replacement and self-healing (`replace.rs`, `heal.rs`).

pub mod compare;
mod delete;
mod drive;
pub mod foreign;
pub mod heal;
mod integrity;
mod plan;
mod prereq;
pub mod reasons;
mod replace;
mod status;
mod strict;
pub mod workload;
mod zone_gate;

use std::time::Duration;

use chrono::{DateTime, Utc};
use journal::{Budget, Entry, EntryBody, Journal, Leader, Mirror, NewEntry, OperationId};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::keys::{FLEET_UID_LABEL, JOURNAL_COMMAND_ANNOTATION};
use crate::api::CelldFleet;
use crate::journal_store;
use crate::render::RenderSettings;

pub use plan::{plan, Desired, LiveView, Plan};

/// The `celld.eric.dev/replace-member` value asking for member `pod` at its UID `uid`.
pub fn replace_request_value(pod: &str, uid: &str) -> String {
    format!("{pod}/{uid}")
}
pub use status::{Class, Report};

/// Operator-wide settings and clients shared by reconciles.
pub struct Ctx {
    /// The API client.
    pub client: Client,
    /// Rendering settings (`--operator-namespace`, `--local-test`).
    pub render: RenderSettings,
    /// `--network-policy-enforced`.
    pub network_policy_enforced: bool,
    /// `--operation-deadline` (test clusters): replaces the 30-minute operation deadline.
    pub operation_deadline: Option<std::time::Duration>,
    /// `--journal-annotation-bytes`.
    pub budget: Budget,
    /// The local journal mirror.
    pub mirror: Option<Mirror>,
    /// Identity stamped into journal entries.
    pub leader: Leader,
    /// Leadership of this process (`None`: a single replica without election, tests only).
    pub leadership: Option<crate::leader::Leadership>,
    /// Queues one Event per journal entry, sent off the reconcile's path (`None`: no Events,
    /// e.g. in unit tests).
    pub recorder: Option<crate::events::Outbox>,
    /// Prometheus metrics.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Fleets reconciled since this process started (to count replays of open operations).
    pub seen: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Fleet UID → (generation, when) of the last ServiceAccount/StorageClass verification.
    pub gates_verified:
        std::sync::Mutex<std::collections::HashMap<String, (i64, std::time::Instant)>>,
    /// Consecutive failed reconciles per fleet (`ns/name`), for the error backoff.
    pub error_streaks: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Restart counts of members seen by this process (Pod UID → restartCount): the
    /// baseline for `MemberSelfFenced`, kept in memory and not re-emitted after a restart.
    pub restart_baseline: std::sync::Mutex<std::collections::HashMap<String, i32>>,
    /// Per-namespace watches that trigger reconciles (`None`: none).
    pub watches: Option<crate::watches::Watches>,
    /// Fleet UID → the request last canceled with `PredecessorChanged`, how often in a row,
    /// and when it may be planned again (the cancel-and-replan backoff).
    pub replan_backoff: std::sync::Mutex<std::collections::HashMap<String, integrity::Replan>>,
    /// `--foreign-operator-window`.
    pub foreign_window: Duration,
    /// Self-healing timings (`--member-replacement-delay` and the fixed windows).
    pub healing: heal::Timings,
    /// Fleet UIDs on which this process has recorded (or found fresh) its installation record.
    pub announced: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Fleet UID → the other installations last reported with a `ForeignOperator` Event.
    pub foreign_reported: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// `--test-fresh-reads`: no cached pass; every reconcile reads fresh (the design before
    /// the caches, kept to measure the two side by side).
    pub fresh_reads: bool,
    /// Fleets (`ns/name`) this process has reconciled successfully and not since found gone
    /// (a gauge: start-up is done when it reaches the fleet count).
    pub reconciled: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The fleet and workload versions this process's own writes replaced: a cached copy at
    /// one of them is known stale ([`crate::own_writes`]).
    pub own_writes: crate::own_writes::OwnWrites,
    /// When each fleet's status was last written: progress-only changes wait for the rest of
    /// `--status-progress-interval` ([`crate::status_pace`]).
    pub status_pace: crate::status_pace::StatusPace,
    /// Per fleet, when its earliest trigger not yet served by a started reconcile arrived
    /// (`celld_operator_reaction_wait_seconds`).
    pub triggers: crate::reaction::Triggers,
    /// The reconcile slots, served in order (`None`: kube-runtime's controller bounds the
    /// reconciles, `--test-kube-slots`, and unit tests).
    pub slots: Option<crate::slots::Slots>,
    /// A fresh pass sends its planning reads at once ([`prefetch`]); `--test-no-prefetch`
    /// turns it off.
    pub prefetch: bool,
    /// Every write of a fresh pass forgets all its reads and its status reads again
    /// (`--test-forget-all-on-write`, the design before [`crate::pass_reads`] scoped them).
    pub forget_all_on_write: bool,
    /// A cached pass may decide and carry out Scale, rolling Restart, Upgrade and
    /// TemplateUpdate operations itself ([`crate::pass::planning_client`]);
    /// `--test-no-cache-planning` keeps the rule before (a cached pass writes nothing but
    /// its status).
    pub cache_planning: bool,
}

impl Ctx {
    /// Publishes the mirror's size on disk (`celld_journal_mirror_disk_bytes`): a few file
    /// metadata reads, after the mirror opens and after each committed append.
    pub fn note_mirror_size(&self) {
        if let Some(Ok(bytes)) = self.mirror.as_ref().map(Mirror::size_on_disk) {
            self.metrics
                .journal_mirror_disk_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The fleet is no longer tracked by the watches (a reconcile found it gone).
    pub fn forgotten(&self, ns: &str, name: &str) -> bool {
        self.watches.as_ref().is_some_and(|w| !w.tracks(ns, name))
    }

    /// The deadline of an operation decided at `now` (docs/design.md "Deadlines, Stalled and
    /// abandon").
    pub fn deadline(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        coordinated_members: Option<u32>,
    ) -> chrono::DateTime<chrono::Utc> {
        match self
            .operation_deadline
            .and_then(|d| chrono::Duration::from_std(d).ok())
        {
            Some(d) => now + d,
            None => journal::default_deadline(now, coordinated_members),
        }
    }

    /// Before any effect: the Lease must be held with at least 5 s left (`leader::MARGIN`); a replica that
    /// lost it stops issuing at once and exits non-zero (docs/design.md "Leader Lease").
    pub fn check_lease(&self) {
        if let Some(l) = &self.leadership {
            if !l.holds() {
                tracing::error!("the leader Lease is not held with 5 s to spare: exiting before issuing an effect");
                std::process::exit(1);
            }
        }
    }
}

/// Errors that end a reconcile early; the next one starts again from fresh reads.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A journal append did not commit.
    #[error(transparent)]
    Append(#[from] journal_store::AppendError),
    /// The journal annotation could not be read.
    #[error("the journal annotation is invalid: {0}")]
    Journal(#[from] journal::LoadError),
    /// A cached pass cannot go on from the caches (`crate::pass`); never reported: the
    /// reconcile runs again from fresh reads.
    #[error("{0}")]
    Refused(String),
}

impl Error {
    /// Stable PascalCase category (Event reason, metric label), one of [`ERROR_CATEGORIES`]
    /// (the `reason` label of `celld_operator_reconcile_errors_total`).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "Conflict",
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 403 => "Forbidden",
            Error::Kube { .. } | Error::Refused(_) => "ApiError",
            Error::Append(journal_store::AppendError::Conflict(_)) => "Conflict",
            Error::Append(journal_store::AppendError::Mirror(_)) => "JournalMirrorFailed",
            Error::Append(_) => "JournalAppendFailed",
            Error::Journal(_) => "JournalInvalid",
        }
    }
}

impl Error {
    /// The local journal mirror's disk failed (`MirrorError::DiskFailed`): sled accepts no
    /// write until the mirror is opened again, so no effect can be issued by this process.
    pub fn mirror_disk_failed(&self) -> bool {
        matches!(
            self,
            Error::Append(journal_store::AppendError::Mirror(
                journal::MirrorError::DiskFailed(_)
            ))
        )
    }
}

/// Every value [`Error::category`] returns.
pub const ERROR_CATEGORIES: [&str; 6] = [
    "Conflict",
    "Forbidden",
    "ApiError",
    "JournalAppendFailed",
    "JournalMirrorFailed",
    "JournalInvalid",
];

/// Adds context to a kube error.
pub(crate) trait KubeContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> KubeContext<T> for Result<T, kube::Error> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Kube {
            context: context(),
            source,
        })
    }
}

/// What one reconcile saw and holds: the fleet as last written and its journal.
pub(crate) struct Run<'a> {
    pub ctx: &'a Ctx,
    /// This pass's client: the operator's, or in a cached pass one that sends nothing
    /// (`crate::pass`).
    pub client: Client,
    /// The namespace's watch-fed stores in a cached pass; `None` in a fresh pass.
    pub cache: Option<crate::watches::NsCache>,
    /// In a fresh pass, the same stores (when ready; not with `--test-fresh-reads`), for the
    /// checks that find nothing to write ([`Run::stored`]).
    pub stores: Option<crate::watches::NsCache>,
    pub api: Api<CelldFleet>,
    pub fleet: CelldFleet,
    pub journal: Journal,
    pub now: DateTime<Utc>,
    pub ns: String,
    pub name: String,
    pub uid: String,
    /// The fleet's journal annotation is damaged or missing (`JournalInvalid`,
    /// `JournalMissing`): `journal` is a fresh one, used only to journal a deletion.
    pub journal_unusable: bool,
    /// Look again after exactly this long (a member's `/state` is polled every second).
    pub requeue: Option<Duration>,
    /// A fresh pass's planning reads, each sent once between two of its writes
    /// (`crate::pass_reads`); `None` in a cached pass and with `--test-fresh-reads`.
    pub reads: Option<std::sync::Arc<crate::pass_reads::PassReads>>,
    /// The next contraction's victim Pod (name, and the Pod or its absence), read from the
    /// API server in this pass while the journal write completing the operation before it
    /// was in flight; taken by the planner when it records that member (`drive::next_victim`).
    pub next_victim: Option<(String, Option<k8s_openapi::api::core::v1::Pod>)>,
    /// The guard's fresh reads for the operation whose `Intent` this pass just appended,
    /// sent while that append was in flight; taken by its guarded write (`drive::issue`).
    pub guard_reads: Option<drive::GuardReads>,
}

impl Run<'_> {
    /// The boundary just before an effect: lease check, then the `before-effect` failpoint.
    /// The pass's kept reads are forgotten (an effect may be a member request, which the
    /// pass's client does not see).
    pub fn before_effect(&self) {
        if let Some(esc) = crate::pass::cached() {
            // A planning pass crosses the boundary of the one effect it may issue itself
            // (inside its decision); any other effect is left to a fresh pass.
            if !esc.deciding() {
                esc.escalate(|| "an effect".into());
                return;
            }
        }
        self.forget_reads();
        self.ctx.check_lease();
        crate::failpoint::reach("before-effect");
    }

    /// Forgets the fresh pass's kept reads ([`crate::pass_reads`]): what the pass reads next
    /// goes to the API server.
    pub fn forget_reads(&self) {
        if let Some(r) = &self.reads {
            r.forget_all();
        }
    }

    /// A write of this pass to the fleet, conditioned on resourceVersion `replaced`, succeeded
    /// ([`crate::own_writes`]).
    pub fn wrote_fleet(&self, replaced: Option<&str>) {
        self.ctx.own_writes.replaced(
            &format!("{}/{}", self.ns, self.name),
            replaced,
            std::time::Instant::now(),
        );
    }

    /// A cached pass (reads from the stores, sends nothing).
    pub fn is_cached(&self) -> bool {
        self.cache.is_some()
    }

    /// Ends a cached pass's use of something it cannot do from the caches (a member's
    /// `/state`, a local write): records `cause`; `true` when this is a cached pass.
    pub fn escalate(&self, cause: impl FnOnce() -> String) -> bool {
        match crate::pass::cached() {
            Some(esc) => {
                esc.escalate(cause);
                true
            }
            None => false,
        }
    }

    /// Opens the decision of an operation of `kind` (`strict` or not) in a cached pass: a
    /// planning pass that may carry it out itself gets the scope
    /// ([`crate::pass::decision`]); any other cached pass escalates and gets
    /// [`Error::Refused`]. Outside a cached pass: `Ok(None)`, nothing to open.
    pub fn decide(
        &self,
        kind: journal::OperationKind,
        strict: bool,
    ) -> Result<Option<crate::pass::Scope>, Error> {
        let Some(esc) = crate::pass::cached() else {
            return Ok(None);
        };
        if esc.may_plan() && crate::pass::plannable(kind) && !strict {
            return Ok(crate::pass::decision());
        }
        let what = format!("decide {kind}{}", if strict { " (strict)" } else { "" });
        esc.escalate(|| what.clone());
        Err(Error::Refused(format!("{what}: left to a fresh pass")))
    }

    /// The Event recorder (`None` in a cached pass, which then escalates).
    pub fn recorder(&self) -> Option<&crate::events::Outbox> {
        crate::pass::recorder(&self.ctx.recorder)
    }

    /// `<ns>/<name>` of kind `K`: from the cache in a cached pass when it holds it (a miss
    /// may be a foreign, unlabelled object, so it is asked of the API server, which a
    /// cached pass refuses), else a fresh GET.
    ///
    /// In a fresh pass this is a planning read: answered from the pass's own reads since its
    /// last write when it has one (by name, or as a member of this fleet's labelled list of
    /// the kind), else read and kept ([`crate::pass_reads`]). A write's own target is read
    /// with [`Run::reread`] instead.
    pub async fn get_opt<K: crate::watches::Cached>(&self, name: &str) -> Result<Option<K>, Error> {
        if let Some(cache) = &self.cache {
            if let Some(obj) = K::store(cache).get(name) {
                return Ok(Some(obj));
            }
        }
        let key = format!("{}/{name}", K::kind(&()));
        if let Some(reads) = &self.reads {
            if let Some(kept) = reads.get::<Option<K>>(&key) {
                return Ok(kept);
            }
            let list = list_key::<K>(FLEET_UID_LABEL, &self.uid);
            if let Some(Some(found)) = reads.find_in::<K>(&list, |o| o.name_any() == name) {
                return Ok(Some(found));
            }
        }
        let found = self.reread::<K>(name).await?;
        if let Some(reads) = &self.reads {
            reads.put(&K::plural(&()), key, found.clone());
        }
        Ok(found)
    }

    /// `<ns>/<name>` of kind `K` as the namespace's watch-fed store holds it, in a fresh pass
    /// (`None`: not held, a cached pass, or no stores). Only for a check that, when it finds
    /// the object as it wants it, has nothing to write; anything it would write or block on is
    /// decided from [`Run::reread`] (docs/design.md "Reads of a fresh pass").
    pub fn stored<K: crate::watches::Cached>(&self, name: &str) -> Option<K> {
        K::store(self.stores.as_ref()?).get(name)
    }

    /// Reservation `name` as the cluster-wide store holds it, in a fresh pass ([`Run::stored`]).
    pub fn stored_reservation(&self, name: &str) -> Option<crate::api::CelldStorageReservation> {
        self.stores
            .as_ref()?
            .reservations
            .get(&kube::runtime::reflector::ObjectRef::new(name))
            .map(|r| (*r).clone())
    }

    /// `<ns>/<name>` of kind `K` as the API server holds it now: the guarded write's re-read
    /// of its own target, never answered from the pass's earlier reads (in a cached pass,
    /// from the cache when it holds it, as [`Run::get_opt`]: a cached pass writes nothing).
    pub async fn reread<K: crate::watches::Cached>(&self, name: &str) -> Result<Option<K>, Error> {
        reread(self.cache.as_ref(), &self.client, &self.ns, name).await
    }

    /// Whether ServiceAccount `name` exists in the fleet's namespace: from the cache in a
    /// cached pass when it holds it, else a fresh GET.
    pub async fn service_account_exists(&self, name: &str) -> Result<bool, Error> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        // Inside a planning pass's decision: read fresh right before it is decided.
        if let Some(cache) = self.cache.as_ref().filter(|_| !guarding()) {
            let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
            if cache.service_accounts.get(&key).is_some() {
                return Ok(true);
            }
        }
        // In a fresh pass a planning read ([`Run::get_opt`]): the gate and the check before
        // an operation in the same pass, with no write between them, share one GET.
        let key = format!("ServiceAccount/{name}");
        if let Some(kept) = self.reads.as_ref().and_then(|r| r.get::<bool>(&key)) {
            return Ok(kept);
        }
        let exists = Api::<ServiceAccount>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .ctx(|| "get serviceaccounts".into())?
            .is_some();
        if let Some(reads) = &self.reads {
            reads.put("serviceaccounts", key, exists);
        }
        Ok(exists)
    }

    /// StorageClass `name`: from the cache in a cached pass when it holds it, else a fresh GET.
    pub async fn storage_class(
        &self,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::storage::v1::StorageClass>, Error> {
        use k8s_openapi::api::storage::v1::StorageClass;
        // Inside a planning pass's decision: read fresh right before it is decided.
        if let Some(cache) = self.cache.as_ref().filter(|_| !guarding()) {
            if let Some(sc) = cache
                .storage_classes
                .get(&kube::runtime::reflector::ObjectRef::new(name))
            {
                return Ok(Some((*sc).clone()));
            }
        }
        // A planning read in a fresh pass, as the ServiceAccount's.
        let key = format!("StorageClass/{name}");
        if let Some(kept) = self
            .reads
            .as_ref()
            .and_then(|r| r.get::<Option<StorageClass>>(&key))
        {
            return Ok(kept);
        }
        let found = Api::<StorageClass>::all(self.client.clone())
            .get_opt(name)
            .await
            .ctx(|| "get storageclasses".into())?;
        if let Some(reads) = &self.reads {
            reads.put("storageclasses", key, found.clone());
        }
        Ok(found)
    }

    /// Reservation `name`: from the cache in a cached pass when it holds it, else a fresh GET.
    pub async fn reservation(
        &self,
        name: &str,
    ) -> Result<Option<crate::api::CelldStorageReservation>, Error> {
        if let Some(cache) = &self.cache {
            if let Some(r) = cache
                .reservations
                .get(&kube::runtime::reflector::ObjectRef::new(name))
            {
                return Ok(Some((*r).clone()));
            }
        }
        Api::<crate::api::CelldStorageReservation>::all(self.client.clone())
            .get_opt(name)
            .await
            .ctx(|| format!("reading reservation {name}"))
    }

    /// Objects of kind `K` with this fleet's label: from the cache in a cached pass, else a
    /// fresh list.
    pub async fn labelled<K: crate::watches::Cached>(&self) -> Result<Vec<K>, Error> {
        self.labelled_by(FLEET_UID_LABEL).await
    }

    /// Objects of kind `K` whose label `key` (the fleet label or the replacement-hold label)
    /// is this fleet's UID: from the cache in a cached pass (which holds objects with the
    /// fleet label: every member Pod carries it from its template; an unreadable cached entry
    /// makes it ask the API server, which a cached pass refuses), else a fresh list.
    /// In a fresh pass a planning read, kept until the pass's next write ([`Run::get_opt`]).
    pub async fn labelled_by<K: crate::watches::Cached>(&self, key: &str) -> Result<Vec<K>, Error> {
        let memo = list_key::<K>(key, &self.uid);
        if let Some(kept) = self.reads.as_ref().and_then(|r| r.get::<Vec<K>>(&memo)) {
            return Ok(kept);
        }
        let found = self.relist_by::<K>(key).await?;
        if let Some(reads) = &self.reads {
            reads.put(&K::plural(&()), memo, found.clone());
        }
        Ok(found)
    }

    /// [`Run::labelled_by`] as the API server holds it now (never from the pass's earlier
    /// reads): the re-read of a write's own targets.
    pub async fn relist_by<K: crate::watches::Cached>(&self, key: &str) -> Result<Vec<K>, Error> {
        if let Some(cache) = &self.cache {
            if let Some(found) = K::store(cache).labelled(key, &self.uid) {
                return Ok(found);
            }
        }
        let lp = ListParams::default().labels(&format!("{key}={}", self.uid));
        Ok(Api::<K>::namespaced(self.client.clone(), &self.ns)
            .list(&lp)
            .await
            .ctx(|| format!("listing {}s", K::kind(&())))?
            .items)
    }

    /// Before deciding an effect: the mirror must hold every entry the annotation holds (a
    /// mirror write that failed after its append committed is caught up here; if that fails
    /// too, the reconcile ends and no effect is issued).
    pub async fn ensure_mirrored(&self) -> Result<(), Error> {
        let Some(mirror) = &self.ctx.mirror else {
            return Ok(());
        };
        if self.is_cached() {
            // A cached pass writes nothing, the mirror included: a mirror that is not at
            // the cached journal's seq is caught up (or found ahead: the cache lags behind
            // this process's own append) by the fresh pass.
            let seq = self.journal.document().seq();
            let head = mirror
                .head(self.journal.fleet_uid())
                .ok()
                .flatten()
                .map(|(s, _)| s);
            if seq != 0 && head != Some(seq) {
                self.escalate(|| "journal mirror not at the cached seq".into());
                return Err(Error::Refused(
                    "the journal mirror is not at the cached seq".into(),
                ));
            }
            return Ok(());
        }
        let signals = journal_store::ensure_mirrored(mirror, &self.journal)
            .map_err(|e| Error::Append(journal_store::AppendError::Mirror(e)))?;
        self.publish_signals(&signals).await;
        Ok(())
    }

    /// `JournalDiverged` / `JournalRollback` found while mirroring: a Warning Event each.
    async fn publish_signals(&self, signals: &[journal::Signal]) {
        use kube::runtime::events::{Event, EventType};
        for signal in signals {
            tracing::warn!(fleet = %format!("{}/{}", self.ns, self.name), reason = signal.event_reason(), "{}", signal.message());
            let Some(recorder) = self.recorder() else {
                continue;
            };
            let event = Event {
                type_: EventType::Warning,
                reason: signal.event_reason().into(),
                note: Some(signal.message()),
                action: format!(
                    "{}-{}",
                    signal.event_reason(),
                    self.journal.document().seq()
                ),
                secondary: None,
            };
            recorder.publish(event, self.fleet.object_ref(&())).await;
        }
    }

    /// Appends one entry (compare-and-swap on the fleet) and mirrors it.
    pub async fn append(&mut self, op: OperationId, body: EntryBody) -> Result<Entry, Error> {
        self.append_with(op, body, false).await
    }

    /// Appends, optionally removing a consumed journal command in the same write.
    pub async fn append_with(
        &mut self,
        op: OperationId,
        body: EntryBody,
        remove_command: bool,
    ) -> Result<Entry, Error> {
        let mut committed = self.append_entries(op, vec![body], remove_command).await?;
        Ok(committed.pop().expect("one entry was appended"))
    }

    /// Appends several entries of operation `op`, in order, in one compare-and-swap: they
    /// commit together or not at all (an operation's `Observed` and `Completed`, docs/design.md
    /// "Journal writes"). Each is checked, mirrored, counted and published as if appended alone.
    pub async fn append_all(
        &mut self,
        op: OperationId,
        bodies: Vec<EntryBody>,
    ) -> Result<Vec<Entry>, Error> {
        self.append_entries(op, bodies, false).await
    }

    async fn append_entries(
        &mut self,
        op: OperationId,
        bodies: Vec<EntryBody>,
        remove_command: bool,
    ) -> Result<Vec<Entry>, Error> {
        let mut remove = Vec::new();
        if remove_command {
            remove.push(JOURNAL_COMMAND_ANNOTATION);
        }
        // An administrative replacement request is removed in the same write that closes its
        // operation (any outcome), unless it was changed meanwhile (then it is a new request).
        if bodies.iter().any(|b| replace::closes_request(self, op, b)) {
            remove.push(crate::api::keys::REPLACE_MEMBER_ANNOTATION);
        }
        // A planning cached pass appends only the entries of an operation it may carry out
        // itself (docs/design.md "Cache-planned operations"); any other entry is decided by
        // a fresh pass. Its append is the same compare-and-swap on the fleet's
        // resourceVersion, here the cached copy's: a copy that lags is refused by the API
        // server, and the reconcile goes on from fresh reads at once.
        let _permit = match crate::pass::cached() {
            Some(esc) => {
                let refused = bodies.iter().find(|b| !self.plannable_entry(op, b));
                if !(esc.may_plan() && !esc.escalated() && remove.is_empty() && refused.is_none()) {
                    let what = format!(
                        "append {}",
                        bodies
                            .iter()
                            .map(|b| format!("{:?}", b.entry_type()))
                            .collect::<Vec<_>>()
                            .join("+")
                    );
                    esc.escalate(|| what.clone());
                    return Err(Error::Refused(format!("{what}: left to a fresh pass")));
                }
                crate::pass::permit()
            }
            None => None,
        };
        let at = Utc::now();
        let entries = bodies
            .into_iter()
            .map(|body| NewEntry {
                at,
                op,
                leader: self.ctx.leader.clone(),
                body,
            })
            .collect();
        let replaced = self.fleet.metadata.resource_version.clone();
        let committed = match journal_store::append(
            &self.api,
            &self.fleet,
            &self.journal,
            entries,
            self.ctx.budget,
            self.ctx.mirror.as_ref(),
            &remove,
        )
        .await
        {
            Ok(c) => c,
            Err(journal_store::AppendError::Conflict(why)) if _permit.is_some() => {
                self.escalate(|| "append conflict (cached fleet behind)".into());
                return Err(Error::Append(journal_store::AppendError::Conflict(why)));
            }
            Err(e) => return Err(e.into()),
        };
        self.wrote_fleet(replaced.as_deref());
        self.ctx.note_mirror_size();
        for entry in &committed.entries {
            tracing::info!(
                fleet = %format!("{}/{}", self.ns, self.name),
                op = %entry.op(),
                seq = entry.seq(),
                entry = %journal::audit::entry_detail(entry),
                "journal entry committed"
            );
        }
        self.fleet = committed.fleet;
        self.journal = committed.journal;
        self.journal_unusable = false;
        self.publish_signals(&committed.signals).await;
        for entry in &committed.entries {
            self.ctx
                .metrics
                .appends
                .get_or_create(&crate::metrics::EntryLabels {
                    namespace: self.ns.clone(),
                    fleet: self.name.clone(),
                    r#type: format!("{:?}", entry.entry_type()),
                })
                .inc();
            self.publish(entry).await;
        }
        Ok(committed.entries)
    }

    /// Whether a planning cached pass may append `body` for operation `op` itself: the
    /// `Intent` of a [`crate::pass::plannable`] kind that is not strict, and that operation's
    /// `Issued`, `Observed` and `Completed`. Everything else (cancels, blocks, stalls,
    /// recoveries, commands, proofs, retirements) is decided by a fresh pass.
    fn plannable_entry(&self, op: OperationId, body: &EntryBody) -> bool {
        let intent = match body {
            EntryBody::Intent(i) => Some(i.clone()),
            EntryBody::Issued(_) | EntryBody::Observed(_) | EntryBody::Completed(_) => self
                .journal
                .fold()
                .operation(op)
                .map(|o| o.intent().clone()),
            _ => None,
        };
        intent.is_some_and(|i| crate::pass::plannable(i.kind) && !strict::is_strict(&i))
    }

    /// One Event per journal entry (docs/design.md "Events and metrics"): stable reason, the
    /// operation id in the note. Best effort: an Event that cannot be written is logged, never
    /// retried into a second journal write.
    async fn publish(&self, entry: &Entry) {
        use kube::runtime::events::{Event, EventType};
        let Some(recorder) = self.recorder() else {
            return;
        };
        let kind = entry.entry_type();
        let op_kind = self
            .journal
            .fold()
            .operation(entry.op())
            .map(|o| o.kind().to_string())
            .unwrap_or_default();
        let event = Event {
            type_: if kind.event_is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: kind.event_reason().into(),
            note: Some(format!(
                "{op_kind} {}: {}",
                entry.op(),
                journal::audit::entry_detail(entry)
            )),
            // The recorder folds events with equal (type, reason, action, regarding) into a
            // series; the entry's seq in the action keeps one Event per journal entry.
            action: format!("{kind:?}-{}", entry.seq()),
            secondary: None,
        };
        recorder.publish(event, self.fleet.object_ref(&())).await;
    }

    /// A Warning Event about a member on the fleet (the Pod as the related object).
    pub async fn member_event(&self, reason: &str, note: String, pod: &Pod) {
        use kube::runtime::events::{Event, EventType};
        tracing::warn!(fleet = %format!("{}/{}", self.ns, self.name), reason, "{note}");
        let Some(recorder) = self.recorder() else {
            return;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: format!("{reason}-{}", pod.metadata.uid.as_deref().unwrap_or("")),
            secondary: Some(pod.object_ref(&())),
        };
        recorder.publish(event, self.fleet.object_ref(&())).await;
    }

    /// `MemberSelfFenced` (docs/runtime.md "Process, health and self-fencing"): a member's
    /// restartCount rose and its last termination exited with code 3. A restart on its own
    /// disk, never removal authority.
    async fn self_fence_events(&self, pods: &[Pod]) {
        use kube::runtime::events::{Event, EventType};
        for pod in pods {
            let (Some(uid), Some(status)) = (pod.metadata.uid.clone(), pod.status.as_ref()) else {
                continue;
            };
            let Some(c) = status
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == "celld")
            else {
                continue;
            };
            let exit3 = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 3);
            // A cached pass leaves a rise it would report to the fresh pass (which reports
            // it and moves the baseline); any other count is the same fact in both passes.
            let (rose, handed_over) = match self.ctx.restart_baseline.lock() {
                Ok(mut baseline) => {
                    let rose = baseline.get(&uid).is_some_and(|p| c.restart_count > *p);
                    let handed_over = exit3
                        && rose
                        && self.escalate(|| "create events (MemberSelfFenced)".into());
                    if !handed_over {
                        baseline.insert(uid, c.restart_count);
                    }
                    (rose, handed_over)
                }
                Err(_) => continue,
            };
            if handed_over || !(exit3 && rose) {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            tracing::warn!(member = %name, restarts = c.restart_count, "member self-fenced (exit code 3)");
            if let Some(recorder) = self.recorder() {
                let event = Event {
                    type_: EventType::Warning,
                    reason: "MemberSelfFenced".into(),
                    note: Some(format!(
                        "Member {name} fenced itself (exit code 3, restart {}): it could not renew its S3 lease; it restarts on its own disk",
                        c.restart_count
                    )),
                    action: format!("SelfFence-{}", c.restart_count),
                    secondary: Some(pod.object_ref(&())),
                };
                recorder.publish(event, self.fleet.object_ref(&())).await;
            }
        }
    }

    /// The fleet's workload, of the kind the spec uses ([`Run::get_opt`]: a planning read).
    pub async fn workload(&self) -> Result<Option<workload::LiveWorkload>, Error> {
        self.workload_with(false).await
    }

    /// The fleet's workload as the API server holds it now ([`Run::reread`]): for a write
    /// to it.
    pub async fn reread_workload(&self) -> Result<Option<workload::LiveWorkload>, Error> {
        self.workload_with(true).await
    }

    async fn workload_with(&self, reread: bool) -> Result<Option<workload::LiveWorkload>, Error> {
        let live = self.workload_from(reread).await?;
        self.saw_workload(live.as_ref());
        // A cached pass does not plan from a copy this process's own write has replaced
        // (`crate::own_writes`): the write's watch event brings the reconcile that does.
        if let (Some(esc), Some(w)) = (crate::pass::cached(), &live) {
            if let Some(left) = self.ctx.own_writes.outdates(
                &crate::own_writes::workload_key(&self.ns, &self.name),
                w.meta().resource_version.as_deref(),
                std::time::Instant::now(),
            ) {
                esc.stale_copy("workload", left);
                return Err(Error::Refused(
                    "the cached workload is older than this process's own write".into(),
                ));
            }
        }
        Ok(live)
    }

    /// A full update of the workload carrying `live`'s resourceVersion (a conflict is a 409,
    /// never retried here); on success that version is recorded as replaced
    /// ([`crate::own_writes`]).
    pub async fn replace_workload(
        &self,
        live: &workload::LiveWorkload,
    ) -> Result<workload::LiveWorkload, kube::Error> {
        let written = workload::replace(&self.client, &self.ns, live).await?;
        crate::reaction::wrote(&self.ctx.metrics, &format!("{}/{}", self.ns, self.name));
        self.saw_workload(Some(&written));
        self.ctx.own_writes.replaced(
            &crate::own_writes::workload_key(&self.ns, &self.name),
            live.meta().resource_version.as_deref(),
            std::time::Instant::now(),
        );
        Ok(written)
    }

    async fn workload_from(&self, reread: bool) -> Result<Option<workload::LiveWorkload>, Error> {
        use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
        Ok(if crate::render::uses_statefulset(&self.fleet.spec) {
            let live = if reread {
                self.reread::<StatefulSet>(&self.name).await?
            } else {
                self.get_opt::<StatefulSet>(&self.name).await?
            };
            live.map(|s| workload::LiveWorkload::StatefulSet(Box::new(s)))
        } else {
            let live = if reread {
                self.reread::<Deployment>(&self.name).await?
            } else {
                self.get_opt::<Deployment>(&self.name).await?
            };
            live.map(|d| workload::LiveWorkload::Deployment(Box::new(d)))
        })
    }

    /// The claim at member `ordinal`'s name ([`Run::get_opt`]): a foreign claim has no fleet
    /// label, so no labelled list would see it.
    pub async fn claim_at(&self, ordinal: i32) -> Result<Option<PersistentVolumeClaim>, Error> {
        self.get_opt(&crate::render::claim_name(&self.name, ordinal))
            .await
    }

    /// Pods with the fleet label ([`Run::labelled`]).
    pub async fn pods(&self) -> Result<Vec<Pod>, Error> {
        let pods: Vec<Pod> = self.labelled().await?;
        if let Some(reads) = &self.reads {
            reads.saw("pods", pods.clone());
        }
        Ok(pods)
    }

    /// The plural resource of the fleet's workload.
    fn workload_resource(&self) -> &'static str {
        if crate::render::uses_statefulset(&self.fleet.spec) {
            "statefulsets"
        } else {
            "deployments"
        }
    }

    /// Records `live` (read, created or written by this pass) as what a fresh pass last saw
    /// of its workload ([`Run::status_inputs`]).
    pub fn saw_workload(&self, live: Option<&workload::LiveWorkload>) {
        if let Some(reads) = &self.reads {
            reads.saw(self.workload_resource(), live.cloned());
        }
    }

    /// The workload and member Pods for the status a pass writes at its end (docs/design.md
    /// "The status of a fresh pass"). A fresh pass uses what it last saw of each (read, or
    /// the answer to its own write of the workload) unless it wrote that kind since: the
    /// status is display only, and reading both again after the pass's journal appends cost
    /// a GET and a LIST, the slowest read, while the pass still held its reconcile slot.
    /// Otherwise (a cached pass, `--test-fresh-reads`, a kind not seen or written since) they
    /// are read as planning reads.
    async fn status_inputs(&self) -> Result<(Option<workload::LiveWorkload>, Vec<Pod>), Error> {
        let seen = self.reads.as_ref();
        let live = match seen
            .and_then(|r| r.last_seen::<Option<workload::LiveWorkload>>(self.workload_resource()))
        {
            Some(w) => w,
            None => self.workload().await?,
        };
        let pods = match seen.and_then(|r| r.last_seen::<Vec<Pod>>("pods")) {
            Some(p) => p,
            None => self.pods().await?,
        };
        Ok((live, pods))
    }
}

/// Inside a planning cached pass's open decision (`crate::pass::decision`): the reads that
/// guard its own write, or that a decision is made from fresh, go to the API server.
fn guarding() -> bool {
    crate::pass::cached().is_some_and(|e| e.deciding())
}

/// [`Run::reread`] from its parts: for a read sent while the pass's run is held by its
/// journal append ([`drive::GuardReads`]).
pub(crate) async fn reread<K: crate::watches::Cached>(
    cache: Option<&crate::watches::NsCache>,
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<K>, Error> {
    // Inside a planning pass's decision the re-read guards that pass's own write: it
    // goes to the API server.
    if let Some(cache) = cache.filter(|_| !guarding()) {
        if let Some(obj) = K::store(cache).get(name) {
            return Ok(Some(obj));
        }
    }
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ctx(|| format!("reading {} {name}", K::kind(&())))
}

/// The key of a labelled list in a pass's reads.
fn list_key<K: crate::watches::Cached>(label: &str, uid: &str) -> String {
    format!("{}?{label}={uid}", K::kind(&()))
}

/// Owned (docs/design.md "Terms"): the fleet label with this fleet's UID and no owner references.
/// (Deletion state is checked by callers: deleting owned objects are still ours.)
pub(crate) fn owned<K: Resource>(obj: &K, uid: &str) -> bool {
    let m = obj.meta();
    m.labels
        .as_ref()
        .and_then(|l| l.get(FLEET_UID_LABEL))
        .map(String::as_str)
        == Some(uid)
        && m.owner_references.as_ref().is_none_or(Vec::is_empty)
}

/// How soon to look again.
pub enum Next {
    /// Soon: something is moving (an open operation, a wait).
    Soon,
    /// Blocked on a person or on an object the operator does not watch (a ServiceAccount, a
    /// StorageClass, a foreign object): look again after [`BLOCKED`]; changes of the fleet
    /// and of watched objects still trigger at once.
    Blocked,
    /// At the slow resync.
    Later,
    /// After exactly this long (a contended fleet refreshes its installation record in time).
    After(Duration),
}

/// Which pass ran a reconcile (`crate::pass`), for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassKind {
    /// Ended in the cached pass: zero requests.
    Cached,
    /// Ended in the cached pass, which found nothing to do but a changed status and sent
    /// that one request (guarded by the cached fleet's resourceVersion).
    Status,
    /// Ended in a planning cached pass that decided or carried out an operation itself
    /// (docs/design.md "Cache-planned operations"): planned from the caches, its journal
    /// appends and its one guarded workload write sent, each with its precondition.
    Planned,
    /// Ran from fresh reads (after an escalated cached pass, or without one).
    Fresh,
    /// Not run: the cached fleet is older than a write this process made to it, whose watch
    /// event brings the next reconcile ([`crate::own_writes`]); zero requests.
    Stale,
}

/// Reconciles one fleet; returns when to look again and which pass decided it.
/// `cached` is the controller's copy of the fleet: with it, and with the namespace's caches
/// ready, the reconcile first runs as a cached pass (`crate::pass`) and only escalates to a
/// fresh pass when that one needs a request.
pub async fn reconcile(
    ns: &str,
    name: &str,
    ctx: &Ctx,
    cached: Option<&CelldFleet>,
) -> (Result<Next, Error>, PassKind) {
    let cache = match (cached, &ctx.watches) {
        (Some(_), Some(w)) if !ctx.fresh_reads => w.cache(ns),
        _ => None,
    };
    // A copy this process's own write has replaced: the write's watch event brings the
    // reconcile of the newer copy (the store holds it before the event triggers), so this one
    // decides nothing. A later look backs that up should the event not come.
    if let Some(fleet) = cached.filter(|_| !ctx.fresh_reads) {
        if let Some(left) = ctx.own_writes.outdates(
            &format!("{ns}/{name}"),
            fleet.metadata.resource_version.as_deref(),
            std::time::Instant::now(),
        ) {
            tracing::debug!(fleet = %format!("{ns}/{name}"), rv = ?fleet.metadata.resource_version, "cached fleet older than this process's own write; left to its watch event");
            return (Ok(Next::After(left)), PassKind::Stale);
        }
    }
    if let (Some(fleet), Some(cache)) = (cached, cache) {
        let esc = std::sync::Arc::new(if ctx.cache_planning {
            crate::pass::Escalation::planning()
        } else {
            crate::pass::Escalation::default()
        });
        let pass = Pass {
            client: if ctx.cache_planning {
                crate::pass::planning_client(esc.clone(), ctx.client.clone())
            } else {
                crate::pass::refusing_client(esc.clone())
            },
            cache: Some(cache),
            fleet: Some(fleet.clone()),
            reads: None,
            stores: None,
        };
        // Boxed, as the fresh pass below: each pass's state is tens of KB, and a pass that
        // plans runs as deep as a fresh one (a debug build overflowed a worker's stack).
        let result =
            crate::pass::scope(esc.clone(), Box::pin(reconcile_pass(ns, name, ctx, pass))).await;
        if let Some(left) = esc.stale_for() {
            tracing::debug!(fleet = %format!("{ns}/{name}"), "cached workload older than this process's own write; left to its watch event");
            // A planning pass that issued its effect and then found the cached workload
            // older than that write leaves the status to the write's watch event.
            let kind = if esc.wrote() {
                PassKind::Planned
            } else {
                PassKind::Stale
            };
            return (Ok(Next::After(left)), kind);
        }
        match esc.cause() {
            None if esc.wrote() => return (result, PassKind::Planned),
            None if esc.sent_status() => return (result, PassKind::Status),
            None => return (result, PassKind::Cached),
            Some(cause) => {
                tracing::debug!(fleet = %format!("{ns}/{name}"), cause, "cached pass escalated");
                ctx.metrics.escalated(&cause);
            }
        }
    } else if cached.is_some() && ctx.watches.is_some() && !ctx.fresh_reads {
        ctx.metrics.escalated("caches not ready");
    }
    // The design before the caches (`--test-fresh-reads`) reads every time, as it did.
    let reads = (!ctx.fresh_reads)
        .then(|| std::sync::Arc::new(crate::pass_reads::PassReads::new(!ctx.forget_all_on_write)));
    let pass = Pass {
        client: match &reads {
            Some(r) => crate::pass_reads::observing_client(ctx.client.clone(), r.clone()),
            None => ctx.client.clone(),
        },
        cache: None,
        fleet: None,
        reads: reads.clone(),
        stores: match &ctx.watches {
            Some(w) if !ctx.fresh_reads => w.cache(ns),
            _ => None,
        },
    };
    let result = Box::pin(reconcile_pass(ns, name, ctx, pass)).await;
    if let Some(r) = &reads {
        ctx.metrics.pass_reads_reused.inc_by(r.reused());
        tracing::debug!(fleet = %format!("{ns}/{name}"), reused = r.reused(), forgotten = r.forgotten(), "fresh pass done");
    }
    (result, PassKind::Fresh)
}

/// What one pass reads with.
struct Pass {
    client: Client,
    cache: Option<crate::watches::NsCache>,
    /// The fleet as cached (a cached pass); `None`: read fresh.
    fleet: Option<CelldFleet>,
    /// A fresh pass's planning reads (`crate::pass_reads`).
    reads: Option<std::sync::Arc<crate::pass_reads::PassReads>>,
    /// A fresh pass's view of the namespace's stores ([`Run::stores`]).
    stores: Option<crate::watches::NsCache>,
}

async fn reconcile_pass(ns: &str, name: &str, ctx: &Ctx, pass: Pass) -> Result<Next, Error> {
    let api: Api<CelldFleet> = Api::namespaced(pass.client.clone(), ns);
    // Fresh read (in a fresh pass): appends are compare-and-swaps on the newest
    // resourceVersion; a cached pass appends nothing.
    let fleet = match pass.fleet {
        Some(f) => Some(f),
        None => api
            .get_opt(name)
            .await
            .ctx(|| format!("reading fleet {ns}/{name}"))?,
    };
    let Some(fleet) = fleet else {
        // Gone: its metric series go with it.
        ctx.metrics.forget_fleet(&crate::metrics::FleetLabels {
            namespace: ns.to_string(),
            fleet: name.to_string(),
        });
        if let Some(watch) = &ctx.watches {
            watch.forget(ns, name);
        }
        ctx.own_writes.forget(ns, name);
        ctx.status_pace.forget(&format!("{ns}/{name}"));
        return Ok(Next::Later);
    };
    let uid = fleet.uid().unwrap_or_default();
    if let Some(watch) = &ctx.watches {
        watch.track(ns, name, &uid);
    }
    // Repairs of a journal that may not load are consumed before it is loaded.
    let fleet = match integrity::consume_repair(ctx, &api, fleet).await? {
        Some(f) => f,
        None => return Ok(Next::Soon),
    };
    let old_status = fleet.status.clone().unwrap_or_default();
    let (journal, unusable) = match integrity::load(ctx, &fleet) {
        Ok(j) => (j, None),
        Err(report) => (journal::Journal::new(uid.clone()), Some(report)),
    };
    let mut run = Run {
        ctx,
        client: pass.client,
        cache: pass.cache,
        api,
        fleet,
        journal,
        now: Utc::now(),
        ns: ns.into(),
        name: name.into(),
        uid,
        journal_unusable: unusable.is_some(),
        requeue: None,
        reads: pass.reads,
        stores: pass.stores,
        next_victim: None,
        guard_reads: None,
    };
    if !run.journal_unusable {
        run.ensure_mirrored().await?;
    }
    // 2. Another operator installation on this fleet stops everything, deletion included.
    // (Its errors, a 403 included, are reported like those of the steps.)
    let steps = match (foreign::check(&mut run).await, unusable) {
        (Err(e), _) => Err(e),
        (Ok(Some(report)), _) => Ok(report),
        // A deleted fleet is not held hostage by a damaged or missing journal: its deletion
        // runs in a fresh journal that keeps the claims (integrity.rs).
        (Ok(None), Some(_)) if run.fleet.meta().deletion_timestamp.is_some() => {
            delete::drive(&mut run).await
        }
        (Ok(None), Some(report)) => Ok(report),
        (Ok(None), None) => reconcile_steps(&mut run).await,
    };
    let report = match steps {
        Ok(r) => r,
        // Creating in a namespace that is being deleted is refused with 403 too; that is not
        // a missing Role: the fleet's own deletion follows, and the pass looks again soon.
        Err(Error::Kube { source: kube::Error::Api(s), context }) if namespace_terminating(&s) => {
            Report::progress(format!(
                "Namespace {} is being deleted, so nothing new can be created there ({context}); \
                 the fleet is deleted with it",
                run.ns
            ))
        }
        Err(Error::Kube { source: kube::Error::Api(s), context }) if s.code == 403 => Report::blocked(
            &reasons::NAMESPACE_ACCESS_DENIED,
            format!(
                "The operator's Role is missing in namespace {} ({context}: forbidden); apply the fleet-namespace Role \
                 and RoleBinding there (chart value fleetNamespaces)",
                run.ns
            ),
        ),
        Err(Error::Append(journal_store::AppendError::Stage(journal::StageError::OverBudget(o)))) => {
            Report::blocked(
                &reasons::JOURNAL_OVER_BUDGET,
                format!(
                    "The journal needs {} bytes to keep what compaction must keep; the budget is {} (--journal-annotation-bytes): {}",
                    o.smallest, o.budget, o.why
                ),
            )
        }
        Err(e) => return Err(e),
    };
    if run.fleet.meta().deletion_timestamp.is_some()
        && !run
            .fleet
            .finalizers()
            .iter()
            .any(|f| f == crate::api::keys::LIFECYCLE_FINALIZER)
    {
        return Ok(Next::Later);
    }
    // Without the namespace Role nothing there can be read: report from the fleet alone.
    let (live, pods) = if report.reason == reasons::NAMESPACE_ACCESS_DENIED.name {
        (None, Vec::new())
    } else {
        run.status_inputs().await?
    };
    // A cached pass that got this far without escalating found nothing to do but, perhaps,
    // a changed status: it sends that one request itself, guarded by the cached fleet's
    // resourceVersion (a fleet that moved on answers 409 and its watch event brings the next
    // reconcile). A status whose storing is announced with an Event is left to a fresh pass.
    let status_api = match crate::pass::cached() {
        Some(esc) if !esc.escalated() => {
            if integrity::announces(&old_status, &report) {
                esc.escalate(|| "create events (Blocked)".into());
                None
            } else {
                Some((esc, Api::namespaced(ctx.client.clone(), ns)))
            }
        }
        _ => None,
    };
    // Progress-only changes (member counts, condition messages) are written at a pace
    // (`crate::status_pace`): within the interval after this fleet's last status write they
    // wait, and the reconcile looks again when it ends.
    let pace_key = format!("{ns}/{name}");
    let (status, stored) = status::write(
        status_api.as_ref().map_or(&run.api, |(_, api)| api),
        &run.fleet,
        &status::Seen {
            journal: (!run.journal_unusable).then_some(&run.journal),
            budget: run.ctx.budget,
            pods: &pods,
            live: live.as_ref(),
            report: &report,
        },
        ctx.status_pace.wait(&pace_key, std::time::Instant::now()),
    )
    .await?;
    if let Some((esc, _)) = &status_api {
        if stored.sent() {
            esc.status_sent();
        }
    }
    match stored {
        status::Stored::Written => {
            run.wrote_fleet(run.fleet.metadata.resource_version.as_deref());
            ctx.status_pace.wrote(&pace_key, std::time::Instant::now());
        }
        status::Stored::Deferred(_) => {
            ctx.metrics.status_deferred.inc();
        }
        _ => {}
    }
    if let Some(after) = status_requeue(stored) {
        run.requeue = Some(run.requeue.map_or(after, |r| r.min(after)));
    }
    if stored.held() {
        // Announced only once the Blocked condition it reports is stored: a status write
        // that lost a race is redone (and announced) by the next reconcile, never twice.
        integrity::announce_blocked(&run, &old_status, &report).await;
    }
    record_metrics(&run, &status);
    run.self_fence_events(&pods).await;
    Ok(
        match (report.class, run.journal.fold().current().is_some()) {
            _ if report.reason == reasons::FOREIGN_OPERATOR.name => {
                Next::After(ctx.foreign_window / 4)
            }
            _ if run.requeue.is_some() => Next::After(run.requeue.unwrap_or(SOON)),
            (Class::Done, false) => Next::Later,
            (Class::Blocked | Class::BlockedInfraReady, _) => Next::Blocked,
            _ => Next::Soon,
        },
    )
}

/// How soon a reconcile looks again because of how its status write went (`None`: no reason
/// of its own). A progress-only change waits for the rest of its pace interval. A status
/// answered 409 (the fleet moved on since the copy it was computed from) is written by the
/// reconcile that the fleet's watch event brings, at once, and that reconcile's requeue
/// replaces this one; [`SOON`] is the bound if no event comes (a watch that lags, or a 409 that
/// changed nothing), instead of the slow resync.
fn status_requeue(stored: status::Stored) -> Option<Duration> {
    match stored {
        status::Stored::Deferred(wait) => Some(wait),
        status::Stored::Conflict => Some(SOON),
        status::Stored::Unchanged | status::Stored::Written => None,
    }
}

use kube::Resource;

/// Fleet and journal gauges from the status just computed (docs/design.md "Events and metrics").
fn record_metrics(run: &Run<'_>, st: &crate::api::CelldFleetStatus) {
    let m = &run.ctx.metrics;
    let l = crate::metrics::FleetLabels {
        namespace: run.ns.clone(),
        fleet: run.name.clone(),
    };
    m.desired
        .get_or_create(&l)
        .set(i64::from(st.desired_replicas.unwrap_or(0)));
    m.applied
        .get_or_create(&l)
        .set(i64::from(st.applied_replicas.unwrap_or(0)));
    m.observed
        .get_or_create(&l)
        .set(i64::from(st.observed_replicas.unwrap_or(0)));
    m.ready
        .get_or_create(&l)
        .set(i64::from(st.ready_replicas.unwrap_or(0)));
    m.joining
        .get_or_create(&l)
        .set(i64::from(st.joining_replicas.unwrap_or(0)));
    m.terminating
        .get_or_create(&l)
        .set(i64::from(st.terminating_replicas.unwrap_or(0)));
    m.observation_valid
        .get_or_create(&l)
        .set(i64::from(st.replica_observation_valid.unwrap_or(false)));
    let blocked_since = st
        .blocked_since
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    m.blocked
        .get_or_create(&l)
        .set(i64::from(blocked_since.is_some()));
    m.blocked_age.get_or_create(&l).set(
        blocked_since
            .map(|t| (Utc::now() - t.with_timezone(&Utc)).num_seconds())
            .unwrap_or(0),
    );
    if run.journal_unusable {
        // Keep the journal gauges at their last values: the fresh placeholder says nothing.
        return;
    }
    let p = run.journal.projection(run.ctx.budget);
    m.open_operations
        .get_or_create(&l)
        .set(p.open_operations as i64);
    m.stalled_operations
        .get_or_create(&l)
        .set(p.stalled_operations as i64);
    m.journal_bytes.get_or_create(&l).set(p.journal.bytes);
}

async fn reconcile_steps(run: &mut Run<'_>) -> Result<Report, Error> {
    // An operation found open by this process's first look is a replay (after a restart or
    // a leader change): it is resumed, never re-planned.
    let first_look = run
        .ctx
        .seen
        .lock()
        .map(|mut s| s.insert(run.uid.clone()))
        .unwrap_or(false);
    if first_look && run.journal.fold().current().is_some() {
        run.ctx
            .metrics
            .replays
            .get_or_create(&crate::metrics::FleetLabels {
                namespace: run.ns.clone(),
                fleet: run.name.clone(),
            })
            .inc();
    }
    // 3. Consume a journal command in any state.
    if let Some(value) = run
        .fleet
        .annotations()
        .get(JOURNAL_COMMAND_ANNOTATION)
        .cloned()
    {
        drive::consume_command(run, &value).await?;
    }
    // 4. Replacement holds, before the pause, deletion and prerequisite gates, so an
    // operator finalizer never keeps a Pod alive.
    if let Some(report) = replace::resolve_holds(run).await? {
        return Ok(report);
    }
    // 5. Deletion, regardless of pause or configuration errors.
    if run.fleet.meta().deletion_timestamp.is_some() {
        return delete::drive(run).await;
    }
    // 6. Validate.
    let violations = crate::validate::validate(&run.name, &run.fleet.spec);
    if let Some(first) = violations.first() {
        let more = if violations.len() > 1 {
            format!(" (and {} more)", violations.len() - 1)
        } else {
            String::new()
        };
        return Ok(Report::blocked(
            &reasons::INVALID_CONFIGURATION,
            format!("{first}{more}"),
        ));
    }
    // 7. Finalizer.
    prereq::ensure_finalizer(run).await?;
    prefetch(run).await;
    // 8. Gates.
    if let Some(report) = prereq::gates(run).await? {
        return Ok(report);
    }
    // 9. Zone gates of Ordered Bucket Pods, even while paused.
    if let Some(report) = zone_gate::release(run).await? {
        return Ok(report);
    }
    // 10. Drive the open operation (also while paused once issued). When it closes here
    // (completed, canceled, abandoned), the steps below go on in the same reconcile and the
    // next operation is planned at once from fresh reads, instead of one wake-up later.
    let paused = run
        .fleet
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| m.paused);
    // 15. (here, so it also runs while an operation is open) Confirm the deletion of members
    // stuck terminating on a node that cannot; never while paused.
    if !paused {
        heal::force_delete_stuck(run).await?;
    }
    if run.journal.fold().current().is_some() {
        let report = Box::pin(drive::drive_open(run)).await?;
        if run.journal.fold().current().is_some() {
            // A replacement request that has to wait says why, unless the open operation is
            // blocked: that needs a person first, and its report must not be hidden (the
            // request waits for it either way).
            let blocked = matches!(
                report.class,
                status::Class::Blocked | status::Class::BlockedInfraReady
            );
            if !blocked {
                if let Some(Err(why)) = replace::admin_request(run).await? {
                    return Ok(Report::blocked(&reasons::REPLACEMENT_REFUSED, why));
                }
            }
            return Ok(report);
        }
    }
    // 11. Pause.
    if run
        .fleet
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| m.paused)
    {
        if let Some(Err(why)) = replace::admin_request(run).await? {
            return Ok(Report::blocked(&reasons::REPLACEMENT_REFUSED, why));
        }
        return Ok(Report::blocked(
            &reasons::MAINTENANCE_PAUSED,
            "Paused: no operation starts and no member is healed".into(),
        ));
    }
    // 12. NetworkPolicy, PDB, Services.
    if let Some(report) = prereq::converge(run).await? {
        return Ok(report);
    }
    // 13.–16. Image, ownership, plan.
    Box::pin(drive::plan_and_open(run)).await
}

/// Sends at once the planning reads a fresh pass's steps make one after another (docs/design.md
/// "Reads of a fresh pass"): the workload, the member Pods and, with no operation open, the
/// ServiceAccount, the StorageClass and (PersistentFleet) the claims at the member names the
/// gates and the planner look at. Each answer is kept in
/// the pass's record, where the steps find it, so what they read and decide is unchanged; only
/// the waiting is shared. An error is not kept: the step that needs the read sends it again and
/// handles the error as before. Not in a cached pass, with `--test-fresh-reads` (no record) or
/// with `--test-no-prefetch`.
async fn prefetch(run: &Run<'_>) {
    if !run.ctx.prefetch || run.reads.is_none() || run.is_cached() {
        return;
    }
    let spec = &run.fleet.spec;
    let persistent = spec.profile == crate::api::Profile::PersistentFleet;
    // With no operation open the pass goes on to the gates and the planner.
    let idle = run.journal.fold().current().is_none();
    let claims: Vec<i32> = if persistent && idle {
        (0..spec.replicas.max(0)).collect()
    } else {
        Vec::new()
    };
    let class = spec.storage.storage_class_name.clone().unwrap_or_default();
    let _ = futures::join!(
        run.workload(),
        run.pods(),
        futures::future::join_all(claims.iter().map(|i| run.claim_at(*i))),
        async {
            if idle {
                let _ = run.service_account_exists(&spec.service_account_name).await;
                if persistent {
                    let _ = run.storage_class(&class).await;
                }
            }
        }
    );
}

/// Whether a refusal is the API server's NamespaceLifecycle admission turning away new
/// content in a namespace that is being deleted (403, "... because it is being terminated").
pub(crate) fn namespace_terminating(s: &kube::core::Status) -> bool {
    s.code == 403 && s.message.contains("because it is being terminated")
}

#[cfg(test)]
mod refusal_tests {
    use super::namespace_terminating;

    fn refused(code: u16, message: &str) -> kube::core::Status {
        serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "Forbidden", "message": message
        }))
        .unwrap()
    }

    #[test]
    fn a_terminating_namespace_is_told_apart_from_a_missing_role() {
        assert!(namespace_terminating(&refused(
            403,
            "networkpolicies.networking.k8s.io \"kappa\" is forbidden: unable to create new \
             content in namespace ns-1 because it is being terminated"
        )));
        assert!(!namespace_terminating(&refused(
            403,
            "networkpolicies.networking.k8s.io is forbidden: User \"system:serviceaccount:op:celld\" \
             cannot create resource \"networkpolicies\" in API group \"networking.k8s.io\" in the \
             namespace \"ns-1\""
        )));
        assert!(!namespace_terminating(&refused(
            409,
            "because it is being terminated"
        )));
    }
}

#[cfg(test)]
mod mirror_tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;

    #[test]
    fn a_mirror_write_that_failed_is_told_apart_from_other_append_failures() {
        let mirror = Error::Append(journal_store::AppendError::Mirror(
            journal::MirrorError::NotADirectory {
                path: "/var/lib/celld-operator/journal".into(),
            },
        ));
        assert_eq!(mirror.category(), "JournalMirrorFailed");
        let incomplete = Error::Append(journal_store::AppendError::Incomplete("a resourceVersion"));
        assert_eq!(incomplete.category(), "JournalAppendFailed");
        for e in [&mirror, &incomplete] {
            assert!(ERROR_CATEGORIES.contains(&e.category()), "{}", e.category());
        }
    }

    #[tokio::test]
    async fn the_mirror_size_on_disk_is_published() {
        let (service, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut ctx = pass_reads_tests::ctx(Client::new(service, "default"));
        ctx.note_mirror_size();
        assert_eq!(ctx.metrics.journal_mirror_disk_bytes.get(), 0, "no mirror");
        let dir = tempfile::tempdir().unwrap();
        let mirror = Mirror::open(dir.path().join("journal"), Default::default()).unwrap();
        let bytes = mirror.size_on_disk().unwrap();
        assert!(bytes > 0);
        ctx.mirror = Some(mirror);
        ctx.note_mirror_size();
        assert_eq!(ctx.metrics.journal_mirror_disk_bytes.get(), bytes as i64);
    }
}

/// Requeue delays.
pub const SOON: Duration = Duration::from_secs(2);
/// Slow resync.
pub const LATER: Duration = Duration::from_secs(600);

/// Re-check interval of a blocked fleet.
pub const BLOCKED: Duration = Duration::from_secs(30);

#[cfg(test)]
pub(crate) mod pass_reads_tests {
    //! A fresh pass's reads through `Run` against a mock API server that pins every request:
    //! planning reads are sent once between writes, re-reads always, a write empties the
    //! record (docs/design.md "Reads of a fresh pass").
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::sync::Arc;
    use tower_test::mock;

    pub(crate) fn ctx(client: Client) -> Ctx {
        Ctx {
            client,
            render: RenderSettings::default(),
            network_policy_enforced: true,
            operation_deadline: None,
            budget: Budget::default(),
            mirror: None,
            leader: Leader {
                identity: "test".into(),
                lease_transitions: 0,
                lease: None,
            },
            leadership: None,
            recorder: None,
            metrics: Arc::new(crate::metrics::Metrics::new()),
            seen: Default::default(),
            gates_verified: Default::default(),
            error_streaks: Default::default(),
            restart_baseline: Default::default(),
            watches: None,
            replan_backoff: Default::default(),
            foreign_window: Duration::from_secs(60),
            healing: heal::Timings::default(),
            announced: Default::default(),
            foreign_reported: Default::default(),
            fresh_reads: false,
            reconciled: Default::default(),
            own_writes: Default::default(),
            status_pace: Default::default(),
            triggers: Default::default(),
            slots: None,
            prefetch: true,
            forget_all_on_write: false,
            cache_planning: true,
        }
    }

    fn fleet() -> CelldFleet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
            "metadata": {"name": "f", "namespace": "ns", "uid": "u-1", "resourceVersion": "1"},
            "spec": {"profile": "PersistentFleet", "runtimeImage": "img@sha256:1", "replicas": 2,
                     "serviceAccountName": "celld",
                     "placement": {"zones": ["us-east-1a"], "azCount": 1, "mode": "Relaxed"},
                     "storage": {"bucket": "b", "region": "us-east-1", "sizeGiB": 1}}
        }))
        .unwrap()
    }

    /// A fresh pass's `Run` of fleet `ns/f` with `client`.
    fn test_run<'a>(
        ctx: &'a Ctx,
        client: Client,
        fleet: CelldFleet,
        reads: Option<Arc<crate::pass_reads::PassReads>>,
    ) -> Run<'a> {
        Run {
            ctx,
            client: client.clone(),
            cache: None,
            api: Api::namespaced(client, "ns"),
            fleet,
            journal: Journal::new("u-1"),
            now: Utc::now(),
            ns: "ns".into(),
            name: "f".into(),
            uid: "u-1".into(),
            journal_unusable: false,
            requeue: None,
            reads,
            stores: None,
            next_victim: None,
            guard_reads: None,
        }
    }

    /// What the mock server `server` saw, once every client is gone (within 10 s); `what`
    /// names the requests expected (a server still waiting for one fails).
    async fn served(server: tokio::task::JoinHandle<Vec<String>>, what: &str) -> Vec<String> {
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the mock server finished")
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    fn answer(body: serde_json::Value) -> Response<Body> {
        Response::new(Body::from(body.to_string().into_bytes()))
    }

    fn sts(rv: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "f", "namespace": "ns", "resourceVersion": rv}})
    }

    fn pod(name: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": {FLEET_UID_LABEL: "u-1"}}})
    }

    /// The API server's side of a mock.
    type MockServer = mock::Handle<Request<Body>, Response<Body>>;

    /// A mock API server's handle, a client to it, and a fresh pass's record of reads with
    /// the pass's observing client over that client.
    fn observed_mock() -> (
        MockServer,
        Client,
        Arc<crate::pass_reads::PassReads>,
        Client,
    ) {
        let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let inner = Client::new(svc, "ns");
        let reads = Arc::new(crate::pass_reads::PassReads::default());
        let client = crate::pass_reads::observing_client(inner.clone(), reads.clone());
        (handle, inner, reads, client)
    }

    #[tokio::test]
    async fn planning_reads_are_sent_once_between_writes_and_rereads_always() {
        let (mut handle, inner, reads, client) = observed_mock();
        let ctx = ctx(inner);
        let run = test_run(&ctx, client, fleet(), Some(reads.clone()));
        // The API server's side: every request the pass sends, in order.
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for answer_with in [
                answer(sts("10")),
                answer(serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                    "metadata": {"resourceVersion": "5"}, "items": [pod("f-0"), pod("f-1")]})),
                answer(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "f-9", "namespace": "ns"}})),
                answer(sts("11")),
                answer(sts("12")),
                answer(sts("13")),
                answer(sts("13")),
            ] {
                let (req, send) = handle.next_request().await.expect("a request");
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(answer_with);
            }
            seen
        });
        let rv =
            |w: Option<workload::LiveWorkload>| w.and_then(|w| w.meta().resource_version.clone());
        // Planning reads: the workload once, the Pods list once; a member by name from the
        // list; a name the list lacks (maybe foreign) from the API server.
        assert_eq!(rv(run.workload().await.unwrap()).as_deref(), Some("10"));
        assert_eq!(rv(run.workload().await.unwrap()).as_deref(), Some("10"));
        assert_eq!(run.pods().await.unwrap().len(), 2);
        assert_eq!(run.pods().await.unwrap().len(), 2);
        let member = run.get_opt::<Pod>("f-1").await.unwrap().unwrap();
        assert_eq!(member.metadata.name.as_deref(), Some("f-1"));
        assert!(run.get_opt::<Pod>("f-9").await.unwrap().is_some());
        // The guarded write's re-read goes out although the record holds the workload.
        assert_eq!(
            rv(run.reread_workload().await.unwrap()).as_deref(),
            Some("11")
        );
        assert_eq!(
            rv(run.workload().await.unwrap()).as_deref(),
            Some("10"),
            "the record is unchanged by a re-read"
        );
        // A write of the pass (here: the workload's replace) empties the record.
        let mut w = run.reread_workload().await.unwrap().unwrap();
        w.set_replicas(3);
        workload::replace(&run.client, "ns", &w).await.unwrap();
        assert_eq!(rv(run.workload().await.unwrap()).as_deref(), Some("13"));
        // Every client gone: a server still waiting for a request fails instead of hanging.
        drop(run);
        drop(ctx);
        let seen = served(
            server,
            "every request the pass was expected to send was sent",
        )
        .await;
        assert_eq!(
            seen,
            [
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
                "GET /api/v1/namespaces/ns/pods",
                "GET /api/v1/namespaces/ns/pods/f-9",
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
                "PUT /apis/apps/v1/namespaces/ns/statefulsets/f",
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
            ]
        );
        assert!(reads.reused() >= 4, "reused {}", reads.reused());
    }

    /// A write of a fresh pass forgets only what the pass read of the written kind: after a
    /// journal append (a write to the fleet) the workload and Pods are answered from the
    /// pass's reads. The status at the end of the pass is computed from what the pass last
    /// saw of its workload and Pods: a write to the same kind makes it read again, and the
    /// workload's own write leaves its answer (docs/design.md "Reads of a fresh pass", "The
    /// status of a fresh pass"). `--test-forget-all-on-write` and `--test-fresh-reads` read
    /// both again, as before.
    #[tokio::test]
    async fn a_write_forgets_its_own_kind_and_the_status_uses_what_the_pass_last_saw() {
        let (mut handle, inner, reads, client) = observed_mock();
        let ctx = ctx(inner.clone());
        let run = test_run(&ctx, client, fleet(), Some(reads.clone()));
        let list = |names: &[&str]| {
            serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "5"},
                "items": names.iter().map(|n| pod(n)).collect::<Vec<_>>()})
        };
        let fleet_json = || serde_json::to_value(fleet()).unwrap();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for answer_with in [
                answer(sts("10")),
                answer(list(&["f-0", "f-1"])),
                answer(fleet_json()),
                answer(pod("f-1")),
                answer(list(&["f-0"])),
                answer(sts("11")),
                // --test-forget-all-on-write: the reads, the append, both read again.
                answer(sts("12")),
                answer(list(&["f-0"])),
                answer(fleet_json()),
                answer(sts("13")),
                answer(list(&["f-0"])),
                // --test-fresh-reads: both read.
                answer(sts("14")),
                answer(list(&["f-0"])),
            ] {
                let (req, send) = handle.next_request().await.expect("a request");
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(answer_with);
            }
            seen
        });
        let rv = |w: &Option<workload::LiveWorkload>| {
            w.as_ref()
                .and_then(|w| w.meta().resource_version.clone())
                .unwrap_or_default()
        };
        let append = |run: &Run<'_>| {
            let api = run.api.clone();
            async move {
                api.patch(
                    "f",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(serde_json::json!({})),
                )
                .await
                .unwrap();
            }
        };
        let mut live = run.workload().await.unwrap();
        assert_eq!(run.pods().await.unwrap().len(), 2);
        // A journal append (a write to the fleet): nothing is read again, for planning or
        // for the status.
        append(&run).await;
        assert_eq!(rv(&run.workload().await.unwrap()), "10");
        assert_eq!(run.pods().await.unwrap().len(), 2);
        let (w, pods) = run.status_inputs().await.unwrap();
        assert_eq!((rv(&w).as_str(), pods.len()), ("10", 2));
        // A Pod deleted by the pass: its Pods are listed again, its workload is not.
        Api::<Pod>::namespaced(run.client.clone(), "ns")
            .delete("f-1", &Default::default())
            .await
            .unwrap();
        let (w, pods) = run.status_inputs().await.unwrap();
        assert_eq!((rv(&w).as_str(), pods.len()), ("10", 1));
        // The workload's own write: its answer is what the status shows.
        let w = live.as_mut().unwrap();
        w.set_replicas(3);
        run.replace_workload(w).await.unwrap();
        let (w, pods) = run.status_inputs().await.unwrap();
        assert_eq!((rv(&w).as_str(), pods.len()), ("11", 1));
        drop(run);

        // `--test-forget-all-on-write`: the append forgets everything; the status reads again.
        let reads = Arc::new(crate::pass_reads::PassReads::new(false));
        let client = crate::pass_reads::observing_client(inner.clone(), reads.clone());
        let run = test_run(&ctx, client, fleet(), Some(reads));
        assert_eq!(rv(&run.workload().await.unwrap()), "12");
        assert_eq!(run.pods().await.unwrap().len(), 1);
        append(&run).await;
        let (w, pods) = run.status_inputs().await.unwrap();
        assert_eq!((rv(&w).as_str(), pods.len()), ("13", 1));
        drop(run);

        // `--test-fresh-reads` keeps no record: the status reads both.
        let run = test_run(&ctx, inner, fleet(), None);
        let (w, pods) = run.status_inputs().await.unwrap();
        assert_eq!((rv(&w).as_str(), pods.len()), ("14", 1));
        drop(run);
        drop(ctx);
        let seen = served(server, "every request expected was sent").await;
        let (sts_get, pods_list, append_patch) = (
            "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
            "GET /api/v1/namespaces/ns/pods",
            "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
        );
        assert_eq!(
            seen,
            [
                sts_get,
                pods_list,
                append_patch,
                "DELETE /api/v1/namespaces/ns/pods/f-1",
                pods_list,
                "PUT /apis/apps/v1/namespaces/ns/statefulsets/f",
                sts_get,
                pods_list,
                append_patch,
                sts_get,
                pods_list,
                sts_get,
                pods_list,
            ]
        );
    }

    /// The planning reads of a fresh pass go out at once, and the steps find them kept.
    #[tokio::test]
    async fn a_fresh_pass_sends_its_planning_reads_at_once_and_finds_them_kept() {
        let (mut handle, inner, reads, client) = observed_mock();
        let ctx = ctx(inner);
        let mut f = fleet();
        f.spec.storage.storage_class_name = Some("sc".into());
        let run = test_run(&ctx, client, f, Some(reads.clone()));
        let claim = |i: i32| crate::render::claim_name("f", i);
        let (c0, c1) = (claim(0), claim(1));
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..6 {
                let (req, send) = handle.next_request().await.expect("a request");
                let path = req.uri().path().to_string();
                let name = path.rsplit('/').next().unwrap_or_default().to_string();
                let body = if path.ends_with("/statefulsets/f") {
                    sts("10")
                } else if path.ends_with("/pods") {
                    serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": "5"}, "items": [pod("f-0"), pod("f-1")]})
                } else if path.contains("/persistentvolumeclaims/") {
                    serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": name, "namespace": "ns"}})
                } else if path.ends_with("/serviceaccounts/celld") {
                    serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "celld", "namespace": "ns"}})
                } else {
                    serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                        "metadata": {"name": name}, "provisioner": "hostpath.csi.k8s.io"})
                };
                seen.push(format!("{} {path}", req.method()));
                send.send_response(answer(body));
            }
            seen
        });
        prefetch(&run).await;
        // What the gates and the planner read next is answered from the record: a request
        // now would find no server and fail.
        assert!(run.workload().await.unwrap().is_some());
        assert_eq!(run.pods().await.unwrap().len(), 2);
        assert!(run.claim_at(0).await.unwrap().is_some());
        assert!(run.claim_at(1).await.unwrap().is_some());
        assert!(run.service_account_exists("celld").await.unwrap());
        assert!(run.storage_class("sc").await.unwrap().is_some());
        let mut seen = served(server, "every read was sent").await;
        seen.sort();
        let mut want = vec![
            "GET /apis/apps/v1/namespaces/ns/statefulsets/f".to_string(),
            "GET /api/v1/namespaces/ns/pods".into(),
            format!("GET /api/v1/namespaces/ns/persistentvolumeclaims/{c0}"),
            format!("GET /api/v1/namespaces/ns/persistentvolumeclaims/{c1}"),
            "GET /api/v1/namespaces/ns/serviceaccounts/celld".into(),
            "GET /apis/storage.k8s.io/v1/storageclasses/sc".into(),
        ];
        want.sort();
        assert_eq!(seen, want);
        assert!(reads.reused() >= 6, "reused {}", reads.reused());
        drop(run);

        // `--test-no-prefetch`: nothing is sent (a request would wait for a server forever).
        let (svc, _handle) = mock::pair::<Request<Body>, Response<Body>>();
        let inner = Client::new(svc, "ns");
        let mut ctx = ctx;
        ctx.client = inner.clone();
        ctx.prefetch = false;
        let run = test_run(
            &ctx,
            inner,
            fleet(),
            Some(Arc::new(crate::pass_reads::PassReads::default())),
        );
        tokio::time::timeout(Duration::from_secs(5), prefetch(&run))
            .await
            .expect("nothing sent");
    }

    /// A cached copy at a resourceVersion this process's own write replaced is not planned
    /// from (docs/design.md "A copy older than the process's own write").
    #[tokio::test]
    async fn a_copy_older_than_the_process_own_write_is_left_to_its_watch_event() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "ns");
        let ctx = ctx(client.clone());
        let run = test_run(&ctx, client, fleet(), None);
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            // The guarded write (answered at 13), then the stale copy (12, what it replaced),
            // then the copy it wrote (13).
            for answer_with in [sts("13"), sts("12"), sts("13")] {
                let (req, send) = handle.next_request().await.expect("a request");
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(answer(answer_with));
            }
            seen
        });
        let mut w: workload::LiveWorkload = workload::LiveWorkload::StatefulSet(Box::new(
            serde_json::from_value(sts("12")).unwrap(),
        ));
        w.set_replicas(3);
        run.replace_workload(&w).await.unwrap();
        // A cached pass that gets the workload at 12 ends: decided nothing, no fresh pass.
        let esc = Arc::new(crate::pass::Escalation::default());
        let stale = crate::pass::scope(esc.clone(), run.workload()).await;
        assert!(matches!(stale, Err(Error::Refused(_))), "{stale:?}");
        let left = esc.stale_for().expect("the pass ended on a stale copy");
        assert!(
            left <= crate::own_writes::WINDOW && !left.is_zero(),
            "{left:?}"
        );
        assert_eq!(
            esc.cause().as_deref(),
            Some("own write not yet seen (workload)")
        );
        // The copy the write produced is planned from.
        let esc = Arc::new(crate::pass::Escalation::default());
        let fresh = crate::pass::scope(esc.clone(), run.workload())
            .await
            .unwrap();
        assert_eq!(
            fresh
                .and_then(|w| w.meta().resource_version.clone())
                .as_deref(),
            Some("13")
        );
        assert_eq!(esc.stale_for(), None);
        assert_eq!(esc.cause(), None);
        drop(run);
        let seen = served(server, "every request was sent").await;
        assert_eq!(seen[0], "PUT /apis/apps/v1/namespaces/ns/statefulsets/f");

        // The fleet: a cached copy at the version an append replaced is not reconciled at
        // all, and nothing is sent (the mock client has no server left: a request would fail).
        ctx.own_writes
            .replaced("ns/f", Some("1"), std::time::Instant::now());
        let (next, pass) = reconcile("ns", "f", &ctx, Some(&fleet())).await;
        assert!(matches!(pass, PassKind::Stale), "{pass:?}");
        match next {
            Ok(Next::After(d)) => assert!(d <= crate::own_writes::WINDOW && !d.is_zero()),
            Ok(_) => panic!("not a requeue within the window"),
            Err(e) => panic!("{e}"),
        }
    }

    /// A status write answered 409 is looked at again within [`SOON`] even if no watch event
    /// comes; before, a fleet whose operation had closed waited for the slow resync (the
    /// exhaustive drills found a Provision left unsettled for 90 s by a 409 on its last status
    /// write).
    #[test]
    fn a_status_answered_409_is_written_again_soon_without_an_event() {
        assert_eq!(status_requeue(status::Stored::Conflict), Some(SOON));
        assert!(SOON < LATER);
        let wait = Duration::from_millis(700);
        assert_eq!(status_requeue(status::Stored::Deferred(wait)), Some(wait));
        assert_eq!(status_requeue(status::Stored::Written), None);
        assert_eq!(status_requeue(status::Stored::Unchanged), None);
    }

    /// A progress-only status change (member counts, condition messages) waits for the rest
    /// of the fleet's pace interval and sends nothing; any other change is written at once
    /// (docs/design.md "Status writes at a pace").
    #[tokio::test]
    async fn a_progress_only_status_change_waits_for_the_pace_and_others_are_written_at_once() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "ns");
        let api: Api<CelldFleet> = Api::namespaced(client, "ns");
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..3 {
                let (req, send) = handle.next_request().await.expect("a request");
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(answer(serde_json::to_value(fleet()).unwrap()));
            }
            seen
        });
        let ready = |name: &str, ok: bool| -> Pod {
            let mut p: Pod = serde_json::from_value(pod(name)).unwrap();
            p.status = Some(k8s_openapi::api::core::v1::PodStatus {
                conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                    type_: "Ready".into(),
                    status: if ok { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            p
        };
        let wait = Some(Duration::from_millis(700));
        let progress = Report::progress("Adding member f-1".into());
        let write = |fleet: CelldFleet, pods: Vec<Pod>, report: Report, wait| {
            let api = api.clone();
            async move {
                let seen = status::Seen {
                    journal: None,
                    budget: Budget::default(),
                    pods: &pods,
                    live: None,
                    report: &report,
                };
                status::write(&api, &fleet, &seen, wait).await.unwrap()
            }
        };
        // 1. No status yet: written although the pace says wait (not progress only).
        let (first, stored) =
            write(fleet(), vec![ready("f-0", true)], progress.clone(), wait).await;
        assert_eq!(stored, status::Stored::Written);
        let mut held = fleet();
        held.status = Some(first.clone());
        // 2. One more member, joining: progress only, so it waits and nothing is sent.
        let two = vec![ready("f-0", true), ready("f-1", false)];
        let (second, stored) = write(held.clone(), two.clone(), progress.clone(), wait).await;
        assert_eq!(stored, status::Stored::Deferred(Duration::from_millis(700)));
        assert!(status::progress_only(&first, &second));
        assert_eq!(second.joining_replicas, Some(1));
        // 3. The same change once the interval has passed: written.
        let (_, stored) = write(held.clone(), two.clone(), progress.clone(), None).await;
        assert_eq!(stored, status::Stored::Written);
        // 4. A condition that changes status (Blocked) is written within the interval.
        let blocked = Report::blocked(&reasons::INVALID_CONFIGURATION, "bad".into());
        let (third, stored) = write(held, two, blocked, wait).await;
        assert_eq!(stored, status::Stored::Written);
        assert!(!status::progress_only(&first, &third));
        drop(api);
        let seen = served(server, "every request was sent").await;
        assert_eq!(
            seen,
            vec!["PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f/status"; 3]
        );
    }

    /// A store of `objs` as a finished first list fills it, viewed for namespace `ns`.
    fn listed<K>(objs: Vec<serde_json::Value>) -> crate::compact_store::CompactStore<K>
    where
        K: kube::Resource
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        use kube::runtime::watcher::Event;
        let store = crate::compact_store::CompactStore::new(&[FLEET_UID_LABEL]);
        store.apply(&Event::Init);
        for o in objs {
            store.apply(&Event::InitApply(serde_json::from_value(o).unwrap()));
        }
        store.apply(&Event::InitDone);
        store.scoped("ns")
    }

    /// Namespace `ns`'s watch-fed stores holding `sts` and `pods` (nothing else).
    fn cache_of(sts: serde_json::Value, pods: Vec<serde_json::Value>) -> crate::watches::NsCache {
        crate::watches::NsCache {
            pods: listed(pods),
            statefulsets: listed(vec![sts]),
            deployments: listed(vec![]),
            claims: listed(vec![]),
            services: listed(vec![]),
            network_policies: listed(vec![]),
            pdbs: listed(vec![]),
            service_accounts: kube::runtime::reflector::store().0,
            storage_classes: kube::runtime::reflector::store().0,
            reservations: kube::runtime::reflector::store().0,
        }
    }

    /// The fleet's StatefulSet at `rv` with `replicas`, owned and settled.
    fn owned_sts(rv: &str, replicas: i32) -> serde_json::Value {
        serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "f", "namespace": "ns", "resourceVersion": rv, "uid": "s-1",
                         "generation": 4, "labels": {FLEET_UID_LABEL: "u-1"}},
            "spec": {"replicas": replicas, "selector": {}, "serviceName": "f",
                     "template": {"metadata": {}, "spec": {"containers": []}}},
            "status": {"replicas": replicas, "readyReplicas": replicas, "observedGeneration": 4,
                       "updatedReplicas": replicas, "currentReplicas": replicas,
                       "availableReplicas": replicas}})
    }

    /// `journal` with `body` of operation `op` appended (in memory), written by leader `test`.
    fn then(journal: Journal, op: OperationId, body: EntryBody) -> Journal {
        let leader = Leader {
            identity: "test".into(),
            lease_transitions: 0,
            lease: None,
        };
        let entry = NewEntry {
            at: Utc::now(),
            op,
            leader,
            body,
        };
        journal
            .stage(entry, Budget::default())
            .unwrap()
            .into_journal()
    }

    /// The fleet at resourceVersion 7 (spec.replicas 2) whose journal holds one open Intent:
    /// Scale 3→2, victim member f-2 (UID p-2).
    fn contracting() -> (CelldFleet, Journal, OperationId) {
        let op = OperationId::new_v4();
        let journal = then(
            Journal::new("u-1"),
            op,
            EntryBody::Intent(journal::Intent {
                kind: journal::OperationKind::Scale,
                from: 3,
                to: 2,
                token: None,
                image: None,
                reason: None,
                deadline: Utc::now() + chrono::Duration::minutes(30),
                targets: vec![journal::Target {
                    pod: "f-2".into(),
                    pod_uid: Some("p-2".into()),
                    pod_ip: None,
                    runtime_generation: None,
                    claim: Some("data-f-2".into()),
                    claim_uid: None,
                    claim_resource_version: None,
                }],
                workload_uid: Some("s-1".into()),
                predecessor_effect: None,
            }),
        );
        let mut f = fleet();
        f.metadata.resource_version = Some("7".into());
        (f, journal, op)
    }

    /// A planning cached pass's `Run` of `fleet` over `cache`, with `client`.
    fn planning_run<'a>(
        ctx: &'a Ctx,
        client: Client,
        fleet: CelldFleet,
        journal: Journal,
        cache: crate::watches::NsCache,
    ) -> Run<'a> {
        let mut run = test_run(ctx, client, fleet, None);
        run.journal = journal;
        run.cache = Some(cache);
        run
    }

    /// A mock API server's handle, a client to it, and a planning cached pass's record with
    /// its planning client over that client.
    fn planning_mock() -> (MockServer, Client, Arc<crate::pass::Escalation>, Client) {
        let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let inner = Client::new(svc, "ns");
        let esc = Arc::new(crate::pass::Escalation::planning());
        let client = crate::pass::planning_client(esc.clone(), inner.clone());
        (handle, inner, esc, client)
    }

    /// A planning cached pass carries out a contraction's step itself: the guarded write's
    /// fresh reads (the workload, the recorded victim), the write, the `Issued` append, and
    /// nothing more; the planning reads before them come from the caches.
    #[tokio::test]
    async fn a_planning_pass_issues_a_contraction_with_its_guards_and_nothing_else() {
        let (mut handle, inner, esc, client) = planning_mock();
        let ctx = ctx(inner);
        let (contracting, journal, _op) = contracting();
        let members = (0..3)
            .map(|i| {
                let mut p = pod(&format!("f-{i}"));
                p["metadata"]["uid"] = format!("p-{i}").into();
                p
            })
            .collect();
        let cache = cache_of(owned_sts("20", 3), members);
        let mut run = planning_run(&ctx, client, contracting, journal, cache);
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut victim = pod("f-2");
            victim["metadata"]["uid"] = "p-2".into();
            let mut patched = serde_json::to_value(fleet()).unwrap();
            patched["metadata"]["resourceVersion"] = "8".into();
            for answer_with in [owned_sts("21", 3), victim, owned_sts("22", 2), patched] {
                let (req, send) = handle.next_request().await.expect("a request");
                seen.push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(answer(answer_with));
            }
            seen
        });
        let report = crate::pass::scope(esc.clone(), drive::drive_open(&mut run))
            .await
            .unwrap();
        // Reported with the phase the journal now holds and what the next pass would say,
        // so that pass has no message of its own to write.
        assert!(
            report.message.contains(
                "Issued at step replicas: waiting for the workload controller to observe the change"
            ),
            "{}",
            report.message
        );
        let current = run.journal.fold().current().cloned().expect("still open");
        assert!(current.issued_anything(), "Issued was appended");
        drop(run);
        assert_eq!(
            served(server, "four requests").await,
            [
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
                "GET /api/v1/namespaces/ns/pods/f-2",
                "PUT /apis/apps/v1/namespaces/ns/statefulsets/f",
                "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
            ]
        );
        assert_eq!(esc.cause(), None, "no escalation");
        assert!(esc.wrote());
        assert!(!esc.deciding() && !esc.permitted(), "every scope closed");
    }

    /// A contraction whose removed member is gone closes with one journal write: `Observed`
    /// and `Completed` in one compare-and-swap on the fleet (docs/design.md "Journal
    /// writes"), decided from the caches with no read; each entry is sealed and chained as if
    /// appended alone. The fleet asks for fewer members still, but the StatefulSet has not
    /// rolled out: the next victim is not read (the planner will wait).
    #[tokio::test]
    async fn a_reached_target_is_observed_and_completed_in_one_write() {
        let (mut handle, inner, esc, client) = planning_mock();
        let ctx = ctx(inner);
        let (mut closing, journal, _op, mut settled) = contraction_issued();
        closing.spec.replicas = 1;
        settled["status"]["updateRevision"] = "r-2".into();
        let cache = cache_of(settled, two_members());
        let mut run = planning_run(&ctx, client, closing, journal, cache);
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            let seen = format!("{} {}", req.method(), req.uri().path());
            let patch = answer_append(req, send, 1, "8").await;
            // Anything else the pass sent, until its client is gone.
            let mut more = Vec::new();
            while let Some((req, _)) = handle.next_request().await {
                more.push(format!("{} {}", req.method(), req.uri().path()));
            }
            (seen, patch, more)
        });
        let report = crate::pass::scope(esc.clone(), drive::drive_open(&mut run))
            .await
            .unwrap();
        assert!(report.message.ends_with("completed"), "{}", report.message);
        assert!(
            run.journal.fold().current().is_none(),
            "the operation is closed"
        );
        let types: Vec<_> = run.journal.document().entries()[2..]
            .iter()
            .map(|e| (e.seq(), format!("{:?}", e.entry_type())))
            .collect();
        assert_eq!(
            types,
            [(3, "Observed".to_string()), (4, "Completed".to_string())]
        );
        drop(run);
        drop(ctx);
        let (seen, patch, more) = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the mock server finished")
            .unwrap();
        assert_eq!(
            seen,
            "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f"
        );
        assert!(more.is_empty(), "nothing else is sent: {more:?}");
        assert_eq!(
            patch["metadata"]["resourceVersion"], "7",
            "a compare-and-swap on the fleet as read"
        );
        let written = Journal::load(
            patch["metadata"]["annotations"][crate::api::keys::JOURNAL_ANNOTATION].as_str(),
            "u-1",
        )
        .expect("the written annotation verifies");
        assert_eq!(written.entries().len(), 4, "both entries in the one write");
        assert!(written.fold().current().is_none());
        assert_eq!(esc.cause(), None, "no escalation");
    }

    /// Answers a fleet PATCH (a journal append) as the API server would: `fleet()` with
    /// `replicas`, at resourceVersion `rv`, carrying the patch's annotations. Returns the patch.
    async fn answer_append(
        req: Request<Body>,
        send: mock::SendResponse<Response<Body>>,
        replicas: i32,
        rv: &str,
    ) -> serde_json::Value {
        let body = http_body_util::BodyExt::collect(req.into_body())
            .await
            .unwrap()
            .to_bytes();
        let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let mut patched = serde_json::to_value(fleet()).unwrap();
        patched["spec"]["replicas"] = replicas.into();
        patched["metadata"]["resourceVersion"] = rv.into();
        patched["metadata"]["annotations"] = patch["metadata"]["annotations"].clone();
        send.send_response(answer(patched));
        patch
    }

    /// The journal of `contracting()` with its Scale 3→2 issued (`Issued` at resourceVersion
    /// 22), and the StatefulSet at 2 replicas carrying its marker, settled.
    fn contraction_issued() -> (CelldFleet, Journal, OperationId, serde_json::Value) {
        let (mut fleet, journal, op) = contracting();
        let journal = then(
            journal,
            op,
            EntryBody::Issued(journal::Issued {
                step: journal::Step::Replicas,
                effect: journal::Effect::new(op, journal::Step::Replicas),
                decided_on_resource_version: Some("21".into()),
                result_resource_version: Some("22".into()),
                replayed: false,
                target: None,
            }),
        );
        fleet.metadata.annotations = Some(
            [(
                crate::api::keys::JOURNAL_ANNOTATION.to_string(),
                journal.document().encode(),
            )]
            .into(),
        );
        let mut settled = owned_sts("22", 2);
        settled["metadata"]["annotations"] =
            serde_json::json!({crate::api::keys::EFFECT_ANNOTATION: format!("{op}/replicas")});
        settled["status"]["currentRevision"] = "r-1".into();
        settled["status"]["updateRevision"] = "r-1".into();
        (fleet, journal, op, settled)
    }

    /// Members f-0 and f-1 (UIDs p-0, p-1).
    fn two_members() -> Vec<serde_json::Value> {
        (0..2)
            .map(|i| {
                let mut p = pod(&format!("f-{i}"));
                p["metadata"]["uid"] = format!("p-{i}").into();
                p
            })
            .collect()
    }

    /// When a contraction completes and the fleet asks for fewer members still, the next
    /// victim's fresh read is sent together with the completing journal write, and the
    /// planner records that read in the next contraction's `Intent` without reading again
    /// (docs/design.md "Fresh reads").
    #[tokio::test]
    async fn the_next_victim_is_read_with_the_completing_write_and_recorded_from_that_read() {
        let (mut handle, inner, esc, client) = planning_mock();
        let ctx = ctx(inner);
        let (mut closing, journal, _op, settled) = contraction_issued();
        closing.spec.replicas = 1;
        let cache = cache_of(settled.clone(), two_members());
        let mut run = planning_run(&ctx, client, closing.clone(), journal, cache);
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (req, send) = handle.next_request().await.expect("a request");
                let path = req.uri().path().to_string();
                seen.push(format!("{} {path}", req.method()));
                if path.ends_with("/pods/f-1") {
                    let mut p = pod("f-1");
                    p["metadata"]["uid"] = "p-1".into();
                    send.send_response(answer(p));
                } else {
                    answer_append(req, send, 1, "8").await;
                }
            }
            seen
        });
        let report = crate::pass::scope(esc.clone(), drive::drive_open(&mut run))
            .await
            .unwrap();
        assert!(report.message.ends_with("completed"), "{}", report.message);
        let (name, read) = run.next_victim.clone().expect("the next victim was read");
        assert_eq!(name, "f-1");
        assert_eq!(read.and_then(|p| p.metadata.uid).as_deref(), Some("p-1"));
        let completed = run.journal.clone();
        drop(run);
        let mut seen = served(server, "the write and the read").await;
        seen.sort();
        assert_eq!(
            seen,
            [
                "GET /api/v1/namespaces/ns/pods/f-1",
                "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
            ]
        );

        // The planner, later in the same pass, records that read: its first request is the
        // Intent's append, with the victim's UID as read above (the server would answer
        // another UID now, to tell the two reads apart).
        let (mut handle, inner, esc, client) = planning_mock();
        let ctx2 = self::ctx(inner);
        let mut fleet2 = closing;
        fleet2.metadata.resource_version = Some("8".into());
        fleet2.metadata.annotations = Some(
            [(
                crate::api::keys::JOURNAL_ANNOTATION.to_string(),
                completed.document().encode(),
            )]
            .into(),
        );
        let mut cache = cache_of(settled.clone(), two_members());
        cache.claims = listed(
            (0..2)
                .map(|i| {
                    serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": format!("data-f-{i}"), "namespace": "ns",
                                     "uid": format!("c-{i}"), "labels": {FLEET_UID_LABEL: "u-1"}}})
                })
                .collect(),
        );
        let (accounts, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(
            serde_json::from_value::<
                kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::ServiceAccount>,
            >(
                serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "celld", "namespace": "ns"}}),
            )
            .unwrap(),
        ));
        cache.service_accounts = accounts;
        let (classes, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(
            serde_json::from_value::<k8s_openapi::api::storage::v1::StorageClass>(
                serde_json::json!({"metadata": {"name": "standard"},
                    "provisioner": "ebs.csi.aws.com", "reclaimPolicy": "Delete",
                    "volumeBindingMode": "WaitForFirstConsumer"}),
            )
            .unwrap(),
        ));
        cache.storage_classes = classes;
        fleet2.spec.storage.storage_class_name = Some("standard".into());
        let mut run = planning_run(&ctx2, client, fleet2, completed, cache);
        // The StatefulSet as rendered, so the planner sees no template change to make first.
        let mut current = match drive::rendered_with(&run, &run.fleet.spec, 2, None) {
            crate::render::Workload::StatefulSet(s) => serde_json::to_value(s).unwrap(),
            other => panic!("a PersistentFleet renders a StatefulSet: {other:?}"),
        };
        current["metadata"] = settled["metadata"].clone();
        current["status"] = settled["status"].clone();
        run.cache.as_mut().unwrap().statefulsets = listed(vec![current.clone()]);
        run.next_victim = Some(("f-1".into(), {
            let mut p: Pod = serde_json::from_value(pod("f-1")).unwrap();
            p.metadata.uid = Some("p-1".into());
            Some(p)
        }));
        // The server answers the Intent's append only once the guard's two reads have come
        // too: the pass waits for it, so they can only have been sent while it was in flight.
        // A read of the victim before the Intent (the kept read unused), or guard reads sent
        // only after the append's answer, leave both sides waiting: the pass times out.
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let answered = current.clone();
        let server = tokio::spawn(async move {
            let note = |req: &Request<Body>| {
                log.lock()
                    .unwrap()
                    .push(format!("{} {}", req.method(), req.uri().path()));
            };
            let (mut append, mut workload, mut victim) = (None, None, None);
            while append.is_none() || workload.is_none() || victim.is_none() {
                let (req, send) = handle.next_request().await.expect("a request");
                note(&req);
                let path = req.uri().path().to_string();
                if req.method() == http::Method::PATCH {
                    append = Some((req, send));
                } else if path.ends_with("/statefulsets/f") {
                    workload = Some(send);
                } else if path.ends_with("/pods/f-1") {
                    victim = Some(send);
                } else {
                    panic!("unexpected {} {path}", req.method());
                }
            }
            let (req, send) = append.unwrap();
            answer_append(req, send, 1, "9").await;
            workload.unwrap().send_response(answer(answered));
            let mut p = pod("f-1");
            p["metadata"]["uid"] = "p-1".into();
            victim.unwrap().send_response(answer(p));
            // The guarded write, then its `Issued`.
            let (req, send) = handle.next_request().await.expect("the write");
            note(&req);
            let body = http_body_util::BodyExt::collect(req.into_body())
                .await
                .unwrap()
                .to_bytes();
            let mut written: serde_json::Value = serde_json::from_slice(&body).unwrap();
            written["metadata"]["resourceVersion"] = "23".into();
            send.send_response(answer(written.clone()));
            let (req, send) = handle.next_request().await.expect("the Issued append");
            note(&req);
            answer_append(req, send, 1, "10").await;
            written
        });
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            crate::pass::scope(esc.clone(), drive::plan_and_open(&mut run)),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the pass waited (requests so far: {:?}): the guard's reads were not sent \
                 with the Intent, or the victim was read again before it",
                seen.lock().unwrap()
            )
        })
        .map(|r| r.message);
        let next_victim = run.next_victim.take();
        let guard_reads = run.guard_reads.take();
        let journal = run.journal.clone();
        drop(run);
        let written = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap_or_else(|_| panic!("the server still waits; the pass ended with {ended:?}"))
            .unwrap();
        assert!(ended.is_ok(), "{ended:?}");
        let seen = seen.lock().unwrap().clone();
        let (together, after) = seen.split_at(3);
        let mut together = together.to_vec();
        together.sort();
        assert_eq!(
            together,
            [
                "GET /api/v1/namespaces/ns/pods/f-1",
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
                "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
            ],
            "the Intent's append and the guard's reads, together"
        );
        assert_eq!(
            after,
            [
                "PUT /apis/apps/v1/namespaces/ns/statefulsets/f",
                "PATCH /apis/celld.eric.dev/v1alpha1/namespaces/ns/celldfleets/f",
            ],
            "then the write and its Issued"
        );
        assert!(next_victim.is_none(), "the read is used once");
        assert!(guard_reads.is_none(), "the guard's reads are used once");
        let open = journal
            .fold()
            .current()
            .cloned()
            .expect("the next contraction is open");
        assert!(open.issued_anything(), "and issued");
        let intent = open.intent().clone();
        assert_eq!((intent.from, intent.to), (2, 1));
        assert_eq!(intent.targets[0].pod, "f-1");
        assert_eq!(intent.targets[0].pod_uid.as_deref(), Some("p-1"));
        assert_eq!(written["spec"]["replicas"], 1);
        assert_eq!(
            written["metadata"]["annotations"][crate::api::keys::EFFECT_ANNOTATION],
            format!("{}/replicas", open.id())
        );
    }

    /// When the guard's fresh read shows a change the cache did not, a planning pass neither
    /// cancels nor fences: it escalates at the fence's write, and the fresh pass decides.
    /// A cached pass that may not plan, and a planning pass on an operation it may not carry
    /// out, escalate before sending anything.
    #[tokio::test]
    async fn a_planning_pass_leaves_every_other_decision_to_a_fresh_pass() {
        let (mut handle, inner, esc, client) = planning_mock();
        let ctx = ctx(inner);
        let (fleet, journal, op) = contracting();
        let cache = cache_of(owned_sts("20", 3), vec![]);
        let mut run = planning_run(&ctx, client, fleet.clone(), journal.clone(), cache);
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            // The guard's reads (sent together: the workload, which has 4 replicas, and the
            // recorded victim); the fence re-reads the workload before its write.
            for _ in 0..3 {
                let (req, send) = handle.next_request().await.expect("a request");
                let path = req.uri().path().to_string();
                seen.push(format!("{} {path}", req.method()));
                send.send_response(if path.ends_with("/pods/f-2") {
                    answer(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "f-2", "namespace": "ns", "uid": "p-2"}}))
                } else {
                    answer(owned_sts("21", 4))
                });
            }
            seen
        });
        let ended = crate::pass::scope(esc.clone(), drive::drive_open(&mut run)).await;
        assert!(
            ended.is_err(),
            "the pass ends: {:?}",
            ended.map(|r| r.message)
        );
        assert_eq!(esc.cause().as_deref(), Some("update statefulsets"));
        assert!(!esc.wrote());
        assert!(
            run.journal
                .fold()
                .current()
                .is_some_and(|o| !o.issued_anything()),
            "nothing appended"
        );
        drop(run);
        let mut seen = served(server, "the three reads").await;
        assert_eq!(
            seen.pop().as_deref(),
            Some("GET /apis/apps/v1/namespaces/ns/statefulsets/f"),
            "the fence's re-read comes last"
        );
        seen.sort();
        assert_eq!(
            seen,
            [
                "GET /api/v1/namespaces/ns/pods/f-2",
                "GET /apis/apps/v1/namespaces/ns/statefulsets/f",
            ],
            "the guard's two reads, in either order"
        );

        // Nothing is sent from here on: the mock has no server left.
        let (svc, _gone) = mock::pair::<Request<Body>, Response<Body>>();
        let dead = Client::new(svc, "ns");
        // A cached pass that may not plan escalates at the decision.
        let esc = Arc::new(crate::pass::Escalation::default());
        let cache = cache_of(owned_sts("20", 3), vec![]);
        let mut run = planning_run(
            &ctx,
            crate::pass::refusing_client(esc.clone()),
            fleet.clone(),
            journal.clone(),
            cache,
        );
        let ended = crate::pass::scope(esc.clone(), drive::drive_open(&mut run)).await;
        assert!(matches!(ended, Err(Error::Refused(_))));
        assert_eq!(esc.cause().as_deref(), Some("decide Scale"));
        // A planning pass appends no entry but an operation's it may carry out.
        let esc = Arc::new(crate::pass::Escalation::planning());
        let cache = cache_of(owned_sts("20", 3), vec![]);
        let mut run = planning_run(
            &ctx,
            crate::pass::planning_client(esc.clone(), dead),
            fleet,
            journal,
            cache,
        );
        let canceled = EntryBody::Canceled(journal::Canceled {
            reason: journal::CancelReason::PredecessorChanged,
        });
        let ended = crate::pass::scope(esc.clone(), run.append(op, canceled)).await;
        assert!(matches!(ended, Err(Error::Refused(_))));
        assert_eq!(esc.cause().as_deref(), Some("append Canceled"));
        assert!(!esc.wrote());
    }
}
