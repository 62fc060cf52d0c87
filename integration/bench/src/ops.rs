//! Figures 1 and 2: one fleet alone in its namespace goes through Provision, growth one member
//! at a time, a rolling Restart by token and a contraction back to one member, a few times,
//! then Delete. Around each operation the operator's request counters are scraped (after it
//! fell quiet); the bench's watches time the effects.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use celld_operator::api::CelldFleet;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::bed::{fleet, fleet_settled, progress, wait_fleet, Bed};
use crate::scrape::{Delta, Snapshot};
use crate::timeline::{self, Timeline};

/// What one profile's scenario does.
#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// `PersistentFleet` or `Bucket`.
    pub profile: String,
    /// Members at the top (growth 1 → members, contraction members → 1).
    pub members: i32,
    /// Grow / restart / contract cycles.
    pub repetitions: usize,
    /// No request (Lease aside) for this long = the operation's traffic is over.
    pub quiet: Duration,
}

/// Operation kinds the bench counts requests for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// Provision of a 1-member fleet.
    Provision,
    /// Scale growth by one member.
    Growth,
    /// One reconcile of the settled fleet at the top size, caused by touching an annotation
    /// (what every 10-minute resync costs).
    Idle,
    /// Rolling restart by `spec.maintenance.restartToken` of all members.
    Restart,
    /// Scale contraction, per member removed.
    Contraction,
    /// Delete of a 1-member fleet.
    Delete,
}

impl OpKind {
    /// Row label.
    pub fn label(self, members: i32) -> String {
        match self {
            OpKind::Provision => "Provision (1 member)".into(),
            OpKind::Growth => "Scale growth (+1 member)".into(),
            OpKind::Idle => format!("Idle reconcile ({members} members, no-op)"),
            OpKind::Restart => format!("Restart, rolling ({members} members)"),
            OpKind::Contraction => "Scale contraction (per member removed)".into(),
            OpKind::Delete => "Delete (1 member)".into(),
        }
    }
}

/// One operation's requests (a contraction's are divided by the members it removed).
#[derive(Debug, Clone)]
pub struct OpSample {
    /// Kind.
    pub kind: OpKind,
    /// Counter deltas.
    pub delta: Delta,
    /// The operator's writes as the audit log answered them, by `verb resource code`
    /// (divided like `delta`).
    pub audited: BTreeMap<String, f64>,
    /// The operator had not fallen quiet within the limit when the "after" scrape was taken.
    pub not_quiet: bool,
}

/// Everything one profile's scenario measured.
#[derive(Debug, Clone, Default)]
pub struct OpsResult {
    /// `PersistentFleet` or `Bucket`.
    pub profile: String,
    /// Members at the top.
    pub members: i32,
    /// Workload settled → next replica decrease (ms).
    pub settled_to_next_removal: Vec<f64>,
    /// Contraction steps whose settle the bench did not see before the next write.
    pub unobserved_settles: usize,
    /// Fleet `spec.replicas` raised → workload `spec.replicas` raised (ms).
    pub growth: Vec<f64>,
    /// Fleet `spec.replicas` lowered → first workload decrease (ms).
    pub contraction_start: Vec<f64>,
    /// Fleet created → workload created (ms).
    pub provision: Vec<f64>,
    /// Requests per operation.
    pub ops: Vec<OpSample>,
}

const FLEET: &str = "ops";

/// Runs the scenario for one profile in a fresh namespace, deleted at the end.
pub async fn run(bed: &Bed, cfg: &OpsConfig) -> Result<OpsResult> {
    let short = if cfg.profile == "PersistentFleet" {
        "pf"
    } else {
        "bk"
    };
    let ns = bed.namespace(&format!("ops-{short}")).await?;
    let api: Api<CelldFleet> = Api::namespaced(bed.client.clone(), &ns);
    let timeline = Timeline::start(&bed.client, &ns, FLEET);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut r = OpsResult {
        profile: cfg.profile.clone(),
        members: cfg.members,
        ..OpsResult::default()
    };
    let m = Measure {
        bed,
        cfg,
        api: &api,
    };
    let mut before = m.quiet().await?.0;
    bed.operator_audit()?;

    progress(&format!("[{}] Provision (1 member) in {ns}", cfg.profile));
    let start = timeline.marks().len();
    let bucket = bed.bucket(&ns, FLEET);
    api.create(
        &PostParams::default(),
        &fleet(FLEET, &cfg.profile, 1, &bucket)?,
    )
    .await?;
    m.settled(1).await?;
    before = m.record(&mut r, OpKind::Provision, before, 1.0).await?;
    if let Some(ms) = timeline::fleet_to_workload(&timeline.marks()[start..]) {
        r.provision.push(ms);
    }

    for rep in 1..=cfg.repetitions {
        progress(&format!(
            "[{}] repetition {rep}/{}: growth 1→{} one member at a time, idle reconcile, rolling restart, contraction {}→1",
            cfg.profile, cfg.repetitions, cfg.members, cfg.members
        ));
        for n in 2..=cfg.members {
            let start = timeline.marks().len();
            m.set_replicas(n).await?;
            m.settled(n).await?;
            before = m.record(&mut r, OpKind::Growth, before, 1.0).await?;
            if let Some(ms) = timeline::fleet_to_workload(&timeline.marks()[start..]) {
                r.growth.push(ms);
            }
        }
        // A settled fleet's reconcile (the resync's cost): an annotation touch is one watch event.
        let touch =
            json!({"metadata": {"annotations": {"bench.celld.eric.dev/touch": rep.to_string()}}});
        api.patch(FLEET, &PatchParams::default(), &Patch::Merge(&touch))
            .await?;
        before = m.record(&mut r, OpKind::Idle, before, 1.0).await?;

        let token = format!("bench-{}-{rep}", bed.run_id);
        let patch = json!({"spec": {"maintenance": {"restartToken": token}}});
        api.patch(FLEET, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let members = cfg.members;
        wait_fleet(&api, FLEET, m.limit(), "the rolling restart", |f| {
            fleet_settled(f, members)
                && f.status
                    .as_ref()
                    .and_then(|s| s.last_restart_token.as_deref())
                    == Some(token.as_str())
        })
        .await?;
        before = m.record(&mut r, OpKind::Restart, before, 1.0).await?;

        let start = timeline.marks().len();
        m.set_replicas(1).await?;
        m.settled(1).await?;
        before = m
            .record(
                &mut r,
                OpKind::Contraction,
                before,
                f64::from(cfg.members - 1),
            )
            .await?;
        // Let late watch events of the last step arrive before reading the window.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let l = timeline::contraction(&timeline.marks()[start..]);
        r.settled_to_next_removal.extend(l.settled_to_next_removal);
        r.unobserved_settles += l.unobserved_settles;
        r.contraction_start.extend(l.fleet_to_workload);
    }

    progress(&format!("[{}] Delete", cfg.profile));
    api.delete(FLEET, &DeleteParams::default()).await?;
    let deadline = std::time::Instant::now() + m.limit();
    while api.get_opt(FLEET).await?.is_some() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "fleet {ns}/{FLEET} was not deleted within {:?}",
            m.limit()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    m.record(&mut r, OpKind::Delete, before, 1.0).await?;
    drop(timeline);
    bed.delete_namespace(&ns, Duration::from_secs(120)).await?;
    Ok(r)
}

struct Measure<'a> {
    bed: &'a Bed,
    cfg: &'a OpsConfig,
    api: &'a Api<CelldFleet>,
}

impl Measure<'_> {
    /// Per-wait limit (generous: the bench never asserts timings).
    fn limit(&self) -> Duration {
        Duration::from_secs(60 + 30 * self.cfg.members as u64)
    }

    async fn quiet(&self) -> Result<(Snapshot, bool)> {
        self.bed
            .metrics
            .quiet(self.cfg.quiet, Duration::from_secs(60))
            .await
    }

    async fn set_replicas(&self, n: i32) -> Result<()> {
        let patch = json!({"spec": {"replicas": n}});
        self.api
            .patch(FLEET, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn settled(&self, n: i32) -> Result<()> {
        wait_fleet(
            self.api,
            FLEET,
            self.limit(),
            &format!("{n} settled members"),
            |f| fleet_settled(f, n),
        )
        .await
    }

    /// Waits until quiet, records `after - before` (divided by `ops`) and returns `after`.
    async fn record(
        &self,
        r: &mut OpsResult,
        kind: OpKind,
        before: Snapshot,
        ops: f64,
    ) -> Result<Snapshot> {
        let (after, quiet) = self.quiet().await?;
        let audited = self.bed.operator_audit()?;
        r.ops.push(OpSample {
            kind,
            delta: after.since(&before).per(ops),
            audited: audited.into_iter().map(|(k, v)| (k, v / ops)).collect(),
            not_quiet: !quiet,
        });
        Ok(after)
    }
}
