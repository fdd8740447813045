//! Nacos source: reads every instance (healthy or not) of the catalog's services through the
//! v1 Open API (`/nacos/v1/ns/instance/list`) or the v3 client API
//! (`/nacos/v3/client/ns/instance/list`), written to the Nacos documentation.
//!
//! - **Connect** ([`NacosSource::connect`]) builds the HTTP client and, with credentials, logs
//!   in (v3 `/nacos/v3/auth/user/login`, then v1 `/nacos/v1/auth/login`). A server that refuses
//!   the credentials (401/403) is a start-up error. A server that cannot be reached is *not*:
//!   the daemon starts fail-static, and login is retried on the next read.
//! - **Read** ([`NacosSource::discover`]) reads every service with `healthyOnly=false`
//!   explicitly (servers differ in the default), from the server that answered last, failing
//!   over to the others in configured order. Any service that no server could read makes the
//!   whole read an error, so the caller keeps its last good snapshot. Hosts with an unusable
//!   address or field are dropped (logged when the set changes, counted in
//!   [`NacosSource::dropped_total`]). The configured clusters are sent as the documented
//!   filter *and* applied to the answer, so a server that ignores the filter changes nothing.
//! - **Tokens** are per server, renewed at 80% of `tokenTtl` and after a 401/403.
//! - **Watch**: the caller polls every `poll_interval` and compares snapshots (`PartialEq`);
//!   [`NacosSource::changed`] completes early on a v1 UDP push (see [`push`]).
//! - **Never panics on input**: answers are bounded to [`http::MAX_BODY`] and parsed from
//!   `serde_json::Value` by hand ([`wire`]).

mod config;
mod error;
pub mod http;
mod push;
mod wire;

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use reqwest::Url;

pub use config::{
    Credentials, NacosApi, NacosConfig, Secret, ValidNacos, DEFAULT_GROUP, MAX_TIMEOUT, MIN_POLL_INTERVAL,
};
pub use error::NacosError;
use http::{Method, Request, ReqwestTransport, Response, Transport};

use super::{Instance, ServiceInfo, Snapshot};

/// A token is renewed when this fraction of its `tokenTtl` has passed.
const TOKEN_RENEW_AT: f64 = 0.8;
/// `tokenTtl` assumed when a login answer has none.
const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    V1,
    V3,
}

struct Token {
    value: String,
    renew_at: Instant,
}

struct Server {
    root: Url,
    /// The list API this server speaks (decided on the first answer with `api = "auto"`).
    api: Option<Api>,
    token: Option<Token>,
    /// Sent as `clientIP` for the UDP push.
    client_ip: Option<Ipv4Addr>,
}

/// The Nacos discovery source. `T` is the HTTP seam; the daemon uses the default.
pub struct NacosSource<T: Transport = ReqwestTransport> {
    cfg: ValidNacos,
    transport: T,
    /// `(model, nacos services)`.
    catalog: Vec<(String, Vec<String>)>,
    servers: Vec<Server>,
    /// Index of the server that answered last: tried first.
    preferred: usize,
    push: Option<push::PushReceiver>,
    dropped_total: u64,
    /// Hosts dropped per service at the last read (a warning only when this changes).
    last_dropped: HashMap<String, Vec<String>>,
}

impl NacosSource<ReqwestTransport> {
    /// Builds the client (rustls, `tls_ca_file`), binds the UDP push socket and logs in. Errors:
    /// an unreadable CA file, or a server that refused the credentials. Unreachable servers
    /// are logged and retried by [`Self::discover`].
    pub async fn connect(cfg: &ValidNacos, catalog: &[(String, Vec<String>)]) -> Result<Self, NacosError> {
        let transport = ReqwestTransport::new(cfg.timeout, cfg.tls_ca_file.as_deref())?;
        Self::with_transport(cfg, catalog, transport).await
    }
}

impl<T: Transport> NacosSource<T> {
    /// [`NacosSource::connect`] over any transport.
    pub async fn with_transport(
        cfg: &ValidNacos,
        catalog: &[(String, Vec<String>)],
        transport: T,
    ) -> Result<Self, NacosError> {
        let push = if cfg.udp_push && cfg.api != NacosApi::V3 {
            match push::PushReceiver::bind() {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "nacos: cannot bind the udp push socket; polling only");
                    None
                }
            }
        } else {
            None
        };
        let servers = cfg
            .servers
            .iter()
            .map(|root| Server {
                root: root.clone(),
                api: match cfg.api {
                    NacosApi::Auto => None,
                    NacosApi::V1 => Some(Api::V1),
                    NacosApi::V3 => Some(Api::V3),
                },
                token: None,
                client_ip: None,
            })
            .collect();
        let mut src = Self {
            cfg: cfg.clone(),
            transport,
            catalog: Vec::new(),
            servers,
            preferred: 0,
            push,
            dropped_total: 0,
            last_dropped: HashMap::new(),
        };
        src.set_catalog(catalog);
        if src.cfg.credentials.is_some() {
            src.first_login().await?;
        }
        Ok(src)
    }

    /// Replaces the watched services (a config reload).
    pub fn set_catalog(&mut self, catalog: &[(String, Vec<String>)]) {
        self.catalog = catalog.to_vec();
        if let Some(p) = &mut self.push {
            p.watch(&self.cfg.group, catalog.iter().flat_map(|(_, s)| s.iter().cloned()));
        }
    }

    /// How often the caller should call [`Self::discover`].
    pub fn poll_interval(&self) -> Duration {
        self.cfg.poll_interval
    }

    /// Hosts dropped so far (counted at every read that drops them).
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// The local UDP port offered for pushes, if push is on.
    pub fn push_port(&self) -> Option<u16> {
        self.push.as_ref().map(push::PushReceiver::port)
    }

    /// Push datagrams received and understood so far.
    pub fn pushes_received(&self) -> u64 {
        self.push.as_ref().map_or(0, push::PushReceiver::received)
    }

    /// Completes when a UDP push for a watched service arrives (after acking it); never when
    /// push is off. Cancel-safe: meant for `select!` next to the poll timer.
    pub async fn changed(&mut self) {
        match &mut self.push {
            Some(p) => p.next().await,
            None => std::future::pending().await,
        }
    }

    /// One full read of every catalog service. Instances are sorted (model, service, cluster,
    /// address) so that equal registry states give equal snapshots.
    pub async fn discover(&mut self) -> Result<Snapshot, NacosError> {
        let mut snap = Snapshot::default();
        let catalog = self.catalog.clone();
        for (model, services) in &catalog {
            for service in services {
                let list = self.read_service(service).await?;
                let dropped_before = self.last_dropped.insert(service.clone(), list.dropped.clone());
                if !list.dropped.is_empty() {
                    self.dropped_total += list.dropped.len() as u64;
                    if dropped_before.as_ref() != Some(&list.dropped) {
                        tracing::warn!(model = %model, service = %service, dropped = ?list.dropped, "nacos: hosts dropped");
                    }
                }
                let clusters = &self.cfg.clusters;
                snap.instances.extend(
                    list.hosts.into_iter().filter(|h| clusters.is_empty() || clusters.contains(&h.cluster)).map(|h| {
                        Instance {
                            model: model.clone(),
                            service: service.clone(),
                            group: self.cfg.group.clone(),
                            cluster: h.cluster,
                            address: h.address,
                            weight: h.weight,
                            healthy: h.healthy,
                            enabled: h.enabled,
                            metadata: h.metadata,
                        }
                    }),
                );
                snap.services.push(ServiceInfo {
                    model: model.clone(),
                    service: service.clone(),
                    reach_protection_threshold: list.reach_protection_threshold,
                });
            }
        }
        snap.instances.sort_by(|a, b| {
            (&a.model, &a.service, &a.cluster, a.address).cmp(&(&b.model, &b.service, &b.cluster, b.address))
        });
        Ok(snap)
    }

    async fn first_login(&mut self) -> Result<(), NacosError> {
        for i in 0..self.servers.len() {
            match self.login(i).await {
                Ok(()) => return Ok(()),
                Err(e @ NacosError::LoginRefused { .. }) => return Err(e),
                Err(e) => tracing::warn!(error = %error_chain(&e), "nacos: login failed; trying the next server"),
            }
        }
        tracing::warn!("nacos: no server answered the login; retrying at every read");
        Ok(())
    }

    async fn login(&mut self, i: usize) -> Result<(), NacosError> {
        let Some(creds) = self.cfg.credentials.clone() else { return Ok(()) };
        let server = self.servers[i].root.to_string();
        let paths: &[&'static str] = match self.cfg.api {
            NacosApi::V1 => &["v1/auth/login"],
            NacosApi::V3 => &["v3/auth/user/login"],
            NacosApi::Auto => &["v3/auth/user/login", "v1/auth/login"],
        };
        for (k, path) in paths.iter().enumerate() {
            let req = Request {
                method: Method::Post,
                url: self.url(i, path),
                headers: Vec::new(),
                form: vec![("username", creds.username.clone()), ("password", creds.password.expose().to_string())],
            };
            let resp = self.transport.send(req).await.map_err(|source| NacosError::Transport {
                server: server.clone(),
                path,
                source,
            })?;
            match resp.status {
                404 | 405 | 501 if k + 1 < paths.len() => continue,
                401 | 403 => {
                    return Err(NacosError::LoginRefused {
                        server,
                        username: creds.username,
                        status: resp.status,
                        message: wire::printable(&resp.body),
                    })
                }
                200..=299 => {
                    let login = wire::parse_login(&resp.body)
                        .map_err(|reason| NacosError::LoginAnswer { server: server.clone(), reason })?;
                    let ttl = login.token_ttl.map_or(DEFAULT_TOKEN_TTL, |s| Duration::from_secs(s.min(86_400 * 365)));
                    self.servers[i].token = Some(Token {
                        value: login.access_token,
                        renew_at: Instant::now() + ttl.mul_f64(TOKEN_RENEW_AT),
                    });
                    tracing::debug!(server = %server, ttl_s = ttl.as_secs(), "nacos: logged in");
                    return Ok(());
                }
                status => {
                    return Err(NacosError::LoginAnswer {
                        server,
                        reason: format!("http {status}: {}", wire::printable(&resp.body)),
                    })
                }
            }
        }
        Err(NacosError::LoginAnswer { server, reason: "no login endpoint".into() })
    }

    fn url(&self, i: usize, path: &str) -> Url {
        // The root ends in '/' and the paths are relative: join only appends.
        self.servers[i].root.join(path).unwrap_or_else(|_| self.servers[i].root.clone())
    }

    async fn read_service(&mut self, service: &str) -> Result<wire::ServiceList, NacosError> {
        let n = self.servers.len();
        let mut last = None;
        for k in 0..n {
            let i = (self.preferred + k) % n;
            match self.read_from(i, service).await {
                Ok(list) => {
                    if i != self.preferred {
                        tracing::info!(server = %self.servers[i].root, "nacos: failing over to this server");
                        self.preferred = i;
                    }
                    return Ok(list);
                }
                Err(e) => {
                    tracing::debug!(error = %error_chain(&e), "nacos: read failed");
                    last = Some(e);
                }
            }
        }
        let Some(last) = last else { return Err(NacosError::NoServers) };
        if n == 1 {
            Err(last)
        } else {
            Err(NacosError::AllServersFailed { service: service.to_string(), servers: n, last: Box::new(last) })
        }
    }

    async fn read_from(&mut self, i: usize, service: &str) -> Result<wire::ServiceList, NacosError> {
        let has_creds = self.cfg.credentials.is_some();
        if has_creds && self.servers[i].token.as_ref().is_none_or(|t| t.renew_at <= Instant::now()) {
            self.login(i).await?;
        }
        let mut relogged = false;
        loop {
            let api = self.servers[i].api.unwrap_or(Api::V3);
            let mut resp = self.list(i, api, service).await?;
            let mut api_used = api;
            if self.servers[i].api.is_none() {
                if matches!(resp.status, 404 | 405 | 501) && wire::v3_envelope(&resp.body).is_none() {
                    tracing::info!(server = %self.servers[i].root, status = resp.status, "nacos: no v3 client api; using v1");
                    self.servers[i].api = Some(Api::V1);
                    api_used = Api::V1;
                    resp = self.list(i, Api::V1, service).await?;
                } else if (200..300).contains(&resp.status) {
                    self.servers[i].api = Some(Api::V3);
                }
            }
            if matches!(resp.status, 401 | 403) && has_creds && !relogged {
                relogged = true;
                self.servers[i].token = None;
                self.login(i).await?;
                continue;
            }
            return self.interpret(i, api_used, service, resp);
        }
    }

    async fn list(&mut self, i: usize, api: Api, service: &str) -> Result<Response, NacosError> {
        if api == Api::V1 && self.push.is_some() && self.servers[i].client_ip.is_none() {
            let root = self.servers[i].root.clone();
            self.servers[i].client_ip =
                tokio::time::timeout(self.cfg.timeout, push::local_ip_towards(&root)).await.ok().flatten();
        }
        let path = match api {
            Api::V1 => "v1/ns/instance/list",
            Api::V3 => "v3/client/ns/instance/list",
        };
        let mut url = self.url(i, path);
        let token = self.servers[i].token.as_ref().map(|t| t.value.clone());
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("serviceName", service).append_pair("groupName", &self.cfg.group);
            if !self.cfg.namespace.is_empty() {
                q.append_pair("namespaceId", &self.cfg.namespace);
            }
            if !self.cfg.clusters.is_empty() {
                let key = if api == Api::V1 { "clusters" } else { "clusterName" };
                q.append_pair(key, &self.cfg.clusters.join(","));
            }
            q.append_pair("healthyOnly", "false");
            if api == Api::V1 {
                if let (Some(p), Some(ip)) = (&self.push, self.servers[i].client_ip) {
                    q.append_pair("udpPort", &p.port().to_string()).append_pair("clientIP", &ip.to_string());
                }
                if let Some(t) = &token {
                    q.append_pair("accessToken", t);
                }
            }
        }
        let headers = token.map(|t| vec![("accessToken", t)]).unwrap_or_default();
        let server = self.servers[i].root.to_string();
        self.transport
            .send(Request { method: Method::Get, url, headers, form: Vec::new() })
            .await
            .map_err(|source| NacosError::Transport { server, path, source })
    }

    fn interpret(&self, i: usize, api: Api, service: &str, resp: Response) -> Result<wire::ServiceList, NacosError> {
        let server = self.servers[i].root.to_string();
        let ok = (200..300).contains(&resp.status);
        let answer = |reason| NacosError::Answer { server: server.clone(), service: service.to_string(), reason };
        match api {
            Api::V1 if ok => wire::parse_v1_list(&resp.body).map_err(answer),
            Api::V3 if ok => match wire::parse_v3_list(&resp.body).map_err(answer)? {
                Ok(list) => Ok(list),
                Err(f) => Err(NacosError::Api { server, service: service.into(), code: f.code, message: f.message }),
            },
            Api::V3 if let Some(f) = wire::v3_envelope(&resp.body) => {
                Err(NacosError::Api { server, service: service.into(), code: f.code, message: f.message })
            }
            _ => Err(NacosError::Status {
                server,
                service: service.into(),
                status: resp.status,
                message: wire::printable(&resp.body),
            }),
        }
    }
}

/// `e: cause: cause` on one line, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
