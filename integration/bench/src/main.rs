//! `celld-bench`: the operator benchmark run by `make bench` (see README.md).
//!
//! Brings up its own control plane (folder and ports apart from the dev cluster), a test
//! kubelet and the real `celld-operator` binary, measures latency and API requests per
//! operation, then the scale bed (start-up, at-rest traffic, RSS, CPU, reaction under load and
//! fairness at each fleet count, for the cached and the fresh-read designs), prints a table,
//! writes `target/bench/operator.json`, and tears down what it started.

mod audit;
mod bed;
mod ops;
mod pace;
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
    /// Test kubelet Nodes, at least (raised to what the largest size's Pods need at
    /// --max-pods per Node, and to one more than the largest fleet: required anti-affinity).
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// Pod capacity of each test-kubelet Node (its --max-pods). A test Node has 64 CPUs and a
    /// member requests 250m, so at most 256 members fit one Node whatever this says; the
    /// default keeps the Node count (sized at 80 % of this) below that.
    #[arg(long, default_value_t = 200)]
    max_pods: u32,
    /// Profiles of the operations scenario (figures 1 and 2).
    #[arg(long, value_delimiter = ',', default_value = "PersistentFleet,Bucket")]
    profiles: Vec<String>,
    /// Figures 1 and 2: members at the top of each grow/contract cycle.
    #[arg(long, default_value_t = 5)]
    ops_members: i32,
    /// Figures 1 and 2: grow / restart / contract cycles per profile.
    #[arg(long, default_value_t = 4)]
    repetitions: usize,
    /// Scale bed (figure 3): fleet counts, grown from one to the next without deleting.
    #[arg(long, value_delimiter = ',', default_value = "100,500,1000")]
    fleets: Vec<usize>,
    /// Scale bed: members per fleet (PersistentFleet, no-process members, one claim each).
    #[arg(long, default_value_t = 3)]
    members: i32,
    /// Scale bed: operator designs compared at each size, in this order (`cached`: the binary
    /// as built; `fresh`: with --test-fresh-reads). Operator flags or environment variables may
    /// follow a design, joined with `+`: `cached+--reconcile-concurrency=32` or
    /// `cached+MALLOC_ARENA_MAX=2` measures a tuning side by side; `+bin:PATH` runs another
    /// operator binary; `+pad:N` pads the design's active fleets with an N-byte annotation
    /// before its reaction figures (the cost of a larger fleet object).
    #[arg(long, value_delimiter = ',', default_value = "cached,fresh", value_parser = scale::Design::parse)]
    designs: Vec<scale::Design>,
    /// Scale bed: length of each at-rest window, e.g. 605s, 10m5s or 90s. At least 10 min 2 s
    /// holds one resync of every fleet (600 s + up to 2 s of jitter).
    #[arg(long, default_value = "10m5s", value_parser = parse_duration)]
    at_rest_window: Duration,
    /// Scale bed: fleets per namespace (the operator watches 8 kinds per fleet namespace).
    #[arg(long, default_value_t = 10)]
    fleets_per_namespace: usize,
    /// Scale bed: at most this many fleets created and not yet settled.
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// Scale bed: fraction of the fleets active at the same time in the reaction measurement
    /// (`0.05` or `5%`; at least 2 fleets).
    #[arg(long, default_value = "5%", value_parser = parse_fraction)]
    active_fraction: f64,
    /// Scale bed: operations per active fleet in each reaction measurement.
    #[arg(long, default_value_t = 3)]
    load_rounds: usize,
    /// Scale bed: a third reaction measurement whose active fleets start their operations
    /// one after another, evenly over this long, instead of all at once (e.g. 10s; 0s
    /// skips it). An operation lasts about as long as the default spread, so most of the
    /// active fleets are in their operations at the same time (the report gives the peak
    /// and the mean); what goes is only that every one of them asked in the same instant.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    spread: Duration,
    /// Removed (RSS is now measured at every --fleets size, for each design); accepted and
    /// ignored so older command lines still run.
    #[arg(long, value_delimiter = ',', hide = true)]
    rss_fleets: Vec<usize>,
    /// Silence (Lease traffic aside) that ends an operation's measurement, e.g. 3s.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    quiet: Duration,
    /// Skip figures 1 and 2.
    #[arg(long)]
    skip_ops: bool,
    /// Skip the scale bed (figure 3).
    #[arg(long)]
    skip_scale: bool,
    /// Leave the control plane running at the end.
    #[arg(long)]
    keep_cluster: bool,
    /// JSON output (default: <repo>/target/bench/operator.json).
    #[arg(long)]
    output: Option<PathBuf>,
}

/// `120s`, `2m`, `500ms`, `10m5s` (a bare number is seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: expected e.g. 120s, 2m or 10m5s");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        total += match unit {
            "s" | "" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "ms" => Duration::from_millis(n),
            _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, ms)")),
        };
    }
    Ok(total)
}

/// `0.05` or `5%`, in (0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = match s.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?}: expected e.g. 0.05 or 5%"))?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!("{s:?}: must be in (0, 1], e.g. 5%"));
    }
    Ok(v)
}

/// Test-kubelet Nodes for the run: `--nodes`, raised so that every fleet can place one more
/// member than it has (required anti-affinity), the operations scenario its top size, and the
/// largest size's Pods (plus the active growth and the hot fleet) fit at 80 % of `--max-pods`.
fn nodes_needed(args: &Args) -> usize {
    let mut nodes = args.nodes;
    if !args.skip_ops {
        nodes = nodes.max(args.ops_members as usize);
    }
    if !args.skip_scale {
        let members = args.members as usize;
        let largest = args.fleets.iter().copied().max().unwrap_or(0);
        let active = (args.active_fraction * largest as f64).ceil() as usize + 2;
        let pods = largest * members + active + members + 1;
        let per_node = (f64::from(args.max_pods) * 0.8).floor().max(1.0) as usize;
        nodes = nodes.max(members + 1).max(pods.div_ceil(per_node));
    }
    nodes
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
    if args.ops_members < 2 {
        bail!("--ops-members must be at least 2");
    }
    if args.members < 1 {
        bail!("--members must be at least 1");
    }
    if !args.rss_fleets.is_empty() {
        progress("--rss-fleets is ignored: RSS is measured at every --fleets size (scale bed)");
    }
    if args.designs.is_empty() && !args.skip_scale {
        bail!("--designs names no design (cached, fresh)");
    }
    // A design's tag names its namespaces, hot fleet and bucket: two alike would collide
    // (the second hot fleet finds the first one's bucket reservation).
    let mut tags = std::collections::BTreeMap::new();
    for d in &args.designs {
        if let Some(other) = tags.insert(d.tag(), d.name().to_string()) {
            bail!(
                "--designs: {} and {other} would share the tag {}; name each design once",
                d.name(),
                d.tag()
            );
        }
    }
    let nodes = nodes_needed(&args);
    if nodes > args.nodes {
        progress(&format!(
            "{nodes} test-kubelet Nodes instead of --nodes {} (anti-affinity and {} Pods per Node at most)",
            args.nodes, args.max_pods
        ));
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
        nodes,
        max_pods: args.max_pods,
        keep_cluster: args.keep_cluster,
    };
    let operator_bin = settings.operator_bin.clone();
    let mut bed = Bed::up(settings).await?;
    let result = measure(&mut bed, &args, &operator_bin).await;
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
            nodes,
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

async fn measure(
    bed: &mut Bed,
    args: &Args,
    operator_bin: &Path,
) -> Result<(Vec<ops::OpsResult>, Option<scale::ScaleResult>)> {
    let mut ops_results = Vec::new();
    if !args.skip_ops {
        for profile in &args.profiles {
            let cfg = ops::OpsConfig {
                profile: profile.clone(),
                members: args.ops_members,
                repetitions: args.repetitions,
                quiet: args.quiet,
            };
            ops_results.push(ops::run(bed, &cfg).await?);
            bed.operator.as_mut().expect("operator").check_running()?;
        }
    }
    let mut scale = None;
    if !args.skip_scale {
        let mut sizes: Vec<usize> = args.fleets.iter().copied().filter(|n| *n > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let cfg = scale::ScaleConfig {
            sizes,
            members: args.members,
            designs: args.designs.clone(),
            window: args.at_rest_window,
            per_namespace: args.fleets_per_namespace,
            batch: args.batch,
            active_fraction: args.active_fraction,
            rounds: args.load_rounds,
            spread: args.spread,
            quiet: Duration::from_secs(5),
        };
        scale = Some(scale::run(bed, &cfg, operator_bin).await?);
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
        ("ops_members", args.ops_members.to_string()),
        ("repetitions", args.repetitions.to_string()),
        ("fleets", join(&args.fleets)),
        ("members", args.members.to_string()),
        (
            "designs",
            args.designs
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("at_rest_window", format!("{:?}", args.at_rest_window)),
        (
            "fleets_per_namespace",
            args.fleets_per_namespace.to_string(),
        ),
        ("batch", args.batch.to_string()),
        ("active_fraction", args.active_fraction.to_string()),
        ("load_rounds", args.load_rounds.to_string()),
        ("spread", format!("{:?}", args.spread)),
        ("quiet", format!("{:?}", args.quiet)),
        ("nodes", args.nodes.to_string()),
        ("max_pods", args.max_pods.to_string()),
        ("skip_ops", args.skip_ops.to_string()),
        ("skip_scale", args.skip_scale.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::{nodes_needed, parse_duration, parse_fraction, Args};
    use std::time::Duration;

    #[test]
    fn durations_take_seconds_minutes_and_milliseconds() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10m5s"), Ok(Duration::from_secs(605)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn fractions_take_percentages() {
        assert_eq!(parse_fraction("5%"), Ok(0.05));
        assert_eq!(parse_fraction("0.1"), Ok(0.1));
        assert!(parse_fraction("0").is_err());
        assert!(parse_fraction("150%").is_err());
    }

    #[test]
    fn nodes_cover_anti_affinity_and_pod_capacity() {
        use clap::Parser;
        let args = Args::parse_from(["celld-bench", "--fleets", "100,1000", "--max-pods", "1000"]);
        // 3,000 members + growth + hot fleet at 800 Pods per Node.
        assert_eq!(nodes_needed(&args), 6);
        let args = Args::parse_from(["celld-bench", "--fleets", "1000", "--max-pods", "500"]);
        assert_eq!(nodes_needed(&args), 8);
        let args = Args::parse_from([
            "celld-bench",
            "--skip-ops",
            "--fleets",
            "10",
            "--nodes",
            "1",
        ]);
        assert_eq!(nodes_needed(&args), 4, "one more than the members");
    }
}
