//! Registering one instance in Nacos over the gateway's HTTP seam ([`Transport`]): the v1 Open
//! API (`/nacos/v1/ns/instance`, `.../instance/beat`) or the v3 client API
//! (`/nacos/v3/client/ns/instance`, `heartBeat=true` for beats). Dynamic metadata is published
//! by registering again with the full string map (Nacos replaces the map), never by the admin
//! update call. Servers are tried in order, starting with the one that answered last.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use reqwest::Url;

use super::config::ValidInstance;
use crate::discovery::nacos::{
    http::{Method, Request, Transport, TransportError},
    NacosApi, ValidNacos,
};

/// The v1 beat answer that means "no such instance": register again.
pub const CODE_NOT_FOUND: i64 = 20404;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("nacos {server}: {what}")]
    Transport {
        server: String,
        what: &'static str,
        #[source]
        source: TransportError,
    },
    #[error("nacos {server}: {what}: http {status}: {message}")]
    Status { server: String, what: &'static str, status: u16, message: String },
    #[error("nacos {server}: login refused: http {status}")]
    LoginRefused { server: String, status: u16 },
    #[error("nacos {server}: login answer without accessToken")]
    LoginAnswer { server: String },
    #[error("nacos: no server configured")]
    NoServers,
}

/// What a beat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    Ok,
    /// The server does not know the instance (code 20404, or a v3 "not found"): register again.
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    V1,
    V3,
}

struct Server {
    root: Url,
    api: Option<Api>,
    token: Option<(String, Instant)>,
}

/// The registration as it is written: static and dynamic metadata, weight, enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub metadata: BTreeMap<String, String>,
    pub weight: f64,
    pub enabled: bool,
}

/// One request as built per API: method, path under the context root, query, form.
type Built = (Method, &'static str, Vec<(&'static str, String)>, Vec<(&'static str, String)>);

pub struct Registry<T: Transport> {
    cfg: ValidNacos,
    transport: T,
    servers: Vec<Server>,
    preferred: usize,
}

fn printable(b: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(b).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    s.chars().take(200).collect()
}

impl<T: Transport> Registry<T> {
    pub fn new(cfg: &ValidNacos, transport: T) -> Self {
        let api = match cfg.api {
            NacosApi::Auto => None,
            NacosApi::V1 => Some(Api::V1),
            NacosApi::V3 => Some(Api::V3),
        };
        let servers = cfg.servers.iter().map(|root| Server { root: root.clone(), api, token: None }).collect();
        Self { cfg: cfg.clone(), transport, servers, preferred: 0 }
    }

    fn base(&self, inst: &ValidInstance) -> Vec<(&'static str, String)> {
        let mut p = vec![
            ("serviceName", inst.service.clone()),
            ("groupName", self.cfg.group.clone()),
            ("ip", inst.ip.to_string()),
            ("port", inst.port.to_string()),
            ("clusterName", inst.cluster.clone()),
            ("ephemeral", "true".to_string()),
        ];
        if !self.cfg.namespace.is_empty() {
            p.push(("namespaceId", self.cfg.namespace.clone()));
        }
        p
    }

    /// Registers (or registers again) with the full metadata.
    pub async fn register(&mut self, inst: &ValidInstance, reg: &Registration) -> Result<(), RegistryError> {
        let meta = serde_json::to_string(&reg.metadata).unwrap_or_else(|_| "{}".into());
        let mut form = self.base(inst);
        form.push(("weight", reg.weight.to_string()));
        form.push(("enabled", reg.enabled.to_string()));
        form.push(("healthy", "true".to_string()));
        form.push(("metadata", meta));
        self.call("register", |api| match api {
            Api::V1 => (Method::Post, "v1/ns/instance", Vec::new(), form.clone()),
            Api::V3 => (Method::Post, "v3/client/ns/instance", Vec::new(), form.clone()),
        })
        .await
        .map(drop)
    }

    /// One heartbeat.
    pub async fn beat(&mut self, inst: &ValidInstance, reg: &Registration) -> Result<Beat, RegistryError> {
        let beat = serde_json::json!({
            "ip": inst.ip.to_string(),
            "port": inst.port,
            "serviceName": format!("{}@@{}", self.cfg.group, inst.service),
            "cluster": inst.cluster,
            "metadata": reg.metadata,
            "weight": reg.weight,
            "scheduled": true,
        })
        .to_string();
        let base = self.base(inst);
        let (api, body) = self
            .call("beat", |api| match api {
                Api::V1 => {
                    let mut q = base.clone();
                    q.push(("beat", beat.clone()));
                    (Method::Put, "v1/ns/instance/beat", q, Vec::new())
                }
                Api::V3 => {
                    let mut q = base.clone();
                    q.push(("heartBeat", "true".to_string()));
                    (Method::Post, "v3/client/ns/instance", q, Vec::new())
                }
            })
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let code = v.get("code").and_then(serde_json::Value::as_i64);
        Ok(match (api, code) {
            (Api::V1, Some(CODE_NOT_FOUND)) => Beat::NotFound,
            (Api::V3, Some(c)) if c != 0 => Beat::NotFound,
            _ => Beat::Ok,
        })
    }

    /// Removes the instance.
    pub async fn deregister(&mut self, inst: &ValidInstance) -> Result<(), RegistryError> {
        let q = self.base(inst);
        self.call("deregister", |api| match api {
            Api::V1 => (Method::Delete, "v1/ns/instance", q.clone(), Vec::new()),
            Api::V3 => (Method::Delete, "v3/client/ns/instance", q.clone(), Vec::new()),
        })
        .await
        .map(drop)
    }

    /// Sends to the preferred server, failing over in order; answers the API used and the body.
    async fn call<F>(&mut self, what: &'static str, build: F) -> Result<(Api, Vec<u8>), RegistryError>
    where
        F: Fn(Api) -> Built,
    {
        let n = self.servers.len();
        let mut last = None;
        for k in 0..n {
            let i = (self.preferred + k) % n;
            match self.call_one(i, what, &build).await {
                Ok(r) => {
                    self.preferred = i;
                    return Ok(r);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(RegistryError::NoServers))
    }

    async fn call_one<F>(&mut self, i: usize, what: &'static str, build: &F) -> Result<(Api, Vec<u8>), RegistryError>
    where
        F: Fn(Api) -> Built,
    {
        let server = self.servers[i].root.to_string();
        let mut relogged = false;
        loop {
            let token = self.token(i).await?;
            let api = self.servers[i].api.unwrap_or(Api::V3);
            let (method, path, query, form) = build(api);
            let mut url = self.servers[i].root.join(path).unwrap_or_else(|_| self.servers[i].root.clone());
            {
                let mut q = url.query_pairs_mut();
                for (k, v) in &query {
                    q.append_pair(k, v);
                }
                if let Some(t) = &token {
                    q.append_pair("accessToken", t);
                }
            }
            let headers = token.map(|t| vec![("accessToken", t)]).unwrap_or_default();
            let resp = self
                .transport
                .send(Request { method, url, headers, form })
                .await
                .map_err(|source| RegistryError::Transport { server: server.clone(), what, source })?;
            if self.servers[i].api.is_none() {
                if matches!(resp.status, 404 | 405 | 501) {
                    tracing::info!(server = %server, status = resp.status, "nacos: no v3 client api; using v1");
                    self.servers[i].api = Some(Api::V1);
                    continue;
                }
                if (200..300).contains(&resp.status) {
                    self.servers[i].api = Some(Api::V3);
                }
            }
            if matches!(resp.status, 401 | 403) && self.cfg.credentials.is_some() && !relogged {
                relogged = true;
                self.servers[i].token = None;
                continue;
            }
            if !(200..300).contains(&resp.status) {
                return Err(RegistryError::Status {
                    server,
                    what,
                    status: resp.status,
                    message: printable(&resp.body),
                });
            }
            return Ok((api, resp.body));
        }
    }

    /// The server's token (logging in when there is none or it is due for renewal).
    async fn token(&mut self, i: usize) -> Result<Option<String>, RegistryError> {
        let Some(creds) = self.cfg.credentials.clone() else { return Ok(None) };
        if let Some((t, renew_at)) = &self.servers[i].token {
            if *renew_at > Instant::now() {
                return Ok(Some(t.clone()));
            }
        }
        let server = self.servers[i].root.to_string();
        for path in ["v1/auth/login", "v3/auth/user/login"] {
            let url = self.servers[i].root.join(path).unwrap_or_else(|_| self.servers[i].root.clone());
            let form = vec![("username", creds.username.clone()), ("password", creds.password.expose().to_string())];
            let resp = self
                .transport
                .send(Request { method: Method::Post, url, headers: Vec::new(), form })
                .await
                .map_err(|source| RegistryError::Transport { server: server.clone(), what: "login", source })?;
            match resp.status {
                404 | 405 | 501 => continue,
                401 | 403 => return Err(RegistryError::LoginRefused { server, status: resp.status }),
                200..=299 => {
                    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
                    let Some(t) = v.get("accessToken").and_then(|t| t.as_str()).filter(|t| !t.is_empty()) else {
                        return Err(RegistryError::LoginAnswer { server });
                    };
                    let ttl = v.get("tokenTtl").and_then(serde_json::Value::as_u64).unwrap_or(60).clamp(1, 86_400);
                    let renew = Instant::now() + Duration::from_secs(ttl).mul_f64(0.8);
                    self.servers[i].token = Some((t.to_string(), renew));
                    return Ok(Some(t.to_string()));
                }
                status => {
                    return Err(RegistryError::Status { server, what: "login", status, message: printable(&resp.body) })
                }
            }
        }
        Err(RegistryError::LoginAnswer { server })
    }
}
