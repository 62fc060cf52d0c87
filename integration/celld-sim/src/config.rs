//! The member environment (docs/runtime.md "The member environment") plus the simulator's own
//! `CELLD_SIM_*` tuning knobs.
//!
//! The simulator takes no arguments: everything comes from the environment the test kubelet
//! resolves from the Pod spec.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Which durability profile the fleet runs (`CELLD_DURABILITY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `bucket`: acknowledged only once the object store holds the write.
    Bucket,
    /// `fleet` (PersistentFleet): local fsync plus one follower's fsync, flushed in the background.
    Fleet,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Bucket => "bucket",
            Durability::Fleet => "fleet",
        }
    }
}

/// Where the S3 endpoint is: `http://host:port` (path-style addressing).
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Host name or IP literal; names go through the hosts file.
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// The `Host` header value.
    pub fn authority(&self) -> String {
        if self.port == 80 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub node: String,
    /// `host:port` where peers reach the internal listener.
    pub advertise: String,
    pub bucket: String,
    /// Key prefix inside the bucket (from `s3://bucket/prefix`), empty or ending in `/`.
    pub key_prefix: String,
    pub region: String,
    pub durability: Durability,
    /// The public listener after replacing `0.0.0.0` with `POD_IP`.
    pub public_addr: SocketAddr,
    /// The internal listener after replacing `0.0.0.0` with `POD_IP`.
    pub internal_addr: SocketAddr,
    pub watch: PathBuf,
    pub ttl: Duration,
    pub shutdown_total: Duration,
    pub tokio_threads: usize,
    pub ready_gate: Duration,
    pub endpoint: Endpoint,
    pub access_key: String,
    pub secret_key: String,
    pub hosts_file: PathBuf,
    pub faults_file: Option<PathBuf>,
    /// `CELLD_SIM_FLUSH_MS`: PersistentFleet background flush period.
    pub flush_interval: Duration,
    /// `CELLD_SIM_RECOVERY_ATTEMPT_MS`: bound of one recovery attempt (4 attempts, then exit 7).
    pub recovery_attempt: Duration,
    /// `CELLD_SIM_STORE_WAIT_MS`: how long startup waits for an unreachable store before exit 7.
    pub store_wait: Duration,
    /// `CELLD_SIM_LOCK_DIR`: where conditional writes take their per-key host lock (see
    /// [`crate::store`]). Default: `$TMPDIR/celld-sim-cas-locks/<hash of endpoint and bucket>`.
    pub lock_dir: PathBuf,
    /// `CELLD_SIM_EXIT_WITH_PID`: exit when this process is gone (test harnesses).
    pub exit_with_pid: Option<u32>,
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("{name}={value:?}: {why}")]
    Invalid {
        name: &'static str,
        value: String,
        why: String,
    },
}

fn invalid(name: &'static str, value: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        value: value.to_string(),
        why: why.into(),
    }
}

/// True for 1–128 characters of `[A-Za-z0-9_.-]`: cell names, ids, operation ids and node names
/// all follow this rule, which also keeps them safe inside S3 keys.
pub fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

impl Config {
    /// Reads the configuration through `get` (normally `std::env::var`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let req = |name: &'static str| {
            get(name)
                .filter(|v| !v.is_empty())
                .ok_or(ConfigError::Missing(name))
        };
        let ms = |name: &'static str, default: u64| -> Result<Duration, ConfigError> {
            match get(name).filter(|v| !v.is_empty()) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| invalid(name, &v, "expected milliseconds")),
            }
        };

        let pod_ip = match get("POD_IP").filter(|v| !v.is_empty()) {
            None => None,
            Some(v) => Some(
                v.parse::<IpAddr>()
                    .map_err(|_| invalid("POD_IP", &v, "expected an IP address"))?,
            ),
        };
        let node = req("CELLD_NODE")?;
        if !is_safe_name(&node) {
            return Err(invalid("CELLD_NODE", &node, "1-128 of [A-Za-z0-9_.-]"));
        }
        let bind = |name: &'static str, default: &str| -> Result<SocketAddr, ConfigError> {
            let v = get(name)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string());
            let addr: SocketAddr = v
                .parse()
                .map_err(|_| invalid(name, &v, "expected ip:port"))?;
            if addr.ip().is_unspecified() {
                // Many members share one host: bind the Pod's own address, same port.
                let ip = pod_ip.ok_or_else(|| {
                    invalid(name, &v, "binds 0.0.0.0, which needs POD_IP to be set")
                })?;
                Ok(SocketAddr::new(ip, addr.port()))
            } else {
                Ok(addr)
            }
        };
        let public_addr = bind("CELLD_ADDR", "0.0.0.0:8080")?;
        let internal_addr = bind("CELLD_INTERNAL_ADDR", "0.0.0.0:8081")?;
        let advertise = get("CELLD_ADVERTISE")
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| internal_addr.to_string());
        if advertise
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .is_none()
        {
            return Err(invalid("CELLD_ADVERTISE", &advertise, "expected host:port"));
        }

        let bucket_url = req("CELLD_BUCKET")?;
        let rest = bucket_url
            .strip_prefix("s3://")
            .ok_or_else(|| invalid("CELLD_BUCKET", &bucket_url, "expected s3://<bucket>"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.len() < 3 {
            return Err(invalid(
                "CELLD_BUCKET",
                &bucket_url,
                "bucket name too short",
            ));
        }
        let key_prefix = match prefix.trim_matches('/') {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let durability = match req("CELLD_DURABILITY")?.as_str() {
            "bucket" => Durability::Bucket,
            "fleet" => Durability::Fleet,
            other => {
                return Err(invalid(
                    "CELLD_DURABILITY",
                    other,
                    "expected bucket or fleet",
                ))
            }
        };

        let endpoint_url = get("S3_ENDPOINT")
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                invalid(
                    "S3_ENDPOINT",
                    "",
                    "the simulator only talks to a local test store; set S3_ENDPOINT",
                )
            })?;
        let allow_http = get("AWS_ALLOW_HTTP")
            .map(|v| v.eq_ignore_ascii_case("true"))
            .unwrap_or(false);
        let endpoint = parse_endpoint(&endpoint_url)?;
        if !allow_http {
            return Err(invalid(
                "AWS_ALLOW_HTTP",
                "",
                "the endpoint is plain http, which needs AWS_ALLOW_HTTP=true",
            ));
        }
        let watch = PathBuf::from(req("CELLD_WATCH")?);
        let tokio_threads =
            match get("CELLD_TOKIO_THREADS").filter(|v| !v.is_empty()) {
                None => 2,
                Some(v) => v.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    invalid("CELLD_TOKIO_THREADS", &v, "expected a positive integer")
                })?,
            };
        let lock_dir = match get("CELLD_SIM_LOCK_DIR").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => {
                use sha2::Digest;
                let scope = format!("{}|{}|{}", endpoint.authority(), bucket, key_prefix);
                let hash = hex::encode(sha2::Sha256::digest(scope.as_bytes()));
                std::env::temp_dir()
                    .join("celld-sim-cas-locks")
                    .join(&hash[..16])
            }
        };
        let ttl = ms("CELLD_TTL_MS", 10_000)?;
        if ttl < Duration::from_millis(300) {
            return Err(invalid(
                "CELLD_TTL_MS",
                &ttl.as_millis().to_string(),
                "at least 300",
            ));
        }
        Ok(Config {
            node,
            advertise,
            bucket: bucket.to_string(),
            key_prefix,
            region: get("AWS_REGION")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "us-east-1".into()),
            durability,
            public_addr,
            internal_addr,
            watch,
            ttl,
            shutdown_total: ms("CELLD_SHUTDOWN_TOTAL_MS", 20_000)?,
            tokio_threads,
            ready_gate: ms("CELLD_READY_FLEET_GATE_MS", 120_000)?,
            endpoint,
            access_key: req("AWS_ACCESS_KEY_ID")?,
            secret_key: req("AWS_SECRET_ACCESS_KEY")?,
            hosts_file: PathBuf::from(
                get("CELLD_SIM_HOSTS_FILE")
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| "/etc/hosts".into()),
            ),
            faults_file: get("CELLD_SIM_FAULTS_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            flush_interval: ms("CELLD_SIM_FLUSH_MS", 1_000)?,
            recovery_attempt: ms("CELLD_SIM_RECOVERY_ATTEMPT_MS", 15 * 60 * 1000)?,
            store_wait: ms("CELLD_SIM_STORE_WAIT_MS", 30_000)?,
            lock_dir,
            exit_with_pid: match get("CELLD_SIM_EXIT_WITH_PID").filter(|v| !v.is_empty()) {
                None => None,
                Some(v) => Some(
                    v.parse()
                        .map_err(|_| invalid("CELLD_SIM_EXIT_WITH_PID", &v, "expected a pid"))?,
                ),
            },
        })
    }

    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }
}

fn parse_endpoint(url: &str) -> Result<Endpoint, ConfigError> {
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if url.starts_with("https://") {
        return Err(invalid(
            "S3_ENDPOINT",
            url,
            "https is not supported by the simulator",
        ));
    } else {
        return Err(invalid("S3_ENDPOINT", url, "expected http://host:port"));
    };
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(invalid("S3_ENDPOINT", url, "no path allowed"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h.to_string(),
            p.parse::<u16>()
                .map_err(|_| invalid("S3_ENDPOINT", url, "bad port"))?,
        ),
        None => (authority.to_string(), 80),
    };
    if host.is_empty() {
        return Err(invalid("S3_ENDPOINT", url, "empty host"));
    }
    Ok(Endpoint { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn base() -> HashMap<&'static str, String> {
        [
            ("POD_IP", "127.0.0.7"),
            ("CELLD_NODE", "beta-0"),
            ("CELLD_ADVERTISE", "beta-0.beta-peers.fleets.svc:8081"),
            ("CELLD_BUCKET", "s3://celld-test"),
            ("CELLD_DURABILITY", "fleet"),
            ("CELLD_ADDR", "0.0.0.0:8080"),
            ("CELLD_INTERNAL_ADDR", "0.0.0.0:8081"),
            ("CELLD_WATCH", "/work"),
            ("S3_ENDPOINT", "http://minio.celld-test-store.svc:9000"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "celld-test"),
            ("AWS_SECRET_ACCESS_KEY", "celld-test-secret"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
    }

    #[test]
    fn unspecified_listeners_bind_the_pod_ip_with_the_same_port() {
        let env = base();
        let cfg = Config::from_lookup(|k| env.get(k).cloned()).unwrap();
        assert_eq!(cfg.public_addr, "127.0.0.7:8080".parse().unwrap());
        assert_eq!(cfg.internal_addr, "127.0.0.7:8081".parse().unwrap());
        assert_eq!(cfg.endpoint.host, "minio.celld-test-store.svc");
        assert_eq!(cfg.endpoint.port, 9000);
        assert_eq!(cfg.ttl, Duration::from_millis(10_000));
    }

    #[test]
    fn unspecified_listener_without_pod_ip_is_rejected() {
        let mut env = base();
        env.remove("POD_IP");
        assert!(Config::from_lookup(|k| env.get(k).cloned()).is_err());
    }

    #[test]
    fn plain_http_endpoint_needs_allow_http() {
        let mut env = base();
        env.remove("AWS_ALLOW_HTTP");
        assert!(Config::from_lookup(|k| env.get(k).cloned()).is_err());
    }

    #[test]
    fn safe_names_follow_the_ledger_rule() {
        assert!(is_safe_name("cell-01_a.b"));
        assert!(!is_safe_name(""));
        assert!(!is_safe_name("a/b"));
        assert!(!is_safe_name(&"x".repeat(129)));
    }
}
