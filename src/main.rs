//! `celld-operator`: flags, telemetry and wiring only.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use kube::api::Api;
use kube::ResourceExt;

use celld_operator::api::{self, CelldFleet};
use celld_operator::cli::{
    parse_target, Cli, Command, JournalCommand, JournalSource, ShowFormat, Source,
};
use celld_operator::journal_store;

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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crds => print!("{}", api::crds_yaml()?),
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
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(celld_operator::controller::run(args))?;
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

/// What the cluster holds for one fleet.
struct ClusterJournal {
    uid: String,
    document: journal::Document,
}

async fn read_cluster(source: &JournalSource) -> anyhow::Result<ClusterJournal> {
    let Some(target) = &source.target else {
        anyhow::bail!("name the fleet as NAMESPACE/FLEET (or read a mirror with --mirror DIR)");
    };
    let (ns, name) = parse_target(target).map_err(anyhow::Error::msg)?;
    let client = kube::Client::try_default().await?;
    let fleet = Api::<CelldFleet>::namespaced(client, &ns)
        .get(&name)
        .await?;
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
        JournalCommand::Show { source, format } => {
            let format = match format {
                ShowFormat::Table => journal::audit::Format::Table,
                ShowFormat::Jsonl => journal::audit::Format::JsonLines,
            };
            match source.resolved() {
                (Source::Mirror, dir) => {
                    let mirror = journal::Mirror::open_existing(dir)?;
                    journal::audit::show(&mirror, source.fleet.as_deref(), format, &mut out)?;
                }
                (Source::Cluster | Source::Both, _) => {
                    let cj = read_cluster(&source).await?;
                    journal::audit::show_entries(&cj.uid, cj.document.entries(), format, &mut out)?;
                }
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
                    let cj = read_cluster(&source).await?;
                    let report = journal::audit::verify_fleet(
                        &cj.uid,
                        Ok(cj.document.entries().to_vec()),
                        0,
                        Some(&cj.document),
                    );
                    journal::audit::render_fleet_report(&report, &mut out)?;
                    report.ok()
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
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
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
