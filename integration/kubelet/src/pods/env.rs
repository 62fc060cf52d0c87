//! Container environment: `envFrom`, `env` (`value`, `fieldRef`, `secretKeyRef`,
//! `configMapKeyRef`), Kubernetes `$(VAR)` expansion, and the test bed's mount conventions.
//!
//! Resolution is pure: the Secrets and ConfigMaps a container refers to are read first
//! ([`referenced_sources`]) and passed in as [`Sources`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod};

/// Why a container's configuration cannot be built (→ `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Secrets and ConfigMaps of the Pod's namespace, by name; `None` = not found.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// Secret name → decoded data (lossy UTF-8).
    pub secrets: HashMap<String, Option<BTreeMap<String, String>>>,
    /// ConfigMap name → data.
    pub config_maps: HashMap<String, Option<BTreeMap<String, String>>>,
}

/// Facts known only to the kubelet.
#[derive(Debug, Clone)]
pub struct PodFacts {
    /// The incarnation's Pod IP.
    pub pod_ip: String,
    /// The node's IP (always 127.0.0.1).
    pub host_ip: String,
}

/// Secret and ConfigMap names a container's env refers to.
pub fn referenced_sources(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut secrets, mut config_maps) = (BTreeSet::new(), BTreeSet::new());
    for from in container.env_from.iter().flatten() {
        if let Some(s) = &from.secret_ref {
            secrets.insert(s.name.clone());
        }
        if let Some(c) = &from.config_map_ref {
            config_maps.insert(c.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(s) = &from.secret_key_ref {
            secrets.insert(s.name.clone());
        }
        if let Some(c) = &from.config_map_key_ref {
            config_maps.insert(c.name.clone());
        }
    }
    (secrets, config_maps)
}

/// Kubernetes `$(VAR)` expansion (a port of `third_party/forked/golang/expansion`): `$(NAME)` is
/// replaced when `lookup` knows NAME and kept verbatim otherwise; `$$` becomes `$`; any other `$`
/// is copied.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&format!("$({name})")),
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // "$" followed by a character that does not open a reference: copy both.
                    let ch = rest.chars().next().expect("non-empty");
                    out.push('$');
                    out.push(ch);
                    ch.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < input.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// An ordered environment where a later definition replaces an earlier one in place.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnvList {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl EnvList {
    /// Sets `name` (replacing an earlier value in place).
    pub fn set(&mut self, name: &str, value: String) {
        match self.index.get(name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.to_string(), self.vars.len());
                self.vars.push((name.to_string(), value));
            }
        }
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }

    /// All variables in definition order.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// Rewrites every value through `f`.
    pub fn map_values(&mut self, f: impl Fn(&str) -> String) {
        for (_, v) in &mut self.vars {
            *v = f(v);
        }
    }
}

fn field_value(pod: &Pod, facts: &PodFacts, path: &str) -> Result<String, ConfigError> {
    let meta = &pod.metadata;
    let labelled = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(|key| {
                map.as_ref()
                    .and_then(|m| m.get(key))
                    .cloned()
                    .unwrap_or_default()
            })
    };
    if let Some(v) = labelled("metadata.labels['", &meta.labels) {
        return Ok(v);
    }
    if let Some(v) = labelled("metadata.annotations['", &meta.annotations) {
        return Ok(v);
    }
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => facts.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        other => {
            return Err(ConfigError(format!(
                "fieldRef {other:?} is not supported by the test kubelet"
            )))
        }
    })
}

fn key_of(
    kind: &str,
    map: &HashMap<String, Option<BTreeMap<String, String>>>,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, ConfigError> {
    match map.get(name).cloned().flatten() {
        Some(data) => match data.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(ConfigError(format!(
                "couldn't find key {key} in {kind} {name}"
            ))),
        },
        None if optional => Ok(None),
        None => Err(ConfigError(format!("{kind} \"{name}\" not found"))),
    }
}

/// The container's environment as Kubernetes defines it: `envFrom` first (no expansion), then
/// `env` in order, each `value` expanded against everything defined before it.
pub fn resolve(
    container: &Container,
    pod: &Pod,
    facts: &PodFacts,
    sources: &Sources,
) -> Result<EnvList, ConfigError> {
    let mut env = EnvList::default();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, data, optional) = if let Some(s) = &from.secret_ref {
            (
                "secret",
                sources.secrets.get(&s.name).cloned().flatten(),
                s.optional.unwrap_or(false),
            )
        } else if let Some(c) = &from.config_map_ref {
            (
                "configmap",
                sources.config_maps.get(&c.name).cloned().flatten(),
                c.optional.unwrap_or(false),
            )
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    let name = format!("{prefix}{k}");
                    if valid_env_name(&name) {
                        env.set(&name, v);
                    }
                }
            }
            None if optional => {}
            None => {
                return Err(ConfigError(format!(
                    "{kind} referenced by envFrom not found"
                )))
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.clone().unwrap_or_default();
                Some(expand(&raw, |n| env.get(n).map(str::to_string)))
            }
            Some(from) => {
                if let Some(f) = &from.field_ref {
                    Some(field_value(pod, facts, &f.field_path)?)
                } else if let Some(s) = &from.secret_key_ref {
                    key_of(
                        "secret",
                        &sources.secrets,
                        &s.name,
                        &s.key,
                        s.optional.unwrap_or(false),
                    )?
                } else if let Some(c) = &from.config_map_key_ref {
                    key_of(
                        "configmap",
                        &sources.config_maps,
                        &c.name,
                        &c.key,
                        c.optional.unwrap_or(false),
                    )?
                } else {
                    return Err(ConfigError(format!(
                        "env {}: only value, fieldRef, secretKeyRef and configMapKeyRef are supported by the test kubelet",
                        var.name
                    )));
                }
            }
        };
        if let Some(value) = value {
            env.set(&var.name, value);
        }
    }
    Ok(env)
}

/// `CELLD_TEST_MOUNT_<mountPath>`: upper case, every run of non-alphanumerics → `_`.
pub fn mount_env_name(mount_path: &str) -> String {
    let mut out = String::from("CELLD_TEST_MOUNT");
    let mut pending = true;
    for c in mount_path.chars() {
        if c.is_ascii_alphanumeric() {
            if pending {
                out.push('_');
                pending = false;
            }
            out.push(c.to_ascii_uppercase());
        } else {
            pending = true;
        }
    }
    out
}

/// Replaces a value that is a mount path, or lies under one (`<mountPath>/…`), by the host folder.
/// `mounts` = (mountPath, host folder); the longest matching mount path wins.
pub fn rewrite_mount_path(value: &str, mounts: &[(String, String)]) -> String {
    let mut best: Option<&(String, String)> = None;
    for m in mounts {
        let mount = m.0.trim_end_matches('/');
        if mount.is_empty() {
            continue;
        }
        let hit = value == mount
            || value
                .strip_prefix(mount)
                .is_some_and(|rest| rest.starts_with('/'));
        if hit && best.is_none_or(|b| b.0.len() < m.0.len()) {
            best = Some(m);
        }
    }
    match best {
        Some((mount, host)) => format!("{host}{}", &value[mount.trim_end_matches('/').len()..]),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, SecretKeySelector,
    };
    use kube::api::ObjectMeta;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        assert_eq!(expand("$(A)", lookup), "alpha");
        assert_eq!(expand("x$(A)y$(A)", lookup), "xalphayalpha");
        assert_eq!(expand("$(MISSING)", lookup), "$(MISSING)");
        assert_eq!(expand("$$(A)", lookup), "$(A)");
        assert_eq!(expand("$$$(A)", lookup), "$alpha");
        assert_eq!(expand("$$", lookup), "$");
        assert_eq!(expand("a$b", lookup), "a$b");
        assert_eq!(expand("$(A", lookup), "$(A");
        assert_eq!(expand("end$", lookup), "end$");
        assert_eq!(expand("$(EMPTY)-", lookup), "-");
        assert_eq!(expand("ünï$(A)cödé", lookup), "ünïalphacödé");
        assert_eq!(expand("$é", lookup), "$é");
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    fn secret(name: &str, secret: &str, key: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.into(),
                    key: key.into(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("m-0".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("celld-node-1".into()),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn facts() -> PodFacts {
        PodFacts {
            pod_ip: "127.1.0.9".into(),
            host_ip: "127.0.0.1".into(),
        }
    }

    #[test]
    fn env_resolves_field_refs_secrets_and_earlier_variables_in_order() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![
                field("POD_IP", "status.podIP"),
                field("CELLD_NODE", "metadata.name"),
                field("NODE", "spec.nodeName"),
                field("UID", "metadata.uid"),
                var("CELLD_ADVERTISE", "$(POD_IP):8081"),
                var("PEER", "$(CELLD_NODE).peers.$(NS).svc"),
                field("NS", "metadata.namespace"),
                secret("KEY", "creds", "key"),
            ]),
            ..Container::default()
        };
        let mut sources = Sources::default();
        sources.secrets.insert(
            "creds".into(),
            Some([("key".to_string(), "s3cr3t".to_string())].into()),
        );
        let env = resolve(&container, &pod(), &facts(), &sources).unwrap();
        assert_eq!(env.get("CELLD_ADVERTISE"), Some("127.1.0.9:8081"));
        // NS is defined after PEER, so its reference stays verbatim (Kubernetes rule).
        assert_eq!(env.get("PEER"), Some("m-0.peers.$(NS).svc"));
        assert_eq!(env.get("NODE"), Some("celld-node-1"));
        assert_eq!(env.get("UID"), Some("u-1"));
        assert_eq!(env.get("KEY"), Some("s3cr3t"));
        assert_eq!(env.vars()[0].0, "POD_IP");
    }

    #[test]
    fn a_missing_secret_is_a_config_error_unless_optional() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![secret("KEY", "creds", "key")]),
            ..Container::default()
        };
        let mut sources = Sources::default();
        sources.secrets.insert("creds".into(), None);
        let err = resolve(&container, &pod(), &facts(), &sources).unwrap_err();
        assert_eq!(err.0, "secret \"creds\" not found");
        sources
            .secrets
            .insert("creds".into(), Some(BTreeMap::default()));
        let err = resolve(&container, &pod(), &facts(), &sources).unwrap_err();
        assert!(err.0.contains("couldn't find key key"));
    }

    #[test]
    fn mount_paths_map_to_env_names_and_host_folders() {
        assert_eq!(mount_env_name("/work"), "CELLD_TEST_MOUNT_WORK");
        assert_eq!(
            mount_env_name("/var/run/secrets/kubernetes.io/serviceaccount"),
            "CELLD_TEST_MOUNT_VAR_RUN_SECRETS_KUBERNETES_IO_SERVICEACCOUNT"
        );
        let mounts = vec![
            ("/work".to_string(), "/h/pvc".to_string()),
            ("/work/cache".to_string(), "/h/cache".to_string()),
        ];
        assert_eq!(rewrite_mount_path("/work", &mounts), "/h/pvc");
        assert_eq!(rewrite_mount_path("/work/a.json", &mounts), "/h/pvc/a.json");
        assert_eq!(rewrite_mount_path("/work/cache/x", &mounts), "/h/cache/x");
        assert_eq!(rewrite_mount_path("/workshop", &mounts), "/workshop");
        assert_eq!(rewrite_mount_path("x=/work", &mounts), "x=/work");
    }
}
