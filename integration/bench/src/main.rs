//! `celld-bench`: the operator benchmark run by `make bench` (see README.md).
//!
//! Brings up its own control plane (folder and ports apart from the dev cluster), a test
//! kubelet and the real `celld-operator` binary, measures latency, API requests per
//! operation, at-rest API traffic and RSS, prints a table, writes
//! `target/bench/operator.json`, and tears down what it started.

mod audit;
mod bed;
mod ops;
mod report;
mod scale;
mod scrape;
mod stats;
mod timeline;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::bed::{progress, Bed, Settings};

/// Operator benchmark against a real local control plane.
#[derive(Parser, Debug)]
#[command(name = "celld-bench")]
struct Args {
    /// Control plane folder (its own, apart from the dev cluster).
    #[arg(long, env = "CELLD_BENCH_CLUSTER_DIR")]
    cluster_dir: Option<PathBuf>,
    /// First port of the control plane (API server on +43, operator metrics on +84).
    #[arg(long, env = "CELLD_BENCH_PORT_BASE", default_value_t = 17400)]
    port_base: u16,
    /// The operator binary (default: next to this binary).
    #[arg(long)]
    operator_bin: Option<PathBuf>,
    /// The test kubelet binary (default: next to this binary).
    #[arg(long)]
    kubelet_bin: Option<PathBuf>,
    /// Test kubelet Nodes (at least --members: required anti-affinity, one member per Node).
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// Profiles of the operations scenario (figures 1 and 2).
    #[arg(long, value_delimiter = ',', default_value = "PersistentFleet,Bucket")]
    profiles: Vec<String>,
    /// Members at the top of each grow/contract cycle.
    #[arg(long, default_value_t = 5)]
    members: i32,
    /// Grow / restart / contract cycles per profile.
    #[arg(long, default_value_t = 4)]
    repetitions: usize,
    /// Fleet counts for the at-rest windows (figure 3).
    #[arg(long, value_delimiter = ',', default_value = "20,100")]
    fleets: Vec<usize>,
    /// Fleet counts for RSS (figure 4).
    #[arg(long, value_delimiter = ',', default_value = "0,50,200")]
    rss_fleets: Vec<usize>,
    /// Length of each at-rest window, e.g. 120s or 2m.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    at_rest_window: Duration,
    /// Fleets per namespace in the scale phase (the operator runs 8 watches per namespace).
    #[arg(long, default_value_t = 10)]
    fleets_per_namespace: usize,
    /// Silence (Lease traffic aside) that ends an operation's measurement, e.g. 3s.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    quiet: Duration,
    /// Skip figures 1 and 2.
    #[arg(long)]
    skip_ops: bool,
    /// Skip figures 3 and 4.
    #[arg(long)]
    skip_scale: bool,
    /// Leave the control plane running at the end.
    #[arg(long)]
    keep_cluster: bool,
    /// JSON output (default: <repo>/target/bench/operator.json).
    #[arg(long)]
    output: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 120s or 2m"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "ms" => Ok(Duration::from_millis(n)),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (s, m, ms)")),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let repo = celld_harness::repo_root();
    let cluster_dir = args
        .cluster_dir
        .clone()
        .unwrap_or_else(|| repo.join(".work/bench-cluster"));
    // Read by the harness (`cluster()`) and up.sh; set before any thread exists.
    std::env::set_var("CELLD_CLUSTER_DIR", &cluster_dir);
    std::env::set_var("CELLD_PORT_BASE", args.port_base.to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(args, repo, cluster_dir)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("celld-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .context("no folder above the bench binary")?
        .join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build it (`cargo build --release -p celld-operator -p celld-test-kubelet`) or pass --{}-bin",
            path.display(),
            name.trim_start_matches("celld-").trim_start_matches("test-")
        );
    }
    Ok(path)
}

async fn run(args: Args, repo: PathBuf, cluster_dir: PathBuf) -> Result<()> {
    let started = Instant::now();
    let load_start = loadavg();
    let started_at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    if args.members < 2 {
        bail!("--members must be at least 2");
    }
    if args.nodes < args.members as usize {
        bail!(
            "--nodes ({}) must be at least --members ({}): members need one Node each",
            args.nodes,
            args.members
        );
    }
    let settings = Settings {
        cluster_dir: cluster_dir.clone(),
        port_base: args.port_base,
        operator_bin: match &args.operator_bin {
            Some(p) => p.clone(),
            None => sibling("celld-operator")?,
        },
        kubelet_bin: match &args.kubelet_bin {
            Some(p) => p.clone(),
            None => sibling("celld-test-kubelet")?,
        },
        nodes: args.nodes,
        keep_cluster: args.keep_cluster,
    };
    let operator_bin = settings.operator_bin.clone();
    let mut bed = Bed::up(settings).await?;
    let result = measure(&mut bed, &args).await;
    let down = bed.down().await;
    let (ops_results, scale) = result?;
    down?;

    let (latency, unobserved_settles, writes_per_operation) = report::from_ops(&ops_results);
    let report = report::Report {
        meta: report::Meta {
            started_at,
            duration_s: started.elapsed().as_secs_f64(),
            git_commit: git(&repo, &["rev-parse", "HEAD"]).trim().to_string(),
            uncommitted: git(
                &repo,
                &[
                    "status",
                    "--porcelain",
                    "--",
                    "src",
                    "journal",
                    "crds",
                    "Cargo.toml",
                ],
            )
            .lines()
            .map(str::to_string)
            .collect(),
            operator_profile: profile_of(&operator_bin),
            operator_binary: operator_bin.display().to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            nodes: args.nodes,
            loadavg: [load_start, loadavg()],
            cluster: format!("{} (port base {})", cluster_dir.display(), args.port_base),
            options: options(&args),
        },
        latency,
        unobserved_settles,
        writes_per_operation,
        scale,
    };
    let text = report.text();
    println!("{text}");
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| repo.join("target/bench/operator.json"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("JSON: {}", out.display());
    Ok(())
}

async fn measure(bed: &mut Bed, args: &Args) -> Result<(Vec<ops::OpsResult>, scale::ScaleResult)> {
    let mut ops_results = Vec::new();
    if !args.skip_ops {
        for profile in &args.profiles {
            let cfg = ops::OpsConfig {
                profile: profile.clone(),
                members: args.members,
                repetitions: args.repetitions,
                quiet: args.quiet,
            };
            ops_results.push(ops::run(bed, &cfg).await?);
            bed.operator.as_mut().expect("operator").check_running()?;
        }
    }
    let mut scale = scale::ScaleResult::default();
    if !args.skip_scale {
        progress("[scale] fresh operator process for the at-rest and RSS figures");
        bed.restart_operator().await?;
        let cfg = scale::ScaleConfig {
            at_rest: args.fleets.clone(),
            rss: args.rss_fleets.clone(),
            window: args.at_rest_window,
            per_namespace: args.fleets_per_namespace,
            quiet: Duration::from_secs(5),
        };
        scale = scale::run(bed, &cfg).await?;
        bed.operator.as_mut().expect("operator").check_running()?;
    }
    Ok((ops_results, scale))
}

fn git(repo: &Path, args: &[&str]) -> String {
    Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The 1-, 5- and 15-minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn profile_of(bin: &Path) -> String {
    bin.parent()
        .and_then(|p| p.file_name())
        .map_or("unknown".into(), |n| n.to_string_lossy().into_owned())
}

fn options(args: &Args) -> BTreeMap<String, String> {
    let join = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    [
        ("profiles", args.profiles.join(",")),
        ("members", args.members.to_string()),
        ("repetitions", args.repetitions.to_string()),
        ("fleets", join(&args.fleets)),
        ("rss_fleets", join(&args.rss_fleets)),
        ("at_rest_window", format!("{:?}", args.at_rest_window)),
        (
            "fleets_per_namespace",
            args.fleets_per_namespace.to_string(),
        ),
        ("quiet", format!("{:?}", args.quiet)),
        ("nodes", args.nodes.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_seconds_minutes_and_milliseconds() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("2h").is_err());
    }
}
