//! Builders shared by the integration tests.
#![allow(dead_code)]

use chrono::{DateTime, Duration, TimeZone, Utc};
use journal::*;
use uuid::Uuid;

pub const FLEET: &str = "5f0c9a6e-1b2c-4d3e-8f40-000000000001";

/// 2026-11-29T10:00:00Z plus `minutes`.
pub fn t(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap() + Duration::minutes(minutes)
}

pub fn leader() -> Leader {
    Leader {
        identity: "celld-operator-0".into(),
        lease_transitions: 2,
        lease: Some("celld-test/celld-operator".into()),
    }
}

/// A deterministic operation id.
pub fn op(n: u64) -> OperationId {
    OperationId::from_uuid(Uuid::from_u128(
        0x4000_8000_0000_0000_0000_u128 << 32 | n as u128,
    ))
}

pub fn target(pod: &str) -> Target {
    Target {
        pod: pod.into(),
        pod_uid: Some(format!("uid-{pod}")),
        pod_ip: Some("10.0.0.7".into()),
        runtime_generation: Some(format!("gen-{pod}")),
        claim: Some(format!("data-{pod}")),
        claim_uid: Some(format!("claim-uid-{pod}")),
        claim_resource_version: Some("812".into()),
    }
}

pub fn intent(kind: OperationKind, from: i32, to: i32) -> Intent {
    Intent {
        kind,
        from,
        to,
        token: None,
        image: None,
        reason: None,
        deadline: t(30),
        targets: vec![],
        workload_uid: Some("wl-uid".into()),
        predecessor_effect: None,
    }
}

pub fn intent_body(kind: OperationKind, from: i32, to: i32) -> EntryBody {
    EntryBody::Intent(intent(kind, from, to))
}

pub fn issued(op: OperationId, step: &str) -> EntryBody {
    let step: Step = step.parse().unwrap();
    EntryBody::Issued(Issued {
        effect: Effect::new(op, step.clone()),
        step,
        decided_on_resource_version: Some("100".into()),
        result_resource_version: Some("101".into()),
        replayed: false,
        target: None,
    })
}

pub fn proof(op: OperationId, member: &str) -> EntryBody {
    EntryBody::ProofCaptured(ProofCaptured {
        member: member.into(),
        proof: Proof {
            operation_id: op.to_string(),
            expected_generation: format!("gen-{member}"),
            phase: "data_safe".into(),
            control_only: true,
            blocker: None,
            observed_at: t(2),
        },
    })
}

pub fn retired(claim: &str) -> EntryBody {
    EntryBody::ClaimRetired(ClaimRetired {
        claim: claim.into(),
        claim_uid: format!("uid-{claim}"),
        claim_resource_version: Some("900".into()),
    })
}

pub fn observed() -> EntryBody {
    EntryBody::Observed(Observed {
        note: "rolled out".into(),
    })
}

pub fn completed(outcome: CompletedOutcome) -> EntryBody {
    EntryBody::Completed(Completed { outcome })
}

pub fn canceled(reason: CancelReason) -> EntryBody {
    EntryBody::Canceled(Canceled { reason })
}

pub fn blocked(why: &str) -> EntryBody {
    EntryBody::Blocked(Blocked {
        blocker: why.into(),
    })
}

pub fn stalled() -> EntryBody {
    EntryBody::Stalled(Stalled { deadline: t(30) })
}

pub fn abandoned() -> EntryBody {
    EntryBody::Abandoned(PersonAction {
        by: "alice".into(),
        reason: Some("journal-command".into()),
    })
}

pub fn retried() -> EntryBody {
    EntryBody::Retried(PersonAction {
        by: "alice".into(),
        reason: None,
    })
}

pub fn recovered(op: OperationId, step: &str) -> EntryBody {
    EntryBody::Recovered(Recovered {
        effect: Effect::new(op, step.parse().unwrap()),
        source: "workload-marker".into(),
    })
}

/// A journal being written by a test, one entry at a time, with a clock.
pub struct Writer {
    pub journal: Journal,
    pub budget: Budget,
    pub minute: i64,
}

impl Writer {
    pub fn new() -> Self {
        Self::with_budget(Budget::default())
    }

    pub fn with_budget(budget: Budget) -> Self {
        Writer {
            journal: Journal::new(FLEET),
            budget,
            minute: 0,
        }
    }

    pub fn new_entry(&mut self, op: OperationId, body: EntryBody) -> NewEntry {
        self.minute += 1;
        NewEntry {
            at: t(self.minute),
            op,
            leader: leader(),
            body,
        }
    }

    /// Appends or returns the stage error.
    pub fn try_push(&mut self, op: OperationId, body: EntryBody) -> Result<Staged, StageError> {
        let entry = self.new_entry(op, body);
        let staged = self.journal.stage(entry, self.budget)?;
        self.journal = staged.clone().into_journal();
        Ok(staged)
    }

    /// Appends; panics on error.
    pub fn push(&mut self, op: OperationId, body: EntryBody) -> Entry {
        match self.try_push(op, body) {
            Ok(s) => s.entry().clone(),
            Err(e) => panic!("append refused: {e}"),
        }
    }

    /// The transition error an entry gets.
    pub fn refused(&mut self, op: OperationId, body: EntryBody) -> TransitionError {
        match self.try_push(op, body) {
            Ok(s) => panic!("append accepted: {:?}", s.entry()),
            Err(StageError::Transition(e)) => e,
            Err(e) => panic!("refused for another reason: {e}"),
        }
    }

    /// A complete Scale operation: Intent, Issued replicas, Observed, Completed.
    pub fn scale(&mut self, op: OperationId, from: i32, to: i32) {
        self.push(op, intent_body(OperationKind::Scale, from, to));
        self.push(op, issued(op, "replicas"));
        self.push(op, observed());
        self.push(op, completed(CompletedOutcome::Succeeded));
    }

    pub fn phase(&self, op: OperationId) -> Phase {
        self.journal.fold().operation(op).unwrap().phase()
    }

    pub fn state(&self, op: OperationId) -> OperationState {
        self.journal.fold().operation(op).unwrap().state()
    }
}

/// The annotation text of a document with this header and these entries (for crafting
/// documents the journal itself would never write).
pub fn document_text(fleet: &str, compacted: (Seq, Hash), entries: &[Entry]) -> String {
    let (seq, head) = entries.last().map_or(compacted, |e| (e.seq(), e.hash()));
    let body: Vec<&str> = entries.iter().map(|e| e.to_json()).collect();
    format!(
        "{{\"v\":1,\"fleetUID\":\"{fleet}\",\"seq\":{seq},\"head\":\"{head}\",\"compactedThrough\":{},\"compactedHash\":\"{}\",\"entries\":[{}]}}",
        compacted.0,
        compacted.1,
        body.join(",")
    )
}

/// Seals bodies into a chain without the transition rules.
pub fn raw_chain(bodies: Vec<(OperationId, EntryBody)>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for (i, (op, body)) in bodies.into_iter().enumerate() {
        let (seq, prev) = out.last().map_or((0, Hash::ZERO), |e| (e.seq(), e.hash()));
        out.push(chain::seal(
            seq,
            prev,
            NewEntry {
                at: t(i as i64),
                op,
                leader: leader(),
                body,
            },
        ));
    }
    out
}

/// Opens a mirror directory with sled directly (to tamper with it), waiting up to 2 s for
/// the lock of a just-dropped handle: sled's flusher thread can hold it a moment longer.
#[allow(dead_code)]
pub fn open_sled(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(e) => panic!("opening {} with sled: {e}", path.display()),
        }
    }
}
