//! Minimal HTTP/1.1 on hyper: a client that opens one connection per request to an address the
//! caller resolved (so the hosts-file rule holds for every dial), and server helpers.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};

pub type Body = Full<Bytes>;

/// Limits of one client call.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub connect: Duration,
    pub total: Duration,
    pub max_body: usize,
}

impl Limits {
    /// Peer and control calls: connect 1 s, whole request 2 s, 16 MiB bodies.
    pub const PEER: Limits = Limits {
        connect: Duration::from_secs(1),
        total: Duration::from_secs(2),
        max_body: 16 << 20,
    };
}

#[derive(Debug)]
pub struct ClientResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl ClientResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("connect to {0} failed: {1}")]
    Connect(SocketAddr, String),
    #[error("request to {0} timed out")]
    Timeout(SocketAddr),
    #[error("request to {0} failed: {1}")]
    Http(SocketAddr, String),
    #[error("answer from {0} larger than {1} bytes")]
    TooLarge(SocketAddr, usize),
}

/// Sends one request on a fresh connection to `addr`, with `authority` as the Host header.
pub async fn call(
    addr: SocketAddr,
    authority: &str,
    method: Method,
    path_and_query: &str,
    headers: &[(&str, String)],
    body: Bytes,
    limits: Limits,
) -> Result<ClientResponse, ClientError> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(HOST, authority);
    for (k, v) in headers {
        builder = builder.header(*k, v.as_str());
    }
    let req = builder
        .body(Full::new(body))
        .map_err(|e| ClientError::Http(addr, e.to_string()))?;
    let work = async {
        let stream = tokio::time::timeout(limits.connect, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Connect(addr, "connect timed out".into()))?
            .map_err(|e| ClientError::Connect(addr, e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http(addr, e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Http(addr, e.to_string()))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, limits.max_body)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ClientError::TooLarge(addr, limits.max_body)
                } else {
                    ClientError::Http(addr, e.to_string())
                }
            })?
            .to_bytes();
        Ok(ClientResponse {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(limits.total, work)
        .await
        .map_err(|_| ClientError::Timeout(addr))?
}

/// Splits `http://host:port/path?query` into (host, port, path_and_query).
pub fn split_http_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().ok()?),
        None => (authority.to_string(), 80),
    };
    Some((host, port, path.to_string()))
}

/// Returned by a handler to drop the connection without an answer (used by the `eof` faults and
/// the peer partition).
#[derive(Debug, Error)]
#[error("connection dropped on purpose")]
pub struct Abort;

pub type HandlerResult = Result<Response<Body>, Abort>;

/// Serves HTTP/1.1 on `listener` until the process ends.
pub async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(handler);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[derive(Debug, Error)]
pub enum BodyError {
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the request body failed: {0}")]
    Io(String),
}

pub async fn read_body(body: Incoming, max: usize) -> Result<Bytes, BodyError> {
    Limited::new(body, max)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                BodyError::TooLarge(max)
            } else {
                BodyError::Io(e.to_string())
            }
        })
}

pub fn json_response(status: u16, value: &serde_json::Value) -> Response<Body> {
    bytes_response(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
    )
}

pub fn bytes_response(status: u16, content_type: &str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, v);
    }
    resp
}

pub fn error_response(status: u16, message: &str) -> Response<Body> {
    json_response(status, &serde_json::json!({ "error": message }))
}

/// Query parameters, percent-decoded, in order.
pub fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Encodes everything but RFC 3986 unreserved characters (and `/` when `keep_slash`).
pub fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_round_trip() {
        assert_eq!(percent_decode("a%3Ab+c%2"), "a:b c%2");
        assert_eq!(percent_encode("a b/c~", true), "a%20b/c~");
        assert_eq!(percent_encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn http_urls_split() {
        assert_eq!(
            split_http_url("http://127.0.0.2:8080/?cell=a"),
            Some(("127.0.0.2".into(), 8080, "/?cell=a".into()))
        );
        assert_eq!(
            split_http_url("http://h"),
            Some(("h".into(), 80, "/".into()))
        );
    }
}
