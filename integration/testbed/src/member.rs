//! Talking to one member by Pod IP: the runtime calls of docs/runtime.md on 8081 (`/state`,
//! strict removal), health on 8080, and the simulator's `/sim/info` and `/sim/faults`.
//! Addresses always come from a fresh Pod read (never a Service or a name).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use celld_sim::http::{self, Limits};
use hyper::Method;
use serde_json::{json, Value};

/// `http://<ip>:8080`: the ledger's member URL.
pub fn member_url(ip: IpAddr) -> String {
    format!("http://{ip}:8080")
}

/// One member, addressed by its Pod IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Pod IP.
    pub ip: IpAddr,
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

const CONTROL: Limits = Limits {
    connect: Duration::from_secs(1),
    total: Duration::from_secs(3),
    max_body: (1 << 20) + 1,
};

impl Member {
    /// The member at `ip`.
    pub fn new(ip: IpAddr) -> Self {
        Self { ip }
    }

    /// Parses a Pod IP string.
    pub fn parse(ip: &str) -> Result<Self> {
        Ok(Self::new(
            ip.parse().with_context(|| format!("Pod IP {ip:?}"))?,
        ))
    }

    /// `http://<ip>:8080`.
    pub fn url(&self) -> String {
        member_url(self.ip)
    }

    /// `<ip>:8081`.
    pub fn internal(&self) -> SocketAddr {
        SocketAddr::new(self.ip, 8081)
    }

    /// `<ip>:8080`.
    pub fn public(&self) -> SocketAddr {
        SocketAddr::new(self.ip, 8080)
    }

    async fn call(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer> {
        let (headers, bytes) = match body {
            Some(v) => (
                vec![("content-type", "application/json".to_string())],
                Bytes::from(v.to_string()),
            ),
            None => (Vec::new(), Bytes::new()),
        };
        let r = http::call(
            addr,
            &addr.to_string(),
            method,
            path,
            &headers,
            bytes,
            CONTROL,
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
        Ok(Answer {
            status: r.status,
            body: r.body,
        })
    }

    /// `GET /state` on 8081.
    pub async fn state(&self) -> Result<Answer> {
        self.call(self.internal(), Method::GET, "/state", None)
            .await
    }

    /// `GET /state`, expecting 200 JSON.
    pub async fn state_json(&self) -> Result<Value> {
        let a = self.state().await?;
        if a.status != 200 {
            return Err(anyhow!("GET /state on {} answered {}", self.ip, a.status));
        }
        Ok(a.json())
    }

    /// `shutdown.runtime_generation` from `/state`.
    pub async fn generation(&self) -> Result<String> {
        let s = self.state_json().await?;
        s["shutdown"]["runtime_generation"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no runtime_generation in {s}"))
    }

    /// `POST /shutdown?mode=remove-disk` with `{operation_id, expected_generation}`.
    pub async fn remove_disk(
        &self,
        operation_id: &str,
        expected_generation: &str,
    ) -> Result<Answer> {
        self.call(
            self.internal(),
            Method::POST,
            "/shutdown?mode=remove-disk",
            Some(
                &json!({"operation_id": operation_id, "expected_generation": expected_generation}),
            ),
        )
        .await
    }

    /// `GET /.well-known/celld/health` on 8080: the status, `None` on a transport error.
    pub async fn health(&self) -> Option<u16> {
        self.call(
            self.public(),
            Method::GET,
            "/.well-known/celld/health",
            None,
        )
        .await
        .ok()
        .map(|a| a.status)
    }

    /// The ledger application: `PUT /?cell=<c>&id=<id>` on 8080 (200 `{"id","stored":true}`
    /// only once durable).
    pub async fn put_id(&self, cell: &str, id: &str) -> Result<Answer> {
        self.call(
            self.public(),
            Method::PUT,
            &format!("/?cell={cell}&id={id}"),
            None,
        )
        .await
    }

    /// The ledger application: `GET /?cell=<c>&id=<id>` on 8080 (forwarded to the cell's owner
    /// by its advertised address when this member does not own it).
    pub async fn get_id(&self, cell: &str, id: &str) -> Result<Answer> {
        self.call(
            self.public(),
            Method::GET,
            &format!("/?cell={cell}&id={id}"),
            None,
        )
        .await
    }

    /// The simulator's `GET /sim/info`.
    pub async fn sim_info(&self) -> Result<Value> {
        let a = self
            .call(self.internal(), Method::GET, "/sim/info", None)
            .await?;
        if a.status != 200 {
            return Err(anyhow!(
                "GET /sim/info on {} answered {}",
                self.ip,
                a.status
            ));
        }
        Ok(a.json())
    }

    /// The simulator's `PUT /sim/faults` (a JSON object; omitted switches keep their value).
    pub async fn set_faults(&self, faults: &Value) -> Result<Value> {
        let a = self
            .call(self.internal(), Method::PUT, "/sim/faults", Some(faults))
            .await?;
        if a.status != 200 {
            return Err(anyhow!(
                "PUT /sim/faults {faults} on {} answered {}: {}",
                self.ip,
                a.status,
                String::from_utf8_lossy(&a.body)
            ));
        }
        Ok(a.json())
    }
}
