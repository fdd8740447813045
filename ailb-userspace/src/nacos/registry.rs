//! Writes: one ephemeral instance registered through the v1 Open API (`/nacos/v1/ns/instance`,
//! `PUT .../instance/beat`) or the v3 client API (`/nacos/v3/client/ns/instance`,
//! `heartBeat=true` for beats). Dynamic metadata is published by registering again with the
//! full string map (Nacos replaces the map), never by the admin update call.

use std::{collections::BTreeMap, net::Ipv4Addr};

use super::{
    error::{NacosError, Op},
    http::{Method, Transport},
    session::{Answer, Api, Call, Session},
    wire,
};

/// The v1 beat answer that means "no such instance": register again.
pub const CODE_NOT_FOUND: i64 = 20404;

/// The instance a write is about: its identity in Nacos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub service: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub cluster: String,
}

/// The registration as it is written: the whole metadata map, weight, enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub metadata: BTreeMap<String, String>,
    pub weight: f64,
    pub enabled: bool,
}

/// What a beat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    Ok,
    /// The server does not know the instance (v1 code 20404, or a v3 answer with a non-zero
    /// code): register again.
    NotFound,
}

impl<T: Transport> Session<T> {
    /// The fields that name the instance, in the query or the form.
    fn identity(&self, ep: &Endpoint) -> Vec<(&'static str, String)> {
        let cfg = self.config();
        let mut p = vec![
            ("serviceName", ep.service.clone()),
            ("groupName", cfg.group.clone()),
            ("ip", ep.ip.to_string()),
            ("port", ep.port.to_string()),
            ("clusterName", ep.cluster.clone()),
            ("ephemeral", "true".to_string()),
        ];
        if !cfg.namespace.is_empty() {
            p.push(("namespaceId", cfg.namespace.clone()));
        }
        p
    }

    /// Registers (or registers again) with the full metadata.
    pub async fn register(&mut self, ep: &Endpoint, reg: &Registration) -> Result<(), NacosError> {
        let mut form = self.identity(ep);
        form.push(("weight", reg.weight.to_string()));
        form.push(("enabled", reg.enabled.to_string()));
        form.push(("healthy", "true".to_string()));
        form.push(("metadata", serde_json::to_string(&reg.metadata).unwrap_or_else(|_| "{}".into())));
        let answer = self
            .call(Op::Register, &ep.service, |api, _| {
                let path = match api {
                    Api::V1 => "v1/ns/instance",
                    Api::V3 => "v3/client/ns/instance",
                };
                Call { method: Method::Post, path, query: Vec::new(), form: form.clone() }
            })
            .await?;
        v3_code_zero(&answer, Op::Register, &ep.service)
    }

    /// One heartbeat for an instance registered with `reg`.
    pub async fn beat(&mut self, ep: &Endpoint, reg: &Registration) -> Result<Beat, NacosError> {
        let group = self.config().group.clone();
        let beat = serde_json::json!({
            "ip": ep.ip.to_string(),
            "port": ep.port,
            "serviceName": format!("{group}@@{}", ep.service),
            "cluster": ep.cluster,
            "metadata": reg.metadata,
            "weight": reg.weight,
            "scheduled": true,
        })
        .to_string();
        let identity = self.identity(ep);
        let answer = self
            .call(Op::Beat, &ep.service, |api, _| {
                let mut query = identity.clone();
                match api {
                    Api::V1 => {
                        query.push(("beat", beat.clone()));
                        Call { method: Method::Put, path: "v1/ns/instance/beat", query, form: Vec::new() }
                    }
                    Api::V3 => {
                        query.push(("heartBeat", "true".to_string()));
                        Call { method: Method::Post, path: "v3/client/ns/instance", query, form: Vec::new() }
                    }
                }
            })
            .await?;
        let code = wire::v3_envelope(&answer.body).map(|f| f.code);
        Ok(match (answer.api, code) {
            (Api::V1, Some(CODE_NOT_FOUND)) => Beat::NotFound,
            (Api::V3, Some(c)) if c != 0 => Beat::NotFound,
            _ => Beat::Ok,
        })
    }

    /// Removes the instance.
    pub async fn deregister(&mut self, ep: &Endpoint) -> Result<(), NacosError> {
        let query = self.identity(ep);
        let answer = self
            .call(Op::Deregister, &ep.service, |api, _| {
                let path = match api {
                    Api::V1 => "v1/ns/instance",
                    Api::V3 => "v3/client/ns/instance",
                };
                Call { method: Method::Delete, path, query: query.clone(), form: Vec::new() }
            })
            .await?;
        v3_code_zero(&answer, Op::Deregister, &ep.service)
    }
}

/// A v3 write succeeded only if its result envelope says code 0 (v1 answers `ok`).
fn v3_code_zero(a: &Answer, op: Op, service: &str) -> Result<(), NacosError> {
    match wire::v3_envelope(&a.body) {
        Some(f) if a.api == Api::V3 && f.code != 0 => Err(NacosError::Api {
            server: a.server.clone(),
            op,
            service: service.to_string(),
            code: f.code,
            message: f.message,
        }),
        _ => Ok(()),
    }
}
