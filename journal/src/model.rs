//! The journal's vocabulary: identifiers, operation kinds, effect steps, entry payloads and the
//! sealed, immutable [`Entry`].
//!
//! An entry is built by the operator as a [`NewEntry`] (a decision that is not yet part of any
//! chain) and becomes an [`Entry`] only by being sealed onto a journal (which assigns `seq`,
//! `prev` and `hash`) or by being decoded from an annotation or the mirror. Sealed entries cannot
//! be changed: their canonical JSON is computed once and kept alongside the fields.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Per-fleet sequence number of an entry; the first entry of a fleet has seq 1.
pub type Seq = u64;

/// Why an identifier, hash, step or effect string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// The id of an operation: a UUID chosen when the operation is decided.
///
/// Its text form is the lowercase hyphenated UUID; parsing accepts exactly that form (36
/// characters), so every id has one spelling and the hash chain is unambiguous.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationId(Uuid);

impl OperationId {
    /// A fresh random (v4) id, for a new decision.
    pub fn new_v4() -> Self {
        OperationId(Uuid::new_v4())
    }
    /// Wraps an existing UUID.
    pub fn from_uuid(uuid: Uuid) -> Self {
        OperationId(uuid)
    }
    /// The UUID.
    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl FromStr for OperationId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let refuse = || {
            ParseError(format!(
                "`{}` is not an operation id (a lowercase hyphenated UUID such as 0b5e8a52-6c3e-4c1f-9d7a-2f3b4c5d6e7f)",
                truncate_for_message(s)
            ))
        };
        if s.len() != 36 {
            return Err(refuse());
        }
        let uuid = Uuid::parse_str(s).map_err(|_| refuse())?;
        if uuid.hyphenated().to_string() != s {
            return Err(refuse());
        }
        Ok(OperationId(uuid))
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationId({self})")
    }
}

/// A SHA-256 digest, written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// All zeros: the `prev` of entry 1, and `head`/`compactedHash` of a document that has none.
    pub const ZERO: Hash = Hash([0; 32]);

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Whether this is [`Hash::ZERO`].
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }
}

impl FromStr for Hash {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let ok = s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !ok {
            return Err(ParseError(format!(
                "`{}` is not a SHA-256 hash (64 lowercase hex digits)",
                truncate_for_message(s)
            )));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| ParseError(e.to_string()))?;
        Ok(Hash(out))
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", &self.to_hex()[..12])
    }
}

/// The writer of an entry: the lease holder's identity and the lease's transition count, for audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Pod name (or hostname) of the operator replica.
    pub identity: String,
    /// `spec.leaseTransitions` of the Lease when the entry was written.
    pub lease_transitions: u32,
    /// The Lease the writer held, `namespace/name`: names the operator installation.
    /// `None` in entries written before installations were recorded (encoded only when set,
    /// so those entries keep their hashes).
    pub lease: Option<String>,
}

/// What an operation changes (docs/design.md "Operation kinds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    /// Creates the workload and prerequisites of a new fleet.
    Provision,
    /// Changes the workload's replica count.
    Scale,
    /// Applies a restart token (rolling or coordinated).
    Restart,
    /// Applies a new runtime image.
    Upgrade,
    /// Corrects drift or applies a template rendered differently by a newer release.
    TemplateUpdate,
    /// Replaces one member on a fresh disk.
    MemberReplacement,
    /// Tears a deleted fleet down.
    Delete,
}

impl OperationKind {
    /// Every kind, in declaration order.
    pub const ALL: [OperationKind; 7] = [
        OperationKind::Provision,
        OperationKind::Scale,
        OperationKind::Restart,
        OperationKind::Upgrade,
        OperationKind::TemplateUpdate,
        OperationKind::MemberReplacement,
        OperationKind::Delete,
    ];

    /// The spelling used in the journal and in status.
    pub fn as_str(&self) -> &'static str {
        match self {
            OperationKind::Provision => "Provision",
            OperationKind::Scale => "Scale",
            OperationKind::Restart => "Restart",
            OperationKind::Upgrade => "Upgrade",
            OperationKind::TemplateUpdate => "TemplateUpdate",
            OperationKind::MemberReplacement => "MemberReplacement",
            OperationKind::Delete => "Delete",
        }
    }

    /// Whether operations of this kind write (or delete) the workload. `MemberReplacement` only
    /// touches Pods and claims.
    pub fn writes_workload(&self) -> bool {
        !matches!(self, OperationKind::MemberReplacement)
    }

    /// Whether `step` is one of this kind's effect steps (docs/design.md "Operation kinds", plus
    /// the `restart/<member>` step of a retried strict proof, docs/design.md "Strict operations").
    pub fn allows_step(&self, step: &Step) -> bool {
        use OperationKind as K;
        match step {
            Step::Create => matches!(self, K::Provision),
            Step::Replicas => matches!(self, K::Scale),
            Step::Template => matches!(self, K::Restart | K::Upgrade | K::TemplateUpdate),
            Step::Stop | Step::Resume => matches!(self, K::Restart),
            Step::Proof(_) | Step::Restart(_) => matches!(self, K::Scale | K::Restart),
            Step::Retire(_) => matches!(
                self,
                K::Scale | K::Restart | K::MemberReplacement | K::Delete
            ),
            Step::Hold | Step::Pod | Step::Commit | Step::Release => {
                matches!(self, K::MemberReplacement)
            }
            Step::Workload | Step::Prerequisites => matches!(self, K::Delete),
        }
    }
}

impl FromStr for OperationKind {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        OperationKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                ParseError(format!(
                    "`{}` is not an operation kind (Provision, Scale, Restart, Upgrade, TemplateUpdate, MemberReplacement, Delete)",
                    truncate_for_message(s)
                ))
            })
    }
}

impl fmt::Display for OperationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One effect step of an operation (docs/design.md "Operation kinds"). Steps that name a member or
/// a claim carry that name; names may not be empty or contain `/`, whitespace or control
/// characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// `create`: create the workload.
    Create,
    /// `replicas`: set `spec.replicas`.
    Replicas,
    /// `template`: replace the operator-owned fields of the workload.
    Template,
    /// `stop`: coordinated restart, `spec.replicas = 0`.
    Stop,
    /// `resume`: coordinated restart, replicas and full rendering back.
    Resume,
    /// `proof/<member>`: strict removal request to a member's runtime.
    Proof(String),
    /// `retire/<claim>`: delete a claim with UID and resourceVersion preconditions.
    Retire(String),
    /// `restart/<member>`: guarded Pod delete of a strict target before a retried proof.
    Restart(String),
    /// `hold`: replacement hold on the member Pod.
    Hold,
    /// `pod`: delete the member Pod.
    Pod,
    /// `commit`: mark the hold committed.
    Commit,
    /// `release`: remove the hold.
    Release,
    /// `workload`: delete the workload.
    Workload,
    /// `prerequisites`: delete NetworkPolicy, PDB and Services.
    Prerequisites,
}

impl Step {
    /// Whether this step writes the workload together with the effect marker
    /// (`celld.eric.dev/effect`), which is what the next operation's predecessor guard compares.
    pub fn writes_workload_marker(&self) -> bool {
        matches!(
            self,
            Step::Create | Step::Replicas | Step::Template | Step::Stop | Step::Resume
        )
    }
}

impl FromStr for Step {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let named = |prefix: &str, make: fn(String) -> Step| -> Option<Result<Step, ParseError>> {
            let name = s.strip_prefix(prefix)?;
            Some(if is_valid_object_name(name) {
                Ok(make(name.to_owned()))
            } else {
                Err(ParseError(format!(
                    "step `{}` names an invalid object `{}`",
                    truncate_for_message(s),
                    truncate_for_message(name)
                )))
            })
        };
        if let Some(r) = named("proof/", Step::Proof) {
            return r;
        }
        if let Some(r) = named("retire/", Step::Retire) {
            return r;
        }
        if let Some(r) = named("restart/", Step::Restart) {
            return r;
        }
        Ok(match s {
            "create" => Step::Create,
            "replicas" => Step::Replicas,
            "template" => Step::Template,
            "stop" => Step::Stop,
            "resume" => Step::Resume,
            "hold" => Step::Hold,
            "pod" => Step::Pod,
            "commit" => Step::Commit,
            "release" => Step::Release,
            "workload" => Step::Workload,
            "prerequisites" => Step::Prerequisites,
            _ => {
                return Err(ParseError(format!(
                    "`{}` is not an effect step",
                    truncate_for_message(s)
                )))
            }
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Create => f.write_str("create"),
            Step::Replicas => f.write_str("replicas"),
            Step::Template => f.write_str("template"),
            Step::Stop => f.write_str("stop"),
            Step::Resume => f.write_str("resume"),
            Step::Proof(m) => write!(f, "proof/{m}"),
            Step::Retire(c) => write!(f, "retire/{c}"),
            Step::Restart(m) => write!(f, "restart/{m}"),
            Step::Hold => f.write_str("hold"),
            Step::Pod => f.write_str("pod"),
            Step::Commit => f.write_str("commit"),
            Step::Release => f.write_str("release"),
            Step::Workload => f.write_str("workload"),
            Step::Prerequisites => f.write_str("prerequisites"),
        }
    }
}

fn is_valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// An effect marker `<op>/<step>`: what the guarded write stamps into `celld.eric.dev/effect`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Effect {
    /// The operation that issued the effect.
    pub op: OperationId,
    /// The step.
    pub step: Step,
}

impl Effect {
    /// `op/step`.
    pub fn new(op: OperationId, step: Step) -> Self {
        Effect { op, step }
    }
}

impl FromStr for Effect {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let (op, step) = s.split_once('/').ok_or_else(|| {
            ParseError(format!(
                "`{}` is not an effect (expected `<operation id>/<step>`)",
                truncate_for_message(s)
            ))
        })?;
        Ok(Effect {
            op: op.parse()?,
            step: step.parse()?,
        })
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.op, self.step)
    }
}

/// One target of an operation, from fresh reads at decision time. Only `pod` is required:
/// Bucket members have no claim, and a plain Retain contraction needs no runtime identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub pod_uid: Option<String>,
    /// Pod IP (strict removal requests go to it).
    pub pod_ip: Option<String>,
    /// The runtime generation reported by `/state`.
    pub runtime_generation: Option<String>,
    /// Claim name.
    pub claim: Option<String>,
    /// Claim UID.
    pub claim_uid: Option<String>,
    /// Claim resourceVersion.
    pub claim_resource_version: Option<String>,
}

/// A strict data-safe proof as read from a member's `/state` (docs/runtime.md "What counts as a
/// proof").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// `operation.operation_id` as reported (must be this operation's id).
    pub operation_id: String,
    /// `operation.expected_generation` as reported.
    pub expected_generation: String,
    /// `operation.phase` (`data_safe` for a valid proof).
    pub phase: String,
    /// `shutdown.control_only`.
    pub control_only: bool,
    /// `operation.blocker`; absent for a valid proof.
    pub blocker: Option<String>,
    /// When the proof was read.
    pub observed_at: DateTime<Utc>,
}

/// How a completed operation ended (`Completed.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletedOutcome {
    /// The target was reached.
    Succeeded,
    /// A replacement found the member changed (recovered, or a new UID) and deleted nothing.
    MemberChanged,
    /// A replacement ended with the old claim kept.
    ClaimKept,
}

/// Why an operation was canceled (`Canceled.reason`); only possible before anything was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// The fleet was paused.
    CanceledBeforeIssue,
    /// The deadline passed before anything was issued.
    DeadlineBeforeIssue,
    /// The spec no longer asks for it, or the fleet is being deleted.
    RequestChanged,
    /// The first step's guard failed (the workload changed under us).
    PredecessorChanged,
}

macro_rules! string_enum {
    ($ty:ident { $($variant:ident),+ $(,)? }) => {
        impl $ty {
            /// The spelling used in the journal and in status.
            pub fn as_str(&self) -> &'static str {
                match self { $($ty::$variant => stringify!($variant)),+ }
            }
        }
        impl FromStr for $ty {
            type Err = ParseError;
            fn from_str(s: &str) -> Result<Self, ParseError> {
                match s {
                    $(stringify!($variant) => Ok($ty::$variant),)+
                    _ => Err(ParseError(format!(
                        "`{}` is not one of {}",
                        truncate_for_message(s),
                        [$(stringify!($variant)),+].join(", ")
                    ))),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum!(CompletedOutcome {
    Succeeded,
    MemberChanged,
    ClaimKept
});
string_enum!(CancelReason {
    CanceledBeforeIssue,
    DeadlineBeforeIssue,
    RequestChanged,
    PredecessorChanged
});

/// `Intent`: decided, nothing issued yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// What the operation changes.
    pub kind: OperationKind,
    /// Replica count before.
    pub from: i32,
    /// Replica count after (equal to `from` for template and replacement operations).
    pub to: i32,
    /// The restart token the operation applies, if any.
    pub token: Option<String>,
    /// The runtime image the operation applies, if any.
    pub image: Option<String>,
    /// Why (e.g. `DiskLost`, `Administrative`, `AdoptedHold`), if the kind has reasons.
    pub reason: Option<String>,
    /// When the operation stalls (after issue) or is canceled (before issue).
    pub deadline: DateTime<Utc>,
    /// The objects the operation acts on, from fresh reads.
    pub targets: Vec<Target>,
    /// The workload's UID, when it exists.
    pub workload_uid: Option<String>,
    /// The last effect this journal issued, which the workload's marker must show; absent for a
    /// new workload.
    pub predecessor_effect: Option<Effect>,
}

/// `Issued`: the guarded write of one step committed (or was found already in the world).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The step.
    pub step: Step,
    /// `<op>/<step>`; must name this entry's operation and step.
    pub effect: Effect,
    /// The target's resourceVersion the write was decided on, when there is one.
    pub decided_on_resource_version: Option<String>,
    /// The target's resourceVersion after the write, when known.
    pub result_resource_version: Option<String>,
    /// True when a restarted manager found the effect already in the world.
    pub replayed: bool,
    /// The member's identity the step was sent to, when it differs from the Intent's: a
    /// `proof/<member>` asked again after a retry restarted the member (new Pod UID, IP and
    /// runtime generation). Encoded only when set, so older entries keep their hashes.
    pub target: Option<Target>,
}

/// `ProofCaptured`: a strict data-safe proof is held for a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofCaptured {
    /// The member (Pod name) the proof is for; must be one of the Intent's targets.
    pub member: String,
    /// The proof.
    pub proof: Proof,
}

/// `ClaimRetired`: the claim delete with UID+RV preconditions was accepted (or the exact claim is
/// already gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRetired {
    /// Claim name.
    pub claim: String,
    /// Claim UID the delete was conditioned on.
    pub claim_uid: String,
    /// Claim resourceVersion the delete was conditioned on, when one was used.
    pub claim_resource_version: Option<String>,
}

/// `Observed`: the world reached the operation's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// What was observed, for people.
    pub note: String,
}

/// `Completed`: terminal, success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// How it ended.
    pub outcome: CompletedOutcome,
}

/// `Canceled`: terminal; allowed only while nothing was issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canceled {
    /// Why.
    pub reason: CancelReason,
}

/// `Blocked`: needs a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The failed check, for people (shown as `currentOperation.blocker`).
    pub blocker: String,
}

/// `Stalled`: the deadline passed after issue; the operation stays open and driven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    /// The deadline that passed.
    pub deadline: DateTime<Utc>,
}

/// `Abandoned` or `Retried`: a person's (or the operator's, e.g. `fleet-deletion`) command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonAction {
    /// Who asked.
    pub by: String,
    /// Why, when given.
    pub reason: Option<String>,
}

/// `Recovered`: the world shows an effect this journal does not hold; recorded, never reissued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The effect found in the world; must name this entry's operation.
    pub effect: Effect,
    /// Where it was found (e.g. `workload-marker`, `orphan-hold`).
    pub source: String,
}

/// The type-specific part of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryBody {
    /// See [`Intent`].
    Intent(Intent),
    /// See [`Issued`].
    Issued(Issued),
    /// See [`ProofCaptured`].
    ProofCaptured(ProofCaptured),
    /// See [`ClaimRetired`].
    ClaimRetired(ClaimRetired),
    /// See [`Observed`].
    Observed(Observed),
    /// See [`Completed`].
    Completed(Completed),
    /// See [`Canceled`].
    Canceled(Canceled),
    /// See [`Blocked`].
    Blocked(Blocked),
    /// See [`Stalled`].
    Stalled(Stalled),
    /// A person abandoned the operation; terminal.
    Abandoned(PersonAction),
    /// A person asked to retry a blocked or stalled operation.
    Retried(PersonAction),
    /// See [`Recovered`].
    Recovered(Recovered),
}

/// The `type` of an entry, without payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryType {
    /// `Intent`
    Intent,
    /// `Issued`
    Issued,
    /// `ProofCaptured`
    ProofCaptured,
    /// `ClaimRetired`
    ClaimRetired,
    /// `Observed`
    Observed,
    /// `Completed`
    Completed,
    /// `Canceled`
    Canceled,
    /// `Blocked`
    Blocked,
    /// `Stalled`
    Stalled,
    /// `Abandoned`
    Abandoned,
    /// `Retried`
    Retried,
    /// `Recovered`
    Recovered,
}

string_enum!(EntryType {
    Intent,
    Issued,
    ProofCaptured,
    ClaimRetired,
    Observed,
    Completed,
    Canceled,
    Blocked,
    Stalled,
    Abandoned,
    Retried,
    Recovered
});

impl EntryType {
    /// Every entry type.
    pub const ALL: [EntryType; 12] = [
        EntryType::Intent,
        EntryType::Issued,
        EntryType::ProofCaptured,
        EntryType::ClaimRetired,
        EntryType::Observed,
        EntryType::Completed,
        EntryType::Canceled,
        EntryType::Blocked,
        EntryType::Stalled,
        EntryType::Abandoned,
        EntryType::Retried,
        EntryType::Recovered,
    ];

    /// Whether the entry closes its operation (`Completed`, `Canceled`, `Abandoned`).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EntryType::Completed | EntryType::Canceled | EntryType::Abandoned
        )
    }

    /// The Event reason published for an entry of this type (docs/design.md "Events and metrics").
    pub fn event_reason(&self) -> &'static str {
        match self {
            EntryType::Intent => "OperationIntent",
            EntryType::Issued => "OperationIssued",
            EntryType::ProofCaptured => "OperationProofCaptured",
            EntryType::ClaimRetired => "OperationClaimRetired",
            EntryType::Observed => "OperationObserved",
            EntryType::Completed => "OperationCompleted",
            EntryType::Canceled => "OperationCanceled",
            EntryType::Blocked => "OperationBlocked",
            EntryType::Stalled => "OperationStalled",
            EntryType::Abandoned => "OperationAbandoned",
            EntryType::Retried => "OperationRetried",
            EntryType::Recovered => "OperationRecovered",
        }
    }

    /// Whether that Event is a Warning (`Blocked`, `Stalled`, `Abandoned`) rather than Normal.
    pub fn event_is_warning(&self) -> bool {
        matches!(
            self,
            EntryType::Blocked | EntryType::Stalled | EntryType::Abandoned
        )
    }
}

impl EntryBody {
    /// The entry's `type`.
    pub fn entry_type(&self) -> EntryType {
        match self {
            EntryBody::Intent(_) => EntryType::Intent,
            EntryBody::Issued(_) => EntryType::Issued,
            EntryBody::ProofCaptured(_) => EntryType::ProofCaptured,
            EntryBody::ClaimRetired(_) => EntryType::ClaimRetired,
            EntryBody::Observed(_) => EntryType::Observed,
            EntryBody::Completed(_) => EntryType::Completed,
            EntryBody::Canceled(_) => EntryType::Canceled,
            EntryBody::Blocked(_) => EntryType::Blocked,
            EntryBody::Stalled(_) => EntryType::Stalled,
            EntryBody::Abandoned(_) => EntryType::Abandoned,
            EntryBody::Retried(_) => EntryType::Retried,
            EntryBody::Recovered(_) => EntryType::Recovered,
        }
    }
}

/// A decision not yet sealed onto a journal: everything but `seq`, `prev` and `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    /// When it was decided.
    pub at: DateTime<Utc>,
    /// The operation it belongs to.
    pub op: OperationId,
    /// Who writes it.
    pub leader: Leader,
    /// Type and payload.
    pub body: EntryBody,
}

/// A sealed journal entry. Immutable: cloning is cheap (shared), and its canonical JSON is
/// computed once when it is sealed or decoded.
#[derive(Clone)]
pub struct Entry(Arc<EntryData>);

struct EntryData {
    seq: Seq,
    at: DateTime<Utc>,
    op: OperationId,
    leader: Leader,
    prev: Hash,
    hash: Hash,
    body: EntryBody,
    /// Canonical JSON including `hash`: exactly what the annotation and the mirror store.
    json: String,
}

impl Entry {
    /// Builds an entry from its parts. `hash` is taken as given (decoders keep the stored hash so
    /// that verification can report a mismatch); use [`crate::chain::seal`] to compute it.
    pub(crate) fn from_parts(
        seq: Seq,
        at: DateTime<Utc>,
        op: OperationId,
        leader: Leader,
        prev: Hash,
        hash: Hash,
        body: EntryBody,
    ) -> Entry {
        let json = crate::codec::entry_json(seq, &at, &op, &leader, &prev, Some(&hash), &body);
        Entry(Arc::new(EntryData {
            seq,
            at,
            op,
            leader,
            prev,
            hash,
            body,
            json,
        }))
    }

    /// Per-fleet sequence number.
    pub fn seq(&self) -> Seq {
        self.0.seq
    }
    /// When it was decided.
    pub fn at(&self) -> DateTime<Utc> {
        self.0.at
    }
    /// The operation it belongs to.
    pub fn op(&self) -> OperationId {
        self.0.op
    }
    /// Who wrote it.
    pub fn leader(&self) -> &Leader {
        &self.0.leader
    }
    /// Hash of the previous entry (all zeros for seq 1).
    pub fn prev(&self) -> Hash {
        self.0.prev
    }
    /// The stored hash of this entry.
    pub fn hash(&self) -> Hash {
        self.0.hash
    }
    /// Type and payload.
    pub fn body(&self) -> &EntryBody {
        &self.0.body
    }
    /// The entry's `type`.
    pub fn entry_type(&self) -> EntryType {
        self.0.body.entry_type()
    }
    /// Canonical JSON of the entry as stored (keys sorted, no whitespace, `hash` included).
    pub fn to_json(&self) -> &str {
        &self.0.json
    }
    /// The entry without `seq`/`prev`/`hash`, e.g. to compare a decision with what was written.
    pub fn to_new_entry(&self) -> NewEntry {
        NewEntry {
            at: self.0.at,
            op: self.0.op,
            leader: self.0.leader.clone(),
            body: self.0.body.clone(),
        }
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.json == other.0.json
    }
}
impl Eq for Entry {}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.json)
    }
}

/// Shortens attacker-controlled text quoted in error messages.
pub(crate) fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.escape_debug().to_string()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{}…", head.escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_have_exactly_one_spelling() {
        let id = OperationId::new_v4();
        assert_eq!(id.to_string().parse::<OperationId>().unwrap(), id);
        assert!(id
            .to_string()
            .to_uppercase()
            .parse::<OperationId>()
            .is_err());
        assert!(id
            .as_uuid()
            .simple()
            .to_string()
            .parse::<OperationId>()
            .is_err());
        assert!(format!("{{{id}}}").parse::<OperationId>().is_err());
    }

    #[test]
    fn hashes_are_lowercase_hex_of_exactly_64_digits() {
        let h: Hash = "ab".repeat(32).parse().unwrap();
        assert_eq!(h.to_hex(), "ab".repeat(32));
        assert!("AB".repeat(32).parse::<Hash>().is_err());
        assert!("ab".repeat(31).parse::<Hash>().is_err());
        assert!(Hash::ZERO.is_zero());
    }

    #[test]
    fn steps_round_trip_through_their_text() {
        for s in [
            "create",
            "replicas",
            "template",
            "stop",
            "resume",
            "proof/beta-1",
            "retire/data-beta-1",
            "restart/beta-1",
            "hold",
            "pod",
            "commit",
            "release",
            "workload",
            "prerequisites",
        ] {
            assert_eq!(s.parse::<Step>().unwrap().to_string(), s);
        }
        for bad in [
            "",
            "proof/",
            "retire/a/b",
            "proof/a b",
            "Template",
            "delete",
        ] {
            assert!(bad.parse::<Step>().is_err(), "{bad}");
        }
    }

    #[test]
    fn effects_split_at_the_first_slash() {
        let op = OperationId::new_v4();
        let e: Effect = format!("{op}/proof/beta-2").parse().unwrap();
        assert_eq!(e, Effect::new(op, Step::Proof("beta-2".into())));
        assert!("no-slash".parse::<Effect>().is_err());
        assert!("not-a-uuid/template".parse::<Effect>().is_err());
    }

    #[test]
    fn only_marker_steps_count_as_workload_effects() {
        assert!(Step::Replicas.writes_workload_marker());
        assert!(Step::Resume.writes_workload_marker());
        assert!(!Step::Proof("m".into()).writes_workload_marker());
        assert!(!Step::Workload.writes_workload_marker());
    }

    #[test]
    fn kinds_allow_only_their_own_steps() {
        use OperationKind as K;
        assert!(K::Scale.allows_step(&Step::Replicas));
        assert!(K::Scale.allows_step(&Step::Retire("c".into())));
        assert!(!K::Scale.allows_step(&Step::Template));
        assert!(K::Restart.allows_step(&Step::Stop));
        assert!(!K::Upgrade.allows_step(&Step::Stop));
        assert!(K::MemberReplacement.allows_step(&Step::Hold));
        assert!(!K::Delete.allows_step(&Step::Replicas));
        assert!(K::Provision.allows_step(&Step::Create));
        assert!(!K::MemberReplacement.writes_workload());
        assert!(K::Delete.writes_workload());
    }

    #[test]
    fn entry_types_know_their_events() {
        assert_eq!(EntryType::Stalled.event_reason(), "OperationStalled");
        assert!(EntryType::Abandoned.event_is_warning());
        assert!(!EntryType::Completed.event_is_warning());
        assert!(EntryType::Canceled.is_terminal());
        assert!(!EntryType::Retried.is_terminal());
        for t in EntryType::ALL {
            assert_eq!(t.as_str().parse::<EntryType>().unwrap(), t);
        }
    }
}
