//! NetworkPolicy, PodDisruptionBudget and Services (docs/design.md "Rendering").

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{fleet_labels, peers_service_name, FleetRef, RenderSettings};

fn meta(name: String, fleet: &FleetRef) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(fleet.namespace.to_string()),
        labels: Some(fleet_labels(fleet.uid)),
        ..ObjectMeta::default()
    }
}

fn selector(labels: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..LabelSelector::default()
    }
}

fn fleet_selector(uid: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(fleet_labels(uid)),
        ..LabelSelector::default()
    }
}

fn port(protocol: &str, number: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(number)),
        ..NetworkPolicyPort::default()
    }
}

fn pods(sel: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(sel),
        ..NetworkPolicyPeer::default()
    }
}

fn pods_in_namespace(ns: LabelSelector, sel: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(ns),
        pod_selector: Some(sel),
        ..NetworkPolicyPeer::default()
    }
}

/// NetworkPolicy `<f>`: members talk to each other on 8081, the operator reaches 8081,
/// labelled clients reach 8080; egress to peers, DNS, HTTPS, the Pod Identity agent
/// and (local test) the test store.
pub fn network_policy(fleet: &FleetRef, settings: &RenderSettings) -> NetworkPolicy {
    let ns_label = "kubernetes.io/metadata.name";
    let ingress = vec![
        NetworkPolicyIngressRule {
            from: Some(vec![
                pods(fleet_selector(fleet.uid)),
                pods_in_namespace(
                    selector(&[(ns_label, &settings.operator_namespace)]),
                    selector(&[("app.kubernetes.io/name", "celld-operator")]),
                ),
            ]),
            ports: Some(vec![port("TCP", 8081)]),
        },
        NetworkPolicyIngressRule {
            from: Some(vec![pods(selector(&[(
                "celld.eric.dev/client-of",
                fleet.name,
            )]))]),
            ports: Some(vec![port("TCP", 8080)]),
        },
    ];
    let mut egress = vec![
        NetworkPolicyEgressRule {
            to: Some(vec![pods(fleet_selector(fleet.uid))]),
            ports: Some(vec![port("TCP", 8081)]),
        },
        NetworkPolicyEgressRule {
            to: Some(vec![pods_in_namespace(
                selector(&[(ns_label, "kube-system")]),
                selector(&[("k8s-app", "kube-dns")]),
            )]),
            ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
        },
        NetworkPolicyEgressRule {
            to: None,
            ports: Some(vec![port("TCP", 443)]),
        },
        NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: "169.254.170.23/32".into(),
                    except: None,
                }),
                ..NetworkPolicyPeer::default()
            }]),
            ports: Some(vec![port("TCP", 80)]),
        },
    ];
    if settings.local_test {
        egress.push(NetworkPolicyEgressRule {
            to: Some(vec![pods_in_namespace(
                selector(&[(ns_label, "celld-test-store")]),
                selector(&[("app", "minio")]),
            )]),
            ports: Some(vec![port("TCP", 9000)]),
        });
    }
    NetworkPolicy {
        metadata: meta(fleet.name.to_string(), fleet),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(fleet_selector(fleet.uid)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }
}

/// PodDisruptionBudget `<f>`: `maxUnavailable: 1` for both profiles.
pub fn pod_disruption_budget(fleet: &FleetRef) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(fleet.name.to_string(), fleet),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(fleet_selector(fleet.uid)),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

fn service_port(name: &str, number: i32, app_protocol: Option<&str>) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port: number,
        target_port: Some(IntOrString::Int(number)),
        protocol: Some("TCP".into()),
        app_protocol: app_protocol.map(str::to_string),
        ..ServicePort::default()
    }
}

/// Service `<f>`: ClusterIP, application port 8080.
pub fn service(fleet: &FleetRef) -> Service {
    Service {
        metadata: meta(fleet.name.to_string(), fleet),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(fleet_labels(fleet.uid)),
            ports: Some(vec![service_port("application", 8080, None)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Service `<f>-peers`: headless, publishes not-ready addresses, peer port 8081 with
/// `appProtocol: tcp` (keeps service meshes from treating peer traffic as HTTP).
pub fn peers_service(fleet: &FleetRef) -> Service {
    Service {
        metadata: meta(peers_service_name(fleet.name), fleet),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(fleet_labels(fleet.uid)),
            ports: Some(vec![service_port("peer", 8081, Some("tcp"))]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures::{fleet_ref, spec};

    #[test]
    fn network_policy_admits_operator_and_clients_and_adds_the_store_rule_only_in_local_test() {
        let s = spec("PersistentFleet");
        let f = fleet_ref(&s);
        let prod = network_policy(&f, &RenderSettings::default());
        let spec_ = prod.spec.as_ref().unwrap();
        assert_eq!(spec_.egress.as_ref().unwrap().len(), 4);
        let op = &spec_.ingress.as_ref().unwrap()[0].from.as_ref().unwrap()[1];
        assert_eq!(
            op.namespace_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["kubernetes.io/metadata.name"],
            "celld-system"
        );
        let client = &spec_.ingress.as_ref().unwrap()[1];
        assert_eq!(
            client.from.as_ref().unwrap()[0]
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["celld.eric.dev/client-of"],
            "beta"
        );
        let test = network_policy(
            &f,
            &RenderSettings {
                local_test: true,
                ..RenderSettings::default()
            },
        );
        let egress = test.spec.unwrap().egress.unwrap();
        assert_eq!(egress.len(), 5);
        assert_eq!(
            egress[4].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(9000))
        );
    }

    #[test]
    fn peers_service_is_headless_with_tcp_app_protocol() {
        let s = spec("PersistentFleet");
        let f = fleet_ref(&s);
        let svc = peers_service(&f);
        assert_eq!(svc.metadata.name.as_deref(), Some("beta-peers"));
        let spec_ = svc.spec.unwrap();
        assert_eq!(spec_.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec_.publish_not_ready_addresses, Some(true));
        assert_eq!(spec_.ports.unwrap()[0].app_protocol.as_deref(), Some("tcp"));
        assert_eq!(
            pod_disruption_budget(&f).spec.unwrap().max_unavailable,
            Some(IntOrString::Int(1))
        );
    }
}
