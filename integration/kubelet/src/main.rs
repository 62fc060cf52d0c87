//! `celld-test-kubelet`: flags, logging, run.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
    let args = celld_test_kubelet::config::Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let code = match celld_test_kubelet::run(args).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "test kubelet failed");
            1
        }
    };
    // Exit at once: a blocking stdin read (--exit-on-stdin-eof) must not hold the runtime open.
    std::process::exit(code)
}
