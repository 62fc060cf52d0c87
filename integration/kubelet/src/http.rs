//! A minimal HTTP/1.1 client over one fresh TCP connection (probes and the control client).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

/// An HTTP answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Bytes,
}

/// Sends one request and reads the whole answer, all within `timeout`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, String> {
    let work = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut builder = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::USER_AGENT, "celld-test-kubelet");
        for (k, v) in headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        if body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| format!("building request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{method} {path_and_query} on {addr}: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading answer from {addr}: {e}"))?
            .to_bytes();
        Ok(Answer { status, body })
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(format!("{method} {path_and_query} on {addr}: timed out")))
}
