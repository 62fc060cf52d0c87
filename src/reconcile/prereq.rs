//! Finalizer, gates and the fleet's non-workload objects (docs/design.md "Reconcile order"
//! steps 7, 8 and 12; "Prerequisites, gates and ownership"; "The storage reservation").

use super::reasons;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::compare::{first_difference, rendered_matches};
use super::{owned, Error, KubeContext, Report, Run};
use crate::api::keys::{LIFECYCLE_FINALIZER, SPEC_HASH_FORMAT, SPEC_HASH_FORMAT_ANNOTATION};
use crate::api::{CelldStorageReservation, Profile};
use crate::render::{self, FleetRef};

/// Step 7: the finalizer, added with a patch carrying the fleet's resourceVersion.
pub async fn ensure_finalizer(run: &mut Run<'_>) -> Result<(), Error> {
    if run
        .fleet
        .finalizers()
        .iter()
        .any(|f| f == LIFECYCLE_FINALIZER)
    {
        return Ok(());
    }
    let mut finalizers = run.fleet.finalizers().to_vec();
    finalizers.push(LIFECYCLE_FINALIZER.into());
    let patch = json!({"metadata": {"resourceVersion": run.fleet.resource_version(), "finalizers": finalizers}});
    run.fleet = run
        .api
        .patch(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ctx(|| "adding the finalizer".into())?;
    Ok(())
}

/// Step 8: gates. Only the reservation may be created here.
pub async fn gates(run: &mut Run<'_>) -> Result<Option<Report>, Error> {
    if !run.ctx.network_policy_enforced {
        return Ok(Some(Report::blocked(
            &reasons::ISOLATION_UNVERIFIED,
            "Nothing is provisioned until an administrator confirms the CNI enforces NetworkPolicy and starts the \
             operator with --network-policy-enforced"
                .into(),
        )));
    }
    if identity_and_storage_due(run) {
        if let Some(report) = identity_and_storage(run).await? {
            return Ok(Some(report));
        }
    }
    reservation(run).await
}

/// Whether step 8 must read the ServiceAccount and StorageClass now (docs/design.md "Fresh reads"):
/// when the fleet generation changed since they were last verified, or at the slow resync.
/// Before any operation that creates Pods or claims they are read again regardless
/// ([`identity_and_storage`] from the planner).
fn identity_and_storage_due(run: &Run<'_>) -> bool {
    let generation = run.fleet.meta().generation.unwrap_or(0);
    run.ctx
        .gates_verified
        .lock()
        .ok()
        .and_then(|m| m.get(&run.uid).copied())
        .is_none_or(|(g, at)| g != generation || at.elapsed() >= super::LATER)
}

/// Fresh reads of the ServiceAccount and (PersistentFleet) the StorageClass; records the
/// verified generation when both are fine.
pub async fn identity_and_storage(run: &Run<'_>) -> Result<Option<Report>, Error> {
    let sa = &run.fleet.spec.service_account_name;
    let class_name = run
        .fleet
        .spec
        .storage
        .storage_class_name
        .clone()
        .unwrap_or_default();
    // Both reads are sent together (the StorageClass only for a PersistentFleet): neither
    // depends on the other, and they are on the way to an operation's first write.
    let persistent = run.fleet.spec.profile == Profile::PersistentFleet;
    let (sa_exists, class) = futures::join!(run.service_account_exists(sa), async {
        if persistent {
            run.storage_class(&class_name).await.map(Some)
        } else {
            Ok(None)
        }
    });
    if !sa_exists? {
        return Ok(Some(Report::blocked(
            &reasons::SERVICE_ACCOUNT_MISSING,
            format!(
                "ServiceAccount {sa} does not exist in {}; celld needs it for bucket access",
                run.ns
            ),
        )));
    }
    if let Some(class) = class? {
        match class {
            None => {
                return Ok(Some(Report::blocked(
                    &reasons::STORAGE_CLASS_MISSING,
                    format!("StorageClass {class_name} does not exist"),
                )))
            }
            Some(sc) => {
                let provisioner_ok = sc.provisioner == "ebs.csi.aws.com"
                    || (run.ctx.render.local_test && sc.provisioner == "hostpath.csi.k8s.io");
                let reclaim = sc.reclaim_policy.clone().unwrap_or_else(|| "Delete".into());
                let binding = sc
                    .volume_binding_mode
                    .clone()
                    .unwrap_or_else(|| "Immediate".into());
                if !provisioner_ok || reclaim != "Delete" || binding != "WaitForFirstConsumer" {
                    return Ok(Some(Report::blocked(
                        &reasons::INVALID_STORAGE_CLASS,
                        format!(
                            "StorageClass {class_name} needs provisioner ebs.csi.aws.com, reclaimPolicy Delete, \
                             volumeBindingMode WaitForFirstConsumer (has {}, {reclaim}, {binding})",
                            sc.provisioner
                        ),
                    )));
                }
            }
        }
    }
    // Only fresh reads verify: a cached pass that found both fine goes on without
    // recording it, so the next fresh pass reads them again.
    if run.is_cached() {
        return Ok(None);
    }
    if let Ok(mut m) = run.ctx.gates_verified.lock() {
        m.insert(
            run.uid.clone(),
            (
                run.fleet.meta().generation.unwrap_or(0),
                std::time::Instant::now(),
            ),
        );
    }
    Ok(None)
}

/// The reservation: a plain create arbitrates; AlreadyExists → compare (docs/design.md "The storage
/// reservation").
/// An existing one is read and compared without a create attempt.
async fn reservation(run: &mut Run<'_>) -> Result<Option<Report>, Error> {
    let api = Api::<CelldStorageReservation>::all(run.client.clone());
    let bucket = run.fleet.spec.storage.bucket.clone();
    let name = CelldStorageReservation::name_for_bucket(&bucket);
    let mut want = CelldStorageReservation::new(
        &name,
        render::reservation_spec(&run.ns, &run.name, &run.uid, &run.fleet.spec),
    );
    want.metadata.annotations = Some(
        [(
            SPEC_HASH_FORMAT_ANNOTATION.to_string(),
            SPEC_HASH_FORMAT.to_string(),
        )]
        .into(),
    );
    // Found in the store as this fleet's, with the status recording it: nothing to write,
    // no request (the same check on a fresh read follows otherwise).
    if let Some(stored) = run.stored_reservation(&name) {
        if reservation_matches(run, &stored) && status_records(run, &name) {
            return Ok(None);
        }
    }
    // Read first: at rest the reservation exists and a create would only be refused
    // (one failed write per reconcile). When absent, the create still arbitrates between
    // fleets, namespaces and operator replicas; losing it means a fresh read and compare.
    let existing = match run.reservation(&name).await? {
        Some(r) => r,
        None => match api.create(&PostParams::default(), &want).await {
            Ok(created) => created,
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&name)
                .await
                .ctx(|| format!("reading reservation {name}"))?,
            Err(e) => return Err(e).ctx(|| format!("creating reservation {name}")),
        },
    };
    if !reservation_matches(run, &existing) {
        return Ok(Some(Report::blocked(
            &reasons::STORAGE_SCOPE_CONFLICT,
            format!(
                "Reservation {name} binds bucket {bucket} to a different fleet or configuration; this fleet creates and \
                 adopts nothing"
            ),
        )));
    }
    if !status_records(run, &name) {
        // Carries the fleet's resourceVersion like every other write (a conflict just means
        // the next reconcile records it).
        let patch = json!({"metadata": {"resourceVersion": run.fleet.resource_version()}, "status": {"reservation": name}});
        let replaced = run.fleet.metadata.resource_version.clone();
        run.fleet = run
            .api
            .patch_status(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ctx(|| "recording status.reservation".into())?;
        run.wrote_fleet(replaced.as_deref());
    }
    Ok(None)
}

/// Whether the fleet's status names reservation `name`.
fn status_records(run: &Run<'_>, name: &str) -> bool {
    run.fleet
        .status
        .as_ref()
        .and_then(|s| s.reservation.as_deref())
        == Some(name)
}

/// Whether `existing` binds the fleet's bucket to this fleet, as rendered.
fn reservation_matches(run: &Run<'_>, existing: &CelldStorageReservation) -> bool {
    let bucket = &run.fleet.spec.storage.bucket;
    let have = &existing.spec;
    // The hash covers `initialReplicas` as recorded at creation, not today's replicas.
    let hash_matches = match (
        existing
            .annotations()
            .contains_key(SPEC_HASH_FORMAT_ANNOTATION),
        have.initial_replicas,
    ) {
        (true, Some(initial)) => have.spec_hash == render::spec_hash(&run.fleet.spec, initial),
        // Legacy reservations (docs/design.md "The storage reservation"): the fleet's own
        // immutability rule fixes the hashed fields.
        _ => true,
    };
    have.bucket == *bucket
        && have.fleet_namespace == run.ns
        && have.fleet_name == run.name
        && have.fleet_uid == run.uid
        && hash_matches
        && existing.owner_references().is_empty()
        && existing.meta().deletion_timestamp.is_none()
        && have.owner_kind.is_none()
        && have.prefix.is_none()
        && have.endpoint.is_none()
        && have.initialization.is_none()
}

/// Creates a missing object; an existing one must be owned. `repair` replaces a
/// differing spec (NetworkPolicy, PDB) with the read resourceVersion; otherwise a
/// difference blocks (Services are verify-only).
async fn converge_one<K>(
    run: &Run<'_>,
    want: K,
    kind: &str,
    repair: bool,
) -> Result<Option<Report>, Error>
where
    K: crate::watches::Cached + Serialize,
{
    let api: Api<K> = Api::namespaced(run.client.clone(), &run.ns);
    let name = want.meta().name.clone().unwrap_or_default();
    let want_spec = serde_json::to_value(&want).unwrap_or_default()["spec"].clone();
    // Found in the namespace's store owned and as rendered: nothing to write, no request
    // (a store that lags only delays a repair until its event). Whatever this step creates,
    // repairs or blocks on is decided from the fresh read below.
    if let Some(stored) = run.stored::<K>(&name) {
        let stored_spec = serde_json::to_value(&stored).unwrap_or_default()["spec"].clone();
        if owned(&stored, &run.uid)
            && stored.meta().deletion_timestamp.is_none()
            && rendered_matches(&want_spec, &stored_spec)
        {
            return Ok(None);
        }
    }
    let Some(live) = run.reread::<K>(&name).await? else {
        match api.create(&PostParams::default(), &want).await {
            Ok(_) => return Ok(None),
            // Someone created it meanwhile: the next reconcile checks ownership.
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(None),
            Err(e) => return Err(e).ctx(|| format!("create {kind} {name}")),
        }
    };
    if !owned(&live, &run.uid) || live.meta().deletion_timestamp.is_some() {
        return Ok(Some(Report::blocked(
            &reasons::INFRASTRUCTURE_BLOCKED,
            format!("{kind} {name} exists but is not owned by this fleet (no fleet-uid label {}); it is neither adopted nor changed", run.uid),
        )));
    }
    let live_spec = serde_json::to_value(&live).unwrap_or_default()["spec"].clone();
    if rendered_matches(&want_spec, &live_spec) {
        return Ok(None);
    }
    if !repair {
        if let Some(filled) = backfill_app_protocol(&want_spec, &live) {
            // Pinned to the verified resourceVersion (carried by the live copy).
            api.replace(&name, &PostParams::default(), &filled)
                .await
                .ctx(|| format!("back-filling appProtocol on {kind} {name}"))?;
            let again = api
                .get(&name)
                .await
                .ctx(|| format!("re-reading {kind} {name}"))?;
            let again_spec = serde_json::to_value(&again).unwrap_or_default()["spec"].clone();
            if owned(&again, &run.uid) && rendered_matches(&want_spec, &again_spec) {
                tracing::info!(service = %name, "back-filled appProtocol: tcp on the peer port");
                return Ok(None);
            }
        }
        let field =
            first_difference(&want_spec, &live_spec, "spec").unwrap_or_else(|| "spec".into());
        return Ok(Some(Report::blocked(
            &reasons::INFRASTRUCTURE_BLOCKED,
            format!("{kind} {name} differs from the required shape ({field}); it is not changed"),
        )));
    }
    let mut replacement = want.clone();
    replacement.meta_mut().resource_version = live.meta().resource_version.clone();
    api.replace(&name, &PostParams::default(), &replacement)
        .await
        .ctx(|| format!("update {kind} {name}"))?;
    Ok(None)
}

/// The sole Service repair (docs/design.md "Prerequisites, gates and ownership"): when the only
/// differences are ports that lack the rendered `appProtocol`, the live object with those values
/// filled in (everything else, allocated addresses and resourceVersion included, kept as read).
/// `None` otherwise.
fn backfill_app_protocol<K: Serialize + DeserializeOwned>(
    want_spec: &Value,
    live: &K,
) -> Option<K> {
    let mut live = serde_json::to_value(live).ok()?;
    let want_ports = want_spec.get("ports")?.as_array()?;
    let live_ports = live.pointer_mut("/spec/ports")?.as_array_mut()?;
    if want_ports.len() != live_ports.len() {
        return None;
    }
    let mut filled = false;
    for (w, l) in want_ports.iter().zip(live_ports.iter_mut()) {
        if let (Some(app), None) = (w.get("appProtocol"), l.get("appProtocol")) {
            l.as_object_mut()?.insert("appProtocol".into(), app.clone());
            filled = true;
        }
    }
    if !(filled && rendered_matches(want_spec, &live["spec"])) {
        return None;
    }
    serde_json::from_value(live).ok()
}

/// Step 12: NetworkPolicy and PDB converge; Services are verified.
pub async fn converge(run: &mut Run<'_>) -> Result<Option<Report>, Error> {
    let f = FleetRef {
        name: &run.name,
        namespace: &run.ns,
        uid: &run.uid,
        spec: &run.fleet.spec,
    };
    let np: NetworkPolicy = render::network_policy(&f, &run.ctx.render);
    let pdb: PodDisruptionBudget = render::pod_disruption_budget(&f);
    let svc: Service = render::service(&f);
    let peers: Service = render::peers_service(&f);
    if let Some(r) = converge_one(run, np, "NetworkPolicy", true).await? {
        return Ok(Some(r));
    }
    if let Some(r) = converge_one(run, pdb, "PodDisruptionBudget", true).await? {
        return Ok(Some(r));
    }
    if let Some(r) = converge_one(run, svc, "Service", false).await? {
        return Ok(Some(r));
    }
    converge_one(run, peers, "Service", false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures::{fleet_ref, spec};

    fn peers() -> (Value, Service) {
        let s = spec("PersistentFleet");
        let want = render::peers_service(&fleet_ref(&s));
        let want_spec = serde_json::to_value(&want).unwrap()["spec"].clone();
        let mut live = serde_json::to_value(&want).unwrap();
        live["metadata"]["resourceVersion"] = json!("41");
        live["spec"]["clusterIPs"] = json!(["None"]);
        (want_spec, serde_json::from_value(live).unwrap())
    }

    #[test]
    fn a_missing_app_protocol_alone_is_back_filled_keeping_the_read_version() {
        let (want_spec, mut live) = peers();
        live.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].app_protocol = None;
        let filled = backfill_app_protocol(&want_spec, &live).expect("back-filled");
        let port = &filled.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!(port.app_protocol.as_deref(), Some("tcp"));
        assert_eq!(filled.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(
            filled.spec.as_ref().unwrap().cluster_ips,
            Some(vec!["None".to_string()])
        );
    }

    #[test]
    fn other_differences_or_nothing_missing_are_not_repaired() {
        let (want_spec, live) = peers();
        assert!(
            backfill_app_protocol(&want_spec, &live).is_none(),
            "nothing to fill"
        );
        let (want_spec, mut live) = peers();
        {
            let port = &mut live.spec.as_mut().unwrap().ports.as_mut().unwrap()[0];
            port.app_protocol = None;
            port.port = 9999;
        }
        assert!(
            backfill_app_protocol(&want_spec, &live).is_none(),
            "port differs too"
        );
        let (want_spec, mut live) = peers();
        live.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].app_protocol = Some("http".into());
        assert!(
            backfill_app_protocol(&want_spec, &live).is_none(),
            "a different value is not missing"
        );
    }
}
