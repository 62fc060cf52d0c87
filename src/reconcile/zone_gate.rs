//! Ordered Bucket zone gate (docs/design.md "Zone gate"): Ordered Bucket Pods in Strict mode start
//! behind the `celld.eric.dev/bucket-zone` scheduling gate; the operator pins ordinal n to
//! `zones[n mod len(zones)]` and removes the gate, so removing the highest ordinal always
//! leaves a zone-balanced prefix. Not journaled: it completes Pod creation and changes no
//! member.

use super::reasons;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::ResourceExt;

use super::{Error, Report, Run};
use crate::api::keys::FLEET_UID_LABEL;
use crate::api::{BucketWorkload, PlacementMode, Profile};
use crate::render::pod::BUCKET_ZONE_GATE;

const ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// Releases the gates of this fleet's gated Pods; `Some(report)` on an error.
pub async fn release(run: &Run<'_>) -> Result<Option<Report>, Error> {
    let spec = &run.fleet.spec;
    if spec.profile != Profile::Bucket
        || spec.bucket_workload != BucketWorkload::Ordered
        || spec.placement.mode != PlacementMode::Strict
    {
        return Ok(None);
    }
    let sts_uid = match run.workload().await? {
        Some(w) => w.meta().uid.clone(),
        None => return Ok(None),
    };
    let pods = Api::<Pod>::namespaced(run.client.clone(), &run.ns);
    // Each released gate is an update carrying the Pod's resourceVersion: read them now.
    for mut pod in run.relist_by::<Pod>(FLEET_UID_LABEL).await? {
        let name = pod.name_any();
        let controlled = pod.owner_references().iter().any(|o| {
            o.controller == Some(true)
                && o.kind == "StatefulSet"
                && o.api_version == "apps/v1"
                && o.name == run.name
                && Some(&o.uid) == sts_uid.as_ref()
        });
        let Some(pod_spec) = pod.spec.as_mut() else {
            continue;
        };
        let gated = pod_spec
            .scheduling_gates
            .as_ref()
            .is_some_and(|g| g.iter().any(|g| g.name == BUCKET_ZONE_GATE));
        if !controlled
            || !gated
            || pod_spec.node_name.is_some()
            || pod.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let Some(ordinal) = name
            .strip_prefix(&format!("{}-", run.name))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let zone = spec.placement.zones[ordinal % spec.placement.zones.len()].clone();
        let selector = pod_spec.node_selector.get_or_insert_with(Default::default);
        if let Some(existing) = selector.get(ZONE_KEY).filter(|z| **z != zone) {
            return Ok(Some(Report::blocked(
                &reasons::SCHEDULING_BLOCKED,
                format!("Could not release the zone gate of Pod {name}: it already selects zone {existing}, ordinal {ordinal} needs {zone}"),
            )));
        }
        selector.insert(ZONE_KEY.into(), zone);
        if let Some(gates) = pod_spec.scheduling_gates.as_mut() {
            gates.retain(|g| g.name != BUCKET_ZONE_GATE);
        }
        // An update carrying the Pod's resourceVersion: a Pod that changed is handled next time.
        match pods.replace(&name, &PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => {
                return Ok(Some(Report::blocked(
                    &reasons::SCHEDULING_BLOCKED,
                    format!("Could not release the zone gate of Pod {name}: {e}"),
                )))
            }
        }
    }
    Ok(None)
}
