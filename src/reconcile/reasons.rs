//! Every condition reason the operator sets, with what it means and what a person does
//! about it: the code's own list. A reconcile can only report a reason from here
//! ([`super::status::Report`]'s constructors take a [`Reason`]); `celld-operator conditions`
//! prints it as docs/conditions.md (`make docs`, drift-checked by `make check`), and a test
//! fails when a reason has no runbook heading in docs/operations.md.

/// One reason.
#[derive(Debug, PartialEq, Eq)]
pub struct Reason {
    /// PascalCase, as on the condition.
    pub name: &'static str,
    /// What the fleet is in, in plain words.
    pub meaning: &'static str,
    /// What a person does ("Nothing: …" when nothing).
    pub action: &'static str,
    /// The heading in docs/operations.md (under "Runbooks by reason") that covers it.
    pub runbook: &'static str,
}

/// The class a reason is reported with, for the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Done,
    Wait,
    Progress,
    Blocked,
    BlockedInfraReady,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Done => "done",
            Kind::Wait => "wait",
            Kind::Progress => "progress",
            Kind::Blocked => "blocked",
            Kind::BlockedInfraReady => "blocked, infrastructure ready",
        }
    }
}

/// A reason with the class it is reported with (the constructors of `Report` take it).
#[derive(Debug, PartialEq, Eq)]
pub struct Classed {
    pub reason: Reason,
    pub kind: Kind,
}

impl std::ops::Deref for Classed {
    type Target = Reason;
    fn deref(&self) -> &Reason {
        &self.reason
    }
}

macro_rules! reason {
    ($konst:ident, $kind:ident, $name:literal, $meaning:literal, $action:literal, $runbook:literal) => {
        #[doc = $meaning]
        pub const $konst: Classed = Classed {
            reason: Reason {
                name: $name,
                meaning: $meaning,
                action: $action,
                runbook: $runbook,
            },
            kind: Kind::$kind,
        };
    };
}

const NORMAL: &str = "Normal reasons";

reason!(
    PROVISIONED,
    Done,
    "Provisioned",
    "Nothing is open or left to plan, no member needs healing, and the workload has rolled out with every member ready.",
    "Nothing: the fleet is as specified.",
    "Normal reasons"
);
reason!(PROVISIONING, Wait, "Provisioning",
    "The operator waits for the world (a rollout, members being scheduled or becoming Ready, a claim, a down member's replacement time, a pause before a canceled request is planned again) or has just closed an operation and plans again; the message says which.",
    "Nothing: it moves by itself; if the same message stays (a member down with an image error, two members down), follow the member-down runbook.", "Normal reasons");
reason!(
    LIFECYCLE_PROGRESS,
    Progress,
    "LifecycleProgress",
    "An operation is open and moving (including the Delete of a deleted fleet); the message names it, its phase and its step.",
    "Nothing: the operation is being driven.",
    "Normal reasons"
);
reason!(OPERATION_BLOCKED, BlockedInfraReady, "OperationBlocked",
    "An open operation (a strict one, a member replacement, or a rolling/scale operation whose workload marker moved after its write) stopped because going on would need a guess; it stays open and the message names it, its step and the blocker.",
    "Resolve the blocker, then `kubectl celld journal retry NS/FLEET OP`, or stop it with `kubectl celld journal abandon NS/FLEET OP` (a moved marker must be put back before a retry can pass).",
    "`OperationBlocked`");
reason!(REPLACEMENT_REFUSED, BlockedInfraReady, "ReplacementRefused",
    "A celld.eric.dev/replace-member request fails one of its checks (value, open operation, pause, member gone, recreated or terminating, another member down); the checks repeat at every reconcile, and while it is pending it is reported instead of the pause or of an open operation that is not blocked.",
    "Wait when the check is one that passes by itself, otherwise withdraw the request (`kubectl annotate celldfleet -n NS FLEET celld.eric.dev/replace-member-`) and ask again with `kubectl celld replace NS/FLEET MEMBER`.",
    "`ReplacementRefused`");
reason!(MEMBER_UNSCHEDULABLE, BlockedInfraReady, "MemberUnschedulable",
    "PersistentFleet with one member down: past the replacement delay the scheduler still cannot place it and a fresh disk cannot help (its claim is not Bound or was created with this Pod); the message quotes the scheduler.",
    "Add capacity or relax what keeps the member off the nodes in the fleet's zones; it starts once placed.",
    "`MemberUnschedulable`");
reason!(STRICT_REMOVAL_UNAVAILABLE, BlockedInfraReady, "StrictRemovalUnavailable",
    "A Retire contraction or coordinated restart is asked for, but a member it needs does not answer /state, does not offer strict disk removal, is control-only or is running a removal, so nothing is started.",
    "Fix the member the message names (reachability, an image with strict removal, a Pod restart for a control-only member), or withdraw the request.",
    "`StrictRemovalUnavailable`");
reason!(INVALID_CONFIGURATION, Blocked, "InvalidConfiguration",
    "The defaulted spec breaks a validation rule (one admission enforces, or one it cannot express); the message names the first violation and how many more, and the operator changes nothing for the fleet.",
    "Fix the named field (`kubectl edit celldfleet -n NS FLEET`) and repeat until the message clears; a wrong field that is fixed at creation means deleting and recreating the fleet.", "`InvalidConfiguration`");
reason!(UNSUPPORTED_TRANSITION, Blocked, "UnsupportedTransition",
    "spec.runtimeImage is not set, so nothing is provisioned or changed (the planner's other use of this reason is not produced by this build).",
    "Set spec.runtimeImage to a registry-qualified image pinned by digest.",
    "`UnsupportedTransition`");
reason!(ISOLATION_UNVERIFIED, Blocked, "IsolationUnverified",
    "The operator runs without --network-policy-enforced, so it provisions nothing for any fleet until an administrator states that the CNI enforces NetworkPolicy.",
    "After checking that the CNI enforces NetworkPolicy, `helm upgrade celld-operator helm/celld-operator -n celld-system --reuse-values --set networkPolicyEnforced=true`.",
    "`IsolationUnverified`");
reason!(SERVICE_ACCOUNT_MISSING, Blocked, "ServiceAccountMissing",
    "The ServiceAccount named by spec.serviceAccountName does not exist in the fleet's namespace (checked before anything is provisioned and again before every operation that creates Pods or claims).",
    "Create that ServiceAccount with the bucket access your platform grants (`kubectl create serviceaccount -n NS NAME`); the field itself is fixed at creation.",
    "`ServiceAccountMissing`");
reason!(
    STORAGE_CLASS_MISSING,
    Blocked,
    "StorageClassMissing",
    "PersistentFleet: the StorageClass named by spec.storage.storageClassName does not exist (checked before anything is provisioned and again before every operation that creates Pods or claims).",
    "Create the StorageClass with provisioner ebs.csi.aws.com, reclaimPolicy Delete and volumeBindingMode WaitForFirstConsumer; the fleet's field is fixed at creation.",
    "`StorageClassMissing`, `InvalidStorageClass`"
);
reason!(INVALID_STORAGE_CLASS, Blocked, "InvalidStorageClass",
    "PersistentFleet: the StorageClass exists but lacks provisioner ebs.csi.aws.com (hostpath.csi.k8s.io also accepted with --local-test), reclaimPolicy Delete or volumeBindingMode WaitForFirstConsumer; the message shows what it has.",
    "Delete the StorageClass and create it again under the same name with those fields (they cannot be updated in place).",
    "`StorageClassMissing`, `InvalidStorageClass`");
reason!(STORAGE_SCOPE_CONFLICT, Blocked, "StorageScopeConflict",
    "The CelldStorageReservation of the fleet's bucket binds it to another fleet (namespace, name or UID) or another fixed configuration, or carries owner references, a deletionTimestamp or other features' fields, so this fleet creates and adopts nothing.",
    "Give the fleet a bucket no reservation holds (delete and recreate the fleet, storage is fixed); delete the reservation only after deciding, outside the operator's rules, that this fleet takes over the bucket of a fleet that no longer exists.",
    "`StorageScopeConflict`");
reason!(STORAGE_IDENTITY_CONFLICT, Blocked, "StorageIdentityConflict",
    "PersistentFleet: a claim data-<fleet>-<i> at a member name the fleet uses exists without this fleet's UID label, so it is neither attached nor deleted and no scale, restart or upgrade is planned.",
    "Find whose disk it is and, once its data is known not to be needed or is saved, delete it (`kubectl delete pvc -n NS data-FLEET-I`).",
    "`StorageIdentityConflict`");
reason!(INFRASTRUCTURE_BLOCKED, Blocked, "InfrastructureBlocked",
    "A NetworkPolicy, PodDisruptionBudget or Service at one of the fleet's names is not owned by this fleet (or is being deleted), or an owned Service differs from the rendered shape, and the operator neither adopts nor changes it.",
    "Wait if it is being deleted; otherwise delete the foreign or misshapen object (`kubectl delete KIND -n NS NAME`) so the operator creates its own, or move an object something else needs to another name.",
    "`InfrastructureBlocked`");
reason!(LIFECYCLE_BLOCKED, Blocked, "LifecycleBlocked",
    "The workload at the fleet's name exists but is not owned by this fleet (no fleet label with its UID, owner references, or it is being deleted), so it is neither adopted nor changed and nothing is planned.",
    "Wait if it is being deleted; otherwise delete it if nothing needs it, or remove owner references a tool added to the fleet's own workload.", "`LifecycleBlocked`");
reason!(SCHEDULING_BLOCKED, Blocked, "SchedulingBlocked",
    "Ordered Bucket fleet in Strict placement: the zone gate of a member Pod could not be released because the Pod already selects another zone, or its update failed with an error other than a conflict or not found.",
    "Delete the Pod if another zone was set on it (`kubectl delete pod -n NS POD`), otherwise fix what the quoted API error names.",
    "`SchedulingBlocked`");
reason!(EFFECT_MARKER_MISMATCH, Blocked, "EffectMarkerMismatch",
    "The workload's celld.eric.dev/effect marker is missing, not a marker, or names an effect the journal recorded before its last one (a hand edit, a restore, another writer), so the operator writes nothing to it and plans nothing.",
    "Stop the other writer, check the live spec, then `kubectl celld journal adopt NS/FLEET` (or restore the marker by hand).",
    "`EffectMarkerMismatch`");
reason!(JOURNAL_INVALID, Blocked, "JournalInvalid",
    "The journal annotation does not decode, belongs to another fleet UID, has a hash chain that does not verify or breaks the transition rules, so the operator writes nothing for the fleet (a deleted fleet is still deleted, keeping its claims).",
    "Run `kubectl celld journal restore NS/FLEET --from-mirror`, else `--from-file EXPORT`, and only when no good copy exists `kubectl celld journal reset NS/FLEET --reason TEXT` after checking the members.",
    "`JournalInvalid`, `JournalMissing`");
reason!(JOURNAL_MISSING, Blocked, "JournalMissing",
    "The journal annotation is gone while the leader's local mirror holds entries for this fleet UID, so the operator writes nothing for the fleet (a deleted fleet is still deleted, keeping its claims).",
    "Stop whatever removed the annotation, then run `kubectl celld journal restore NS/FLEET --from-mirror` (or `--from-file EXPORT`, or `journal reset NS/FLEET --reason TEXT` when no copy exists).",
    "`JournalInvalid`, `JournalMissing`");
reason!(JOURNAL_OVER_BUDGET, Blocked, "JournalOverBudget",
    "A journal append does not fit --journal-annotation-bytes even after compaction dropped everything it may, so nothing is appended and the step that needed the entry does not go on.",
    "Raise the budget above the size the message names (chart journal.annotationBytes, at most 131072).",
    "`JournalOverBudget`");
reason!(FOREIGN_OPERATOR, Blocked, "ForeignOperator",
    "Another operator installation (another Lease) wrote a journal entry or an installation record on this fleet within --foreign-operator-window, so no installation issues anything for it, deletion included.",
    "Stop or narrow (fleetNamespaces) every installation but one; the survivor goes on once the others' records are older than the window, or at once after `kubectl annotate celldfleet -n NS FLEET celld.eric.dev/operators-`.", "`ForeignOperator`");
reason!(NAMESPACE_ACCESS_DENIED, Blocked, "NamespaceAccessDenied",
    "A request of this reconcile was refused with 403, usually because the Role and RoleBinding celld-fleet-operator are missing in the fleet's namespace, so nothing there is read or written.",
    "Add the namespace to the chart's fleetNamespaces (`helm upgrade ... --reuse-values --set 'fleetNamespaces={...,NS}'`), or grant what the message's refused request needs.",
    "`NamespaceAccessDenied`");
reason!(DELETION_BLOCKED, Blocked, "DeletionBlocked",
    "The fleet is being deleted but the workload at its name is not owned by this fleet (no fleet label with its UID, or owner references), so the Delete operation waits and the finalizer stays.",
    "Delete that workload by hand if nothing needs it (or, if it is the fleet's own, remove the owner references); never remove the fleet's finalizer by hand.", "`DeletionBlocked`");
reason!(MAINTENANCE_PAUSED, Blocked, "MaintenancePaused",
    "spec.maintenance.paused is true: no operation starts and no member is healed, an open operation that issued nothing is canceled, and one already issued is still driven (and reported instead).",
    "Nothing while the pause is intended; to resume, `kubectl patch celldfleet -n NS FLEET --type merge -p '{\"spec\":{\"maintenance\":{\"paused\":false}}}'`.", "`MaintenancePaused`");

/// Every reason the reconcile reports (carried by Ready, InfrastructureReady, Progressing and
/// Blocked).
pub const REPORTED: &[&Classed] = &[
    &PROVISIONED,
    &PROVISIONING,
    &LIFECYCLE_PROGRESS,
    &OPERATION_BLOCKED,
    &REPLACEMENT_REFUSED,
    &MEMBER_UNSCHEDULABLE,
    &STRICT_REMOVAL_UNAVAILABLE,
    &INVALID_CONFIGURATION,
    &UNSUPPORTED_TRANSITION,
    &ISOLATION_UNVERIFIED,
    &SERVICE_ACCOUNT_MISSING,
    &STORAGE_CLASS_MISSING,
    &INVALID_STORAGE_CLASS,
    &STORAGE_SCOPE_CONFLICT,
    &STORAGE_IDENTITY_CONFLICT,
    &INFRASTRUCTURE_BLOCKED,
    &LIFECYCLE_BLOCKED,
    &SCHEDULING_BLOCKED,
    &EFFECT_MARKER_MISMATCH,
    &JOURNAL_INVALID,
    &JOURNAL_MISSING,
    &JOURNAL_OVER_BUDGET,
    &FOREIGN_OPERATOR,
    &NAMESPACE_ACCESS_DENIED,
    &DELETION_BLOCKED,
    &MAINTENANCE_PAUSED,
];

macro_rules! own {
    ($konst:ident, $name:literal, $meaning:literal, $action:literal, $runbook:expr) => {
        #[doc = $meaning]
        pub const $konst: Reason = Reason {
            name: $name,
            meaning: $meaning,
            action: $action,
            runbook: $runbook,
        };
    };
}

own!(
    NOT_PAUSED,
    "NotPaused",
    "The fleet is not paused: operations start and members are healed.",
    "Nothing.",
    NORMAL
);
own!(DELETING, "Deleting",
    "The fleet has a deletionTimestamp and its Delete operation runs; the message is the reconcile's own.",
    "Nothing, unless Blocked is also True (DeletionBlocked, ForeignOperator, NamespaceAccessDenied): follow that reason's runbook.", NORMAL);
own!(
    NOT_DELETING,
    "NotDeleting",
    "The fleet is not being deleted.",
    "Nothing.",
    NORMAL
);
own!(DEADLINE_EXCEEDED, "DeadlineExceeded",
    "An open operation issued its first write and passed its deadline without reaching its target; it is still driven and completes normally if the target is reached, and nothing else is planned meanwhile.",
    "Find and fix why its target is not reached (a new image or token supersedes a waiting rolling operation), or stop it with `kubectl celld journal abandon NS/FLEET OP`.",
    "`DeadlineExceeded`");
own!(
    NO_STALLED_OPERATION,
    "NoStalledOperation",
    "No open operation is past its deadline (or the open one is blocked, which Blocked reports).",
    "Nothing.",
    NORMAL
);
own!(
    JOURNAL_NEAR_CAPACITY,
    "JournalNearCapacity",
    "The journal annotation uses more than 75 % of --journal-annotation-bytes and compaction has nothing left it may drop; nothing is blocked yet.",
    "Raise the budget (chart journal.annotationBytes, at most 131072) before an append fails with JournalOverBudget.",
    "`JournalNearCapacity`"
);
own!(
    JOURNAL_WITHIN_BUDGET,
    "JournalWithinBudget",
    "The journal fits its budget, or compaction can still make room; the message gives its size.",
    "Nothing.",
    NORMAL
);
own!(ENTRY_TIMES_INCONSISTENT, "EntryTimesInconsistent",
    "A journal entry's time is earlier than its predecessor's or more than 5 minutes in the future, so a writer's clock was wrong and deadlines or audits that read entry times may be misled; nothing is blocked.",
    "Fix the clock of the node the writing operator replica ran on (`kubectl celld journal verify NS/FLEET` lists the entries).",
    "`EntryTimesInconsistent`");
own!(
    ENTRY_TIMES_CONSISTENT,
    "EntryTimesConsistent",
    "Every entry's time follows its predecessor's and none is ahead of the clock.",
    "Nothing.",
    NORMAL
);

/// A condition type with its own reasons: (status, reason).
pub struct OwnCondition {
    pub type_: &'static str,
    pub meaning: &'static str,
    pub reasons: &'static [(bool, &'static Reason)],
}

/// The condition types with their own reasons.
pub const OWN_CONDITIONS: &[OwnCondition] = &[
    OwnCondition {
        type_: "MaintenancePaused",
        meaning: "True while `spec.maintenance.paused` is set.",
        reasons: &[(true, &MAINTENANCE_PAUSED.reason), (false, &NOT_PAUSED)],
    },
    OwnCondition {
        type_: "Deleting",
        meaning: "True from the deletionTimestamp until the finalizer is removed.",
        reasons: &[(true, &DELETING), (false, &NOT_DELETING)],
    },
    OwnCondition {
        type_: "OperationStalled",
        meaning: "True while the open operation is past its deadline after issuing writes.",
        reasons: &[(true, &DEADLINE_EXCEEDED), (false, &NO_STALLED_OPERATION)],
    },
    OwnCondition {
        type_: "JournalSizeWarning",
        meaning: "True when the journal is near its byte budget with nothing left to compact.",
        reasons: &[
            (true, &JOURNAL_NEAR_CAPACITY),
            (false, &JOURNAL_WITHIN_BUDGET),
        ],
    },
    OwnCondition {
        type_: "JournalTimeWarning",
        meaning: "True when an entry's time is inconsistent with its neighbours.",
        reasons: &[
            (true, &ENTRY_TIMES_INCONSISTENT),
            (false, &ENTRY_TIMES_CONSISTENT),
        ],
    },
];

/// The two commands that resolve a blocked operation, ready to paste.
pub fn resolve_hint(ns: &str, name: &str, op: impl std::fmt::Display) -> String {
    format!(
        "Resolve the blocker, then `kubectl celld journal retry {ns}/{name} {op}`, or stop the operation with `kubectl celld journal abandon {ns}/{name} {op}`"
    )
}

/// The GitHub anchor of a Markdown heading: lower case, punctuation other than `-` and `_`
/// dropped, spaces to `-`.
pub fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn runbook_link(r: &Reason) -> String {
    format!(
        "[{}](operations.md#{})",
        r.runbook.replace('`', ""),
        anchor(r.runbook)
    )
}

/// docs/conditions.md.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Conditions and reasons\n\n\
         <!-- Generated by `celld-operator conditions` (`make docs`) from src/reconcile/reasons.rs; \
         `make check` fails when it drifts. Do not edit by hand. -->\n\n\
         Every reconcile ends with one reason and message. They are carried by four conditions, \
         whose statuses follow the reason's class; the message of `Ready`, `InfrastructureReady` \
         and `Progressing` speaks about its own subject (members, objects, the open operation) \
         when the reconcile's message is about something else. Five further conditions have \
         reasons of their own. `kubectl describe celldfleet` and `kubectl celld status` show \
         them; each reason links to its runbook in [operations.md](operations.md).\n\n\
         ## The reconcile's reason\n\n\
         | Class | Ready | InfrastructureReady | Progressing | Blocked |\n\
         |---|---|---|---|---|\n\
         | done | True when every member is ready | True | False | False |\n\
         | wait, progress | as counted | True | True | False |\n\
         | blocked | as counted | False | False | True |\n\
         | blocked, infrastructure ready | as counted | True | False | True |\n\n\
         | Reason | Class | Meaning | What to do | Runbook |\n\
         |---|---|---|---|---|\n",
    );
    for r in REPORTED {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            r.name,
            r.kind.label(),
            cell(r.meaning),
            cell(r.action),
            runbook_link(r)
        ));
    }
    out.push_str(
        "\n## Conditions with their own reasons\n\n\
         | Condition | Status | Reason | Meaning | What to do | Runbook |\n\
         |---|---|---|---|---|---|\n",
    );
    for c in OWN_CONDITIONS {
        for (status, r) in c.reasons {
            out.push_str(&format!(
                "| `{}` | {} | `{}` | {} | {} | {} |\n",
                c.type_,
                if *status { "True" } else { "False" },
                r.name,
                cell(if *status { c.meaning } else { r.meaning }),
                cell(r.action),
                runbook_link(r)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_reason() -> Vec<&'static Reason> {
        REPORTED
            .iter()
            .map(|c| &c.reason)
            .chain(
                OWN_CONDITIONS
                    .iter()
                    .flat_map(|c| c.reasons.iter().map(|r| r.1)),
            )
            .collect()
    }

    #[test]
    fn every_reason_has_a_runbook_heading_in_the_operations_guide() {
        let guide = include_str!("../../docs/operations.md");
        let headings: Vec<&str> = guide
            .lines()
            .filter_map(|l| l.strip_prefix("### "))
            .collect();
        let missing: Vec<String> = every_reason()
            .iter()
            .filter(|r| !headings.contains(&r.runbook))
            .map(|r| format!("{} (heading {:?})", r.name, r.runbook))
            .collect();
        assert!(
            missing.is_empty(),
            "reasons without a runbook heading (### …) in docs/operations.md: {missing:?}"
        );
        // Every reason that needs a person is named in its own heading.
        for r in every_reason() {
            if r.runbook != NORMAL {
                assert!(r.runbook.contains(&format!("`{}`", r.name)), "{}", r.name);
            } else {
                assert!(r.action.starts_with("Nothing"), "{}: {}", r.name, r.action);
            }
        }
    }

    #[test]
    fn names_are_pascal_case_and_unique_and_texts_are_sentences() {
        let mut seen = std::collections::BTreeSet::new();
        for r in REPORTED.iter().map(|c| &c.reason) {
            assert!(seen.insert(r.name), "{} twice", r.name);
        }
        for r in every_reason() {
            assert!(
                r.name.chars().next().unwrap().is_ascii_uppercase(),
                "{}",
                r.name
            );
            assert!(
                r.name.chars().all(|c| c.is_ascii_alphanumeric()),
                "{}",
                r.name
            );
            for text in [r.meaning, r.action] {
                assert!(text.ends_with('.'), "{}: {text:?}", r.name);
            }
        }
    }

    #[test]
    fn the_reference_lists_every_reason_with_a_link() {
        let md = markdown();
        for r in every_reason() {
            assert!(md.contains(&format!("`{}`", r.name)), "{}", r.name);
            assert!(md.contains(&format!("operations.md#{}", anchor(r.runbook))));
        }
        assert_eq!(
            anchor("`StorageClassMissing`, `InvalidStorageClass`"),
            "storageclassmissing-invalidstorageclass"
        );
    }
}
