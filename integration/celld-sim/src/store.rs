//! The S3 client: path-style requests signed with SigV4 to `S3_ENDPOINT`, resolved through the
//! hosts file, with the `store` fault switch applied to every call.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use crate::config::Config;
use crate::faults::{Faults, StoreFault};
use crate::hosts::Hosts;
use crate::http::{self, percent_encode, ClientResponse, Limits};
use crate::sigv4::{self, Credentials};

#[derive(Debug, Error)]
pub enum StoreError {
    /// Transport failure, timeout, 5xx, or the `store=partition` fault: the store may or may not
    /// have applied a write.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A conditional write lost (412), or its verification read saw another writer's object.
    #[error("precondition failed")]
    PreconditionFailed,
    #[error("store answered {status}: {body}")]
    Unexpected { status: u16, body: String },
    #[error("stored object {key} is not valid JSON: {why}")]
    Corrupt { key: String, why: String },
}

/// A write precondition.
#[derive(Clone, Debug)]
pub enum Cond {
    None,
    /// `If-None-Match: *`: create only.
    Absent,
    /// `If-Match: <etag>`: compare-and-swap.
    Matches(String),
}

#[derive(Clone, Debug)]
pub struct Object {
    pub body: Bytes,
    pub etag: String,
}

/// How long a conditional writer waits before its verification read (see [`Store::put_checked`]).
const VERIFY_SETTLE: Duration = Duration::from_millis(60);

/// How long a conditional writer waits for another writer of the same key on this host.
const LOCK_WAIT: Duration = Duration::from_secs(2);

pub struct Store {
    endpoint_host: String,
    endpoint_port: u16,
    authority: String,
    bucket: String,
    prefix: String,
    access_key: String,
    secret_key: String,
    region: String,
    hosts: Arc<Hosts>,
    faults: Arc<Faults>,
    lock_dir: std::path::PathBuf,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Store {
    pub fn new(cfg: &Config, hosts: Arc<Hosts>, faults: Arc<Faults>) -> Store {
        Store {
            endpoint_host: cfg.endpoint.host.clone(),
            endpoint_port: cfg.endpoint.port,
            authority: cfg.endpoint.authority(),
            bucket: cfg.bucket.clone(),
            prefix: cfg.key_prefix.clone(),
            access_key: cfg.access_key.clone(),
            secret_key: cfg.secret_key.clone(),
            region: cfg.region.clone(),
            hosts,
            faults,
            lock_dir: cfg.lock_dir.clone(),
        }
    }

    /// s3s-fs checks a write's precondition and then writes, holding nothing in between, so two
    /// concurrent conditional writes to one key can both succeed (real S3 makes them atomic).
    /// Every member runs on this one machine, so a per-key `flock` held for the duration of the
    /// request makes conditional writes to one key atomic again. Writers of different keys never
    /// wait for each other; a writer waits at most [`LOCK_WAIT`], then reports the store
    /// unavailable.
    async fn cas_lock(&self, key: &str) -> Result<std::fs::File, StoreError> {
        let unavailable = |e: std::io::Error| {
            StoreError::Unavailable(format!(
                "conditional-write lock in {}: {e}",
                self.lock_dir.display()
            ))
        };
        std::fs::create_dir_all(&self.lock_dir).map_err(unavailable)?;
        let name = &sigv4::sha256_hex(format!("{}{key}", self.prefix).as_bytes())[..32];
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.lock_dir.join(format!("{name}.lock")))
            .map_err(unavailable)?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Unavailable(format!(
                            "another writer of {key} holds its conditional-write lock"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(unavailable(e)),
            }
        }
    }

    async fn request(
        &self,
        method: Method,
        key: Option<&str>,
        query: Vec<(String, String)>,
        extra: Vec<(&str, String)>,
        body: Bytes,
    ) -> Result<ClientResponse, StoreError> {
        match self.faults.get().store {
            StoreFault::Partition => {
                return Err(StoreError::Unavailable(
                    "partitioned by the store fault switch".into(),
                ))
            }
            StoreFault::LatencyMs(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            StoreFault::Ok => {}
        }
        let ip = self
            .hosts
            .resolve(&self.endpoint_host)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let addr = std::net::SocketAddr::new(ip, self.endpoint_port);
        let path = match key {
            Some(k) => format!(
                "/{}/{}",
                self.bucket,
                percent_encode(&format!("{}{k}", self.prefix), true)
            ),
            None => format!("/{}", self.bucket),
        };
        let signed = sigv4::sign(
            &Credentials {
                access_key: &self.access_key,
                secret_key: &self.secret_key,
                region: &self.region,
            },
            method.as_str(),
            &path,
            &query,
            &self.authority,
            &body,
            now_secs(),
        );
        let mut target = path;
        if !query.is_empty() {
            target.push('?');
            target.push_str(
                &query
                    .iter()
                    .map(|(k, v)| {
                        format!("{}={}", percent_encode(k, false), percent_encode(v, false))
                    })
                    .collect::<Vec<_>>()
                    .join("&"),
            );
        }
        let mut headers = vec![
            ("x-amz-date", signed.amz_date),
            ("x-amz-content-sha256", signed.content_sha256),
            ("authorization", signed.authorization),
        ];
        headers.extend(extra);
        let limits = Limits {
            connect: Duration::from_secs(1),
            total: Duration::from_secs(5),
            max_body: 64 << 20,
        };
        let resp = http::call(
            addr,
            &self.authority,
            method,
            &target,
            &headers,
            body,
            limits,
        )
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        if resp.status >= 500 {
            return Err(StoreError::Unavailable(format!(
                "store answered {}: {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            )));
        }
        Ok(resp)
    }

    fn unexpected(resp: &ClientResponse) -> StoreError {
        StoreError::Unexpected {
            status: resp.status,
            body: String::from_utf8_lossy(&resp.body)
                .chars()
                .take(300)
                .collect(),
        }
    }

    pub async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let resp = self
            .request(Method::GET, Some(key), vec![], vec![], Bytes::new())
            .await?;
        match resp.status {
            200 => Ok(Some(Object {
                etag: resp.header("etag").unwrap_or_default().to_string(),
                body: resp.body,
            })),
            404 => Ok(None),
            _ => Err(Self::unexpected(&resp)),
        }
    }

    pub async fn get_json<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, String)>, StoreError> {
        match self.get(key).await? {
            None => Ok(None),
            Some(obj) => serde_json::from_slice(&obj.body)
                .map(|v| Some((v, obj.etag)))
                .map_err(|e| StoreError::Corrupt {
                    key: key.to_string(),
                    why: e.to_string(),
                }),
        }
    }

    /// Reads bytes `first..=last`; `None` when the object is absent. Fails unless the store
    /// answers 206 with exactly that range.
    pub async fn get_range(
        &self,
        key: &str,
        first: u64,
        last: u64,
    ) -> Result<Option<Bytes>, StoreError> {
        let resp = self
            .request(
                Method::GET,
                Some(key),
                vec![],
                vec![("range", format!("bytes={first}-{last}"))],
                Bytes::new(),
            )
            .await?;
        match resp.status {
            206 => Ok(Some(resp.body)),
            404 => Ok(None),
            _ => Err(Self::unexpected(&resp)),
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let resp = self
            .request(Method::HEAD, Some(key), vec![], vec![], Bytes::new())
            .await?;
        match resp.status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(Self::unexpected(&resp)),
        }
    }

    /// Writes an object; returns its new ETag.
    pub async fn put(&self, key: &str, body: Bytes, cond: Cond) -> Result<String, StoreError> {
        let extra = match &cond {
            Cond::None => vec![],
            Cond::Absent => vec![("if-none-match", "*".to_string())],
            Cond::Matches(etag) => vec![("if-match", etag.clone())],
        };
        // Held until the answer arrived (dropping the file releases the lock).
        let _lock = match cond {
            Cond::None => None,
            _ => Some(self.cas_lock(key).await?),
        };
        let resp = self
            .request(Method::PUT, Some(key), vec![], extra, body)
            .await?;
        match resp.status {
            200 => Ok(resp.header("etag").unwrap_or_default().to_string()),
            // 409 is S3's ConditionalRequestConflict for concurrent conditional writes.
            412 | 409 => Err(StoreError::PreconditionFailed),
            _ => Err(Self::unexpected(&resp)),
        }
    }

    pub async fn put_json<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        cond: Cond,
    ) -> Result<String, StoreError> {
        let body = serde_json::to_vec(value).expect("serializable record");
        self.put(key, Bytes::from(body), cond).await
    }

    /// A conditional write that also verifies it won: a second guard besides the per-key lock
    /// (which only covers writers on this host that share the lock folder). Every record the
    /// simulator writes conditionally is unique (it carries a generation, an epoch or an expiry),
    /// so after a short settle delay a re-read whose ETag differs from ours proves another writer
    /// overwrote us: that counts as a lost precondition.
    pub async fn put_checked<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        cond: Cond,
    ) -> Result<String, StoreError> {
        let etag = self.put_json(key, value, cond).await?;
        tokio::time::sleep(VERIFY_SETTLE).await;
        match self.get(key).await? {
            Some(obj) if obj.etag == etag => Ok(etag),
            _ => Err(StoreError::PreconditionFailed),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let resp = self
            .request(Method::DELETE, Some(key), vec![], vec![], Bytes::new())
            .await?;
        match resp.status {
            200 | 204 | 404 => Ok(()),
            _ => Err(Self::unexpected(&resp)),
        }
    }

    /// Every key under `prefix` (relative to the configured key prefix), sorted.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let full_prefix = format!("{}{prefix}", self.prefix);
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("list-type".to_string(), "2".to_string()),
                ("prefix".to_string(), full_prefix.clone()),
            ];
            if let Some(t) = &token {
                query.push(("continuation-token".to_string(), t.clone()));
            }
            let resp = self
                .request(Method::GET, None, query, vec![], Bytes::new())
                .await?;
            if resp.status != 200 {
                return Err(Self::unexpected(&resp));
            }
            let xml = String::from_utf8_lossy(&resp.body);
            for key in xml_values(&xml, "Key") {
                if let Some(rel) = key.strip_prefix(&self.prefix) {
                    keys.push(rel.to_string());
                }
            }
            let truncated = xml_values(&xml, "IsTruncated")
                .first()
                .is_some_and(|v| v == "true");
            token = xml_values(&xml, "NextContinuationToken").into_iter().next();
            if !truncated || token.is_none() {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// The text of every `<tag>…</tag>` element, XML-unescaped. Enough for ListObjectsV2 answers.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(
            after[..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[end + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_answers_parse() {
        let xml = "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a/b&amp;c</Key></Contents><Contents><Key>d</Key></Contents><NextContinuationToken>d</NextContinuationToken></ListBucketResult>";
        assert_eq!(xml_values(xml, "Key"), vec!["a/b&c", "d"]);
        assert_eq!(xml_values(xml, "IsTruncated"), vec!["true"]);
        assert_eq!(xml_values(xml, "NextContinuationToken"), vec!["d"]);
    }
}
