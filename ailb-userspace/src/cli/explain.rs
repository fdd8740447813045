//! `ailb explain --model M [--conversation ID] [--json]`: why each backend of a model has its
//! weight (from the daemon's `/v1/plan`), and which backend a conversation gets now (the
//! kernel's pick, run over the pinned maps). `ailb explain --request FILE [-H ...]`: first the
//! routing inputs the front door finds in that request (the same code as `ailb gateway`),
//! then the same for its model, conversation and memory need; with tenants configured, the
//! request's tenant (by its API key, a trusted header or `--client-ip`), priority and token
//! cost. Whether it would wait, and why, is the running gateway's state, which this command
//! does not read: the gateway's access log (`queued_ms`) and its error bodies say it.

use std::{
    net::{SocketAddr, SocketAddrV4},
    path::Path,
};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::{
    datapath::explain::{explain_conversation, ConversationExplain},
    gateway::control::plan::{PlanClient, PlanError},
    gateway::inputs::{Inputs, KeySource, MemorySource},
    gateway::tenants::{MatchedBy, TenantView},
    policy::{ModelPlan, PlanView},
};

/// What to explain.
pub enum What {
    Model { model: String, conversation: Option<String>, memory_mb: u32 },
    Request(RequestInputs),
}

/// A request's routing inputs as the front door finds them.
#[derive(Debug, Serialize)]
pub struct RequestInputs {
    pub path: String,
    #[serde(flatten)]
    pub inputs: Inputs,
    /// Where the front door connects for it (the model's first VIP).
    pub vip: SocketAddrV4,
    /// The conversation key's hash, as `ailb hash` prints it.
    pub conversation_hash: Option<String>,
    /// The prompt's prefix keys the front door sends (`[gateway] prefix_keys`), in hex.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "hex_keys")]
    pub prefix_keys: Vec<u64>,
    /// Its tenant and priority (tenants configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantView>,
}

/// The routing inputs of a request with body `body` (a file, or `-` for standard input),
/// `path` and `headers` ("Name: value"), by the catalog and `[gateway]` of `config`.
pub fn request_inputs(
    config: Option<&Path>,
    body: &Path,
    path: &str,
    headers: &[String],
    client_ip: Option<std::net::IpAddr>,
) -> anyhow::Result<RequestInputs> {
    let (valid, gateway) = crate::gateway::load(config)?;
    let bytes = if body == Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("reading the request body from stdin")?;
        b
    } else {
        std::fs::read(body).with_context(|| format!("reading the request body {}", body.display()))?
    };
    let mut map = hyper::HeaderMap::new();
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            bail!("--header {h:?}: expected \"Name: value\"");
        };
        let name = hyper::header::HeaderName::try_from(name.trim())
            .with_context(|| format!("--header {h:?}: invalid header name {:?}", name.trim()))?;
        let value = hyper::header::HeaderValue::try_from(value.trim())
            .with_context(|| format!("--header {h:?}: invalid header value"))?;
        map.append(name, value);
    }
    let would_answer = |e: crate::gateway::http::ApiError| {
        anyhow::anyhow!(
            "the front door would answer {} ({}): {}",
            e.status.as_u16(),
            e.code.unwrap_or(e.kind),
            e.message
        )
    };
    let routing = crate::gateway::routing_inputs(&valid, &gateway, path, &map, &bytes).map_err(would_answer)?;
    let inputs = routing.inputs;
    let tenant = gateway
        .tenancy
        .as_ref()
        .map(|t| crate::gateway::tenants::explain(t, path, &map, &bytes, client_ip))
        .transpose()
        .map_err(would_answer)?;
    let conversation_hash = inputs.conversation.as_ref().map(|c| format!("{:#018x}", c.hash()));
    Ok(RequestInputs {
        path: path.to_string(),
        inputs,
        vip: routing.vip,
        conversation_hash,
        prefix_keys: routing.prefix_keys,
        tenant,
    })
}

fn hex_keys<S: serde::Serializer>(keys: &[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(keys.iter().map(|k| format!("{k:#018x}")))
}

fn print_request(r: &RequestInputs) {
    let i = &r.inputs;
    println!("request POST {} -> model {} (VIP {})", r.path, i.model, r.vip);
    match (i.memory_mb, i.memory_source) {
        (Some(mb), Some(src)) => {
            let from = match src {
                MemorySource::Header => "X-Required-Memory",
                MemorySource::HeaderMb => "X-Required-Memory-MB",
                MemorySource::Model => "the model's required_memory_mb",
                MemorySource::Estimate => "the estimate from the prompt, max_tokens and kv_bytes_per_token",
            };
            println!("  memory       {mb} MB (from {from})");
        }
        _ => println!("  memory       none (any backend fits)"),
    }
    match (&i.conversation, &r.conversation_hash) {
        (Some(c), Some(h)) => {
            let from = match c.source {
                KeySource::SessionHeader => "X-Session-ID",
                KeySource::PromptCacheKey => "the body's prompt_cache_key",
                KeySource::Cookie => "the llm-d-session cookie",
                KeySource::ConfiguredHeader => "gateway.session_header",
                KeySource::Derived => {
                    "derived from the request (model, system prompt, first user message or prompt prefix)"
                }
                KeySource::PreviousResponse => "the stored response named by previous_response_id",
            };
            println!("  conversation {:?} (hash {h}, from {from})", c.key);
        }
        _ => println!("  conversation none: a fresh weighted pick for every request"),
    }
    if r.prefix_keys.is_empty() {
        println!("  prefix keys  none (the model sends none: [gateway] prefix_keys, or not a chat or completion)");
    } else {
        println!("  prefix keys  {} sent (every k-th block's and the last)", r.prefix_keys.len());
    }
    if let Some(t) = &r.tenant {
        let by = match t.matched_by {
            MatchedBy::ApiKey => "its API key's SHA-256",
            MatchedBy::Header => "gateway.scheduler.tenant_header",
            MatchedBy::Address => "the client address (--client-ip)",
            MatchedBy::Default => "no tenant matched",
        };
        let asked = t.asked.map_or("none".to_string(), |a| a.to_string());
        println!("  tenant       {} (by {by}), weight {}", t.tenant, t.weight);
        println!(
            "  priority     {} (asked {asked}, the tenant's ceiling {}); costs {} tokens of its rate",
            t.priority, t.max_priority, t.cost_tokens
        );
        println!(
            "               when the model is saturated it waits in band {} (whether it would wait now is the \
             running gateway's state: its access log's queued_ms and its metrics)",
            t.priority
        );
    }
    if let Some(id) = &i.previous_response_id {
        println!(
            "  pinned       previous_response_id {id:?}: the running gateway sends it to the backend that stored \
             that response (its table, which this command cannot read), with no kernel pick"
        );
    }
    println!();
}

/// What `ailb explain --json` prints.
#[derive(Debug, Serialize)]
struct ExplainOutput<'a> {
    /// The request's routing inputs (`--request` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'a RequestInputs>,
    model: &'a str,
    /// The model's plan from `/v1/plan`; `null` without the daemon's endpoint.
    plan: Option<ModelPlan>,
    /// The kernel's pick for `--conversation`.
    conversation: Option<ConversationExplain>,
}

/// How long `ailb explain` waits for the daemon's plan: a plan of 16,000 backends took over the
/// front door's 500 ms on a busy machine (the `scale` test), and an operator can wait.
const EXPLAIN_PLAN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The daemon's plan (`None` before its first), read as the front door reads it.
async fn fetch_plan(listen: SocketAddr) -> anyhow::Result<Option<PlanView>> {
    match PlanClient::with_timeout(listen, EXPLAIN_PLAN_TIMEOUT).fetch().await {
        Err(PlanError::Request { url, source }) => {
            Err(anyhow::Error::new(source).context(format!("GET {url} (is `ailb run` started with daemon.listen?)")))
        }
        plan => Ok(plan?),
    }
}

/// `model`'s plan in the daemon's view, or an error naming the models it has.
fn model_plan(view: Option<PlanView>, model: &str) -> anyhow::Result<ModelPlan> {
    let mut models = view.map(|v| v.models).unwrap_or_default();
    match models.remove(model) {
        Some(m) => Ok(m),
        None => {
            let known: Vec<&String> = models.keys().collect();
            bail!("model {model:?} is not in the daemon's plan (models: {known:?})")
        }
    }
}

pub fn explain(listen: Option<SocketAddr>, bpffs: &Path, what: What, json: bool) -> anyhow::Result<()> {
    let (request, model, conversation, memory_mb) = match what {
        What::Model { model, conversation, memory_mb } => (None, model, conversation, memory_mb),
        What::Request(r) => {
            let (model, conv, mb) =
                (r.inputs.model.clone(), r.inputs.conversation.as_ref().map(|c| c.key.clone()), r.inputs.memory_mb);
            (Some(r), model, conv, mb.unwrap_or(0))
        }
    };
    let keys = request.as_ref().map(|r| r.prefix_keys.clone()).unwrap_or_default();
    let (model, conversation) = (model.as_str(), conversation.as_deref());
    if let (Some(r), false) = (&request, json) {
        // First: the inputs stand on their own, even when the kernel's maps cannot be read.
        print_request(r);
    }
    let plan = match listen {
        Some(addr) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            Some(model_plan(rt.block_on(fetch_plan(addr))?, model)?)
        }
        None => None,
    };
    let conv = conversation
        .map(|c| explain_conversation(bpffs, model, c, memory_mb, &keys))
        .transpose()
        .map_err(|e| super::access::pin_error(&e, bpffs, "ailb explain"))?;
    if json {
        let out = ExplainOutput { request: request.as_ref(), model, plan, conversation: conv };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if let Some(m) = &plan {
        let vips: Vec<String> = m.vips.iter().map(ToString::to_string).collect();
        println!(
            "model {model}: {} (VIPs {})",
            if m.available { "available" } else { "UNAVAILABLE: no eligible backend" },
            vips.join(", ")
        );
        for b in &m.backends {
            println!(
                "  {:<22} {:>5}  {}",
                b.address.to_string(),
                if b.eligible { b.weight.to_string() } else { "-".to_string() },
                b.reason()
            );
        }
    } else {
        println!("(weights and reasons need the daemon's HTTP endpoint: pass --listen or --config with daemon.listen)");
    }
    if let Some(c) = conv {
        println!(
            "\nconversation {:?} (hash {}): {} — {}",
            c.conversation,
            c.hash,
            c.backend.as_deref().unwrap_or("refused"),
            c.why
        );
        if let Some(b6) = &c.backend_ipv6_client {
            println!("  from an IPv6 client: {b6}");
        }
        if let Some(p) = &c.prefix {
            let holders = if p.holders.is_empty() { "none".to_string() } else { p.holders.join(", ") };
            let evicted = if p.evicted.is_empty() {
                String::new()
            } else {
                format!("; evicted by their engines within the lifetime: {}", p.evicted.join(", "))
            };
            println!(
                "  prefix: {} of its {} keys held (holders {holders}{evicted}): {}, {}",
                p.found, p.sent, p.usage, p.why
            );
        }
        if let (Some(b), Some(age)) = (&c.affinity_backend, c.affinity_age_ms) {
            println!("  affinity entry: {b}, last used {:.1} s ago", age as f64 / 1000.0);
        } else {
            println!("  no affinity entry yet: its first connection will create one");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
