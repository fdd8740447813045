//! Reads: one service's instance list through the v1 Open API
//! (`GET /nacos/v1/ns/instance/list`) or the v3 client API
//! (`GET /nacos/v3/client/ns/instance/list`), written to the Nacos documentation.
//!
//! Every instance is asked for, healthy or not (`healthyOnly=false` explicitly: servers
//! differ in the default). The configured clusters are sent as the documented filter; the
//! caller applies them to the answer too. With a UDP push port set, v1 reads carry `udpPort`
//! and `clientIP` (see [`super::push`]).

use super::{
    error::{NacosError, Op},
    http::{Method, Transport},
    session::{Answer, Api, Call, Session},
    wire::{self, ServiceList},
};

impl<T: Transport> Session<T> {
    /// The instance list of `service` in the configured namespace and group.
    pub(crate) async fn list_instances(&mut self, service: &str) -> Result<ServiceList, NacosError> {
        let cfg = self.config();
        let (group, namespace, clusters) = (cfg.group.clone(), cfg.namespace.clone(), cfg.clusters.join(","));
        let push_port = self.push_port();
        let answer = self
            .call(Op::List, service, |api, client_ip| {
                let mut q = vec![("serviceName", service.to_string()), ("groupName", group.clone())];
                if !namespace.is_empty() {
                    q.push(("namespaceId", namespace.clone()));
                }
                if !clusters.is_empty() {
                    q.push((if api == Api::V1 { "clusters" } else { "clusterName" }, clusters.clone()));
                }
                q.push(("healthyOnly", "false".to_string()));
                if let (Api::V1, Some(port), Some(ip)) = (api, push_port, client_ip) {
                    q.push(("udpPort", port.to_string()));
                    q.push(("clientIP", ip.to_string()));
                }
                let path = match api {
                    Api::V1 => "v1/ns/instance/list",
                    Api::V3 => "v3/client/ns/instance/list",
                };
                Call { method: Method::Get, path, query: q, form: Vec::new() }
            })
            .await?;
        interpret(answer, service)
    }
}

fn interpret(a: Answer, service: &str) -> Result<ServiceList, NacosError> {
    let unusable =
        |source| NacosError::Answer { server: a.server.clone(), op: Op::List, service: service.to_string(), source };
    match a.api {
        Api::V1 => wire::parse_v1_list(&a.body).map_err(unusable),
        Api::V3 => match wire::parse_v3_list(&a.body).map_err(unusable)? {
            Ok(list) => Ok(list),
            Err(f) => Err(NacosError::Api {
                server: a.server.clone(),
                op: Op::List,
                service: service.to_string(),
                code: f.code,
                message: f.message,
            }),
        },
    }
}
