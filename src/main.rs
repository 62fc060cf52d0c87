//! `celld-operator`: flags, telemetry and wiring only.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use celld_operator::api;
use celld_operator::cli::{Cli, Command, JournalCommand, JournalSource, ShowFormat};

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
            anyhow::bail!(
                "the controller is not part of this build yet (flags parsed: operator namespace {}); \
                 see README \"Status of this tree\"",
                args.operator_namespace
            );
        }
        Command::Journal(cmd) => return journal(cmd),
    }
    Ok(ExitCode::SUCCESS)
}

fn open_mirror(source: &JournalSource) -> anyhow::Result<journal::Mirror> {
    let Some(dir) = &source.mirror else {
        anyhow::bail!(
            "reading journals from the cluster is not part of this build yet; pass --mirror DIR"
        );
    };
    Ok(journal::Mirror::open_existing(dir)?)
}

fn journal(cmd: JournalCommand) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cmd {
        JournalCommand::Show { source, format } => {
            let mirror = open_mirror(&source)?;
            let format = match format {
                ShowFormat::Table => journal::audit::Format::Table,
                ShowFormat::Jsonl => journal::audit::Format::JsonLines,
            };
            journal::audit::show(&mirror, source.fleet.as_deref(), format, &mut out)?;
        }
        JournalCommand::Export { source, .. } => {
            let mirror = open_mirror(&source)?;
            journal::audit::export(&mirror, source.fleet.as_deref(), &mut out)?;
        }
        JournalCommand::Verify { source } => {
            let mirror = open_mirror(&source)?;
            let report = journal::audit::verify(&mirror, source.fleet.as_deref(), &[], &mut out)?;
            out.flush()?;
            if !report.ok() {
                return Ok(ExitCode::from(1));
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
