//! Shared HTTP/2 connections for the namespace watches.
//!
//! kube's client speaks HTTP/1.1 only, so every open watch holds its own TCP and TLS
//! connection: 9 per watched namespace, about 900 at 1,000 fleets in 100 namespaces, each with
//! its own buffers in the operator and in the API server. The API server speaks HTTP/2, where
//! one connection carries many streams (up to the server's `SETTINGS_MAX_CONCURRENT_STREAMS`:
//! kube-apiserver allows 1000 by default, Go's HTTP/2 server 250). The namespace watches
//! therefore go through HTTP/2 clients, each carrying the watches of at most
//! `--watch-namespaces-per-connection` namespaces (10 by default: 90 streams, well below any
//! server's limit, so a watch never queues for a stream). Requests (reads and guarded writes)
//! keep the main client and its layers unchanged.
//!
//! A shard is one client with one connection; a namespace is given the first shard with room,
//! and a shard whose last namespace stopped is dropped (its connection closes with it).
//! HTTP/2 is used only when the cluster URL is `https` without a proxy or a TLS server-name
//! override (the cases kube's own builder handles specially); otherwise, and with
//! `--watch-namespaces-per-connection 0`, the watches use the main client as before.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// Namespaces assigned to shards of at most `per_shard` each; `T` is the shard's client.
#[derive(Debug)]
pub struct Shards<T> {
    per_shard: usize,
    shards: Vec<(T, HashSet<String>)>,
}

impl<T: Clone> Shards<T> {
    /// Shards of `per_shard` (at least 1) namespaces.
    pub fn new(per_shard: usize) -> Self {
        Self {
            per_shard: per_shard.max(1),
            shards: Vec::new(),
        }
    }

    /// The shard of `ns`: its current one, else the first with room, else a new one made by
    /// `make` (an error from `make` leaves the shards unchanged).
    pub fn assign<E>(&mut self, ns: &str, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        if let Some((t, _)) = self.shards.iter().find(|(_, n)| n.contains(ns)) {
            return Ok(t.clone());
        }
        if let Some((t, n)) = self
            .shards
            .iter_mut()
            .find(|(_, n)| n.len() < self.per_shard)
        {
            n.insert(ns.to_string());
            return Ok(t.clone());
        }
        let t = make()?;
        self.shards
            .push((t.clone(), HashSet::from([ns.to_string()])));
        Ok(t)
    }

    /// `ns` no longer watched: a shard left without namespaces is dropped.
    pub fn release(&mut self, ns: &str) {
        for (_, n) in self.shards.iter_mut() {
            n.remove(ns);
        }
        self.shards.retain(|(_, n)| !n.is_empty());
    }

    /// Shards in use (one connection each).
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether no shard is in use.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }
}

type Make = Box<dyn Fn() -> anyhow::Result<Client> + Send + Sync>;

/// The HTTP/2 watch clients of one process.
pub struct WatchClients {
    make: Make,
    shards: Mutex<Shards<Client>>,
}

impl WatchClients {
    /// Watch clients over `config`, `per_connection` namespaces per HTTP/2 connection, each
    /// client finished by `finish` (the operator's transport and request-counting layers).
    /// `None` when the configuration needs kube's own builder (see the module docs) or
    /// `per_connection` is 0.
    pub fn new(
        config: &Config,
        per_connection: usize,
        finish: impl Fn(ClientBuilder<GenericService>) -> Client + Send + Sync + 'static,
    ) -> Option<Self> {
        if per_connection == 0 || !http2_possible(config) {
            return None;
        }
        let config = config.clone();
        Some(Self {
            make: Box::new(move || Ok(finish(http2_builder(&config)?))),
            shards: Mutex::new(Shards::new(per_connection)),
        })
    }

    /// The client that carries `ns`'s watches.
    pub fn client_for(&self, ns: &str) -> anyhow::Result<Client> {
        let mut shards = self
            .shards
            .lock()
            .map_err(|_| anyhow::anyhow!("watch clients lock poisoned"))?;
        let before = shards.len();
        let client = shards.assign(ns, || (self.make)())?;
        if shards.len() > before {
            tracing::info!(
                namespace = ns,
                connections = shards.len(),
                "new HTTP/2 connection for namespace watches"
            );
        }
        Ok(client)
    }

    /// `ns`'s watches stopped.
    pub fn release(&self, ns: &str) {
        if let Ok(mut shards) = self.shards.lock() {
            shards.release(ns);
        }
    }

    /// HTTP/2 connections in use.
    pub fn connections(&self) -> usize {
        self.shards.lock().map(|s| s.len()).unwrap_or(0)
    }
}

/// Whether the watches can use HTTP/2 with this configuration.
pub fn http2_possible(config: &Config) -> bool {
    config.cluster_url.scheme_str() == Some("https")
        && config.proxy_url.is_none()
        && config.tls_server_name.is_none()
}

/// The service stack kube's [`ClientBuilder`] starts from.
pub type GenericService =
    tower::util::BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A client builder over one HTTP/2-only connection to the API server, with kube's base URI,
/// authentication and extra-header (impersonation, user agent) layers.
fn http2_builder(config: &Config) -> anyhow::Result<ClientBuilder<GenericService>> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_only()
        .enable_http2()
        .wrap_connector(http);
    // Pings find a connection that died silently (every watch on it then errors and is
    // restarted by the watcher's backoff); the window adapts so an initial list of a
    // namespace's Pods is not paced by the 64 KiB default.
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(Some(Duration::from_secs(30)))
        .http2_keep_alive_timeout(Duration::from_secs(10))
        .http2_keep_alive_while_idle(true)
        .http2_adaptive_window(true)
        .build::<_, Body>(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper)
        .map_response(|resp: http::Response<hyper::body::Incoming>| {
            resp.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> impl FnMut() -> Result<u32, ()> {
        let mut next = 0;
        move || {
            next += 1;
            Ok(next)
        }
    }

    #[test]
    fn namespaces_fill_a_shard_before_the_next_one_is_made() {
        let mut shards = Shards::new(2);
        let mut make = counter();
        let got: Vec<u32> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|ns| shards.assign(ns, &mut make).unwrap())
            .collect();
        assert_eq!(got, vec![1, 1, 2, 2, 3]);
        assert_eq!(shards.len(), 3);
        // A namespace already assigned keeps its shard.
        assert_eq!(shards.assign("c", &mut make), Ok(2));
        assert_eq!(shards.len(), 3);
    }

    #[test]
    fn a_released_slot_is_reused_and_an_empty_shard_is_dropped() {
        let mut shards = Shards::new(2);
        let mut make = counter();
        for ns in ["a", "b", "c"] {
            shards.assign(ns, &mut make).unwrap();
        }
        shards.release("a");
        assert_eq!(shards.len(), 2);
        assert_eq!(shards.assign("d", &mut make), Ok(1), "a's slot in shard 1");
        shards.release("c");
        assert_eq!(shards.len(), 1, "shard 2 had only c");
        assert_eq!(shards.assign("e", &mut make), Ok(3), "a new shard, not 2");
        shards.release("nobody");
        assert_eq!(shards.len(), 2);
    }

    #[test]
    fn a_failed_make_leaves_the_shards_unchanged() {
        let mut shards: Shards<u32> = Shards::new(1);
        assert_eq!(shards.assign("a", || Err("no tls")), Err("no tls"));
        assert!(shards.is_empty());
        assert_eq!(shards.assign("a", || Ok::<_, ()>(7)), Ok(7));
    }

    #[test]
    fn http2_only_for_direct_https() {
        let https = Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(http2_possible(&https));
        let plain = Config::new("http://127.0.0.1:8080".parse().unwrap());
        assert!(!http2_possible(&plain));
        let mut proxied = https.clone();
        proxied.proxy_url = Some("http://127.0.0.1:3128".parse().unwrap());
        assert!(!http2_possible(&proxied));
        let mut named = https.clone();
        named.tls_server_name = Some("kubernetes".into());
        assert!(!http2_possible(&named));
        assert!(WatchClients::new(&https, 0, |b| b.build()).is_none());
        assert!(WatchClients::new(&plain, 10, |b| b.build()).is_none());
    }
}
