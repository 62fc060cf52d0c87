//! `celld-operator`: flags, telemetry and wiring only.

use clap::{Parser, Subcommand};

use celld_operator::api;

/// Kubernetes operator for fleets of the celld runtime.
#[derive(Parser, Debug)]
#[command(name = "celld-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the CRD YAML (CelldFleet, CelldStorageReservation).
    Crds,
    /// Print the version.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => print!("{}", api::crds_yaml()?),
        Command::Version => println!("celld-operator {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
