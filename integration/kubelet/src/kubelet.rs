//! Wiring: client, stale-process cleanup, Nodes, Pod dispatcher, provisioner, control endpoint,
//! shutdown.

use std::sync::Arc;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::watch;

use crate::config::Args;
use crate::shared::Shared;

async fn client(args: &Args) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn wait_for_exit_request(exit_on_stdin_eof: bool) -> &'static str {
    use tokio::io::AsyncReadExt;
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let stdin_closed = async {
        if !exit_on_stdin_eof {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = stdin_closed => "stdin closed",
    }
}

/// Runs the kubelet until SIGTERM/SIGINT (or stdin EOF with `--exit-on-stdin-eof`).
pub async fn run(args: Args) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    // Absolute paths: members get them in env and run in other folders.
    let cwd = std::env::current_dir()?;
    let args = Args {
        work_dir: args.work_dir.canonicalize()?,
        image_map: args.image_map.as_ref().map(|p| cwd.join(p)),
        hosts_file: args.hosts_file.as_ref().map(|p| cwd.join(p)),
        kubeconfig: cwd.join(&args.kubeconfig),
        ..args
    };
    let killed = crate::pods::process::kill_recorded_groups(&args.work_dir);
    if killed > 0 {
        tracing::warn!(
            killed,
            "killed process groups left by a previous kubelet on this work dir"
        );
    }
    let client = client(&args).await?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shared =
        Arc::new(Shared::new(client, args.clone(), shutdown_rx).map_err(anyhow::Error::msg)?);
    shared
        .hosts
        .lock()
        .expect("hosts lock")
        .write()
        .with_context(|| format!("writing {}", args.hosts_path().display()))?;

    crate::nodes::register(&shared)
        .await
        .context("registering nodes")?;
    let mut tasks = Vec::new();
    for (node, _) in &shared.nodes {
        tasks.push(tokio::spawn(crate::nodes::heartbeat(
            shared.clone(),
            node.clone(),
        )));
    }
    let (synced_tx, synced_rx) = watch::channel(false);
    let dispatcher = tokio::spawn(crate::pods::run(shared.clone(), synced_tx));
    tasks.push(tokio::spawn(crate::provisioner::run(shared.clone())));
    let (addr, control) = crate::control::serve(shared.clone(), synced_rx)
        .await
        .with_context(|| format!("binding the control endpoint {}", args.control_addr))?;
    tasks.push(control);
    std::fs::write(args.work_dir.join("control-addr"), addr.to_string())?;
    tracing::info!(
        control = %addr,
        work_dir = %args.work_dir.display(),
        hosts_file = %args.hosts_path().display(),
        pod_logs = %args.work_dir.join("pods/<ns>_<name>_<uid>/logs/<container>.log").display(),
        nodes = ?shared.nodes,
        "test kubelet running"
    );

    let why = wait_for_exit_request(args.exit_on_stdin_eof).await;
    tracing::info!(reason = why, "shutting down: stopping every container");
    shutdown_tx.send_replace(true);
    let _ = dispatcher.await;
    let leftovers = crate::pods::process::kill_recorded_groups(&args.work_dir);
    if leftovers > 0 {
        tracing::warn!(
            leftovers,
            "killed process groups that outlived their workers"
        );
    }
    for t in tasks {
        t.abort();
    }
    if !args.keep_nodes_on_exit {
        crate::nodes::deregister(&shared).await;
    }
    tracing::info!("test kubelet stopped");
    Ok(())
}
