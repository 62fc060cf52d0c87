//! The fault proxy's modes, driven through its HTTP control endpoint, in front of a tiny
//! upstream that answers every request line with `pong`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use celld_store_proxy::{Mode, Proxy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(_)) = lines.next_line().await {
                    if w.write_all(b"pong\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn control(proxy: &Proxy, method: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(proxy.control_addr).await.unwrap();
    let req = format!(
        "{method} /mode HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let text = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, text)
}

/// Sends one line on a connection and waits up to `wait` for the answer line.
async fn ping(conn: &mut BufReader<TcpStream>, wait: Duration) -> Result<String, String> {
    conn.get_mut()
        .write_all(b"ping\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    match tokio::time::timeout(wait, conn.read_line(&mut line)).await {
        Err(_) => Err("timeout".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(0)) => Err("closed".into()),
        Ok(Ok(_)) => Ok(line.trim().to_string()),
    }
}

async fn connect(proxy: &Proxy) -> BufReader<TcpStream> {
    BufReader::new(TcpStream::connect(proxy.listen_addr).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_modes_change_at_run_time() {
    let up = upstream().await;
    let proxy = Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        up,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let second = Duration::from_secs(1);

    let mut c = connect(&proxy).await;
    assert_eq!(ping(&mut c, second).await.unwrap(), "pong");
    assert_eq!(control(&proxy, "GET", "").await, (200, "ok".into()));

    // latency: every chunk waits.
    assert_eq!(control(&proxy, "PUT", "latency_ms:300").await.0, 200);
    let t = Instant::now();
    assert_eq!(ping(&mut c, Duration::from_secs(3)).await.unwrap(), "pong");
    assert!(
        t.elapsed() >= Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );

    // blackhole: the open connection and new ones get no answer.
    assert_eq!(control(&proxy, "PUT", "blackhole").await.0, 200);
    assert_eq!(ping(&mut c, second).await.unwrap_err(), "timeout");
    let mut fresh = connect(&proxy).await;
    assert_eq!(ping(&mut fresh, second).await.unwrap_err(), "timeout");

    // back to ok: a new connection works again.
    assert_eq!(control(&proxy, "PUT", "ok").await.0, 200);
    let mut c = connect(&proxy).await;
    assert_eq!(ping(&mut c, second).await.unwrap(), "pong");

    // refuse: the open connection is closed, new ones are closed at once.
    assert_eq!(control(&proxy, "PUT", "refuse").await.0, 200);
    assert!(ping(&mut c, second).await.is_err());
    let mut refused = connect(&proxy).await;
    let err = ping(&mut refused, second).await.unwrap_err();
    assert_ne!(err, "timeout", "refused connections end at once");

    assert_eq!(control(&proxy, "PUT", "nonsense").await.0, 400);
    assert_eq!(proxy.mode(), Mode::Refuse);
    proxy.set_mode(Mode::Ok);
    let mut c = connect(&proxy).await;
    assert_eq!(ping(&mut c, second).await.unwrap(), "pong");
}
