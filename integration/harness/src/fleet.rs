//! Edits a test makes to a fleet, the way a person would (merge patches on the CelldFleet).

use celld_operator::api::CelldFleet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

async fn merge(api: &Api<CelldFleet>, name: &str, patch: Value, what: &str) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("{what} on fleet {name}: {e}"));
}

/// Sets `spec.maintenance.paused` of fleet `name`.
pub async fn set_paused(api: &Api<CelldFleet>, name: &str, paused: bool) {
    let patch = json!({"spec": {"maintenance": {"paused": paused}}});
    merge(api, name, patch, &format!("setting paused={paused}")).await;
}

/// Sets `spec.maintenance.restartToken` of fleet `name`: a restart (rolling, or coordinated
/// with `allowCoordinatedDowntime`).
pub async fn set_restart_token(api: &Api<CelldFleet>, name: &str, token: &str) {
    let patch = json!({"spec": {"maintenance": {"restartToken": token}}});
    merge(api, name, patch, &format!("setting restart token {token}")).await;
}

/// Asks for an administrative replacement of member `pod` at `uid`
/// (`celld.eric.dev/replace-member`, as `celld-operator replace` sets it).
pub async fn request_replacement(api: &Api<CelldFleet>, name: &str, pod: &str, uid: &str) {
    let patch = json!({"metadata": {"annotations": {
        celld_operator::api::keys::REPLACE_MEMBER_ANNOTATION: format!("{pod}/{uid}")}}});
    merge(api, name, patch, &format!("asking to replace {pod}")).await;
}
