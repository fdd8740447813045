//! Nacos answers to ailb types, written to the Nacos documentation and defensive about
//! everything else: pure functions of the bytes, no panics, no I/O. A malformed answer is an
//! error; a malformed host in a good answer is dropped with its reason.
//!
//! Defaults for absent host fields are Nacos' own (`weight` 1.0, `healthy` true, `enabled`
//! true, `clusterName` "DEFAULT"); a field of the wrong type drops the host.

use std::{
    collections::BTreeMap,
    io::Read,
    net::{IpAddr, SocketAddr},
};

use serde_json::{Map, Value};

/// One host of an instance list, before the model and service are attached.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Host {
    pub cluster: String,
    pub address: SocketAddr,
    pub weight: f64,
    pub healthy: bool,
    pub enabled: bool,
    pub metadata: BTreeMap<String, String>,
}

/// A service's instance list.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct ServiceList {
    pub hosts: Vec<Host>,
    /// Hosts left out, with why (for a warning and a counter).
    pub dropped: Vec<String>,
    pub reach_protection_threshold: bool,
}

/// A v3 answer with a non-zero `code`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiFailure {
    pub code: i64,
    pub message: String,
}

/// Why an answer (or one host in it) was unusable.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not JSON")]
    NotJson(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("no {field}")]
    Missing { field: &'static str },
    #[error("{field} is {problem}")]
    Field { field: &'static str, problem: &'static str },
    #[error("bad gzip")]
    Gzip(#[source] std::io::Error),
    #[error("decompresses to more than {limit} bytes")]
    TooLarge { limit: u64 },
}

fn field(field: &'static str, problem: &'static str) -> WireError {
    WireError::Field { field, problem }
}

fn missing(field: &'static str) -> WireError {
    WireError::Missing { field }
}

/// The login answer (v1 and v3 share it): `{"accessToken": "...", "tokenTtl": 18000, ...}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Login {
    /// A credential as good as the password while it lives: never printed.
    pub access_token: super::Secret,
    /// Seconds; `None` when absent or not a positive integer.
    pub token_ttl: Option<u64>,
}

fn parse_json(body: &[u8]) -> Result<Value, WireError> {
    serde_json::from_slice(body).map_err(WireError::NotJson)
}

fn object(v: &Value) -> Result<&Map<String, Value>, WireError> {
    v.as_object().ok_or(WireError::NotObject)
}

pub(crate) fn parse_login(body: &[u8]) -> Result<Login, WireError> {
    let v = parse_json(body)?;
    let o = object(&v)?;
    let token = match o.get("accessToken") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 8192 && s.bytes().all(|b| b.is_ascii_graphic()) => s,
        Some(Value::String(_)) => return Err(field("accessToken", "empty, too long or not printable ASCII")),
        Some(_) => return Err(field("accessToken", "not a string")),
        None => return Err(missing("accessToken")),
    };
    let token_ttl = match o.get("tokenTtl") {
        Some(Value::Number(n)) => n.as_u64().filter(|&t| t > 0),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok().filter(|&t| t > 0),
        _ => None,
    };
    Ok(Login { access_token: super::Secret::new(token.clone()), token_ttl })
}

/// The v1 Open API answer: `{"name": .., "hosts": [..], "reachProtectionThreshold": false, ..}`.
pub(crate) fn parse_v1_list(body: &[u8]) -> Result<ServiceList, WireError> {
    let v = parse_json(body)?;
    let o = object(&v)?;
    let hosts = match o.get("hosts") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(field("hosts", "not an array")),
        None => return Err(missing("hosts")),
    };
    let reach_protection_threshold = matches!(o.get("reachProtectionThreshold"), Some(Value::Bool(true)));
    let mut list = parse_hosts(hosts);
    list.reach_protection_threshold = reach_protection_threshold;
    Ok(list)
}

/// The v3 client API answer: `{"code": 0, "message": "success", "data": [instance, ..]}`.
/// `Ok(Err(..))`: a well-formed answer with a non-zero code.
pub(crate) fn parse_v3_list(body: &[u8]) -> Result<Result<ServiceList, ApiFailure>, WireError> {
    let v = parse_json(body)?;
    let o = object(&v)?;
    match v3_code(o) {
        Some(0) => {}
        Some(code) => return Ok(Err(ApiFailure { code, message: v3_message(o) })),
        None => return Err(missing("integer code")),
    }
    match o.get("data") {
        Some(Value::Array(a)) => Ok(Ok(parse_hosts(a))),
        Some(Value::Null) | None => Err(missing("data")),
        Some(_) => Err(field("data", "not an array")),
    }
}

/// A v3 result envelope (any `code`): tells a v3 server's 404 from a server without the v3 API.
pub(crate) fn v3_envelope(body: &[u8]) -> Option<ApiFailure> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    Some(ApiFailure { code: v3_code(o)?, message: v3_message(o) })
}

fn v3_code(o: &Map<String, Value>) -> Option<i64> {
    o.get("code").and_then(Value::as_i64)
}

fn v3_message(o: &Map<String, Value>) -> String {
    match o.get("message") {
        Some(Value::String(s)) => printable(s.as_bytes()),
        _ => String::new(),
    }
}

fn parse_hosts(hosts: &[Value]) -> ServiceList {
    let mut list = ServiceList::default();
    for (i, h) in hosts.iter().enumerate() {
        match parse_host(h) {
            Ok(host) => list.hosts.push(host),
            Err(why) => list.dropped.push(format!("host {i} ({}): {why}", host_label(h))),
        }
    }
    list
}

/// `ip:port` as far as it can be read, for the warning.
fn host_label(h: &Value) -> String {
    let ip = h.get("ip").map_or_else(|| "?".to_string(), |v| printable(v.to_string().as_bytes()));
    let port = h.get("port").map_or_else(|| "?".to_string(), |v| printable(v.to_string().as_bytes()));
    format!("{ip}:{port}")
}

fn parse_host(h: &Value) -> Result<Host, WireError> {
    let o = h.as_object().ok_or(field("host", "not an object"))?;
    let ip = match o.get("ip") {
        Some(Value::String(s)) => s.parse::<IpAddr>().map_err(|_| field("ip", "not an IPv4 or IPv6 address"))?,
        Some(_) => return Err(field("ip", "not a string")),
        None => return Err(missing("ip")),
    };
    // A v4-mapped IPv6 address (`::ffff:a.b.c.d`) is the IPv4 backend it names.
    let ip = ip.to_canonical();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || broadcast || ip.is_multicast() {
        return Err(field("ip", "not a unicast address"));
    }
    let port = match o.get("port") {
        Some(Value::Number(n)) => {
            n.as_u64().filter(|p| (1..=65535).contains(p)).ok_or(field("port", "not 1..=65535"))?
        }
        Some(_) => return Err(field("port", "not a number")),
        None => return Err(missing("port")),
    };
    let weight = match o.get("weight") {
        None | Some(Value::Null) => 1.0,
        Some(Value::Number(n)) => {
            n.as_f64().filter(|w| w.is_finite() && *w >= 0.0).ok_or(field("weight", "not a finite number >= 0"))?
        }
        Some(_) => return Err(field("weight", "not a number")),
    };
    let healthy = opt_bool(o, "healthy", true)?;
    let enabled = opt_bool(o, "enabled", true)?;
    let cluster = match o.get("clusterName") {
        None | Some(Value::Null) => "DEFAULT".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(field("clusterName", "not a string")),
    };
    let metadata = match o.get("metadata") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect(),
        Some(_) => return Err(field("metadata", "not an object")),
    };
    Ok(Host {
        cluster,
        address: SocketAddr::new(ip, u16::try_from(port).unwrap_or(0)),
        weight,
        healthy,
        enabled,
        metadata,
    })
}

fn opt_bool(o: &Map<String, Value>, key: &'static str, default: bool) -> Result<bool, WireError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field(key, "not a boolean")),
    }
}

/// Text for a log line or an error message: lossy UTF-8, control characters escaped, at most
/// 200 characters.
pub(crate) fn printable(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(4 * MAX)]);
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_default).collect();
    if s.chars().count() > MAX || bytes.len() > 4 * MAX {
        out.push_str("...");
    }
    out
}

/// A v1 UDP push packet, after decompression: `{"type": "dom", "data": "<json>",
/// "lastRefTime": 123}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PushPacket {
    pub kind: String,
    /// The pushed service's name (`group@@service` or `service`), when the data names one.
    pub service: Option<String>,
    /// `lastRefTime`, as the server sent it (echoed in the ack).
    pub last_ref_time: Option<String>,
}

/// Largest decompressed push packet.
pub(crate) const MAX_PUSH: u64 = 1024 * 1024;

pub(crate) fn parse_push(datagram: &[u8]) -> Result<PushPacket, WireError> {
    let mut raw = Vec::new();
    let bytes: &[u8] = if datagram.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(datagram).take(MAX_PUSH + 1).read_to_end(&mut raw).map_err(WireError::Gzip)?;
        if raw.len() as u64 > MAX_PUSH {
            return Err(WireError::TooLarge { limit: MAX_PUSH });
        }
        &raw
    } else {
        datagram
    };
    let v = parse_json(bytes)?;
    let o = object(&v)?;
    let kind = match o.get("type") {
        Some(Value::String(s)) => printable(s.as_bytes()),
        _ => return Err(missing("type")),
    };
    let last_ref_time = match o.get("lastRefTime") {
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::String(s)) if s.len() <= 64 => Some(s.clone()),
        _ => None,
    };
    let service = match o.get("data") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .ok()
            .and_then(|d| ["name", "dom"].iter().find_map(|k| d.get(*k).and_then(Value::as_str).map(str::to_string))),
        _ => None,
    };
    Ok(PushPacket { kind, service, last_ref_time })
}

/// The ack the Nacos 1.x client sends for a push: `push-ack` for service data, `dump-ack`
/// (with an empty dump) for `dump`, `unknown-ack` otherwise; `lastRefTime` echoed.
pub(crate) fn push_ack(p: &PushPacket) -> Option<Vec<u8>> {
    let t = p.last_ref_time.as_ref()?;
    let (kind, data) = match p.kind.as_str() {
        "dom" | "service" => ("push-ack", ""),
        "dump" => ("dump-ack", "{}"),
        _ => ("unknown-ack", ""),
    };
    Some(serde_json::json!({ "type": kind, "lastRefTime": t, "data": data }).to_string().into_bytes())
}

#[cfg(test)]
mod tests;
