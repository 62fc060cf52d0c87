//! `celld-operator`: flags, telemetry and wiring only.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use kube::api::Api;
use kube::ResourceExt;

use celld_operator::api::{self, CelldFleet};
use celld_operator::cli::{
    parse_target, Cli, Command, JournalCommand, JournalSource, ShowFormat, Source, StatusFormat,
};
use celld_operator::{journal_store, repair};

fn main() -> ExitCode {
    // Installed as `kubectl-celld`, kubectl passes the plugin's arguments unchanged.
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("celld-operator: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--malloc-arenas`: glibc's `M_ARENA_MAX`, unless 0 or `MALLOC_ARENA_MAX` is set (then
/// glibc has applied that already, and the environment wins).
fn limit_malloc_arenas(arenas: u16) {
    if arenas == 0 || std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt(3) takes no pointer; M_ARENA_MAX only bounds arenas created later.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, i32::from(arenas)) };
        if ok != 1 {
            eprintln!("celld-operator run: mallopt(M_ARENA_MAX, {arenas}) failed; glibc's default is kept");
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crds => print!("{}", api::crds_yaml()?),
        Command::Conditions => print!("{}", celld_operator::reconcile::reasons::markdown()),
        Command::Version => println!(
            "celld-operator {} (API {}/{})",
            env!("CARGO_PKG_VERSION"),
            api::GROUP,
            api::VERSION
        ),
        Command::Run(args) => {
            if let Err(problem) = args.check() {
                eprintln!("celld-operator run: {problem}");
                return Ok(ExitCode::from(2));
            }
            // Before the runtime starts its threads: an arena limit applies to arenas created
            // afterwards, so it is set while only this thread has allocated.
            limit_malloc_arenas(args.malloc_arenas);
            // 8 MiB per worker, as the main thread has, instead of tokio's 2 MiB: a reconcile
            // runs nested futures tens of KB each, and a debug build overflowed 2 MiB. Only
            // the pages a worker touches are resident.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_stack_size(8 << 20)
                .build()?;
            runtime.block_on(celld_operator::controller::run(*args))?;
        }
        Command::Status {
            target,
            output,
            journal_budget,
            no_state,
        } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(status(target, output, journal_budget, no_state))?;
        }
        Command::Replace { target, member } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(replace(target, &member))?;
        }
        Command::Journal(cmd) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            return runtime.block_on(journal(cmd));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `status NS/FLEET`: reads the fleet, its Pods (by the fleet's UID label) and the
/// namespace's claims, asks each member with an IP for `/state`, prints the view.
async fn status(
    (ns, name): (String, String),
    output: StatusFormat,
    budget: u32,
    no_state: bool,
) -> anyhow::Result<()> {
    use celld_operator::status_view::{state_name, States, View};
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    let client = kube::Client::try_default().await?;
    let fleet = Api::<CelldFleet>::namespaced(client.clone(), &ns)
        .get_opt(&name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{ns}/{name}: no such CelldFleet"))?;
    let selector = format!(
        "{}={}",
        api::keys::FLEET_UID_LABEL,
        fleet.uid().unwrap_or_default()
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?
        .items;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client, &ns)
        .list(&Default::default())
        .await?
        .items;
    let mut states = States::new();
    if !no_state {
        let asks = pods.iter().filter_map(|p| {
            let ip: std::net::IpAddr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
            let member = state_name(&fleet, p);
            let pod = p.name_any();
            Some(async move {
                let answer = celld_operator::member::state(ip, &member)
                    .await
                    .map(|s| s.shutdown.runtime_generation)
                    .map_err(|e| e.0);
                (pod, answer)
            })
        });
        states.extend(futures::future::join_all(asks).await);
    }
    let view = View::build(&fleet, &pods, &claims, &states, i64::from(budget));
    match output {
        StatusFormat::Text => print!("{}", view.render()),
        StatusFormat::Json => println!("{}", serde_json::to_string_pretty(&view)?),
    }
    Ok(())
}

/// `replace NS/FLEET MEMBER`: the member's current UID into `celld.eric.dev/replace-member`.
async fn replace((ns, name): (String, String), member: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let client = kube::Client::try_default().await?;
    let fleets = Api::<CelldFleet>::namespaced(client.clone(), &ns);
    let fleet = fleets.get(&name).await?;
    let pod = Api::<Pod>::namespaced(client, &ns)
        .get_opt(member)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{ns}/{member}: no such Pod"))?;
    let fleet_uid = fleet.uid().unwrap_or_default();
    if pod.labels().get(api::keys::FLEET_UID_LABEL) != Some(&fleet_uid) {
        anyhow::bail!("{ns}/{member} is not a member of fleet {name}");
    }
    let uid = pod.uid().unwrap_or_default();
    let value = celld_operator::reconcile::replace_request_value(member, &uid);
    fleets
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({
                "metadata": {"annotations": {api::keys::REPLACE_MEMBER_ANNOTATION: value}}
            })),
        )
        .await?;
    println!(
        "{ns}/{name}: set {} to {value:?}; the operator replaces {member} once nothing else is open and every other member is Ready (see the fleet's conditions and Events)",
        api::keys::REPLACE_MEMBER_ANNOTATION
    );
    Ok(())
}

/// What the cluster holds for one fleet.
struct ClusterJournal {
    uid: String,
    document: journal::Document,
}

/// The fleet `source` names, read from the cluster (with its namespace and name).
async fn read_fleet(source: &JournalSource) -> anyhow::Result<(String, String, CelldFleet)> {
    let Some(target) = &source.target else {
        anyhow::bail!("name the fleet as NAMESPACE/FLEET (or read a mirror with --mirror DIR)");
    };
    let (ns, name) = parse_target(target).map_err(anyhow::Error::msg)?;
    let client = kube::Client::try_default().await?;
    let fleet = Api::<CelldFleet>::namespaced(client, &ns)
        .get(&name)
        .await?;
    Ok((ns, name, fleet))
}

async fn read_cluster(source: &JournalSource) -> anyhow::Result<ClusterJournal> {
    let (ns, name, fleet) = read_fleet(source).await?;
    let uid = fleet.uid().unwrap_or_default();
    let document = match fleet.annotations().get(api::keys::JOURNAL_ANNOTATION) {
        Some(text) => journal::decode_document(text)
            .map_err(|e| anyhow::anyhow!("{ns}/{name}: the journal annotation is invalid: {e}"))?,
        None => journal::Document::empty(uid.clone()),
    };
    Ok(ClusterJournal { uid, document })
}

async fn journal(cmd: JournalCommand) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cmd {
        JournalCommand::Show {
            source,
            format,
            operation,
            since,
        } => {
            let options = journal::audit::ShowOptions {
                format: match format {
                    ShowFormat::Table => journal::audit::Format::Table,
                    _ => journal::audit::Format::JsonLines,
                },
                operation,
                since,
            };
            // JSON and YAML are the JSON Lines collected into one document.
            let mut lines = Vec::new();
            let sink: &mut dyn Write = match format {
                ShowFormat::Table | ShowFormat::Jsonl => &mut out,
                ShowFormat::Json | ShowFormat::Yaml => &mut lines,
            };
            match source.resolved() {
                (Source::Mirror, dir) => {
                    let mirror = journal::Mirror::open_existing(dir)?;
                    journal::audit::show_with(&mirror, source.fleet.as_deref(), &options, sink)?;
                }
                (Source::Cluster | Source::Both, _) => {
                    let cj = read_cluster(&source).await?;
                    journal::audit::show_entries_with(
                        &cj.uid,
                        cj.document.entries(),
                        &options,
                        sink,
                    )?;
                }
            }
            if matches!(format, ShowFormat::Json | ShowFormat::Yaml) {
                let operations = String::from_utf8_lossy(&lines)
                    .lines()
                    .map(serde_json::from_str)
                    .collect::<Result<Vec<serde_json::Value>, _>>()?;
                let text = if format == ShowFormat::Json {
                    serde_json::to_string_pretty(&operations)? + "\n"
                } else {
                    serde_yaml::to_string(&operations)?
                };
                out.write_all(text.as_bytes())?;
            }
        }
        JournalCommand::Export { source, .. } => match source.resolved() {
            (Source::Mirror, dir) => {
                let mirror = journal::Mirror::open_existing(dir)?;
                journal::audit::export(&mirror, source.fleet.as_deref(), &mut out)?;
            }
            (Source::Cluster | Source::Both, _) => {
                let cj = read_cluster(&source).await?;
                journal::audit::export_entries(&cj.uid, cj.document.entries(), &mut out)?;
            }
        },
        JournalCommand::Verify { source } => {
            let ok = match source.resolved() {
                (Source::Mirror, dir) => {
                    let mirror = journal::Mirror::open_existing(dir)?;
                    journal::audit::verify(&mirror, source.fleet.as_deref(), &[], &mut out)?.ok()
                }
                (Source::Cluster, _) => {
                    let (uid, text) = read_annotation(&source).await?;
                    journal::audit::verify_annotation(
                        &uid,
                        text.as_deref(),
                        chrono::Utc::now(),
                        &mut out,
                    )?
                }
                (Source::Both, dir) => {
                    let cj = read_cluster(&source).await?;
                    let mirror = journal::Mirror::open_existing(dir)?;
                    journal::audit::verify(&mirror, Some(&cj.uid), &[cj.document], &mut out)?.ok()
                }
            };
            out.flush()?;
            if !ok {
                return Ok(ExitCode::from(1));
            }
        }
        JournalCommand::Abandon { target, op } => send(&mut out, target, "abandon", &op).await?,
        JournalCommand::Retry { target, op } => send(&mut out, target, "retry", &op).await?,
        JournalCommand::Restore {
            target,
            from_mirror,
            from_file,
            journal_annotation_bytes,
        } => match (from_mirror, from_file) {
            (_, Some(file)) => {
                let budget = journal::Budget::new(journal_annotation_bytes as usize)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                repair::restore_from_file(&mut out, target, &file, budget).await?
            }
            _ => send_raw(&mut out, target, "restore-from-mirror").await?,
        },
        JournalCommand::Reset { target, reason } => {
            send_raw(&mut out, target, &format!("reset {}", reason.trim())).await?
        }
        JournalCommand::Adopt { target } => repair::adopt(&mut out, target).await?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The fleet's UID and its journal annotation as stored (not decoded).
async fn read_annotation(source: &JournalSource) -> anyhow::Result<(String, Option<String>)> {
    let (_, _, fleet) = read_fleet(source).await?;
    Ok((
        fleet.uid().unwrap_or_default(),
        fleet
            .annotations()
            .get(api::keys::JOURNAL_ANNOTATION)
            .cloned(),
    ))
}

/// Sets a repair command (`restore-from-mirror`, `reset <reason>`), checked by the
/// operator's own parser first.
async fn send_raw(
    out: &mut impl Write,
    (ns, name): (String, String),
    command: &str,
) -> anyhow::Result<()> {
    match journal::parse_repair_command(command) {
        Some(Ok(_)) => {}
        Some(Err(e)) => anyhow::bail!("{e}"),
        None => anyhow::bail!("{command:?} is not a repair command"),
    }
    let client = kube::Client::try_default().await?;
    journal_store::send_command(&Api::namespaced(client, &ns), &name, command).await?;
    writeln!(
        out,
        "{ns}/{name}: set {} to {command:?}; the operator consumes it at its next reconcile (see the fleet's Events)",
        api::keys::JOURNAL_COMMAND_ANNOTATION
    )?;
    Ok(())
}

async fn send(
    out: &mut impl Write,
    (ns, name): (String, String),
    verb: &str,
    op: &str,
) -> anyhow::Result<()> {
    let command = format!("{verb} {op}");
    // The operator's own parser: a typo fails here, not later in the controller.
    journal::parse_command(&command).map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = kube::Client::try_default().await?;
    journal_store::send_command(&Api::namespaced(client, &ns), &name, &command).await?;
    writeln!(
        out,
        "{ns}/{name}: set {} to {command:?}",
        api::keys::JOURNAL_COMMAND_ANNOTATION
    )?;
    Ok(())
}
