//! `ailb explain --model M [--conversation ID] [--json]`: why each backend of a model has its
//! weight (from the daemon's `/v1/plan`), and which backend a conversation gets now (the
//! kernel's pick, run over the pinned maps). `ailb explain --request FILE [-H ...]`: first the
//! routing inputs the front door finds in that request (the same code as `ailb gateway`),
//! then the same for its model, conversation and memory need.

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
}

/// The routing inputs of a request with body `body` (a file, or `-` for standard input),
/// `path` and `headers` ("Name: value"), by the catalog and `[gateway]` of `config`.
pub fn request_inputs(
    config: Option<&Path>,
    body: &Path,
    path: &str,
    headers: &[String],
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
    let (inputs, vip) = crate::gateway::routing_inputs(&valid, &gateway, path, &map, &bytes).map_err(|e| {
        anyhow::anyhow!(
            "the front door would answer {} ({}): {}",
            e.status.as_u16(),
            e.code.unwrap_or(e.kind),
            e.message
        )
    })?;
    let conversation_hash = inputs.conversation.as_ref().map(|c| format!("{:#018x}", c.hash()));
    Ok(RequestInputs { path: path.to_string(), inputs, vip, conversation_hash })
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
            };
            println!("  conversation {:?} (hash {h}, from {from})", c.key);
        }
        _ => println!("  conversation none: a fresh weighted pick for every request"),
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

/// The daemon's plan (`None` before its first), read as the front door reads it.
async fn fetch_plan(listen: SocketAddr) -> anyhow::Result<Option<PlanView>> {
    match PlanClient::new(listen).fetch().await {
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
        .map(|c| explain_conversation(bpffs, model, c, memory_mb))
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
        if let (Some(b), Some(age)) = (&c.affinity_backend, c.affinity_age_ms) {
            println!("  affinity entry: {b}, last used {:.1} s ago", age as f64 / 1000.0);
        } else {
            println!("  no affinity entry yet: its first connection will create one");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        sync::{Arc, RwLock},
    };

    use super::*;
    use crate::{
        config::Config,
        daemon::http,
        discovery::{Instance, Snapshot},
        gateway::control::plan,
        policy::{self, PolicyState},
    };

    fn inst(i: u8, meta: &[(&str, &str)]) -> Instance {
        Instance::test(i, meta)
    }

    /// A plan with an eligible backend (every factor reported), one excluded for memory, and
    /// two whose every metadata key is invalid (each of the two memory keys once).
    fn view() -> PlanView {
        let text = "[policy.gpu_capability]\n\"A100-80GB\" = 2.0\n[[models]]\nname = \"m\"\n\
                    vips = [\"127.77.0.1:8000\"]\nrequired_memory_mb = 8192\naffinity_ttl = \"10m\"\n";
        let cfg = Config::parse(text, "t").unwrap().validate().unwrap();
        let garbage: Vec<(&str, &str)> = [
            "model_id",
            "supported_models",
            "model_version",
            "supported_tasks",
            "gpu_type",
            "gpu_memory_total_mb",
            "gpu_util",
            "current_requests",
            "queue_length",
            "health_status",
            "max_inflight",
            "kv_cache_usage",
            "agent_version",
            "updated_at_ms",
        ]
        .into_iter()
        .map(|k| (k, if k.starts_with("supported") { "," } else { "" }))
        .collect();
        let with = |key: &'static str| garbage.iter().copied().chain([(key, "lots")]).collect::<Vec<_>>();
        let snapshot = Snapshot {
            instances: vec![
                inst(
                    1,
                    &[
                        ("gpu_type", "A100-80GB"),
                        ("remaining_memory_mb", "20000"),
                        ("gpu_util", "25"),
                        ("current_requests", "2"),
                        ("max_inflight", "16"),
                    ],
                ),
                inst(2, &[("remaining_memory", "6")]),
                inst(3, &with("remaining_memory_mb")),
                inst(4, &with("remaining_memory")),
            ],
            services: Vec::new(),
        };
        let models = policy::plan(&snapshot, &cfg.models, &cfg.policy, &mut PolicyState::default());
        PlanView { generation: 7, models }
    }

    #[test]
    fn the_plan_reads_back_as_the_daemon_serves_it() {
        let v = view();
        // The daemon serves its `Option<PlanView>` through `axum::Json`, i.e. serde_json.
        let body = serde_json::to_string(&Some(&v)).unwrap();
        assert_eq!(plan::parse(&body).unwrap(), Some(v.clone()));
        assert_eq!(plan::parse(&serde_json::to_string(&None::<PlanView>).unwrap()).unwrap(), None);
        // Every metadata key of the contract can be named in an explanation and reads back.
        let named: BTreeSet<&str> = v.models["m"]
            .backends
            .iter()
            .flat_map(|b| b.explain.invalid.iter().map(|f| f.key).chain([b.explain.memory.key]))
            .collect();
        assert_eq!(named.len(), 16, "{named:?}");
        assert!(plan::parse(&body.replace("\"gpu_util\"", "\"gpu_utilisation\"")).is_err(), "unknown keys are refused");
    }

    #[test]
    fn the_json_keeps_the_keys_that_clients_read() {
        let v = serde_json::to_value(view()).unwrap();
        assert_eq!(v["generation"], 7);
        let m = &v["models"]["m"];
        assert_eq!(m["vips"], serde_json::json!(["127.77.0.1:8000"]));
        assert_eq!(
            (&m["available"], &m["weights_held"], &m["affinity_ttl"]),
            (&true.into(), &false.into(), &"10m".into())
        );
        let b = &m["backends"][0];
        assert_eq!(b["address"], "10.0.0.1:8000");
        assert_eq!(
            (&b["eligible"], &b["weight"], &b["cap"], &b["free_memory_mb"]),
            (&true.into(), &1000.into(), &16.into(), &20000.into())
        );
        assert!(b["reason"].as_str().is_some_and(|r| r.starts_with("eligible: weight 1000")), "{b}");
        assert_eq!(b["explain"]["util"]["smoothed"], 25.0);
        assert_eq!(b["explain"]["util"]["band"], "low");
        let excluded = &m["backends"][1];
        assert_eq!((&excluded["eligible"], &excluded["weight"]), (&false.into(), &0.into()));
        assert_eq!(excluded["explain"]["excluded_by"], "memory");
        assert_eq!(m["backends"][2]["explain"]["invalid"][0]["effect"], "excluded");
    }

    #[test]
    fn explain_json_nests_the_models_plan() {
        let plan = model_plan(Some(view()), "m").unwrap();
        let out =
            serde_json::to_value(ExplainOutput { request: None, model: "m", plan: Some(plan), conversation: None })
                .unwrap();
        assert_eq!(out["model"], "m");
        assert_eq!(out["plan"]["backends"][0]["address"], "10.0.0.1:8000");
        assert_eq!(out["plan"]["backends"][1]["eligible"], false);
        assert!(out["conversation"].is_null());
        let e = model_plan(Some(view()), "other").unwrap_err().to_string();
        assert!(e.contains("\"other\"") && e.contains("[\"m\"]"), "{e}");
        let e = model_plan(None, "m").unwrap_err().to_string();
        assert!(e.contains("(models: [])"), "{e}");
    }

    #[tokio::test]
    async fn explain_fetches_what_the_endpoint_serves() {
        let shared = Arc::new(http::Shared { registry: Default::default(), plan: RwLock::new(None) });
        let addr = http::serve("127.0.0.1:0".parse().unwrap(), shared.clone()).await.unwrap();
        assert_eq!(fetch_plan(addr).await.unwrap(), None, "before the first plan");
        *shared.plan.write().unwrap() = Some(view());
        assert_eq!(fetch_plan(addr).await.unwrap(), Some(view()));
    }
}
