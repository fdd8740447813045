//! The front door's catalog: each model of the config with a VIP, what the pipeline knows of
//! it (its facts, its metric series, how its prompts are keyed), and the routing inputs a
//! request to it would have (what `ailb explain --request` shows).

use std::collections::BTreeMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

use hyper::header::HeaderMap;

use super::http::{ApiError, Headers};
use super::inputs::{self, Endpoint, Inputs, InputsError, ModelFacts, Rules};
use super::metrics::ModelSeries;
use super::request_fields::Fields;
use crate::config::gateway::{ValidGateway, DEFAULT_KV_BLOCK_TOKENS};
use crate::config::ValidConfig;

/// A model of the catalog as the pipeline sends its requests.
#[derive(Clone, Debug)]
pub struct CatalogModel {
    /// The model's first VIP: every request of the model connects there.
    pub vip: SocketAddrV4,
    pub facts: ModelFacts,
    /// Its place in the catalog (by name), which keys its kept upstream connections.
    pub index: u32,
    /// Its metric series, reached without a label lookup per request.
    pub series: Arc<ModelSeries>,
    /// How its requests' prefix keys are made (`[gateway] prefix_keys`); `None`: none sent.
    pub keyer: Option<super::prefix_keys::Keyer>,
}

/// Each model of the catalog with a VIP (where its requests connect).
pub fn catalog(config: &ValidConfig, cfg: &ValidGateway) -> BTreeMap<String, CatalogModel> {
    config
        .models
        .iter()
        .filter_map(|(name, m)| {
            // The front door connects through the model's first IPv4 VIP.
            let vip = m.spec.vips.iter().find_map(|v| match v {
                SocketAddr::V4(a) => Some(*a),
                SocketAddr::V6(_) => None,
            })?;
            let facts = ModelFacts {
                required_memory_mb: m.spec.required_memory_mb,
                kv_bytes_per_token: cfg.kv_bytes_per_token.get(name).copied(),
                kv_block_tokens: cfg.kv_block_tokens.get(name).copied().unwrap_or(DEFAULT_KV_BLOCK_TOKENS),
            };
            Some((name.clone(), vip, facts, m.spec.prefix))
        })
        .enumerate()
        .map(|(i, (name, vip, facts, prefix))| {
            let index = u32::try_from(i).expect("a catalog has fewer than 2^32 models");
            let series = Arc::new(ModelSeries::new(name.clone()));
            let keyer = cfg.prefix_keys.then(|| match cfg.tokenizers.get(&name) {
                Some(t) => super::prefix_keys::Keyer::Tokens {
                    tokenizer: t.tokenizer.clone(),
                    withhold: prefix == crate::policy::PrefixMode::Precise,
                    block: std::num::NonZeroU32::new(facts.kv_block_tokens.clamp(1, u32::MAX as u64) as u32)
                        .unwrap_or(std::num::NonZeroU32::MIN),
                },
                None => super::prefix_keys::Keyer::Text,
            });
            (name, CatalogModel { vip, facts, index, series, keyer })
        })
        .collect()
}

/// What the front door would tag a request's connection with.
#[derive(Debug)]
pub struct Routing {
    pub inputs: Inputs,
    /// Where it connects for it (the model's first VIP).
    pub vip: SocketAddrV4,
    /// The prompt's prefix keys it sends (empty: none, as without `prefix_keys`).
    pub prefix_keys: Vec<u64>,
}

/// The routing inputs and prefix keys the front door would find in a request to `path` with
/// `headers` and `body` (what `ailb explain --request` shows), or the error it would answer.
pub fn routing_inputs(
    config: &ValidConfig,
    cfg: &ValidGateway,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Routing, ApiError> {
    let Some(endpoint) = Endpoint::from_path(path).or_else(|| Endpoint::pass_through(path)) else {
        return Err(ApiError::not_found(format!("POST {path}: no such route")));
    };
    let models = catalog(config, cfg);
    let (inputs, fields) = find_inputs(&models, cfg, endpoint, headers, body)?;
    let model = &models[&inputs.model];
    let prefix_keys = model.keyer.as_ref().map(|k| k.keys(endpoint, &fields, body)).unwrap_or_default();
    Ok(Routing { vip: model.vip, inputs, prefix_keys })
}

/// The routing inputs of a request to `endpoint`, by the catalog `models` and `cfg`'s rules,
/// and the body's fields they were read from.
pub(super) fn find_inputs<'b>(
    models: &BTreeMap<String, CatalogModel>,
    cfg: &ValidGateway,
    endpoint: Endpoint,
    headers: &impl Headers,
    body: &'b [u8],
) -> Result<(Inputs, Fields<'b>), InputsError> {
    let json = inputs::parse_body(body)?;
    let rules =
        Rules { session_header: cfg.session_header.as_ref(), completion_prefix_bytes: cfg.completion_prefix_bytes };
    let inputs = inputs::extract(endpoint, headers, &json, rules, |m| models.get(m).map(|r| r.facts))?;
    Ok((inputs, json))
}
