//! Who sends a request, at which priority, and whether its tenant may send it now
//! (`[[gateway.tenants]]`, `[gateway.scheduler]`; see [`crate::config::gateway::tenants`]).
//! No I/O and no waiting: the pipeline calls it between the routing inputs and the admission.
//!
//! - **Tenant**, from trusted sources only, first match wins: the SHA-256 of the request's API
//!   key (`Authorization: Bearer KEY`, else `x-api-key: KEY`; the key is hashed and dropped,
//!   never kept or logged), then `scheduler.tenant_header` when the operator configured it,
//!   then the client's address against each tenant's `cidrs`; else the default tenant.
//! - **Priority**: the `scheduler.priority_header` header, else the body's `priority` (both a
//!   whole number, 0 the lowest), else the body's `service_tier` (`"flex"`: 0, `"priority"`:
//!   the highest level, anything else: the default), else `scheduler.default_priority`; then
//!   lowered to the tenant's `max_priority`.
//! - **Token rate**: a token bucket per tenant (`tokens_per_second`, `burst_tokens`), a request
//!   costing its prompt's estimate plus its `max_tokens` ([`super::inputs::token_estimate`]);
//!   a request finding too few tokens gets 429 with the `Retry-After` after which the bucket
//!   holds its cost. A request costing more than the whole bucket is let through when the
//!   bucket is full (and leaves it in debt), so it is slowed, never refused forever.
//! - **Concurrency**: a tenant's requests in flight (those waiting in the scheduler included)
//!   at most `concurrency_share` x `gateway.max_concurrent`; one more gets 429 at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hyper::header::HeaderMap;
use hyper::StatusCode;
use serde_json::Value;

use super::http::{visible_ascii, ApiError, Headers};
use super::inputs::{parse_body, token_estimate, Endpoint};
use super::request_fields::Fields;
use crate::config::gateway::{ValidTenancy, ValidTenant};

/// A tenant, by its place in [`ValidTenancy::tenants`].
pub type TenantId = usize;

/// How a request's tenant was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    ApiKey,
    Header,
    Address,
    Default,
}

/// What `ailb explain --request` shows of a request's tenant.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TenantView {
    pub tenant: String,
    pub matched_by: MatchedBy,
    pub weight: u32,
    pub priority: u8,
    pub asked: Option<u8>,
    pub max_priority: u8,
    /// Its tokens against the tenant's rate (prompt estimate + max_tokens).
    pub cost_tokens: u64,
}

/// The tenant, priority and cost the front door gives a request to `path` with `headers` and
/// `body` from `client` (for `ailb explain --request`).
pub fn explain(
    cfg: &ValidTenancy,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
    client: Option<IpAddr>,
) -> Result<TenantView, ApiError> {
    let endpoint = Endpoint::from_path(path)
        .or_else(|| Endpoint::pass_through(path))
        .ok_or_else(|| ApiError::not_found(format!("POST {path}: no such route")))?;
    let tenancy = Tenancy::new(cfg.clone());
    let fields = parse_body(body)?;
    let (tenant, matched_by) = tenancy.identify_by(headers, || client);
    let (priority, asked) = tenancy.priority(tenant, headers, &fields)?;
    let cost_tokens = token_estimate(endpoint, &fields, u64::from(cfg.assumed_max_tokens))?;
    let t = tenancy.tenant(tenant);
    Ok(TenantView {
        tenant: t.name.clone(),
        matched_by,
        weight: t.weight,
        priority,
        asked,
        max_priority: t.max_priority,
        cost_tokens,
    })
}

/// Whose a request is, and at which priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Who {
    pub tenant: TenantId,
    /// After the tenant's ceiling.
    pub priority: u8,
    /// What the request asked for, before the ceiling (`None`: it named none).
    pub asked: Option<u8>,
    /// Its tokens (prompt estimate + max_tokens).
    pub cost: u64,
}

/// A token bucket: `level` tokens, refilled at `rate` per second up to `burst`.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Self { rate, burst, level: burst, at: now }
    }

    /// Takes `cost` tokens at `now`; when too few are there, the seconds until there are
    /// (whole, at least 1: `Retry-After`). A cost above the bucket's size is taken from a
    /// full bucket (leaving it in debt).
    pub fn take(&mut self, cost: u64, now: Instant) -> Result<(), u32> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * self.rate).min(self.burst);
        self.at = now;
        let cost = cost as f64;
        if self.level >= cost || self.level >= self.burst {
            self.level -= cost;
            return Ok(());
        }
        let missing = cost.min(self.burst) - self.level;
        Err(((missing / self.rate).ceil() as u32).max(1))
    }
}

/// One tenant's running state.
struct TenantState {
    bucket: Option<Mutex<Bucket>>,
    in_flight: Arc<AtomicU32>,
}

/// A request's place among its tenant's requests in flight: given back on drop.
#[derive(Debug)]
pub struct TenantSlot(Arc<AtomicU32>);

impl Drop for TenantSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The tenants and their running state, shared by every worker.
pub struct Tenancy {
    cfg: ValidTenancy,
    by_key: HashMap<[u8; 32], TenantId>,
    by_header: HashMap<String, TenantId>,
    /// Whether a tenant matches client addresses (else the address is never read).
    by_addr: bool,
    states: Vec<TenantState>,
    /// The tenants' names, shared with each request's access log.
    names: Vec<Arc<str>>,
}

impl Tenancy {
    pub fn new(cfg: ValidTenancy) -> Arc<Self> {
        let now = Instant::now();
        let mut by_key = HashMap::new();
        let mut by_header = HashMap::new();
        for (id, t) in cfg.tenants.iter().enumerate() {
            by_key.extend(t.api_keys.iter().map(|k| (*k, id)));
            by_header.extend(t.header_values.iter().map(|v| (v.clone(), id)));
        }
        let by_addr = cfg.tenants.iter().any(|t| !t.cidrs.is_empty());
        let states = cfg
            .tenants
            .iter()
            .map(|t| TenantState {
                bucket: t.rate.map(|(rate, burst)| Mutex::new(Bucket::new(rate, burst, now))),
                in_flight: Arc::default(),
            })
            .collect();
        let names = cfg.tenants.iter().map(|t| Arc::from(t.name.as_str())).collect();
        Arc::new(Self { cfg, by_key, by_header, by_addr, states, names })
    }

    /// A tenant's name.
    pub fn name(&self, id: TenantId) -> Arc<str> {
        self.names[id].clone()
    }

    pub fn config(&self) -> &ValidTenancy {
        &self.cfg
    }

    pub fn tenant(&self, id: TenantId) -> &ValidTenant {
        &self.cfg.tenants[id]
    }

    /// The default tenant's id (the last).
    pub fn default_tenant(&self) -> TenantId {
        self.cfg.tenants.len() - 1
    }

    /// The tenant of a request with `headers` from `client`.
    pub fn identify(&self, headers: &impl Headers, client: impl FnOnce() -> Option<IpAddr>) -> TenantId {
        self.identify_by(headers, client).0
    }

    /// The tenant of a request with `headers` from `client`, and how it was found.
    pub fn identify_by(
        &self,
        headers: &impl Headers,
        client: impl FnOnce() -> Option<IpAddr>,
    ) -> (TenantId, MatchedBy) {
        if let Some(key) = api_key(headers) {
            let digest = ring::digest::digest(&ring::digest::SHA256, key);
            if let Some(id) = <[u8; 32]>::try_from(digest.as_ref()).ok().and_then(|d| self.by_key.get(&d)) {
                return (*id, MatchedBy::ApiKey);
            }
        }
        if let Some(name) = &self.cfg.tenant_header {
            let value = headers.first(name.as_str()).and_then(visible_ascii).map(str::trim);
            if let Some(id) = value.and_then(|v| self.by_header.get(v)) {
                return (*id, MatchedBy::Header);
            }
        }
        if self.by_addr {
            if let Some(ip) = client() {
                let ip = ip.to_canonical();
                if let Some(id) = self.cfg.tenants.iter().position(|t| t.cidrs.iter().any(|c| c.contains(&ip))) {
                    return (id, MatchedBy::Address);
                }
            }
        }
        (self.default_tenant(), MatchedBy::Default)
    }

    /// The priority of a request of `tenant` (see the module's rules), and what it asked.
    pub fn priority(
        &self,
        tenant: TenantId,
        headers: &impl Headers,
        body: &Fields<'_>,
    ) -> Result<(u8, Option<u8>), ApiError> {
        let top = self.cfg.levels - 1;
        let header = self.cfg.priority_header.as_str();
        let asked = if let Some(v) = headers.first(header) {
            let text = visible_ascii(v).map(str::trim).unwrap_or_default();
            Some(level(text.parse::<u64>().ok(), top).ok_or_else(|| bad_priority(header, text))?)
        } else if let Some(v) = body.priority.as_ref().filter(|v| !v.is_null()) {
            Some(level(v.as_u64(), top).ok_or_else(|| bad_priority("priority", &v.to_string()))?)
        } else {
            match body.service_tier.as_ref().and_then(Value::as_str) {
                Some("flex") => Some(0),
                Some("priority") => Some(top),
                _ => None,
            }
        };
        let ceiling = self.cfg.tenants[tenant].max_priority;
        Ok((asked.unwrap_or(self.cfg.default_priority).min(ceiling), asked))
    }

    /// Takes `cost` tokens from `tenant`'s bucket, or the 429 that says when to retry.
    pub fn take_tokens(&self, tenant: TenantId, cost: u64, now: Instant) -> Result<(), ApiError> {
        let Some(bucket) = &self.states[tenant].bucket else { return Ok(()) };
        let taken = bucket.lock().unwrap_or_else(|p| p.into_inner()).take(cost, now);
        taken.map_err(|retry_after| {
            let t = &self.cfg.tenants[tenant];
            let (rate, burst) = t.rate.unwrap_or_default();
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "tenant_rate_limited",
                format!(
                    "tenant `{}` is over its token rate: this request costs {cost} tokens (prompt estimate + \
                     max_tokens), the bucket refills {rate} tokens/s up to {burst} \
                     (gateway.tenants.tokens_per_second, burst_tokens)",
                    t.name
                ),
            );
            e.retry_after = Some(retry_after);
            e
        })
    }

    /// A place among `tenant`'s requests in flight, or 429 when they are at its share.
    pub fn enter(&self, tenant: TenantId, retry_after: u32) -> Result<TenantSlot, ApiError> {
        let t = &self.cfg.tenants[tenant];
        let count = &self.states[tenant].in_flight;
        if count.fetch_add(1, Ordering::AcqRel) >= t.max_concurrent {
            count.fetch_sub(1, Ordering::AcqRel);
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "tenant_concurrency",
                format!(
                    "tenant `{}` has {} requests in flight, its share of gateway.max_concurrent \
                     (gateway.tenants.concurrency_share)",
                    t.name, t.max_concurrent
                ),
            );
            e.retry_after = Some(retry_after);
            return Err(e);
        }
        Ok(TenantSlot(count.clone()))
    }
}

/// A priority level: a whole number, above `top` lowered to it.
fn level(v: Option<u64>, top: u8) -> Option<u8> {
    v.map(|n| n.min(u64::from(top)) as u8)
}

fn bad_priority(field: &str, value: &str) -> ApiError {
    ApiError::invalid_request(
        "invalid_value",
        format!("{field}: invalid priority {value:?}: expected a whole number, 0 the lowest"),
    )
    .param(Some(field))
}

/// The request's API key: `Authorization: Bearer KEY`, else `x-api-key: KEY`.
fn api_key(headers: &impl Headers) -> Option<&[u8]> {
    if let Some(v) = headers.first("authorization") {
        let v = v.trim_ascii();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(v[7..].trim_ascii());
        }
    }
    headers.first("x-api-key").map(<[u8]>::trim_ascii).filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests;
