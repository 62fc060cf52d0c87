//! A TCP fault proxy for the test bed's object store.
//!
//! It listens on one loopback address, forwards every connection to the store, and takes its fault
//! mode from a tiny HTTP control endpoint, so tests can partition members from the store and restore
//! it at run time without touching the store or the members.
//!
//! Modes (see [`Mode`]): `ok` forwards; `latency_ms:<n>` delays every forwarded chunk by n ms;
//! `refuse` resets new connections at once and resets the open ones; `blackhole` accepts new
//! connections and never answers, and stops forwarding on open ones (they resume when the mode goes
//! back to `ok` or `latency_ms`).
//!
//! Control API (HTTP/1.1, one request per connection):
//! - `GET /mode` → `200` with the current mode as text.
//! - `PUT /mode` with the mode as the body (or `POST /mode?set=<mode>`) → `200` with the new mode,
//!   `400` for an unknown mode.
//! - `GET /health` → `200 ok`.

pub mod listening;

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy's fault mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Ok,
    /// Forward, delaying every chunk in both directions by this many milliseconds.
    LatencyMs(u64),
    /// Reset new and existing connections.
    Refuse,
    /// Accept and never answer; stop forwarding on existing connections.
    Blackhole,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "ok" => Ok(Mode::Ok),
            "refuse" => Ok(Mode::Refuse),
            "blackhole" => Ok(Mode::Blackhole),
            _ => match s.strip_prefix("latency_ms:") {
                Some(n) => n
                    .parse::<u64>()
                    .map(Mode::LatencyMs)
                    .map_err(|_| format!("bad latency in {s:?}")),
                None => Err(format!(
                    "unknown mode {s:?}: expected ok | latency_ms:<n> | refuse | blackhole"
                )),
            },
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Ok => f.write_str("ok"),
            Mode::LatencyMs(n) => write!(f, "latency_ms:{n}"),
            Mode::Refuse => f.write_str("refuse"),
            Mode::Blackhole => f.write_str("blackhole"),
        }
    }
}

/// A running proxy: its bound addresses and a handle to change the mode in process.
pub struct Proxy {
    /// Where clients connect (forwarded to the store).
    pub listen_addr: SocketAddr,
    /// The HTTP control endpoint.
    pub control_addr: SocketAddr,
    mode: watch::Sender<Mode>,
    tasks: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Binds both listeners and starts serving. Use port 0 to let the OS choose.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        control: SocketAddr,
    ) -> anyhow::Result<Proxy> {
        let data = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the proxy listener {listen}"))?;
        let ctl = TcpListener::bind(control)
            .await
            .with_context(|| format!("binding the control listener {control}"))?;
        let (tx, rx) = watch::channel(Mode::Ok);
        let listen_addr = data.local_addr()?;
        let control_addr = ctl.local_addr()?;
        let t1 = tokio::spawn(accept_loop(data, upstream, rx));
        let t2 = tokio::spawn(control_loop(ctl, tx.clone()));
        Ok(Proxy {
            listen_addr,
            control_addr,
            mode: tx,
            tasks: vec![t1, t2],
        })
    }

    /// Sets the mode directly (same effect as the control endpoint).
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mode = mode.clone();
        tokio::spawn(async move {
            let _ = serve_connection(client, upstream, mode).await;
        });
    }
}

/// Closes a refused connection at once, without reading from it.
fn reset(stream: TcpStream) {
    drop(stream);
}

async fn serve_connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
) -> std::io::Result<()> {
    let current = *mode.borrow_and_update();
    match current {
        Mode::Refuse => {
            reset(client);
            return Ok(());
        }
        Mode::Blackhole => {
            // Hold the connection without reading until the mode changes.
            loop {
                if mode.changed().await.is_err() {
                    return Ok(());
                }
                match *mode.borrow_and_update() {
                    Mode::Blackhole => continue,
                    Mode::Refuse => {
                        reset(client);
                        return Ok(());
                    }
                    _ => break,
                }
            }
        }
        _ => {}
    }
    let server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        Err(_) => {
            reset(client);
            return Ok(());
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, mode.clone());
    let down = pump(sr, cw, mode.clone());
    // Each direction ends on EOF (passing the half-close on) or on `refuse`; when both have ended,
    // dropping the halves closes both sockets.
    tokio::join!(up, down);
    Ok(())
}

/// Copies one direction, honouring the mode before every chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Wait out a black-hole before reading more.
        loop {
            let m = *mode.borrow_and_update();
            match m {
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::Refuse => return,
                _ => break,
            }
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            _ = mode.changed() => continue,
        };
        let now = *mode.borrow();
        match now {
            Mode::LatencyMs(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Mode::Refuse => return,
            // A chunk read just before a black-hole began is held until it ends.
            Mode::Blackhole => loop {
                if mode.changed().await.is_err() {
                    return;
                }
                match *mode.borrow_and_update() {
                    Mode::Blackhole => continue,
                    Mode::Refuse => return,
                    _ => break,
                }
            },
            Mode::Ok => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn control_loop(listener: TcpListener, mode: watch::Sender<Mode>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mode = mode.clone();
        tokio::spawn(async move {
            let _ = handle_control(stream, mode).await;
        });
    }
}

async fn handle_control(mut stream: TcpStream, mode: watch::Sender<Mode>) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read the head, then the body by Content-Length.
    let (head_end, content_length) = loop {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await??;
        if n == 0 {
            anyhow::bail!("eof before the request head");
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 64 * 1024 {
            anyhow::bail!("request too large");
        }
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..pos]).to_string();
            let len = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (pos + 4, len);
        }
    };
    while buf.len() < head_end + content_length {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await??;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, text) = match (method, path) {
        ("GET", "/health") => (200, "ok".to_string()),
        ("GET", "/mode") => (200, mode.borrow().to_string()),
        ("PUT", "/mode") | ("POST", "/mode") => {
            let wanted = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("set="))
                .map(|v| v.replace("%3A", ":").replace("%3a", ":"))
                .unwrap_or(body);
            match wanted.parse::<Mode>() {
                Ok(m) => {
                    mode.send_replace(m);
                    (200, m.to_string())
                }
                Err(e) => (400, e),
            }
        }
        _ => (404, "not found".to_string()),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        _ => "Not Found",
    };
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_the_same() {
        for text in ["ok", "latency_ms:250", "refuse", "blackhole"] {
            assert_eq!(text.parse::<Mode>().unwrap().to_string(), text);
        }
        assert!("latency_ms:x".parse::<Mode>().is_err());
        assert!("drop".parse::<Mode>().is_err());
    }
}
