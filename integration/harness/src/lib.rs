//! The test-bed harness for real-cluster tests (docs/design.md "Test bed").
//!
//! [`cluster()`] starts the local control plane once per test process (or reuses a
//! healthy one started by `make cluster-up` or an earlier test binary), installs the
//! CRDs from `crds/`, and registers a panic hook that prints where every component's
//! log is kept. [`TestNamespace`] gives each test its own namespace.
//!
//! The control plane is never skipped: when its binaries are missing, `up.sh` builds
//! them (tens of minutes, once per machine) or the test fails with the build error.

pub mod audit;
pub mod drill;
pub mod fleet;
pub mod net;
pub mod operator;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Facts about the running control plane.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The work folder of `up.sh` (PKI, logs, pids, audit log, kubeconfigs).
    pub work_dir: PathBuf,
    /// Folder holding kubectl, helm and the control-plane binaries.
    pub bin_dir: PathBuf,
    /// Admin kubeconfig (system:masters).
    pub admin_kubeconfig: PathBuf,
    /// API server URL.
    pub apiserver_url: String,
}

static CLUSTER: OnceLock<std::result::Result<Cluster, String>> = OnceLock::new();

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root exists")
}

/// Starts (or reuses) the control plane and installs the CRDs; panics with the
/// reason and the log locations if that fails. Safe to call from every test.
pub fn cluster() -> &'static Cluster {
    let result = CLUSTER.get_or_init(|| start_cluster().map_err(|e| format!("{e:#}")));
    match result {
        Ok(c) => c,
        Err(e) => panic!(
            "the local control plane is not available: {e}\n{}",
            log_locations_text()
        ),
    }
}

fn start_cluster() -> Result<Cluster> {
    let repo = repo_root();
    let work_dir = std::env::var_os("CELLD_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".work/cluster"));
    let up = repo.join("integration/cluster/up.sh");
    let status = Command::new(&up)
        .arg(&work_dir)
        .status()
        .with_context(|| format!("running {}", up.display()))?;
    if !status.success() {
        bail!("{} failed with {status}", up.display());
    }
    let ports = read_env_file(&work_dir.join("ports.env"))?;
    let cluster = Cluster {
        admin_kubeconfig: work_dir.join("admin.kubeconfig"),
        bin_dir: PathBuf::from(
            ports
                .get("CELLD_CLUSTER_BIN")
                .context("ports.env lacks CELLD_CLUSTER_BIN")?,
        ),
        apiserver_url: ports
            .get("CELLD_APISERVER_URL")
            .context("ports.env lacks CELLD_APISERVER_URL")?
            .clone(),
        work_dir,
    };
    install_panic_hook(cluster.work_dir.clone());
    // CRDs: applied with kubectl (server-side) so every test binary sees the current files.
    let crds = repo.join("crds");
    cluster.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &crds.to_string_lossy(),
    ])?;
    cluster.kubectl(&[
        "wait",
        "--for",
        "condition=Established",
        "crd/celldfleets.celld.eric.dev",
        "crd/celldstoragereservations.celld.eric.dev",
        "--timeout",
        "60s",
    ])?;
    Ok(cluster)
}

fn read_env_file(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

fn log_locations_text() -> String {
    let work = std::env::var_os("CELLD_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".work/cluster"));
    log_locations(&work)
}

/// Where each component's log is kept, as printed on test failure.
pub fn log_locations(work: &Path) -> String {
    let mut out = String::from("component logs:\n");
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        out.push_str(&format!(
            "  {name}: {}\n",
            work.join("logs").join(format!("{name}.log")).display()
        ));
    }
    out.push_str(&format!(
        "  audit log: {}\n",
        work.join("audit/audit.log").display()
    ));
    out
}

fn install_panic_hook(work: PathBuf) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        eprintln!("{}", log_locations(&work));
        eprintln!("{}", operator::started_logs_text(40));
    }));
}

impl Cluster {
    /// Runs kubectl with the admin kubeconfig; returns stdout, fails with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl_output(args)?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs kubectl and returns the raw output (for tests that expect a failure).
    pub fn kubectl_output(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(self.bin_dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .output()
            .context("running kubectl")
    }

    /// A client with admin credentials.
    pub async fn admin_client(&self) -> Result<Client> {
        self.client_as(None).await
    }

    /// A client impersonating `user` (e.g. `system:serviceaccount:NS:NAME`), or admin.
    pub async fn client_as(&self, user: Option<&str>) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        if let Some(user) = user {
            config.auth_info.impersonate = Some(user.to_string());
        }
        Ok(Client::try_from(config)?)
    }
}

/// The namespace annotation of the API server's PodNodeSelector admission plugin (enabled by
/// `integration/cluster/up.sh`): every Pod created in the namespace gets this node selector.
pub const NODE_SELECTOR_ANNOTATION: &str = "scheduler.alpha.kubernetes.io/node-selector";

/// A namespace owned by one test; its name is `<prefix>-<random>`.
pub struct TestNamespace {
    /// The namespace name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates a fresh namespace for one test.
    pub async fn create(client: &Client, prefix: &str) -> Result<Self> {
        Self::create_on(client, prefix, None).await
    }

    /// Creates a fresh namespace for one test whose Pods run only on the Nodes that match
    /// `node_selector` (`key=value`; e.g. the Nodes of the test process's own kubelet), so
    /// test processes that share the control plane never run each other's Pods.
    pub async fn create_on(
        client: &Client,
        prefix: &str,
        node_selector: Option<&str>,
    ) -> Result<Self> {
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("celld.eric.dev/test".to_string(), "true".to_string())].into()),
                annotations: node_selector
                    .map(|s| [(NODE_SELECTOR_ANNOTATION.to_string(), s.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self {
            name,
            client: client.clone(),
        })
    }

    /// Deletes the namespace and waits (up to 120 s) until it is gone, e.g. while the
    /// operator still runs, so no fleet of a test is left for a later test's operator.
    pub async fn delete_and_wait(self) -> Result<()> {
        let (name, client) = (self.name.clone(), self.client.clone());
        self.delete().await?;
        let namespaces = Api::<Namespace>::all(client);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while namespaces.get_opt(&name).await?.is_some() {
            if std::time::Instant::now() > deadline {
                let left = namespace_leftovers(&namespaces, &name).await;
                bail!("namespace {name} was not deleted within 120 s; {left}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Deletes the namespace (tests call this at the end; a failed test keeps its
    /// namespace for inspection).
    pub async fn delete(self) -> Result<()> {
        Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}

/// What keeps a namespace from going away, as its status conditions say (the
/// namespace controller lists the kinds left and the finalizers that hold them).
async fn namespace_leftovers(namespaces: &Api<Namespace>, name: &str) -> String {
    let conditions = match namespaces.get_opt(name).await {
        Ok(Some(ns)) => ns
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.status == "True")
            .map(|c| format!("{}: {}", c.type_, c.message.unwrap_or_default()))
            .collect::<Vec<_>>(),
        Ok(None) => return "it is gone now".to_string(),
        Err(e) => return format!("its status could not be read: {e}"),
    };
    if conditions.is_empty() {
        "its status names nothing left".to_string()
    } else {
        format!("left: {}", conditions.join("; "))
    }
}

/// Server-side applies a YAML/JSON object with the field manager `celld-tests`.
pub async fn apply_json<K>(api: &Api<K>, name: &str, value: &serde_json::Value) -> Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + serde::Serialize,
{
    Ok(api
        .patch(
            name,
            &PatchParams::apply("celld-tests").force(),
            &Patch::Apply(value),
        )
        .await?)
}

/// The message of an API error, or a description of an unexpected result.
pub fn api_error_message<T: std::fmt::Debug>(
    result: std::result::Result<T, kube::Error>,
) -> Result<String> {
    match result {
        Ok(v) => bail!("expected the API server to reject the request, but it was accepted: {v:?}"),
        Err(kube::Error::Api(status)) => Ok(status.message.clone()),
        Err(other) => bail!("expected an API rejection, got another error: {other}"),
    }
}

impl Cluster {
    /// Runs helm with the admin kubeconfig; returns stdout, fails with stderr.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.bin_dir.join("helm"))
            .env("KUBECONFIG", &self.admin_kubeconfig)
            .env("HELM_CACHE_HOME", self.work_dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.work_dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.work_dir.join("helm/data"))
            .args(args)
            .output()
            .context("running helm")?;
        if !out.status.success() {
            bail!(
                "helm {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The HTTP status of an API error (403, 404, …), or `None` when the call succeeded.
pub fn api_status<T>(result: &std::result::Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(_) => Some(0),
    }
}
