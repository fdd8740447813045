//! Entry points for the fuzz targets in `tests/fuzz` (cargo feature `fuzzing`, off by default):
//! thin wrappers over the crate-private parsers of outside input, returning plain copies of
//! their results, so that the parsers and their types stay private. Not a stable API.
#![forbid(unsafe_code)]

use std::{collections::BTreeMap, net::SocketAddr};

use crate::{
    nacos::{wire, WireError},
    telemetry::{exposition, model_server::MetricNames, ServerSample},
};

/// One host of a Nacos instance list.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub cluster: String,
    pub address: SocketAddr,
    pub weight: f64,
    pub healthy: bool,
    pub enabled: bool,
    pub metadata: BTreeMap<String, String>,
}

/// A Nacos instance list: the hosts kept and the reasons of those dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct List {
    pub hosts: Vec<Host>,
    pub dropped: Vec<String>,
    pub reach_protection_threshold: bool,
}

impl From<wire::ServiceList> for List {
    fn from(l: wire::ServiceList) -> Self {
        let hosts = l
            .hosts
            .into_iter()
            .map(|h| Host {
                cluster: h.cluster,
                address: h.address,
                weight: h.weight,
                healthy: h.healthy,
                enabled: h.enabled,
                metadata: h.metadata,
            })
            .collect();
        List { hosts, dropped: l.dropped, reach_protection_threshold: l.reach_protection_threshold }
    }
}

/// A v1 Open API instance list (`GET /nacos/v1/ns/instance/list`).
pub fn nacos_v1_list(body: &[u8]) -> Result<List, WireError> {
    wire::parse_v1_list(body).map(List::from)
}

/// A v3 client API instance list; `Ok(Err((code, message)))`: a well-formed failure.
pub fn nacos_v3_list(body: &[u8]) -> Result<Result<List, (i64, String)>, WireError> {
    Ok(wire::parse_v3_list(body)?.map(List::from).map_err(|f| (f.code, f.message)))
}

/// A v3 result envelope of any code: `(code, message)`.
pub fn nacos_v3_envelope(body: &[u8]) -> Option<(i64, String)> {
    wire::v3_envelope(body).map(|f| (f.code, f.message))
}

/// A login answer: `(access token, token TTL in seconds)`.
pub fn nacos_login(body: &[u8]) -> Result<(String, Option<u64>), WireError> {
    wire::parse_login(body).map(|l| (l.access_token.expose().to_string(), l.token_ttl))
}

/// A parsed v1 UDP push packet and the ack the client sends for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    pub kind: String,
    pub service: Option<String>,
    pub last_ref_time: Option<String>,
    pub ack: Option<Vec<u8>>,
}

/// The largest decompressed push packet [`nacos_push`] reads.
pub const MAX_PUSH: u64 = wire::MAX_PUSH;

/// A v1 UDP push datagram (plain or gzip).
pub fn nacos_push(datagram: &[u8]) -> Result<Push, WireError> {
    let p = wire::parse_push(datagram)?;
    let ack = wire::push_ack(&p);
    Ok(Push { kind: p.kind, service: p.service, last_ref_time: p.last_ref_time, ack })
}

/// One Prometheus sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Prometheus exposition text; `Err((line, reason))`: not exposition text.
pub fn exposition(text: &str) -> Result<Vec<Sample>, (usize, String)> {
    let samples = exposition::parse(text).map_err(|e| (e.line, e.reason))?;
    Ok(samples.into_iter().map(|s| Sample { name: s.name, labels: s.labels, value: s.value }).collect())
}

/// A metrics body as the agent reads it: parsed, then the load, KV-cache and GPU values that
/// `names` asks for (health taken as given).
pub fn scrape(text: &str, names: &MetricNames) -> Result<ServerSample, (usize, String)> {
    let samples = exposition::parse(text).map_err(|e| (e.line, e.reason))?;
    Ok(crate::telemetry::model_server::read(&samples, names, true))
}
