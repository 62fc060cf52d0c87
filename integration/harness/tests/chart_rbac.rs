//! The Helm chart on the real API server: install, least-privilege RBAC proven by
//! impersonating the chart's ServiceAccount, upgrade of a flag, uninstall keeping fleets.
//!
//! One test, because the chart's cluster-scoped objects (ClusterRole, CRDs) are shared.

use celld_harness::{api_status, cluster, repo_root, TestNamespace};
use celld_operator::api::{CelldFleet, CelldStorageReservation};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const OPERATOR_NS: &str = "celld-system";
const OPERATOR_SA: &str = "system:serviceaccount:celld-system:celld-operator";

#[tokio::test]
async fn chart_grants_exactly_what_the_operator_needs() {
    let cluster = cluster();
    let admin = cluster.admin_client().await.unwrap();
    let listed = TestNamespace::create(&admin, "fleets").await.unwrap();
    let unlisted = TestNamespace::create(&admin, "other").await.unwrap();
    let chart = repo_root().join("helm/celld-operator");
    let chart = chart.to_str().unwrap();
    let fleet_namespaces = format!("fleetNamespaces={{{}}}", listed.name);
    cluster
        .helm(&[
            "upgrade",
            "--install",
            "celld-operator",
            chart,
            "--namespace",
            OPERATOR_NS,
            "--create-namespace",
            "--set",
            &fleet_namespaces,
            "--set",
            "memberReplacementDelay=10m",
        ])
        .unwrap();

    let op = cluster.client_as(Some(OPERATOR_SA)).await.unwrap();
    let lp = ListParams::default().limit(1);

    // Allowed: the fleet API, reservations (create, read), StorageClass reads, the fleet
    // namespace's workloads, Pods, claims, Services, the leader Lease.
    let allowed: Vec<(&str, Option<u16>)> = vec![
        (
            "list celldfleets (all namespaces)",
            api_status(&Api::<CelldFleet>::all(op.clone()).list(&lp).await),
        ),
        (
            "list reservations",
            api_status(
                &Api::<CelldStorageReservation>::all(op.clone())
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list pods in fleet namespace",
            api_status(
                &Api::<Pod>::namespaced(op.clone(), &listed.name)
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list claims in fleet namespace",
            api_status(
                &Api::<PersistentVolumeClaim>::namespaced(op.clone(), &listed.name)
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list statefulsets in fleet namespace",
            api_status(
                &Api::<StatefulSet>::namespaced(op.clone(), &listed.name)
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list deployments in fleet namespace",
            api_status(
                &Api::<Deployment>::namespaced(op.clone(), &listed.name)
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list services in fleet namespace",
            api_status(
                &Api::<Service>::namespaced(op.clone(), &listed.name)
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list leases in operator namespace",
            api_status(
                &Api::<Lease>::namespaced(op.clone(), OPERATOR_NS)
                    .list(&lp)
                    .await,
            ),
        ),
    ];
    for (what, status) in &allowed {
        assert_eq!(*status, None, "the operator must be allowed to {what}");
    }
    // Get-only objects: 404 proves the request was authorized.
    let sa = api_status(
        &Api::<ServiceAccount>::namespaced(op.clone(), &listed.name)
            .get("nope")
            .await,
    );
    assert_eq!(
        sa,
        Some(404),
        "get serviceaccounts in a fleet namespace must be allowed"
    );
    let sc = api_status(&Api::<StorageClass>::all(op.clone()).get("nope").await);
    assert_eq!(sc, Some(404), "get storageclasses must be allowed");
    // The watch-fed caches list and watch ServiceAccounts (metadata) in a fleet namespace
    // and StorageClasses cluster-wide.
    let cached: Vec<(&str, Option<u16>)> = vec![
        (
            "list serviceaccounts in a fleet namespace",
            api_status(
                &Api::<ServiceAccount>::namespaced(op.clone(), &listed.name)
                    .list_metadata(&lp)
                    .await,
            ),
        ),
        (
            "list storageclasses",
            api_status(&Api::<StorageClass>::all(op.clone()).list(&lp).await),
        ),
    ];
    for (what, status) in &cached {
        assert_eq!(*status, None, "the operator must be allowed to {what}");
    }

    // Denied: PVs, Nodes, VolumeAttachments, Secrets, namespaces not listed, claim
    // creation, cluster-wide Pods and claims, reservation updates and deletes.
    let ns_other = unlisted.name.clone();
    let denied: Vec<(&str, Option<u16>)> = vec![
        ("list persistentvolumes", api_status(&Api::<PersistentVolume>::all(op.clone()).list(&lp).await)),
        ("list nodes", api_status(&Api::<Node>::all(op.clone()).list(&lp).await)),
        ("list volumeattachments", api_status(&Api::<VolumeAttachment>::all(op.clone()).list(&lp).await)),
        ("get secrets in the fleet namespace",
            api_status(&Api::<Secret>::namespaced(op.clone(), &listed.name).get("any").await)),
        ("list secrets in the fleet namespace",
            api_status(&Api::<Secret>::namespaced(op.clone(), &listed.name).list(&lp).await)),
        ("list pods in an unlisted namespace", api_status(&Api::<Pod>::namespaced(op.clone(), &ns_other).list(&lp).await)),
        ("list claims in an unlisted namespace",
            api_status(&Api::<PersistentVolumeClaim>::namespaced(op.clone(), &ns_other).list(&lp).await)),
        ("list statefulsets in an unlisted namespace",
            api_status(&Api::<StatefulSet>::namespaced(op.clone(), &ns_other).list(&lp).await)),
        ("list pods cluster-wide", api_status(&Api::<Pod>::all(op.clone()).list(&lp).await)),
        ("list claims cluster-wide", api_status(&Api::<PersistentVolumeClaim>::all(op.clone()).list(&lp).await)),
        ("create a claim", api_status(&Api::<PersistentVolumeClaim>::namespaced(op.clone(), &listed.name)
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": "data-x-0"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            })).unwrap()).await)),
        ("delete a reservation", api_status(&Api::<CelldStorageReservation>::all(op.clone())
            .delete("s3-nope", &DeleteParams::default()).await)),
        ("patch a reservation", api_status(&Api::<CelldStorageReservation>::all(op.clone())
            .patch("s3-nope", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await)),
        ("delete a fleet", api_status(&Api::<CelldFleet>::namespaced(op.clone(), &listed.name)
            .delete("nope", &DeleteParams::default()).await)),
        ("list leases outside the operator namespace",
            api_status(&Api::<Lease>::namespaced(op.clone(), &listed.name).list(&lp).await)),
    ];
    let wrong: Vec<_> = denied
        .iter()
        .filter(|(_, s)| *s != Some(403))
        .map(|(w, s)| format!("{w}: {s:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the chart's ServiceAccount must be denied (403):\n{}",
        wrong.join("\n")
    );

    // watchScope: cluster adds cluster-wide reads of the fleets' objects, and nothing else:
    // no writes outside the fleet namespaces, no Secrets, no PVs or Nodes.
    cluster
        .helm(&[
            "upgrade",
            "celld-operator",
            chart,
            "--namespace",
            OPERATOR_NS,
            "--reuse-values",
            "--set",
            "watchScope=cluster",
        ])
        .unwrap();
    let wide: Vec<(&str, Option<u16>)> = vec![
        (
            "list pods cluster-wide",
            api_status(&Api::<Pod>::all(op.clone()).list(&lp).await),
        ),
        (
            "list claims cluster-wide",
            api_status(
                &Api::<PersistentVolumeClaim>::all(op.clone())
                    .list(&lp)
                    .await,
            ),
        ),
        (
            "list services cluster-wide",
            api_status(&Api::<Service>::all(op.clone()).list(&lp).await),
        ),
        (
            "list statefulsets cluster-wide",
            api_status(&Api::<StatefulSet>::all(op.clone()).list(&lp).await),
        ),
        (
            "list deployments cluster-wide",
            api_status(&Api::<Deployment>::all(op.clone()).list(&lp).await),
        ),
        (
            "list replicasets cluster-wide",
            api_status(&Api::<ReplicaSet>::all(op.clone()).list_metadata(&lp).await),
        ),
        (
            "list networkpolicies cluster-wide",
            api_status(&Api::<NetworkPolicy>::all(op.clone()).list(&lp).await),
        ),
        (
            "list poddisruptionbudgets cluster-wide",
            api_status(&Api::<PodDisruptionBudget>::all(op.clone()).list(&lp).await),
        ),
        (
            "list pods in an unlisted namespace",
            api_status(
                &Api::<Pod>::namespaced(op.clone(), &ns_other)
                    .list(&lp)
                    .await,
            ),
        ),
    ];
    for (what, status) in &wide {
        assert_eq!(
            *status, None,
            "watchScope=cluster must allow the operator to {what}"
        );
    }
    let still_denied: Vec<(&str, Option<u16>)> = vec![
        (
            "delete a pod in an unlisted namespace",
            api_status(
                &Api::<Pod>::namespaced(op.clone(), &ns_other)
                    .delete("nope", &DeleteParams::default())
                    .await
                    .map(|_| ()),
            ),
        ),
        (
            "create a service in an unlisted namespace",
            api_status(
                &Api::<Service>::namespaced(op.clone(), &ns_other)
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({
                            "metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}]}
                        }))
                        .unwrap(),
                    )
                    .await,
            ),
        ),
        (
            "delete a claim in an unlisted namespace",
            api_status(
                &Api::<PersistentVolumeClaim>::namespaced(op.clone(), &ns_other)
                    .delete("nope", &DeleteParams::default())
                    .await
                    .map(|_| ()),
            ),
        ),
        (
            "list secrets cluster-wide",
            api_status(&Api::<Secret>::all(op.clone()).list(&lp).await),
        ),
        (
            "list serviceaccounts cluster-wide",
            api_status(
                &Api::<ServiceAccount>::all(op.clone())
                    .list_metadata(&lp)
                    .await,
            ),
        ),
        (
            "list persistentvolumes",
            api_status(&Api::<PersistentVolume>::all(op.clone()).list(&lp).await),
        ),
        (
            "list nodes",
            api_status(&Api::<Node>::all(op.clone()).list(&lp).await),
        ),
    ];
    let wrong: Vec<_> = still_denied
        .iter()
        .filter(|(_, s)| *s != Some(403))
        .map(|(w, s)| format!("{w}: {s:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "with watchScope=cluster the chart's ServiceAccount must still be denied (403):\n{}",
        wrong.join("\n")
    );

    // helm upgrade changes the operator's flag.
    cluster
        .helm(&[
            "upgrade",
            "celld-operator",
            chart,
            "--namespace",
            OPERATOR_NS,
            "--reuse-values",
            "--set",
            "memberReplacementDelay=20m",
        ])
        .unwrap();
    let deploy = Api::<Deployment>::namespaced(admin.clone(), OPERATOR_NS)
        .get("celld-operator")
        .await
        .unwrap();
    let args = deploy.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.contains(&"--member-replacement-delay=20m".to_string()),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a == "--member-replacement-delay=10m"));
    assert!(
        args.contains(&"--watch-scope=cluster".to_string()),
        "{args:?}"
    );

    // helm uninstall leaves fleets, reservations and the CRDs alone.
    let fleets = Api::<CelldFleet>::namespaced(admin.clone(), &listed.name);
    let sample =
        std::fs::read_to_string(repo_root().join("config/samples/bucket-fleet.yaml")).unwrap();
    let fleet: CelldFleet = serde_yaml::from_str(&sample).unwrap();
    fleets.create(&PostParams::default(), &fleet).await.unwrap();
    let reservations = Api::<CelldStorageReservation>::all(admin.clone());
    let bucket = format!("chart-{}", &listed.name);
    let reservation_name = CelldStorageReservation::name_for_bucket(&bucket);
    let reservation: CelldStorageReservation = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldStorageReservation",
        "metadata": {"name": reservation_name},
        "spec": {"bucket": bucket, "fleetNamespace": listed.name, "fleetName": "alpha",
                 "fleetUID": "uid-1", "specHash": "a".repeat(64)}
    }))
    .unwrap();
    reservations
        .create(&PostParams::default(), &reservation)
        .await
        .unwrap();
    cluster
        .helm(&["uninstall", "celld-operator", "--namespace", OPERATOR_NS])
        .unwrap();
    assert!(
        fleets.get("alpha").await.is_ok(),
        "helm uninstall must leave fleets alone"
    );
    assert!(
        reservations.get(&reservation_name).await.is_ok(),
        "helm uninstall must leave reservations alone"
    );
    let crds = cluster
        .kubectl(&["get", "crd", "celldfleets.celld.eric.dev", "-o", "name"])
        .unwrap();
    assert_eq!(
        crds.trim(),
        "customresourcedefinition.apiextensions.k8s.io/celldfleets.celld.eric.dev"
    );
    let gone = api_status(
        &Api::<Deployment>::namespaced(admin.clone(), OPERATOR_NS)
            .get("celld-operator")
            .await,
    );
    assert_eq!(gone, Some(404), "uninstall removes the operator itself");
    listed.delete().await.unwrap();
    unlisted.delete().await.unwrap();
}
