//! The live table the demo prints from `ailb status --json` (shape in README, "CLI").

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Runs `ailb status --json` and parses it.
pub(crate) fn status(ailb: &Path) -> Result<Value> {
    let out = Command::new(ailb)
        .args(["status", "--json"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} status --json", ailb.display()))?;
    if !out.status.success() {
        bail!("`ailb status --json` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    serde_json::from_slice(&out.stdout).context("parsing `ailb status --json`")
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// A compact table: global counters, then per model its backends.
pub(crate) fn render(status: &Value, elapsed_s: u64) -> String {
    let s = &status["stats"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "--- t={elapsed_s}s generation {}  picks {}  affinity hits {}  breaks {}  spills {}  refused(no backend/no fit) {}/{}",
        num(&status["generation"]),
        num(&s["picks"]),
        num(&s["affinity_hits"]),
        num(&s["affinity_breaks"]),
        num(&s["spills"]),
        num(&s["no_backend"]),
        num(&s["no_fit"]),
    );
    for model in status["models"].as_array().into_iter().flatten() {
        let vips: Vec<&str> = model["vips"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let _ = writeln!(
            out,
            "    model {} [{}]  available {}  in-flight {}  table {} slots",
            model["name"].as_str().unwrap_or("?"),
            vips.join(", "),
            num(&model["available"]),
            num(&model["inflight"]),
            num(&model["table_size"]),
        );
        let _ = writeln!(
            out,
            "    {:<18} {:>6} {:>7} {:>9} {:>7} {:>13}",
            "backend", "weight", "share", "in-flight", "picks", "affinity hits"
        );
        for b in model["backends"].as_array().into_iter().flatten() {
            // Share of the model's table, from the slot counts (unambiguous, unlike a float
            // that could be a fraction or a percentage).
            let share = match (b["table_slots"].as_f64(), model["table_size"].as_f64()) {
                (Some(slots), Some(size)) if size > 0.0 => format!("{:.1}%", slots / size * 100.0),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "    {:<18} {:>6} {:>7} {:>9} {:>7} {:>13}",
                b["address"].as_str().unwrap_or("?"),
                num(&b["weight"]),
                share,
                num(&b["inflight"]),
                num(&b["picks"]),
                num(&b["affinity_hits"]),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests;
