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
mod tests {
    use super::render;

    #[test]
    fn renders_backends_with_shares_from_slot_counts() {
        let status = serde_json::json!({
            "generation": 3,
            "stats": {"picks": 10, "affinity_hits": 4, "affinity_breaks": 0, "spills": 1,
                      "no_backend": 0, "no_fit": 0},
            "models": [{"name": "demo-7b", "vips": ["127.77.0.1:8000"], "available": true,
                "inflight": 2, "table_size": 4093,
                "backends": [{"address": "127.0.0.11:18001", "weight": 1, "table_slots": 512,
                              "inflight": 2, "picks": 10, "affinity_hits": 4}]}]
        });
        let out = render(&status, 4);
        assert!(out.contains("t=4s generation 3  picks 10  affinity hits 4"), "{out}");
        assert!(out.contains("model demo-7b [127.77.0.1:8000]"), "{out}");
        let row = out.lines().find(|l| l.contains("127.0.0.11:18001")).expect(&out);
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols, ["127.0.0.11:18001", "1", "12.5%", "2", "10", "4"]);
    }

    #[test]
    fn missing_fields_render_as_dashes() {
        let out = render(&serde_json::json!({"models": [{"backends": [{}]}]}), 0);
        assert!(out.contains("generation -"), "{out}");
    }
}
