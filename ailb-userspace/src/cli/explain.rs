//! `ailb explain --model M [--conversation ID] [--json]`: why each backend of a model has its
//! weight (from the daemon's `/v1/plan`), and which backend a conversation gets now (the
//! kernel's pick, run over the pinned maps).

use std::{net::SocketAddr, path::Path, time::Duration};

use anyhow::{bail, Context};

use crate::datapath::explain::explain_conversation;

async fn fetch_plan(listen: SocketAddr) -> anyhow::Result<serde_json::Value> {
    let url = format!("http://{listen}/v1/plan");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(3)).build()?;
    let resp = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url} (is `ailb run` started with daemon.listen?)"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: HTTP {}", resp.status());
    }
    let text = resp.text().await.with_context(|| format!("GET {url}: reading the body"))?;
    serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON"))
}

pub fn explain(
    listen: Option<SocketAddr>,
    bpffs: &Path,
    model: &str,
    conversation: Option<&str>,
    memory_mb: u32,
    json: bool,
) -> anyhow::Result<()> {
    let plan = match listen {
        Some(addr) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let plan = rt.block_on(fetch_plan(addr))?;
            let m = plan["models"].get(model).cloned();
            if m.is_none() {
                let known: Vec<&String> = plan["models"].as_object().map(|o| o.keys().collect()).unwrap_or_default();
                bail!("model {model:?} is not in the daemon's plan (models: {known:?})");
            }
            m
        }
        None => None,
    };
    let conv = conversation.map(|c| explain_conversation(bpffs, model, c, memory_mb)).transpose()?;
    if json {
        let out = serde_json::json!({ "model": model, "plan": plan, "conversation": conv });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if let Some(m) = &plan {
        println!(
            "model {model}: {} (VIPs {})",
            if m["available"].as_bool() == Some(true) { "available" } else { "UNAVAILABLE: no eligible backend" },
            m["vips"]
                .as_array()
                .map(|v| v.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default()
        );
        for b in m["backends"].as_array().into_iter().flatten() {
            println!(
                "  {:<22} {:>5}  {}",
                b["address"].as_str().unwrap_or("?"),
                if b["eligible"].as_bool() == Some(true) { b["weight"].to_string() } else { "-".to_string() },
                b["reason"].as_str().unwrap_or("")
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
        if let (Some(b), Some(age)) = (&c.affinity_backend, c.affinity_age_ms) {
            println!("  affinity entry: {b}, last used {:.1} s ago", age as f64 / 1000.0);
        } else {
            println!("  no affinity entry yet: its first connection will create one");
        }
    }
    Ok(())
}
