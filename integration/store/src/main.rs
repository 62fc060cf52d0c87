//! `celld-store-proxy --listen 127.0.0.1:9000 --upstream 127.0.0.1:8014 --control 127.0.0.1:9001`
//!
//! Forwards TCP connections from `--listen` to `--upstream` and serves the control API of
//! [`celld_store_proxy`] on `--control`. Prints `listening <addr> control <addr>` once both are
//! bound, then runs until killed.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use celld_store_proxy::{Mode, Proxy};

fn usage() -> &'static str {
    "usage: celld-store-proxy --listen <ip:port> --upstream <ip:port> --control <ip:port> [--mode <mode>]"
}

fn main() -> anyhow::Result<()> {
    let mut listen = None;
    let mut upstream = None;
    let mut control = None;
    let mut mode = Mode::Ok;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = Some(value()?.parse::<SocketAddr>()?),
            "--upstream" => upstream = Some(value()?.parse::<SocketAddr>()?),
            "--control" => control = Some(value()?.parse::<SocketAddr>()?),
            "--mode" => mode = value()?.parse::<Mode>().map_err(anyhow::Error::msg)?,
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    let (Some(listen), Some(upstream), Some(control)) = (listen, upstream, control) else {
        bail!("{}", usage());
    };
    for addr in [listen, upstream, control] {
        if !addr.ip().is_loopback() {
            bail!("{addr} is not a loopback address: the test bed stays on 127.0.0.0/8");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let proxy = Proxy::start(listen, upstream, control).await?;
        proxy.set_mode(mode);
        println!(
            "listening {} control {}",
            proxy.listen_addr, proxy.control_addr
        );
        std::future::pending::<()>().await;
        Ok(())
    })
}
