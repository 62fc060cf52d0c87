//! Deletion (docs/design.md "Delete"): workload (Foreground, UID + RV), then every fleet claim
//! (UID + RV from a fresh read), then the owned prerequisites, then the finalizer. The
//! reservation is never touched.

use super::reasons;
use journal::{
    CancelReason, Canceled, ClaimRetired, Completed, CompletedOutcome, Effect, EntryBody, Intent,
    Issued, Observed, OperationId, OperationKind, PersonAction, Step,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::drive::open_op;
use super::workload;
use super::{owned, Error, KubeContext, Report, Run};
use crate::api::keys::{FLEET_UID_LABEL, LIFECYCLE_FINALIZER};
use crate::failpoint;
use crate::render::{peers_service_name, uses_statefulset};

fn preconditions<K: Resource>(obj: &K) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: obj.meta().resource_version.clone(),
        }),
        ..DeleteParams::default()
    }
}

/// Drives the deletion of a fleet with a deletionTimestamp.
pub async fn drive(run: &mut Run<'_>) -> Result<Report, Error> {
    if !run
        .fleet
        .finalizers()
        .iter()
        .any(|f| f == LIFECYCLE_FINALIZER)
    {
        return Ok(Report::progress("Deletion finished".into()));
    }
    // An open operation of another kind first.
    if let Some(mut op) = open_op(run).filter(|o| o.kind != OperationKind::Delete) {
        if !op.issued && super::drive::effect_landed(run, &op).await? {
            // Its write landed before a kill and was never recorded: record it first, so
            // the journal does not call a change the world shows "canceled before issue".
            super::drive::record_replayed(run, &op).await?;
            op.issued = true;
        }
        let body = if op.issued {
            EntryBody::Abandoned(PersonAction {
                by: "fleet-deletion".into(),
                reason: Some("the fleet is being deleted".into()),
            })
        } else {
            EntryBody::Canceled(Canceled {
                reason: CancelReason::RequestChanged,
            })
        };
        run.append(op.id, body).await?;
    }
    let sts = uses_statefulset(&run.fleet.spec);
    let client = run.client.clone();
    let op = match open_op(run) {
        Some(op) => op,
        None => {
            let finished_delete = run
                .journal
                .fold()
                .finished_newest_first()
                .first()
                .is_some_and(|o| {
                    o.kind() == OperationKind::Delete
                        && o.closure()
                            .is_some_and(|c| c.outcome.as_str() == "Succeeded")
                });
            if finished_delete {
                return remove_finalizer(run).await;
            }
            let live = workload::get(&client, &run.ns, &run.name, sts)
                .await
                .ctx(|| "reading the workload".into())?;
            failpoint::reach("before-intent");
            let intent = Intent {
                kind: OperationKind::Delete,
                from: live
                    .as_ref()
                    .map(workload::LiveWorkload::replicas)
                    .unwrap_or(0),
                to: 0,
                token: None,
                image: None,
                reason: Some(if run.journal_unusable {
                    super::integrity::KEEP_CLAIMS_REASON.into()
                } else {
                    "fleet deleted".into()
                }),
                deadline: run.ctx.deadline(run.now, None),
                targets: vec![],
                workload_uid: live.as_ref().and_then(|w| w.meta().uid.clone()),
                predecessor_effect: run.journal.predecessor_effect(),
            };
            run.append(OperationId::new_v4(), EntryBody::Intent(intent))
                .await?;
            failpoint::reach("after-intent");
            open_op(run).expect("the Delete operation was just opened")
        }
    };
    let id = op.id;
    let has = |run: &Run<'_>, step: &Step| {
        run.journal
            .fold()
            .operation(id)
            .is_some_and(|o| o.has_effect(step))
    };
    let progress = |detail: String| Report::progress(format!("Delete {id} (deleting): {detail}"));

    // 1. The workload.
    let live = workload::get(&client, &run.ns, &run.name, sts)
        .await
        .ctx(|| "reading the workload".into())?;
    let workload_issued = |replayed: bool, rv: Option<String>| {
        EntryBody::Issued(Issued {
            step: Step::Workload,
            effect: Effect::new(id, Step::Workload),
            decided_on_resource_version: rv,
            result_resource_version: None,
            replayed,
            target: None,
        })
    };
    if let Some(w) = &live {
        if !has(run, &Step::Workload) && w.meta().deletion_timestamp.is_some() {
            // Killed after the delete was sent (`after-effect`): the workload is already
            // terminating. Record the effect as replayed; never a second delete.
            run.append(id, workload_issued(true, w.meta().resource_version.clone()))
                .await?;
        } else if !has(run, &Step::Workload) {
            if !w.owned_by(&run.uid) {
                let kind = if sts { "StatefulSet" } else { "Deployment" };
                return Ok(Report::blocked(
                    &reasons::DELETION_BLOCKED,
                    format!("{kind} {} is not owned by this fleet; deletion waits until it is removed or relabelled by hand", run.name),
                ));
            }
            run.before_effect();
            match workload::delete(&client, &run.ns, w).await {
                Ok(()) => {}
                Err(kube::Error::Api(ref s)) if s.code == 404 => {}
                Err(e) => return Err(e).ctx(|| "deleting the workload".into()),
            }
            failpoint::reach("after-effect");
            run.append(
                id,
                workload_issued(false, w.meta().resource_version.clone()),
            )
            .await?;
        }
        return Ok(progress(
            "Workload deletion requested; members hand off their cells as they stop".into(),
        ));
    }

    if !has(run, &Step::Workload) && op.intent.workload_uid.is_some() {
        // The workload the Intent recorded is gone and no Issued says so: the delete landed
        // before a kill (`after-effect`) and the object finished terminating meanwhile.
        run.append(id, workload_issued(true, None)).await?;
    }

    // 2. Every fleet claim, removed members' included, from a fresh list — unless the
    // deletion runs in a journal started because the fleet's own was unusable: then the
    // claims' history is unknown and they are kept for a person to delete.
    let claims_api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &run.ns);
    let keep_claims = op.intent.reason.as_deref() == Some(super::integrity::KEEP_CLAIMS_REASON);
    let claims = if keep_claims {
        Vec::new()
    } else {
        // Each delete carries the claim's UID and resourceVersion: read them now.
        run.relist_by::<PersistentVolumeClaim>(FLEET_UID_LABEL)
            .await?
    };
    for claim in &claims {
        let name = claim.name_any();
        if has(run, &Step::Retire(name.clone())) {
            continue;
        }
        let uid = claim.uid().unwrap_or_default();
        if claim.meta().deletion_timestamp.is_none() {
            run.ctx.check_lease();
            failpoint::reach("before-claim-delete");
            match claims_api.delete(&name, &preconditions(claim)).await {
                Ok(_) => {}
                Err(kube::Error::Api(ref s)) if s.code == 404 => {}
                Err(e) => return Err(e).ctx(|| format!("deleting claim {name}")),
            }
            failpoint::reach("after-claim-delete");
        }
        run.append(
            id,
            EntryBody::ClaimRetired(ClaimRetired {
                claim: name,
                claim_uid: uid,
                claim_resource_version: claim.resource_version(),
            }),
        )
        .await?;
    }
    if !claims.is_empty() {
        return Ok(progress(format!(
            "{} claims deleted; waiting for them to go",
            claims.len()
        )));
    }

    // 3. Prerequisites: each owned one deleted with UID + RV; foreign ones left alone.
    if !has(run, &Step::Prerequisites) {
        run.before_effect();
        delete_owned::<NetworkPolicy>(run, &run.name.clone()).await?;
        delete_owned::<PodDisruptionBudget>(run, &run.name.clone()).await?;
        delete_owned::<Service>(run, &run.name.clone()).await?;
        delete_owned::<Service>(run, &peers_service_name(&run.name)).await?;
        failpoint::reach("after-effect");
        run.append(
            id,
            EntryBody::Issued(Issued {
                step: Step::Prerequisites,
                effect: Effect::new(id, Step::Prerequisites),
                decided_on_resource_version: None,
                result_resource_version: None,
                replayed: false,
                target: None,
            }),
        )
        .await?;
    }
    if !op.observed {
        run.append(
            id,
            EntryBody::Observed(Observed {
                note: if keep_claims {
                    "no workload or owned prerequisite remains; the fleet's claims were kept".into()
                } else {
                    "no workload, fleet claim or owned prerequisite remains".into()
                },
            }),
        )
        .await?;
    }
    failpoint::reach("before-complete");
    run.append(
        id,
        EntryBody::Completed(Completed {
            outcome: CompletedOutcome::Succeeded,
        }),
    )
    .await?;
    remove_finalizer(run).await
}

async fn delete_owned<K>(run: &Run<'_>, name: &str) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(run.client.clone(), &run.ns);
    if let Some(obj) = api.get_opt(name).await.ctx(|| format!("reading {name}"))? {
        if owned(&obj, &run.uid) && obj.meta().deletion_timestamp.is_none() {
            match api.delete(name, &preconditions(&obj)).await {
                Ok(_) => {}
                Err(kube::Error::Api(ref s)) if s.code == 404 => {}
                Err(e) => return Err(e).ctx(|| format!("deleting {name}")),
            }
        }
    }
    Ok(())
}

async fn remove_finalizer(run: &mut Run<'_>) -> Result<Report, Error> {
    let finalizers: Vec<String> = run
        .fleet
        .finalizers()
        .iter()
        .filter(|f| *f != LIFECYCLE_FINALIZER)
        .cloned()
        .collect();
    let patch = json!({"metadata": {"resourceVersion": run.fleet.resource_version(), "finalizers": finalizers}});
    run.fleet = run
        .api
        .patch(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ctx(|| "removing the finalizer".into())?;
    Ok(Report::progress(
        "Deletion finished; the reservation keeps the bucket bound to this fleet's UID".into(),
    ))
}
