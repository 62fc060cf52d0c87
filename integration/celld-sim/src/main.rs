//! `celld-sim`: no arguments, configuration by environment (integration/celld-sim/README.md
//! "Running it").
//!
//! Exit codes: 0 after a SIGTERM drain, 3 after a `SELF-FENCE:` line, 7 on a startup failure.

use celld_sim::config::Config;
use celld_sim::node::{self, EXIT_STARTUP};

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CELLD_SIM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if std::env::args().len() > 1 {
        eprintln!("celld-sim takes no arguments; configure it through the environment");
        std::process::exit(EXIT_STARTUP);
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("celld-sim: configuration: {e}");
            std::process::exit(EXIT_STARTUP);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.tokio_threads)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("celld-sim: tokio runtime: {e}");
            std::process::exit(EXIT_STARTUP);
        }
    };
    let code = runtime.block_on(node::run(cfg));
    std::process::exit(code);
}
