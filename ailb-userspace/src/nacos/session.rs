//! [`Session`]: what a Nacos client keeps per configured server list, shared by every read
//! and write: the servers in order, the one that answered last, each server's API (v1 or v3)
//! and its login token.
//!
//! - **Failover**: a call goes to the server that answered last, then to the others in
//!   configured order; the first that answers becomes the preferred one.
//! - **API detection** (`api = "auto"`): v3 first; a server that answers v3 as a *missing API*
//!   ([`api_missing`]) is a v1 server from then on, and one that answers v3 with success is a
//!   v3 server. Decided once per server.
//! - **Login** (with credentials): per server, before the first call, again when 80% of the
//!   token's `tokenTtl` has passed, and once after a call answered 401/403.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use reqwest::Url;
use tracing::{debug, info, warn};

use super::{
    config::{NacosApi, ValidNacos},
    error::{NacosError, Op},
    http::{Method, Request, ReqwestTransport, Response, Transport},
    push, wire,
};

/// A token is renewed when this fraction of its lifetime has passed.
const TOKEN_RENEW_AT: f64 = 0.8;
/// The lifetime assumed when a login answer has no usable `tokenTtl`.
pub(crate) const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60);
/// The longest lifetime believed. Nacos' default is 18000 s; a larger claim (a server's
/// misconfiguration, or garbage) still gets a fresh login once a day, which costs nothing.
pub(crate) const MAX_TOKEN_TTL: Duration = Duration::from_secs(86_400);

/// The API a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// The v1 Open API (`/nacos/v1/ns/...`): Nacos 1.x to 3.1, rnacos.
    V1,
    /// The v3 client API (`/nacos/v3/client/ns/...`): Nacos 3.0 and later.
    V3,
}

struct Token {
    value: super::Secret,
    renew_at: Instant,
}

struct Server {
    root: Url,
    /// `None` until decided (`api = "auto"`).
    api: Option<Api>,
    token: Option<Token>,
    /// The local address the route to this server leaves from, sent as `clientIP` with v1
    /// reads when a UDP push port is set.
    client_ip: Option<Ipv4Addr>,
}

/// One request as built for an API: method, path under the context root, query and form.
pub(crate) struct Call {
    pub(crate) method: Method,
    pub(crate) path: &'static str,
    pub(crate) query: Vec<(&'static str, String)>,
    pub(crate) form: Vec<(&'static str, String)>,
}

/// A success (2xx) answer: which server and API gave it, and the body.
pub(crate) struct Answer {
    pub(crate) server: String,
    pub(crate) api: Api,
    pub(crate) body: Vec<u8>,
}

/// The answer of a server without the requested API: 404, 405 or 501 *without* a Nacos result
/// envelope. A v3 server answers its own "not found" (an unknown service, say) with a
/// `{"code": .., "message": ..}` envelope: that is an answer, and no reason to switch APIs.
pub(crate) fn api_missing(resp: &Response) -> bool {
    matches!(resp.status, 404 | 405 | 501) && wire::v3_envelope(&resp.body).is_none()
}

/// How long a token with this `tokenTtl` (seconds) is used before it is renewed.
pub(crate) fn renew_after(token_ttl_s: Option<u64>) -> Duration {
    token_ttl_s.map_or(DEFAULT_TOKEN_TTL, |s| Duration::from_secs(s).min(MAX_TOKEN_TTL)).mul_f64(TOKEN_RENEW_AT)
}

/// The state of a client of one server list. `T` is the HTTP seam; the binary uses the default.
pub struct Session<T: Transport = ReqwestTransport> {
    cfg: ValidNacos,
    transport: T,
    servers: Vec<Server>,
    /// Index of the server that answered last: tried first.
    preferred: usize,
    /// The local UDP port offered for v1 pushes, sent with v1 reads.
    push_port: Option<u16>,
}

impl Session<ReqwestTransport> {
    /// Builds the HTTP client (rustls, `tls_ca_file`). No request is sent.
    pub fn new(cfg: &ValidNacos) -> Result<Self, NacosError> {
        Ok(Self::with_transport(cfg, ReqwestTransport::new(cfg.timeout, cfg.tls_ca_file.as_deref())?))
    }
}

impl<T: Transport> Session<T> {
    /// A session over any transport. No request is sent.
    pub fn with_transport(cfg: &ValidNacos, transport: T) -> Self {
        let api = match cfg.api {
            NacosApi::Auto => None,
            NacosApi::V1 => Some(Api::V1),
            NacosApi::V3 => Some(Api::V3),
        };
        let servers =
            cfg.servers.iter().map(|root| Server { root: root.clone(), api, token: None, client_ip: None }).collect();
        Self { cfg: cfg.clone(), transport, servers, preferred: 0, push_port: None }
    }

    pub fn config(&self) -> &ValidNacos {
        &self.cfg
    }

    pub(crate) fn set_push_port(&mut self, port: Option<u16>) {
        self.push_port = port;
    }

    pub(crate) fn push_port(&self) -> Option<u16> {
        self.push_port
    }

    /// Logs in to the first server that answers, in configured order (without credentials:
    /// nothing). Refused credentials are an error; servers that cannot be reached are not
    /// (logged; the login is retried before the next call to each server).
    pub async fn login_first(&mut self) -> Result<(), NacosError> {
        if self.cfg.credentials.is_none() {
            return Ok(());
        }
        for i in 0..self.servers.len() {
            match self.login(i).await {
                Ok(()) => return Ok(()),
                Err(e @ NacosError::LoginRefused { .. }) => return Err(e),
                Err(e) => warn!(error = %crate::error_chain(&e), "nacos: login failed; trying the next server"),
            }
        }
        warn!("nacos: no server answered the login; retrying before every call");
        Ok(())
    }

    /// Sends `build(api, client_ip)` to the preferred server, then to the others in order.
    /// With more than one server, the error names them all failing and carries the last one.
    pub(crate) async fn call<B>(&mut self, op: Op, service: &str, build: B) -> Result<Answer, NacosError>
    where
        B: Fn(Api, Option<Ipv4Addr>) -> Call,
    {
        let n = self.servers.len();
        let mut last = None;
        for k in 0..n {
            let i = (self.preferred + k) % n;
            match self.call_at(i, op, service, &build).await {
                Ok(answer) => {
                    if i != self.preferred {
                        info!(server = %self.servers[i].root, "nacos: failing over to this server");
                        self.preferred = i;
                    }
                    return Ok(answer);
                }
                Err(e) => {
                    debug!(error = %crate::error_chain(&e), "nacos: {op} failed");
                    last = Some(e);
                }
            }
        }
        match last {
            None => Err(NacosError::NoServers),
            Some(last) if n == 1 => Err(last),
            Some(last) => {
                Err(NacosError::AllServersFailed { op, service: service.to_string(), servers: n, last: Box::new(last) })
            }
        }
    }

    /// One server: login when due, API detection, one renewed login after 401/403.
    async fn call_at<B>(&mut self, i: usize, op: Op, service: &str, build: &B) -> Result<Answer, NacosError>
    where
        B: Fn(Api, Option<Ipv4Addr>) -> Call,
    {
        let has_creds = self.cfg.credentials.is_some();
        if has_creds && self.servers[i].token.as_ref().is_none_or(|t| t.renew_at <= Instant::now()) {
            self.login(i).await?;
        }
        let mut relogged = false;
        loop {
            let api = self.servers[i].api.unwrap_or(Api::V3);
            if api == Api::V1 && self.push_port.is_some() && self.servers[i].client_ip.is_none() {
                let root = self.servers[i].root.clone();
                self.servers[i].client_ip =
                    tokio::time::timeout(self.cfg.timeout, push::local_ip_towards(&root)).await.ok().flatten();
            }
            let call = build(api, self.servers[i].client_ip);
            let resp = self.send(i, api, call).await?;
            if self.servers[i].api.is_none() {
                if api_missing(&resp) {
                    info!(server = %self.servers[i].root, status = resp.status, "nacos: no v3 client api; using v1");
                    self.servers[i].api = Some(Api::V1);
                    continue;
                }
                if (200..300).contains(&resp.status) {
                    self.servers[i].api = Some(Api::V3);
                }
            }
            if matches!(resp.status, 401 | 403) && has_creds && !relogged {
                relogged = true;
                self.servers[i].token = None;
                self.login(i).await?;
                continue;
            }
            return self.answer(i, op, service, api, resp);
        }
    }

    /// 2xx: the answer. Else an error: a v3 result envelope's code, or the HTTP status.
    fn answer(&self, i: usize, op: Op, service: &str, api: Api, resp: Response) -> Result<Answer, NacosError> {
        let server = self.servers[i].root.to_string();
        if (200..300).contains(&resp.status) {
            return Ok(Answer { server, api, body: resp.body });
        }
        let service = service.to_string();
        match wire::v3_envelope(&resp.body) {
            Some(f) if api == Api::V3 => Err(NacosError::Api { server, op, service, code: f.code, message: f.message }),
            _ => Err(NacosError::Status {
                server,
                op,
                service,
                status: resp.status,
                message: wire::printable(&resp.body),
            }),
        }
    }

    /// The token goes in the `accessToken` header; v1 reads only the query parameter of that
    /// name (Nacos 1.x), so v1 calls carry both. v3 calls keep it out of the URL.
    async fn send(&self, i: usize, api: Api, call: Call) -> Result<Response, NacosError> {
        let mut url = self.url(i, call.path);
        let token = self.servers[i].token.as_ref().map(|t| t.value.expose().to_string());
        let token_in_query = token.as_ref().filter(|_| api == Api::V1);
        if !call.query.is_empty() || token_in_query.is_some() {
            let mut q = url.query_pairs_mut();
            for (k, v) in &call.query {
                q.append_pair(k, v);
            }
            if let Some(t) = token_in_query {
                q.append_pair("accessToken", t);
            }
        }
        let headers = token.map(|t| vec![("accessToken", t)]).unwrap_or_default();
        let path = call.path;
        self.transport
            .send(Request { method: call.method, url, headers, form: call.form })
            .await
            .map_err(|source| NacosError::Transport { server: self.servers[i].root.to_string(), path, source })
    }

    /// Logs in to server `i` with the API it is known to speak; not yet known: v3 first, v1
    /// when v3 is missing ([`api_missing`]). v3 first because it is the API of current Nacos
    /// (3.2 has no v1 HTTP API at all) and the one the reads and writes try first; a v1-only
    /// server costs one extra request per login, and none once its API is known.
    async fn login(&mut self, i: usize) -> Result<(), NacosError> {
        let Some(creds) = self.cfg.credentials.clone() else { return Ok(()) };
        let server = self.servers[i].root.to_string();
        let paths: &[&'static str] = match self.servers[i].api {
            Some(Api::V1) => &["v1/auth/login"],
            Some(Api::V3) => &["v3/auth/user/login"],
            None => &["v3/auth/user/login", "v1/auth/login"],
        };
        for path in paths {
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
                _ if api_missing(&resp) => continue,
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
                        .map_err(|source| NacosError::LoginAnswer { server: server.clone(), source })?;
                    let lifetime = renew_after(login.token_ttl);
                    self.servers[i].token =
                        Some(Token { value: login.access_token, renew_at: Instant::now() + lifetime });
                    debug!(server = %server, renew_in_s = lifetime.as_secs(), "nacos: logged in");
                    return Ok(());
                }
                status => return Err(NacosError::LoginStatus { server, status, message: wire::printable(&resp.body) }),
            }
        }
        Err(NacosError::NoLoginApi { server })
    }

    fn url(&self, i: usize, path: &str) -> Url {
        // The root ends in '/' and the paths are relative: join only appends.
        self.servers[i].root.join(path).unwrap_or_else(|_| self.servers[i].root.clone())
    }

    /// Test hook: makes every token due for renewal.
    #[cfg(test)]
    pub(crate) fn expire_tokens(&mut self) {
        for s in &mut self.servers {
            if let Some(t) = &mut s.token {
                t.renew_at = Instant::now();
            }
        }
    }
}
