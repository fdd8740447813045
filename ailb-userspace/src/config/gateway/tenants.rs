//! `[gateway.scheduler]` and `[[gateway.tenants]]`: who sends a request, how much of the fleet
//! it may take, and in which order waiting requests are served when a model is saturated.
//!
//! ```toml
//! [gateway.scheduler]
//! levels = 3                         # priorities 0 (lowest, shed first) to levels - 1
//! default_priority = 1               # a request that names none
//! priority_header = "x-ailb-priority"
//! tenant_header = "x-ailb-tenant"    # trusted: set it only behind a proxy that overwrites it
//! max_queued = 1024                  # requests waiting per model, every tenant and band
//! max_queued_per_tenant = 256        # requests of one tenant waiting per model
//! max_wait = "5s"                    # longest wait, then 503
//! fair_lag_tokens = 0                # arrival order until a tenant leads its share by this many
//!                                    # tokens per weight, then by weight (0: by weight always)
//! assumed_max_tokens = 256           # output tokens of a request without max_tokens
//!
//! [[gateway.tenants]]
//! name = "search"
//! api_key_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! header_values = ["search"]         # values of scheduler.tenant_header
//! cidrs = ["10.1.0.0/16"]
//! weight = 3                         # share of a saturated band
//! max_priority = 2                   # a higher asked priority is lowered to this
//! tokens_per_second = 20000          # token bucket; default none (unlimited)
//! burst_tokens = 40000               # default: one second of tokens_per_second
//! concurrency_share = 0.5            # of gateway.max_concurrent; default 1.0
//! ```
//!
//! A tenant named `default` (without identifiers) takes every request no other tenant matches;
//! without one, such requests go to an implicit `default` with weight 1, `max_priority` =
//! `default_priority` and no limits. A request is matched by the SHA-256 of its API key
//! (`Authorization: Bearer KEY` or `x-api-key: KEY`) first, then by `tenant_header` when
//! configured, then by the client's address.

use std::collections::BTreeSet;
use std::time::Duration;

use hyper::header::HeaderName;
use ipnet::IpNet;
use serde::Deserialize;

use crate::validate::{parse_duration, ConfigError};

/// The most priority levels accepted.
pub const MAX_LEVELS: u8 = 16;
/// The largest `weight` accepted.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// The name of the tenant of requests no tenant matches.
pub const DEFAULT_TENANT: &str = "default";

/// `[gateway.scheduler]` as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerTable {
    /// Priority levels: 0 (the lowest, whose requests are shed first) to `levels - 1`.
    /// Default 3.
    #[serde(default = "default_levels")]
    pub levels: u8,
    /// The priority of a request that names none. Default 1.
    #[serde(default = "default_priority")]
    pub default_priority: u8,
    /// The header a client names its priority in (a whole number). Default "x-ailb-priority".
    #[serde(default = "default_priority_header")]
    pub priority_header: String,
    /// A header that names the tenant, read only when set here: the operator vouches that a
    /// proxy in front sets it (a client could name any tenant otherwise). Default: none.
    #[serde(default)]
    pub tenant_header: Option<String>,
    /// Requests waiting per model, all tenants and bands together. Default 1024.
    #[serde(default = "default_max_queued")]
    pub max_queued: u32,
    /// Requests of one tenant waiting per model. Default 256.
    #[serde(default = "default_max_queued_per_tenant")]
    pub max_queued_per_tenant: u32,
    /// The longest a request waits for room, then 503. Default "5s".
    #[serde(default = "default_max_wait")]
    pub max_wait: String,
    /// Output tokens counted for a request that does not set `max_tokens` (its cost is the
    /// prompt's estimate plus this). Default 256.
    #[serde(default = "default_assumed_max_tokens")]
    pub assumed_max_tokens: u32,
    /// Inside a band, requests go in arrival order among the tenants whose tokens served per
    /// unit of weight are at most this many ahead of the least served waiting tenant's; a
    /// tenant further ahead waits for the others. So the weights decide the order once a
    /// tenant has taken more than its share by this much, not in every burst. 0: by weight at
    /// every request. Default 0.
    #[serde(default)]
    pub fair_lag_tokens: u64,
}

fn default_levels() -> u8 {
    3
}
fn default_priority() -> u8 {
    1
}
fn default_priority_header() -> String {
    "x-ailb-priority".to_string()
}
fn default_max_queued() -> u32 {
    1024
}
fn default_max_queued_per_tenant() -> u32 {
    256
}
fn default_max_wait() -> String {
    "5s".to_string()
}
fn default_assumed_max_tokens() -> u32 {
    256
}

impl Default for SchedulerTable {
    fn default() -> Self {
        Self {
            levels: default_levels(),
            default_priority: default_priority(),
            priority_header: default_priority_header(),
            tenant_header: None,
            max_queued: default_max_queued(),
            max_queued_per_tenant: default_max_queued_per_tenant(),
            max_wait: default_max_wait(),
            assumed_max_tokens: default_assumed_max_tokens(),
            fair_lag_tokens: 0,
        }
    }
}

/// One `[[gateway.tenants]]` as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTable {
    /// Its name in metrics, the access log and errors: letters, digits, `_`, `-`, `.`.
    pub name: String,
    /// SHA-256 (hex) of its API keys: `printf %s "$KEY" | sha256sum`.
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// Values of `scheduler.tenant_header` that name it.
    #[serde(default)]
    pub header_values: Vec<String>,
    /// Client addresses (CIDR, or one address) it sends from.
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// Its share of a saturated band against the others'. Default 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The highest priority its requests get. Default: `scheduler.default_priority`.
    #[serde(default)]
    pub max_priority: Option<u8>,
    /// Tokens per second it may send (prompt estimate + max_tokens). Default: unlimited.
    #[serde(default)]
    pub tokens_per_second: Option<f64>,
    /// The token bucket's size. Default: one second of `tokens_per_second`.
    #[serde(default)]
    pub burst_tokens: Option<f64>,
    /// The share of `gateway.max_concurrent` its requests may hold at once. Default 1.0.
    #[serde(default = "default_share")]
    pub concurrency_share: f64,
}

fn default_weight() -> u32 {
    1
}
fn default_share() -> f64 {
    1.0
}

/// A tenant, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTenant {
    pub name: String,
    /// SHA-256 digests of its API keys.
    pub api_keys: Vec<[u8; 32]>,
    pub header_values: Vec<String>,
    pub cidrs: Vec<IpNet>,
    pub weight: u32,
    pub max_priority: u8,
    /// Tokens per second and the bucket's size; `None`: unlimited.
    pub rate: Option<(f64, f64)>,
    /// Requests it may hold at once.
    pub max_concurrent: u32,
}

/// `[gateway.scheduler]` and `[[gateway.tenants]]`, checked. The default tenant is last.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTenancy {
    pub levels: u8,
    pub default_priority: u8,
    pub priority_header: HeaderName,
    pub tenant_header: Option<HeaderName>,
    pub max_queued: u32,
    pub max_queued_per_tenant: u32,
    pub max_wait: Duration,
    pub assumed_max_tokens: u32,
    /// See [`SchedulerTable::fair_lag_tokens`].
    pub fair_lag_tokens: u64,
    /// Every tenant; the last is the default tenant.
    pub tenants: Vec<ValidTenant>,
}

fn header(field: &str, value: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::try_from(value).map_err(|_| ConfigError::invalid(field, value, "not a valid HTTP header name"))
}

/// Checks `scheduler` and `tenants` (`None` when neither is configured); `max_concurrent` is
/// `gateway.max_concurrent`.
pub fn validate(
    scheduler: Option<&SchedulerTable>,
    tenants: &[TenantTable],
    max_concurrent: u32,
) -> Result<Option<ValidTenancy>, ConfigError> {
    if scheduler.is_none() && tenants.is_empty() {
        return Ok(None);
    }
    let s = scheduler.cloned().unwrap_or_default();
    check_scheduler(&s)?;
    let priority_header = header("gateway.scheduler.priority_header", &s.priority_header)?;
    let tenant_header = s.tenant_header.as_deref().map(|h| header("gateway.scheduler.tenant_header", h)).transpose()?;
    let max_wait = parse_duration("gateway.scheduler.max_wait", &s.max_wait)?;
    let tenants = checked_tenants(tenants, &s, tenant_header.is_some(), max_concurrent)?;
    Ok(Some(ValidTenancy {
        levels: s.levels,
        default_priority: s.default_priority,
        priority_header,
        tenant_header,
        max_queued: s.max_queued,
        max_queued_per_tenant: s.max_queued_per_tenant,
        max_wait,
        assumed_max_tokens: s.assumed_max_tokens,
        fair_lag_tokens: s.fair_lag_tokens,
        tenants,
    }))
}

/// The scheduler's numbers: levels, the default priority among them, the queues' bounds.
fn check_scheduler(s: &SchedulerTable) -> Result<(), ConfigError> {
    if !(1..=MAX_LEVELS).contains(&s.levels) {
        return Err(ConfigError::invalid("gateway.scheduler.levels", s.levels, format!("must be 1 to {MAX_LEVELS}")));
    }
    if s.default_priority >= s.levels {
        return Err(ConfigError::invalid(
            "gateway.scheduler.default_priority",
            s.default_priority,
            format!("must be below gateway.scheduler.levels ({})", s.levels),
        ));
    }
    if s.max_queued == 0 {
        return Err(ConfigError::invalid("gateway.scheduler.max_queued", 0, "must be above zero"));
    }
    if s.max_queued_per_tenant == 0 || s.max_queued_per_tenant > s.max_queued {
        return Err(ConfigError::invalid(
            "gateway.scheduler.max_queued_per_tenant",
            s.max_queued_per_tenant,
            format!("must be 1 to gateway.scheduler.max_queued ({})", s.max_queued),
        ));
    }
    Ok(())
}

/// Every tenant checked, in their order, names and key hashes unique across them; the default
/// tenant (the configured one, or an implicit one) last.
fn checked_tenants(
    tenants: &[TenantTable],
    s: &SchedulerTable,
    has_header: bool,
    max_concurrent: u32,
) -> Result<Vec<ValidTenant>, ConfigError> {
    let mut names = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut valid = Vec::with_capacity(tenants.len() + 1);
    let mut default = None;
    for (i, t) in tenants.iter().enumerate() {
        let v = tenant(i, t, s, has_header, max_concurrent)?;
        if !names.insert(v.name.clone()) {
            return Err(ConfigError::invalid(
                format!("gateway.tenants[{i}].name"),
                &t.name,
                "a tenant of this name exists",
            ));
        }
        for (k, key) in v.api_keys.iter().enumerate() {
            if !keys.insert(*key) {
                return Err(ConfigError::invalid(
                    format!("gateway.tenants[{i}].api_key_sha256[{k}]"),
                    &t.api_key_sha256[k],
                    "another tenant has this key hash",
                ));
            }
        }
        if v.name == DEFAULT_TENANT {
            default = Some(v);
        } else {
            valid.push(v);
        }
    }
    valid.push(default.unwrap_or_else(|| implicit_default(s, max_concurrent)));
    Ok(valid)
}

/// The default tenant when none is configured: weight 1, the default priority, no limits.
fn implicit_default(s: &SchedulerTable, max_concurrent: u32) -> ValidTenant {
    ValidTenant {
        name: DEFAULT_TENANT.to_string(),
        api_keys: Vec::new(),
        header_values: Vec::new(),
        cidrs: Vec::new(),
        weight: 1,
        max_priority: s.default_priority,
        rate: None,
        max_concurrent,
    }
}

/// `[[gateway.tenants]]` number `i`, checked: its name, its identifiers (which only the
/// default tenant goes without), its weight and priority, its limits.
fn tenant(
    i: usize,
    t: &TenantTable,
    s: &SchedulerTable,
    has_header: bool,
    max_concurrent: u32,
) -> Result<ValidTenant, ConfigError> {
    let field = |f: &str| format!("gateway.tenants[{i}].{f}");
    check_name(&field("name"), &t.name)?;
    let api_keys = api_keys(i, &t.api_key_sha256)?;
    if !t.header_values.is_empty() && !has_header {
        return Err(ConfigError::invalid(
            field("header_values"),
            format!("{:?}", t.header_values),
            "needs gateway.scheduler.tenant_header (the header is read only when the operator names it as trusted)",
        ));
    }
    let cidrs = cidrs(i, &t.cidrs)?;
    let identified = !(api_keys.is_empty() && t.header_values.is_empty() && cidrs.is_empty());
    check_identified(&field("name"), &t.name, identified)?;
    if !(1..=MAX_WEIGHT).contains(&t.weight) {
        return Err(ConfigError::invalid(field("weight"), t.weight, format!("must be 1 to {MAX_WEIGHT}")));
    }
    let max_priority = t.max_priority.unwrap_or(s.default_priority);
    if max_priority >= s.levels {
        return Err(ConfigError::invalid(
            field("max_priority"),
            max_priority,
            format!("must be below gateway.scheduler.levels ({})", s.levels),
        ));
    }
    let rate = rate(i, t.tokens_per_second, t.burst_tokens)?;
    let max_concurrent = concurrency(&field("concurrency_share"), t.concurrency_share, max_concurrent)?;
    Ok(ValidTenant {
        name: t.name.clone(),
        api_keys,
        header_values: t.header_values.clone(),
        cidrs,
        weight: t.weight,
        max_priority,
        rate,
        max_concurrent,
    })
}

/// A tenant's name: what metrics, the access log and errors can carry.
fn check_name(field: &str, name: &str) -> Result<(), ConfigError> {
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !name_ok {
        return Err(ConfigError::invalid(field, name, "expected 1 to 64 letters, digits, '_', '-' or '.'"));
    }
    Ok(())
}

/// Tenant `i`'s `api_key_sha256`, as digests.
fn api_keys(i: usize, hexes: &[String]) -> Result<Vec<[u8; 32]>, ConfigError> {
    hexes
        .iter()
        .enumerate()
        .map(|(k, hex)| {
            // The value is not echoed: it may be a key pasted in clear.
            sha256_hex(hex).ok_or_else(|| {
                ConfigError::invalid(
                    format!("gateway.tenants[{i}].api_key_sha256[{k}]"),
                    format!("<{} characters, not shown>", hex.len()),
                    "expected 64 hex digits (printf %s \"$KEY\" | sha256sum), never the key itself",
                )
            })
        })
        .collect()
}

/// Tenant `i`'s `cidrs`: networks, or single addresses.
fn cidrs(i: usize, texts: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    texts
        .iter()
        .enumerate()
        .map(|(c, text)| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| ConfigError::invalid(format!("gateway.tenants[{i}].cidrs[{c}]"), text, "expected a CIDR"))
        })
        .collect()
}

/// The default tenant has no identifiers (it takes what no other matches); every other has one.
fn check_identified(field: &str, name: &str, identified: bool) -> Result<(), ConfigError> {
    if name == DEFAULT_TENANT && identified {
        return Err(ConfigError::invalid(
            field,
            name,
            "the default tenant takes the requests no other tenant matches, and has no identifiers",
        ));
    }
    if name != DEFAULT_TENANT && !identified {
        return Err(ConfigError::invalid(
            field,
            name,
            "a tenant needs api_key_sha256, header_values or cidrs (or the name \"default\")",
        ));
    }
    Ok(())
}

/// The token bucket: `None` (unlimited) without `tokens_per_second`; the burst defaults to one
/// second of it.
fn rate(
    i: usize,
    tokens_per_second: Option<f64>,
    burst_tokens: Option<f64>,
) -> Result<Option<(f64, f64)>, ConfigError> {
    let field = |f: &str| format!("gateway.tenants[{i}].{f}");
    match (tokens_per_second, burst_tokens) {
        (None, None) => Ok(None),
        (None, Some(b)) => Err(ConfigError::invalid(field("burst_tokens"), b, "needs tokens_per_second")),
        (Some(r), burst) => {
            if !(r.is_finite() && r > 0.0) {
                return Err(ConfigError::invalid(field("tokens_per_second"), r, "must be above zero"));
            }
            let b = burst.unwrap_or(r);
            if !(b.is_finite() && b >= 1.0) {
                return Err(ConfigError::invalid(field("burst_tokens"), b, "must be at least 1"));
            }
            Ok(Some((r, b)))
        }
    }
}

/// The requests a tenant may hold at once: its `concurrency_share` of `max_concurrent`,
/// rounded up, at least 1.
fn concurrency(field: &str, share: f64, max_concurrent: u32) -> Result<u32, ConfigError> {
    if !(share.is_finite() && share > 0.0 && share <= 1.0) {
        return Err(ConfigError::invalid(field, share, "must be above 0 and at most 1"));
    }
    Ok(((f64::from(max_concurrent) * share).ceil() as u32).clamp(1, max_concurrent))
}

/// 64 hex digits as 32 bytes.
fn sha256_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}
