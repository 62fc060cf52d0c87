//! Property tests: random operation scripts driven by a small simulated operator, with crashes
//! injected between any two steps (the process's memory is dropped; the annotation, the mirror
//! and the world stay as they were), lost responses and conflicts on the compare-and-swap,
//! pauses, blocks with `retry`/`abandon` commands, passing deadlines and hand edits of the
//! workload's effect marker (found as a mismatch, then adopted) and deleted annotations (found
//! missing, then restored from the mirror). Replay must converge:
//! every request is carried out exactly once, every effect is written to the world at most once
//! and recorded exactly once, the chain verifies, the annotation never exceeds its budget, and
//! compaction never drops an open operation.
//!
//! The seed and the number of cases are fixed, so the run is the same every time.
mod common;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use common::{leader, t, FLEET};
use journal::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

const SEED: [u8; 32] = *b"celld-journal replay property 01";
const CASES: u32 = 64;
const BUDGET: usize = 64 * 1024;
const MIRROR: MirrorOptions = MirrorOptions {
    retention: journal::DEFAULT_RETENTION,
    cache_bytes: journal::DEFAULT_CACHE_BYTES,
    live_entries: 4,
};

// ---- the script ----

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Scale(i32),
    Rolling,
    Coordinated(u8),
    Replace,
    Retire,
}

#[derive(Debug, Clone)]
struct Request {
    req: Req,
    /// Block before this step (once), then the harness sets a command.
    block_at: Option<usize>,
    /// The command is `abandon` instead of `retry`.
    abandon: bool,
}

#[derive(Debug, Clone)]
struct Case {
    requests: Vec<Request>,
    /// Boundary crossings at which the process dies.
    crashes: BTreeSet<u32>,
    /// Compare-and-swap calls that fail.
    faults: BTreeMap<u64, Fault>,
    /// Reconciles during which the fleet is paused.
    pauses: BTreeSet<u32>,
    /// Reconciles before which a person removes the workload's effect marker by hand (while
    /// no operation is open); a later reconcile finds the mismatch, and the person adopts.
    hand_edits: BTreeSet<u32>,
    /// Reconciles before which the journal annotation is deleted (a backup tool, a person);
    /// the operator finds it missing while its mirror holds entries, and the person restores
    /// it from the mirror.
    deletions: BTreeSet<u32>,
}

fn req_strategy() -> impl Strategy<Value = Req> {
    prop_oneof![
        3 => (1i32..6).prop_map(Req::Scale),
        2 => Just(Req::Rolling),
        1 => (1u8..4).prop_map(Req::Coordinated),
        1 => Just(Req::Replace),
        1 => Just(Req::Retire),
    ]
}

fn request_strategy() -> impl Strategy<Value = Request> {
    (
        req_strategy(),
        prop::option::weighted(0.15, 0usize..5),
        any::<bool>(),
    )
        .prop_map(|(req, block_at, abandon)| Request {
            req,
            block_at,
            abandon,
        })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(request_strategy(), 8..40),
        prop::collection::btree_set(0u32..600, 0..25),
        prop::collection::btree_map(
            1u64..300,
            prop_oneof![
                Just(Fault::Conflict),
                Just(Fault::LoseResponse),
                Just(Fault::Unavailable)
            ],
            0..15,
        ),
        prop::collection::btree_set(0u32..200, 0..10),
        prop::collection::btree_set(0u32..300, 0..6),
        prop::collection::btree_set(0u32..300, 0..3),
    )
        .prop_map(
            |(requests, crashes, faults, pauses, hand_edits, deletions)| Case {
                requests,
                crashes,
                faults,
                pauses,
                hand_edits,
                deletions,
            },
        )
}

fn steps(req: &Req) -> Vec<Step> {
    match req {
        Req::Scale(_) => vec![Step::Replicas],
        Req::Rolling => vec![Step::Template],
        Req::Coordinated(m) => {
            let mut s: Vec<Step> = (0..*m).map(|i| Step::Proof(format!("beta-{i}"))).collect();
            s.push(Step::Stop);
            s.push(Step::Resume);
            s
        }
        Req::Replace => vec![
            Step::Hold,
            Step::Pod,
            Step::Commit,
            Step::Retire("data-beta-1".into()),
            Step::Release,
        ],
        Req::Retire => vec![
            Step::Proof("beta-2".into()),
            Step::Replicas,
            Step::Retire("data-beta-2".into()),
        ],
    }
}

fn target(pod: &str) -> Target {
    Target {
        pod: pod.into(),
        pod_uid: Some(format!("uid-{pod}")),
        pod_ip: Some("10.1.2.3".into()),
        runtime_generation: Some(format!("gen-{pod}")),
        claim: Some(format!("data-{pod}")),
        claim_uid: Some(format!("claim-uid-{pod}")),
        claim_resource_version: Some("77".into()),
    }
}

// ---- the world ----

#[derive(Debug, Default)]
struct World {
    /// `celld.eric.dev/effect` on the workload.
    marker: Option<Effect>,
    /// Every effect written, in order (the API server's audit log).
    writes: Vec<Effect>,
    /// Request indices in the order their last effect landed.
    fulfilled: Vec<usize>,
    /// `celld.eric.dev/journal-command`, and the minute a person gets round to setting it.
    command: Option<(String, i64)>,
    /// The marker was removed by hand and not yet adopted.
    edited: bool,
}

impl World {
    fn has(&self, e: &Effect) -> bool {
        self.writes.contains(e)
    }
}

// ---- the simulated operator ----

#[derive(Debug)]
enum Stop {
    /// The process died at a boundary.
    Crash,
    /// A store error: end the reconcile, drop the cached journal.
    Fault,
    /// Nothing left to do.
    Idle,
}

#[derive(Default)]
struct Process {
    cached: Option<(Journal, Version)>,
    started: bool,
}

struct Harness {
    case: Case,
    store: InMemoryAppender,
    /// On disk, holding 4 entries per fleet in sled: the rest of the history goes through the
    /// archive's segment files, and every crash reopens it.
    mirror: Mirror,
    dir: tempfile::TempDir,
    world: World,
    minute: i64,
    next_op: u64,
    boundaries: u32,
    reconciles: u32,
    blocked_requests: BTreeSet<usize>,
    compactions: usize,
    crashes: usize,
    adoptions: usize,
    restores: usize,
}

impl Harness {
    fn new(case: Case) -> Harness {
        let store = InMemoryAppender::new();
        for (call, fault) in &case.faults {
            store.inject_at(*call, *fault);
        }
        let dir = tempfile::tempdir().unwrap();
        Harness {
            case,
            store,
            mirror: Mirror::open(dir.path(), MIRROR).unwrap(),
            dir,
            world: World::default(),
            minute: 0,
            next_op: 0,
            boundaries: 0,
            reconciles: 0,
            blocked_requests: BTreeSet::new(),
            compactions: 0,
            crashes: 0,
            adoptions: 0,
            restores: 0,
        }
    }

    fn now(&self) -> DateTime<Utc> {
        t(self.minute)
    }

    fn boundary(&mut self) -> Result<(), Stop> {
        self.boundaries += 1;
        if self.case.crashes.contains(&self.boundaries) {
            self.crashes += 1;
            return Err(Stop::Crash);
        }
        Ok(())
    }

    fn append(&mut self, p: &mut Process, op: OperationId, body: EntryBody) -> Result<(), Stop> {
        self.minute += 1;
        let entry = NewEntry {
            at: self.now(),
            op,
            leader: leader(),
            body,
        };
        let (journal, version) = p.cached.as_ref().expect("loaded");
        let open_before: Vec<OperationId> =
            journal.fold().open_operations().map(|o| o.id()).collect();
        match append(
            &self.store,
            journal,
            version,
            entry,
            Budget::new(BUDGET).unwrap(),
        ) {
            Ok(a) => {
                if let Some(c) = &a.compaction {
                    self.compactions += 1;
                    for id in &open_before {
                        assert!(
                            !c.dropped_operations.contains(id),
                            "compaction dropped open operation {id}"
                        );
                        assert!(a.journal.fold().operation(*id).is_some());
                    }
                }
                // The process may die between the annotation write and the mirror write.
                let entry = a.entry.clone();
                let doc = a.journal.document().clone();
                p.cached = Some((a.journal, a.version));
                self.boundary()?;
                let plan = self
                    .mirror
                    .record(&doc, std::slice::from_ref(&entry))
                    .unwrap();
                if let Some(plan) = plan {
                    assert!(plan.signals.is_empty(), "{:?}", plan.signals);
                }
                Ok(())
            }
            Err(AppendFailure::Store(_)) => {
                p.cached = None;
                Err(Stop::Fault)
            }
            Err(AppendFailure::Stage(e)) => panic!("the journal refused a legal entry: {e}"),
        }
    }

    fn request_of(&self, op: &Operation) -> usize {
        op.intent()
            .reason
            .as_deref()
            .and_then(|r| r.strip_prefix("req-"))
            .and_then(|n| n.parse().ok())
            .expect("the simulated planner tags every Intent")
    }

    /// One reconcile, in the order of docs/design.md "Reconcile order".
    fn reconcile(&mut self, p: &mut Process) -> Result<(), Stop> {
        self.reconciles += 1;
        if self.case.deletions.contains(&self.reconciles) && self.store.annotation().is_some() {
            self.store.set_annotation(None);
            p.cached = None;
        }
        if self.store.annotation().is_none() {
            if let Some((head, _)) = self.mirror.head(FLEET).unwrap() {
                // JournalMissing: nothing is planned or written until the person restores the
                // chain from the mirror (`journal restore --from-mirror`). The mirror may lag
                // the lost annotation by one entry (a crash between the two writes): the world
                // then shows an effect the restored journal lacks, which replay records.
                let restored = Journal::from_history(
                    FLEET,
                    self.mirror.entries(FLEET).unwrap(),
                    Budget::new(BUDGET).unwrap(),
                )
                .expect("the mirror's chain restores");
                assert_eq!(restored.document().seq(), head);
                self.store
                    .set_annotation(Some(restored.document().encode()));
                self.restores += 1;
                p.cached = None;
                return Err(Stop::Idle);
            }
        }
        if p.cached.is_none() {
            let (journal, version) = load_journal(&self.store, FLEET).expect("annotation loads");
            if !p.started {
                let plan = self.mirror.reconcile(journal.document()).unwrap();
                assert!(plan.signals.is_empty(), "{:?}", plan.signals);
                p.started = true;
            }
            p.cached = Some((journal, version));
        }
        // Before any effect the mirror holds what the annotation holds (the operator's
        // `ensure_mirrored`): a lost response left it one entry behind.
        let doc = p.cached.as_ref().unwrap().0.document().clone();
        if doc.seq() > 0 && self.mirror.head(FLEET).unwrap().map(|(s, _)| s) != Some(doc.seq()) {
            let plan = self.mirror.reconcile(&doc).unwrap();
            assert!(plan.signals.is_empty(), "{:?}", plan.signals);
        }
        // Step 3: commands, in any state.
        if let Some((text, _)) = self
            .world
            .command
            .clone()
            .filter(|(_, visible)| *visible <= self.minute)
        {
            let cmd = parse_command(&text).expect("the harness writes valid commands");
            let journal = &p.cached.as_ref().unwrap().0;
            // Refused when it was already applied before a crash: then it is just removed.
            if let Ok(entry) = journal.command_entry(
                &cmd,
                "tester",
                Some("journal-command"),
                self.now(),
                leader(),
            ) {
                self.append(p, entry.op, entry.body)?;
            }
            self.world.command = None;
        }
        // A person removes the marker by hand while nothing is open.
        let journal = &p.cached.as_ref().unwrap().0;
        if self.case.hand_edits.contains(&self.reconciles)
            && journal.fold().current().is_none()
            && self.world.marker.is_some()
        {
            self.world.marker = None;
            self.world.edited = true;
        }
        // The world's marker against the journal (Journal::check_marker), unless it is the
        // open operation's own (its step records it as replayed): an effect that landed but
        // was never recorded (the operation was abandoned on restart before recording it) is
        // recorded as Recovered; a mismatch blocks — nothing is planned or written — until the
        // person adopts (sets the marker to the journal's last effect).
        let journal = &p.cached.as_ref().unwrap().0;
        let own_open = self
            .world
            .marker
            .as_ref()
            .is_some_and(|m| journal.fold().operation(m.op).is_some_and(|o| o.is_open()));
        if !own_open {
            let live = self.world.marker.as_ref().map(ToString::to_string);
            match journal.check_marker(live.as_deref()) {
                MarkerCheck::Expected => self.world.edited = false,
                MarkerCheck::Unrecorded(marker) => {
                    let body = EntryBody::Recovered(Recovered {
                        effect: marker.clone(),
                        source: "workload-marker".into(),
                    });
                    return self.append(p, marker.op, body);
                }
                MarkerCheck::Mismatch { expected, why, .. } => {
                    assert!(
                        self.world.edited,
                        "the journal cannot explain a marker only it wrote ({live:?}): {why}"
                    );
                    self.world.marker = expected;
                    self.world.edited = false;
                    self.adoptions += 1;
                    return Err(Stop::Idle);
                }
            }
        }
        // An open operation with nothing recorded whose effect the world already shows (its
        // record was lost: a restore from a mirror one entry behind) is driven first, so the
        // landed effect is recorded as replayed before any cancel rule for Intent applies
        // (the operator's `effect_landed` check).
        let journal = &p.cached.as_ref().unwrap().0;
        if let Some(op) = journal.fold().current().cloned() {
            if !op.issued_anything()
                && op.blocked().is_none()
                && self.world.writes.iter().any(|e| e.op == op.id())
            {
                return self.drive(p, &op, false);
            }
        }
        // Deadlines.
        let journal = &p.cached.as_ref().unwrap().0;
        if let Some(action) = journal.deadlines_due(self.now()).into_iter().next() {
            return self.append(p, action.op(), action.body());
        }
        let paused = self.case.pauses.contains(&self.reconciles);
        let journal = &p.cached.as_ref().unwrap().0;
        match journal.fold().current().cloned() {
            Some(op) => self.drive(p, &op, paused),
            None if paused => Err(Stop::Idle),
            None => self.plan(p),
        }
    }

    fn plan(&mut self, p: &mut Process) -> Result<(), Stop> {
        let Some(index) = (0..self.case.requests.len()).find(|i| !self.world.fulfilled.contains(i))
        else {
            return Err(Stop::Idle);
        };
        let req = self.case.requests[index].req.clone();
        self.boundary()?; // before-intent
        self.next_op += 1;
        let op = common::op(1_000 + self.next_op);
        let (kind, from, to, targets, members) = match &req {
            Req::Scale(to) => (OperationKind::Scale, 3, *to, vec![], None),
            Req::Rolling => (OperationKind::Restart, 3, 3, vec![], None),
            Req::Coordinated(m) => (
                OperationKind::Restart,
                3,
                3,
                (0..*m).map(|i| target(&format!("beta-{i}"))).collect(),
                Some(u32::from(*m)),
            ),
            Req::Replace => (
                OperationKind::MemberReplacement,
                3,
                3,
                vec![target("beta-1")],
                None,
            ),
            Req::Retire => (OperationKind::Scale, 3, 2, vec![target("beta-2")], None),
        };
        let journal = &p.cached.as_ref().unwrap().0;
        let intent = Intent {
            kind,
            from,
            to,
            token: matches!(req, Req::Rolling | Req::Coordinated(_))
                .then(|| format!("tok-{index}")),
            image: None,
            reason: Some(format!("req-{index}")),
            deadline: default_deadline(self.now(), members),
            targets,
            workload_uid: Some("wl".into()),
            predecessor_effect: journal.predecessor_effect(),
        };
        self.append(p, op, EntryBody::Intent(intent))?;
        self.boundary() // after-intent
    }

    fn drive(&mut self, p: &mut Process, op: &Operation, paused: bool) -> Result<(), Stop> {
        let id = op.id();
        if op.blocked().is_some() {
            return Err(Stop::Idle); // waits for the command
        }
        if paused && !op.issued_anything() {
            return self.append(
                p,
                id,
                EntryBody::Canceled(Canceled {
                    reason: CancelReason::CanceledBeforeIssue,
                }),
            );
        }
        let index = self.request_of(op);
        let request = self.case.requests[index].clone();
        let script = steps(&request.req);
        let next = script.iter().position(|s| !op.has_effect(s));
        // A proof request that was accepted needs its proof recorded before anything else.
        for s in &script[..next.unwrap_or(script.len())] {
            if let Step::Proof(member) = s {
                if op.proof_for(member).is_none() {
                    let body = EntryBody::ProofCaptured(ProofCaptured {
                        member: member.clone(),
                        proof: Proof {
                            operation_id: id.to_string(),
                            expected_generation: format!("gen-{member}"),
                            phase: "data_safe".into(),
                            control_only: true,
                            blocker: None,
                            observed_at: self.now(),
                        },
                    });
                    return self.append(p, id, body);
                }
            }
        }
        let Some(k) = next else {
            if op.observed().is_none() {
                return self.append(
                    p,
                    id,
                    EntryBody::Observed(Observed {
                        note: "target reached".into(),
                    }),
                );
            }
            self.boundary()?; // before-complete
            return self.append(
                p,
                id,
                EntryBody::Completed(Completed {
                    outcome: CompletedOutcome::Succeeded,
                }),
            );
        };
        let step = script[k].clone();
        let effect = Effect::new(id, step.clone());
        if request.block_at == Some(k) && !self.blocked_requests.contains(&index) {
            self.blocked_requests.insert(index);
            let verb = if request.abandon { "abandon" } else { "retry" };
            self.world.command = Some((format!("{verb} {id}\n"), self.minute + 40));
            return self.append(
                p,
                id,
                EntryBody::Blocked(Blocked {
                    blocker: format!("injected before {step}"),
                }),
            );
        }
        let body = |replayed: bool| match &step {
            Step::Retire(claim) => EntryBody::ClaimRetired(ClaimRetired {
                claim: claim.clone(),
                claim_uid: format!("uid-{claim}"),
                claim_resource_version: Some("77".into()),
            }),
            _ => EntryBody::Issued(Issued {
                step: step.clone(),
                effect: effect.clone(),
                decided_on_resource_version: Some("5".into()),
                result_resource_version: (!replayed).then(|| "6".to_owned()),
                replayed,
                target: None,
            }),
        };
        // Guarded write, step 2: already in the world → record it, write nothing.
        if self.world.has(&effect) {
            return self.append(p, id, body(true));
        }
        // Step 3: the predecessor must match, or the journal lied about the world.
        if step.writes_workload_marker() {
            let previous = script[..k]
                .iter()
                .rev()
                .find(|s| s.writes_workload_marker())
                .map(|s| Effect::new(id, s.clone()));
            let expected = previous.or_else(|| op.intent().predecessor_effect.clone());
            assert_eq!(
                self.world.marker, expected,
                "the predecessor guard failed for {effect}"
            );
        }
        self.boundary()?; // before-effect / before-claim-delete
        self.world.writes.push(effect.clone());
        if step.writes_workload_marker() {
            self.world.marker = Some(effect.clone());
        }
        if k + 1 == script.len() {
            self.world.fulfilled.push(index);
        }
        self.boundary()?; // after-effect / after-claim-delete
        self.append(p, id, body(false))
    }

    /// What a restarted process does: opens the mirror it left.
    fn reopen_mirror(&mut self) {
        drop(std::mem::replace(
            &mut self.mirror,
            Mirror::temporary(MIRROR).unwrap(),
        ));
        self.mirror = Mirror::open(self.dir.path(), MIRROR).unwrap();
    }

    /// Runs reconciles until everything is done, restarting the process after each crash.
    fn run(&mut self) {
        let mut process = Process::default();
        let mut idle = 0;
        for _ in 0..20_000 {
            match self.reconcile(&mut process) {
                Ok(()) => idle = 0,
                // Time passes while a process restarts, after an error, and while a person
                // decides what to do with a blocked operation: deadlines do pass.
                Err(Stop::Crash) => {
                    process = Process::default();
                    self.reopen_mirror();
                    self.minute += 9;
                }
                Err(Stop::Fault) => self.minute += 4,
                Err(Stop::Idle) => {
                    idle += 1;
                    self.minute += 25;
                    let done = self.world.fulfilled.len() == self.case.requests.len()
                        && self.world.command.is_none();
                    if done && idle > 2 {
                        return;
                    }
                    if idle > 400 {
                        panic!(
                            "stuck: {:?}",
                            process.cached.map(|c| c.0.projection(Budget::default()))
                        );
                    }
                }
            }
        }
        panic!("did not converge");
    }

    fn check(&self, stats: &mut BTreeMap<String, usize>) {
        let n = self.case.requests.len();
        // Every request carried out exactly once.
        let mut fulfilled = self.world.fulfilled.clone();
        fulfilled.sort_unstable();
        assert_eq!(fulfilled, (0..n).collect::<Vec<_>>());
        // No effect written twice.
        let unique: BTreeSet<&Effect> = self.world.writes.iter().collect();
        assert_eq!(
            unique.len(),
            self.world.writes.len(),
            "an effect was written twice"
        );
        // The annotation never exceeded its budget.
        for w in self.store.writes() {
            assert!(w.len() <= BUDGET, "annotation of {} bytes", w.len());
        }
        // The annotation loads and verifies; nothing is open.
        let journal =
            Journal::load(self.store.annotation().as_deref(), FLEET).expect("final annotation");
        assert!(journal.fold().current().is_none());
        // The mirror holds the whole history, agrees with the annotation, and verifies.
        let plan = plan_reconcile(
            &self
                .mirror
                .entries(FLEET)
                .unwrap()
                .iter()
                .map(|e| (e.seq(), e.hash()))
                .collect::<Vec<_>>(),
            journal.document(),
        );
        assert!(plan.is_empty(), "{plan:?}");
        let history = self.mirror.entries(FLEET).unwrap();
        assert_eq!(history.len() as u64, journal.document().seq());
        chain::verify_entries(&history, Some((0, Hash::ZERO))).unwrap();
        // Every effect recorded exactly once, and matching the world.
        let fold = Fold::from_entries(&history).expect("the whole history is legal");
        for e in &history {
            let key = match e.body() {
                EntryBody::Issued(i) if i.replayed => "Issued (replayed)".to_owned(),
                EntryBody::Canceled(c) => format!("Canceled/{}", c.reason),
                b => b.entry_type().as_str().to_owned(),
            };
            *stats.entry(key).or_default() += 1;
        }
        *stats.entry("crashes".into()).or_default() += self.crashes;
        *stats.entry("compactions".into()).or_default() += self.compactions;
        *stats.entry("marker mismatches adopted".into()).or_default() += self.adoptions;
        *stats
            .entry("deleted annotations restored".into())
            .or_default() += self.restores;
        *stats.entry("store faults".into()).or_default() += self
            .case
            .faults
            .keys()
            .filter(|&&c| c <= self.store.cas_calls())
            .count();
        let mut recorded: Vec<Effect> = Vec::new();
        for o in fold.operations() {
            for e in o.effects() {
                recorded.push(Effect::new(o.id(), e.step.clone()));
            }
            let in_world: BTreeSet<&Effect> = self
                .world
                .writes
                .iter()
                .filter(|e| e.op == o.id())
                .collect();
            let in_journal: BTreeSet<Effect> = o
                .effects()
                .iter()
                .map(|e| Effect::new(o.id(), e.step.clone()))
                .collect();
            let in_journal: BTreeSet<&Effect> = in_journal.iter().collect();
            if o.closure().map(|c| c.outcome) == Some(Outcome::Abandoned) {
                // Abandon leaves the world as it is: an effect may have landed unrecorded.
                assert!(in_journal.is_subset(&in_world), "{:?}", o.id());
            } else {
                assert_eq!(in_journal, in_world, "operation {}", o.id());
            }
        }
        let mut seen = BTreeSet::new();
        for e in &recorded {
            if !seen.insert(e) {
                let o = fold.operation(e.op).unwrap();
                panic!("{e} was recorded twice: {:#?}", o.entries());
            }
        }
        assert!(fold.foreign_records().is_empty());
    }
}

#[test]
fn replay_after_any_crash_converges_to_each_effect_exactly_once() {
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let stats = std::cell::RefCell::new(BTreeMap::new());
    runner
        .run(&case_strategy(), |case| {
            let mut h = Harness::new(case);
            h.run();
            h.check(&mut stats.borrow_mut());
            Ok(())
        })
        .unwrap();
    // The fixed seed must exercise every path the property is about.
    let stats = stats.into_inner();
    println!("{stats:#?}");
    for key in [
        "crashes",
        "compactions",
        "marker mismatches adopted",
        "deleted annotations restored",
        "store faults",
        "Issued (replayed)",
        "Canceled/CanceledBeforeIssue",
        "Canceled/DeadlineBeforeIssue",
        "Stalled",
        "Blocked",
        "Retried",
        "Abandoned",
        "ProofCaptured",
        "ClaimRetired",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "no case exercised {key}"
        );
    }
}

#[test]
fn a_restored_older_annotation_is_recovered_from_the_world_without_reissuing() {
    let case = Case {
        requests: (0..4)
            .map(|i| Request {
                req: if i % 2 == 0 {
                    Req::Scale(4)
                } else {
                    Req::Rolling
                },
                block_at: None,
                abandon: false,
            })
            .collect(),
        crashes: BTreeSet::new(),
        faults: BTreeMap::new(),
        pauses: BTreeSet::new(),
        hand_edits: BTreeSet::new(),
        deletions: BTreeSet::new(),
    };
    let mut h = Harness::new(case);
    h.run();
    let writes_before = h.world.writes.len();
    // Restore the annotation as it was after the first operation completed.
    let old = h
        .store
        .writes()
        .into_iter()
        .find(|w| decode_document(w).unwrap().seq() == 4)
        .unwrap();
    h.store.set_annotation(Some(old));
    let journal = load_journal(&h.store, FLEET).unwrap().0;
    let plan = h.mirror.reconcile(journal.document()).unwrap();
    assert_eq!(
        plan.signals,
        vec![Signal::JournalRollback {
            annotation_seq: 4,
            mirror_seq: 16
        }]
    );
    assert_eq!(h.mirror.diverged(FLEET).unwrap().len(), 12);
    // The restarted operator records the world's marker and plans nothing already done.
    let mut p = Process {
        cached: None,
        started: true,
    };
    h.reconcile(&mut p).unwrap();
    let journal = load_journal(&h.store, FLEET).unwrap().0;
    let last = journal.entries().last().unwrap();
    assert_eq!(last.entry_type(), EntryType::Recovered);
    assert_eq!(journal.fold().foreign_records().len(), 1);
    assert_eq!(journal.predecessor_effect(), h.world.marker);
    assert!(matches!(h.reconcile(&mut p), Err(Stop::Idle)));
    assert_eq!(h.world.writes.len(), writes_before, "nothing was reissued");
}
