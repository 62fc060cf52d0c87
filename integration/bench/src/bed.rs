//! The bench's own test bed: a control plane in its own folder and ports (`up.sh` through
//! `celld_harness::cluster()`), a test kubelet with its own Nodes and Pod IP range, and the
//! operator binary as a child process whose pid is known (for RSS). Everything it creates is
//! labelled or named `bench-…` and removed again by [`Bed::down`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use celld_operator::api::{CelldFleet, CelldStorageReservation};
use celld_test_kubelet::images::NO_PROCESS_IMAGE;
use celld_test_kubelet::launcher::{Options, TestKubelet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::audit::{self, AuditTail};
use crate::scrape::MetricsEndpoint;

/// Label on every namespace the bench creates (leftovers of an interrupted run are removed
/// at the next start).
pub const BENCH_LABEL: &str = "celld.eric.dev/bench";
/// The operator's namespace (its Lease).
pub const OPERATOR_NAMESPACE: &str = "celld-bench-system";
/// The single zone of the bench's Nodes and fleets.
pub const ZONE: &str = "us-east-1a";
/// Buckets of bench fleets start with this.
pub const BUCKET_PREFIX: &str = "bench-";

/// Where things are and how big the bed is.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `up.sh` work folder.
    pub cluster_dir: PathBuf,
    /// `CELLD_PORT_BASE`.
    pub port_base: u16,
    /// The `celld-operator` binary.
    pub operator_bin: PathBuf,
    /// The `celld-test-kubelet` binary.
    pub kubelet_bin: PathBuf,
    /// Test kubelet Nodes.
    pub nodes: usize,
    /// Pod capacity of each Node (the kubelet's `--max-pods`).
    pub max_pods: u32,
    /// Leave the control plane running at the end.
    pub keep_cluster: bool,
}

/// The running bed.
pub struct Bed {
    /// Admin client.
    pub client: Client,
    /// The operator's metrics endpoint.
    pub metrics: MetricsEndpoint,
    /// The operator's health address (`/livez`, `/readyz`), `127.0.0.1:PORT`.
    pub health: String,
    /// The operator.
    pub operator: Option<Operator>,
    /// Extra flags of the running operator (a design of the scale bed).
    operator_flags: Vec<String>,
    /// The binary of the running design, if not `settings.operator_bin`.
    operator_binary: Option<PathBuf>,
    kubelet: Option<TestKubelet>,
    started_cluster: bool,
    settings: Settings,
    /// Short random id of this run (namespaces, buckets).
    pub run_id: String,
    /// Folder of this run's kubelet and operator (logs, journal mirror).
    pub work: PathBuf,
    audit: std::sync::Mutex<AuditTail>,
}

fn alive(pid_file: &Path) -> bool {
    std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

impl Bed {
    /// Brings up (or reuses) the control plane, removes leftovers of earlier runs, starts the
    /// test kubelet and the operator, and waits until the operator holds its Lease.
    pub async fn up(settings: Settings) -> Result<Bed> {
        // `main` exported CELLD_CLUSTER_DIR and CELLD_PORT_BASE (read by the harness and up.sh).
        let already = alive(&settings.cluster_dir.join("run/kube-apiserver.pid"));
        if !already && settings.cluster_dir.join("etcd").exists() {
            // A stopped bench cluster keeps what earlier runs left in etcd: PersistentVolumes
            // of deleted claims that no provisioner deletes any more (a 1,000-fleet run leaves
            // about 3,000), which slow the next run's volume binding to a halt. The bench's
            // control plane is its own: start it empty.
            let down = celld_harness::repo_root().join("integration/cluster/down.sh");
            let status = Command::new(&down)
                .arg(&settings.cluster_dir)
                .arg("--purge")
                .status()
                .with_context(|| format!("running {}", down.display()))?;
            if !status.success() {
                bail!("{} --purge failed with {status}", down.display());
            }
            progress(&format!(
                "removed the stopped bench cluster's state ({})",
                settings.cluster_dir.display()
            ));
        }
        let started = Instant::now();
        let cluster = tokio::task::spawn_blocking(celld_harness::cluster)
            .await
            .context("bringing up the control plane")?;
        progress(&format!(
            "control plane {} at {} ({:.0} s)",
            if already { "reused" } else { "started" },
            cluster.apiserver_url,
            started.elapsed().as_secs_f64()
        ));
        let client = cluster.admin_client().await?;
        let sc = celld_harness::repo_root().join("config/test-storageclass.yaml");
        cluster.kubectl(&["apply", "-f", &sc.to_string_lossy()])?;
        remove_leftovers(&client).await?;
        ensure_namespace(&client, OPERATOR_NAMESPACE).await?;
        let _ = Api::<Lease>::namespaced(client.clone(), OPERATOR_NAMESPACE)
            .delete("celld-operator", &DeleteParams::default())
            .await;
        let run_id = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
        let work = cluster.work_dir.join("bench").join(&run_id);
        std::fs::create_dir_all(&work)?;

        let mut opts = Options::new(
            &settings.kubelet_bin,
            cluster.work_dir.join("test-kubelet.kubeconfig"),
            work.join("kubelet"),
        );
        opts.node_prefix = format!("bench-{run_id}");
        opts.nodes = settings.nodes;
        opts.pod_ip_range = "127.60.0.0/16".into();
        // One zone: fleets of 1 member need `azCount: 1` (replicas ≥ azCount), and a fleet's
        // members are spread over Nodes of its zones only.
        opts.zones = vec![ZONE.into()];
        opts.extra_args = vec!["--max-pods".into(), settings.max_pods.to_string()];
        let kubelet = tokio::task::spawn_blocking(move || TestKubelet::start(&opts))
            .await?
            .map_err(anyhow::Error::msg)?;
        progress(&format!(
            "test kubelet: {} Nodes bench-{run_id}-* in zone {ZONE} ({} Pods each at most), Pod IPs 127.60.0.0/16, log {}",
            settings.nodes,
            settings.max_pods,
            kubelet.log.display()
        ));

        let metrics = MetricsEndpoint {
            addr: format!("127.0.0.1:{}", settings.port_base + 84),
        };
        let health = format!("127.0.0.1:{}", settings.port_base + 82);
        audit::operator_kubeconfig(&cluster.admin_kubeconfig, &work.join("operator.kubeconfig"))?;
        let audit =
            std::sync::Mutex::new(AuditTail::new(&cluster.work_dir.join("audit/audit.log")));
        let mut bed = Bed {
            audit,
            client,
            metrics,
            health,
            operator: None,
            operator_flags: Vec::new(),
            operator_binary: None,
            kubelet: Some(kubelet),
            started_cluster: !already,
            settings,
            run_id,
            work,
        };
        bed.start_operator().await?;
        Ok(bed)
    }

    /// Starts the operator (identity `celld-bench-<run id>`) and waits until it holds the Lease.
    async fn start_operator(&mut self) -> Result<()> {
        self.spawn_operator()?;
        self.wait_leader(Duration::from_secs(60)).await
    }

    /// Starts the operator process with the current flags; returns when it was spawned.
    fn spawn_operator(&mut self) -> Result<Instant> {
        let spawned = Instant::now();
        let operator = Operator::start(
            self.operator_binary
                .as_deref()
                .unwrap_or(&self.settings.operator_bin),
            &self.work.join("operator.kubeconfig"),
            &format!("celld-bench-{}", self.run_id),
            &self.work.join("operator"),
            &self.metrics.addr,
            &self.health,
            &self.operator_flags,
        )?;
        self.operator = Some(operator);
        Ok(spawned)
    }

    /// Waits until the running operator reports `celld_operator_leader 1`, at most `within`.
    pub async fn wait_leader(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while !self.metrics.is_leader().await {
            self.operator
                .as_mut()
                .context("no operator process")?
                .check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "the operator did not take its Lease within {within:?}; log: {}",
                    self.operator().log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let op = self.operator();
        progress(&format!(
            "operator pid {}{} holds the Lease; metrics http://{}/metrics, log {}",
            op.pid,
            if self.operator_flags.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.operator_flags.join(" "))
            },
            self.metrics.addr,
            op.log.display()
        ));
        Ok(())
    }

    /// Stops the operator, deletes its Lease and starts a fresh process (same identity and
    /// journal mirror) of `binary` (default: `--operator-bin`) with `flags` added (a design
    /// of the scale bed); returns the instant the process was spawned, without waiting for it.
    pub async fn restart_operator_with(
        &mut self,
        binary: Option<&Path>,
        flags: Vec<String>,
    ) -> Result<Instant> {
        if let Some(op) = self.operator.take() {
            op.stop();
        }
        let _ = Api::<Lease>::namespaced(self.client.clone(), OPERATOR_NAMESPACE)
            .delete("celld-operator", &DeleteParams::default())
            .await;
        self.operator_flags = flags;
        self.operator_binary = binary.map(Path::to_path_buf);
        self.spawn_operator()
    }

    /// Skips the audit log written so far (figures after this count from here; the scale
    /// bed's fleet creation writes far more than is worth reading).
    pub fn audit_skip(&self) -> Result<()> {
        self.audit
            .lock()
            .map_err(|_| anyhow::anyhow!("audit reader poisoned"))?
            .skip_to_end();
        Ok(())
    }

    /// The operator's writes the audit log recorded since the last call, by
    /// `verb resource code`.
    pub fn operator_audit(&self) -> Result<std::collections::BTreeMap<String, f64>> {
        self.audit
            .lock()
            .map_err(|_| anyhow::anyhow!("audit reader poisoned"))?
            .operator_writes()
    }

    /// The operator (present until [`Bed::down`]).
    pub fn operator(&self) -> &Operator {
        self.operator.as_ref().expect("the operator runs")
    }

    /// A fresh namespace `bench-<prefix>-<run id>` with the fleets' ServiceAccount.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let name = format!("bench-{prefix}-{}", self.run_id);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(BENCH_LABEL.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "celld"}}))?;
        Api::<ServiceAccount>::namespaced(self.client.clone(), &name)
            .create(&PostParams::default(), &sa)
            .await?;
        Ok(name)
    }

    /// A bucket name unique to this run, namespace and fleet (reservations are cluster-wide).
    pub fn bucket(&self, ns: &str, fleet: &str) -> String {
        let ns_part = ns.rsplit_once('-').map_or(ns, |(head, _)| head);
        let b = format!("{BUCKET_PREFIX}{}-{ns_part}-{fleet}", self.run_id);
        b.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches('-')
            .to_string()
    }

    /// Deletes a namespace while the operator runs (its fleets are deleted by the operator)
    /// and waits until it is gone.
    pub async fn delete_namespace(&self, ns: &str, within: Duration) -> Result<()> {
        let api = Api::<Namespace>::all(self.client.clone());
        let _ = api.delete(ns, &DeleteParams::default()).await;
        let deadline = Instant::now() + within;
        while api.get_opt(ns).await?.is_some() {
            if Instant::now() > deadline {
                bail!("namespace {ns} still exists after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Stops the operator and the kubelet, removes the bench's namespaces and reservations,
    /// and stops the control plane if this run started it (unless `keep_cluster`).
    pub async fn down(mut self) -> Result<()> {
        if let Some(op) = self.operator.take() {
            op.stop();
        }
        let cleanup = remove_leftovers(&self.client).await;
        if let Some(k) = self.kubelet.take() {
            tokio::task::spawn_blocking(move || k.stop()).await?;
        }
        if self.started_cluster && !self.settings.keep_cluster {
            let down = celld_harness::repo_root().join("integration/cluster/down.sh");
            let status = Command::new(&down)
                .arg(&self.settings.cluster_dir)
                .status()
                .with_context(|| format!("running {}", down.display()))?;
            if !status.success() {
                bail!("{} failed with {status}", down.display());
            }
            progress("control plane stopped (started by this run)");
        } else {
            progress(&format!(
                "control plane left running ({})",
                if self.started_cluster {
                    "--keep-cluster"
                } else {
                    "it was running before this run"
                }
            ));
        }
        cleanup
    }
}

/// Namespaces labelled [`BENCH_LABEL`] (their fleets' finalizers stripped: the operator may
/// not be running) and reservations of bench buckets.
async fn remove_leftovers(client: &Client) -> Result<()> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let lp = ListParams::default().labels(&format!("{BENCH_LABEL}=true"));
    let found = namespaces.list(&lp).await?.items;
    let mut fleet_count = 0u64;
    for ns in &found {
        let name = ns.name_any();
        let fleets = Api::<CelldFleet>::namespaced(client.clone(), &name);
        for f in fleets.list(&ListParams::default()).await?.items {
            fleet_count += 1;
            if !f.finalizers().is_empty() {
                let strip = json!({"metadata": {"finalizers": null}});
                let _ = fleets
                    .patch(
                        &f.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&strip),
                    )
                    .await;
            }
        }
        if ns.metadata.deletion_timestamp.is_none() {
            let _ = namespaces.delete(&name, &DeleteParams::default()).await;
        }
    }
    // The namespace controller deletes every member Pod and claim (the scale bed leaves
    // thousands): allow time in proportion.
    let within = Duration::from_secs(300 + fleet_count / 2);
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let left = namespaces.list(&lp).await?.items.len();
        if left == 0 {
            break;
        }
        if started.elapsed() > within {
            bail!("{left} bench namespaces still exist after {within:?}");
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            progress(&format!(
                "removing bench namespaces: {left} of {} left after {:.0} s",
                found.len(),
                started.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if !found.is_empty() {
        progress(&format!("removed {} bench namespaces", found.len()));
    }
    let reservations = Api::<CelldStorageReservation>::all(client.clone());
    let mut removed = 0;
    for r in reservations.list(&ListParams::default()).await?.items {
        if r.spec.bucket.starts_with(BUCKET_PREFIX) {
            let _ = reservations
                .delete(&r.name_any(), &DeleteParams::default())
                .await;
            removed += 1;
        }
    }
    if removed > 0 {
        progress(&format!("removed {removed} bench reservations"));
    }
    Ok(())
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api = Api::<Namespace>::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns).await?;
    }
    Ok(())
}

/// The fleet object: `replicas` no-process members (the test kubelet makes them Running and
/// Ready at once), one zone ([`ZONE`]), a bench bucket.
pub fn fleet(name: &str, profile: &str, replicas: i32, bucket: &str) -> Result<CelldFleet> {
    let image = format!("{NO_PROCESS_IMAGE}@sha256:{}", "1".repeat(64));
    let mut v = json!({
        "apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": {"profile": profile, "runtimeImage": image, "replicas": replicas, "serviceAccountName": "celld",
                 "storage": {"bucket": bucket, "region": "us-east-1", "sizeGiB": 1},
                 "placement": {"zones": [ZONE], "azCount": 1}}
    });
    if profile == "PersistentFleet" {
        v["spec"]["storage"]["storageClassName"] = json!("celld-test-hostpath");
    }
    Ok(serde_json::from_value(v)?)
}

/// Settled at `n` members as the fleet reports it: current generation observed, no open
/// operation, `Ready=True`, `readyReplicas == appliedReplicas == n`.
pub fn fleet_settled(f: &CelldFleet, n: i32) -> bool {
    let Some(s) = &f.status else {
        return false;
    };
    s.observed_generation == f.metadata.generation
        && s.current_operation.is_none()
        && s.ready_replicas == Some(n)
        && s.applied_replicas == Some(n)
        && s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Polls the fleet every 200 ms until `done(fleet)`, at most `within`.
pub async fn wait_fleet(
    api: &Api<CelldFleet>,
    name: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&CelldFleet) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(f) = api.get_opt(name).await? {
            if done(&f) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let conditions: Vec<String> = f
                    .status
                    .map(|s| {
                        s.conditions
                            .iter()
                            .map(|c| {
                                format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                bail!("{name}: timed out after {within:?} waiting for {what}; conditions: {conditions:?}");
            }
        } else if Instant::now() > deadline {
            bail!(
                "{name}: timed out after {within:?} waiting for {what}; the fleet does not exist"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator under test: `celld-operator run --local-test --network-policy-enforced` with
/// JSON logs at `info` (as deployed; debug logging would tax the figures), metrics and health
/// on loopback, its own journal mirror, plus the flags of a scale-bed design.
pub struct Operator {
    child: Child,
    /// Process id (RSS is read from `/proc/<pid>/status`).
    pub pid: u32,
    /// stdout + stderr.
    pub log: PathBuf,
}

impl Operator {
    fn start(
        binary: &Path,
        kubeconfig: &Path,
        identity: &str,
        dir: &Path,
        metrics: &str,
        health: &str,
        extra: &[String],
    ) -> Result<Operator> {
        std::fs::create_dir_all(dir)?;
        let log = dir.join("operator.log");
        // Appended: a restarted operator keeps the earlier process's lines.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let (env, flags): (Vec<&String>, Vec<&String>) =
            extra.iter().partition(|e| crate::scale::is_env(e));
        let child = Command::new(binary)
            .envs(env.iter().filter_map(|e| e.split_once('=')))
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info")
            .args([
                "run",
                "--local-test",
                "--network-policy-enforced",
                "--log-format",
                "json",
            ])
            .args(["--operator-namespace", OPERATOR_NAMESPACE])
            .arg(format!("--health-bind-address={health}"))
            .arg(format!("--metrics-bind-address={metrics}"))
            .args(flags)
            .arg("--journal-dir")
            .arg(dir.join("journal"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Operator {
            pid: child.id(),
            child,
            log,
        })
    }

    /// `(VmRSS, VmHWM)` in KiB.
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let status = self.status()?;
        let field = |name: &str| {
            status_kib(&status, name)
                .with_context(|| format!("{name} missing in /proc/{}/status", self.pid))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// `(RssAnon, RssFile)` in KiB: the heap and stacks, and the mapped files (mostly the
    /// binary's own code, shared with the page cache). `None` if the kernel does not say.
    pub fn rss_split_kib(&self) -> Option<(u64, u64)> {
        let status = self.status().ok()?;
        Some((
            status_kib(&status, "RssAnon:")?,
            status_kib(&status, "RssFile:")?,
        ))
    }

    /// `/proc/<pid>/status`.
    fn status(&self) -> Result<String> {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .with_context(|| format!("reading /proc/{}/status (did the operator exit?)", self.pid))
    }

    /// CPU time (user + system) the process used so far, in seconds (`/proc/<pid>/stat`).
    pub fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .with_context(|| format!("reading /proc/{}/stat (did the operator exit?)", self.pid))?;
        cpu_seconds_of(&stat, clock_ticks())
            .with_context(|| format!("unexpected /proc/{}/stat: {stat:.200}", self.pid))
    }

    /// Fails if the operator exited (it must run through every phase).
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the operator exited with {status}; log: {}",
                self.log.display()
            );
        }
        Ok(())
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line, in seconds. The fields
/// are counted after the command name's closing parenthesis (the name may hold spaces).
fn cpu_seconds_of(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second)
}

/// `getconf CLK_TCK` (clock ticks per second of `/proc` times), 100 when it cannot be read.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t: &f64| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// A progress line on stderr.
pub fn progress(msg: &str) {
    eprintln!("[bench {}] {msg}", chrono::Utc::now().format("%H:%M:%S"));
}

#[cfg(test)]
mod tests {
    use super::cpu_seconds_of;

    #[test]
    fn cpu_time_is_utime_plus_stime_after_the_command_name() {
        let stat =
            "4242 (celld op (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3";
        assert_eq!(cpu_seconds_of(stat, 100.0), Some(3.0));
        assert_eq!(cpu_seconds_of("garbage", 100.0), None);
    }
}

/// The number after `name` in a `/proc/<pid>/status` text (`VmRSS:   1234 kB` → 1234).
fn status_kib(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod status_tests {
    #[test]
    fn status_fields_are_read_by_name() {
        let s = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 700 kB\n";
        assert_eq!(super::status_kib(s, "VmRSS:"), Some(1024));
        assert_eq!(super::status_kib(s, "VmHWM:"), Some(2048));
        assert_eq!(super::status_kib(s, "RssAnon:"), Some(700));
        assert_eq!(super::status_kib(s, "RssFile:"), None);
    }
}
