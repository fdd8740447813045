//! Reading `ailb status --json` (shape in the contract's CLI section).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// `ailb status --bpffs DIR --json`, parsed; `Err` with stderr when it fails (e.g. no pins yet).
pub fn ailb_status(bin: &Path, bpffs: &Path) -> Result<Value, String> {
    let out = crate::run_cmd(
        Command::new(bin).arg("status").arg("--bpffs").arg(bpffs).arg("--json"),
        Duration::from_secs(10),
    );
    if !out.status.success() {
        return Err(format!("exit {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("status output is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// `ailb explain --json --model MODEL --listen LISTEN --bpffs DIR [args]`, parsed; panics with
/// stderr when it fails.
pub fn ailb_explain(bin: &Path, model: &str, listen: &str, bpffs: &str, args: &[&str]) -> Value {
    let out = crate::run_cmd(
        Command::new(bin)
            .args(["explain", "--json", "--model", model, "--listen", listen, "--bpffs", bpffs])
            .args(args),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "ailb explain failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ailb explain --json: {e}"))
}

/// The `prefix` object of model `model` in a status (its mode, map entries and counters).
pub fn model_prefix(status: &Value, model: &str) -> Value {
    status["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == model))
        .map(|m| m["prefix"].clone())
        .unwrap_or_else(|| panic!("no model {model} in status: {status}"))
}

/// The `generation` field.
pub fn generation(status: &Value) -> u64 {
    status["generation"].as_u64().unwrap_or_else(|| panic!("status without a numeric generation: {status}"))
}

/// A counter of `stats`.
pub fn stat(status: &Value, name: &str) -> u64 {
    status["stats"][name].as_u64().unwrap_or_else(|| panic!("status.stats.{name} missing: {}", status["stats"]))
}

/// Every backend object of every model.
pub fn backends(status: &Value) -> Vec<&Value> {
    status["models"]
        .as_array()
        .unwrap_or_else(|| panic!("status without a models array: {status}"))
        .iter()
        .flat_map(|m| m["backends"].as_array().map(|b| b.iter().collect::<Vec<_>>()).unwrap_or_default())
        .collect()
}

/// The backend objects of `model`.
pub fn model_backends<'a>(status: &'a Value, model: &str) -> Vec<&'a Value> {
    status["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"] == model)
        .flat_map(|m| m["backends"].as_array().into_iter().flatten())
        .collect()
}

/// How many backends of `model` are live in the pinned maps.
pub fn live_backends(status: &Value, model: &str) -> usize {
    model_backends(status, model).into_iter().filter(|b| b["live"].as_bool() == Some(true)).count()
}

/// The backend object with `address`, if the status lists it.
pub fn backend<'a>(status: &'a Value, address: &str) -> Option<&'a Value> {
    backends(status).into_iter().find(|b| b["address"].as_str() == Some(address))
}

/// `models[].backends[].inflight` keyed by address.
pub fn inflight_by_address(status: &Value) -> BTreeMap<String, u64> {
    backend_numbers(status, "inflight")
}

/// `backends[].inflight_mem_mb` (memory hints in flight) keyed by address.
pub fn inflight_mem_by_address(status: &Value) -> BTreeMap<String, u64> {
    backend_numbers(status, "inflight_mem_mb")
}

/// The number `key` of every backend, keyed by address.
fn backend_numbers(status: &Value, key: &str) -> BTreeMap<String, u64> {
    backends(status)
        .into_iter()
        .map(|b| {
            let addr = b["address"].as_str().unwrap_or_else(|| panic!("backend without address: {b}"));
            let n = b[key].as_u64().unwrap_or_else(|| panic!("backend {addr} without {key}: {b}"));
            (addr.to_owned(), n)
        })
        .collect()
}

/// `models[].inflight` keyed by model name.
pub fn model_inflight(status: &Value) -> BTreeMap<String, u64> {
    status["models"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    let name = m["name"].as_str().unwrap_or("?").to_owned();
                    (name, m["inflight"].as_u64().unwrap_or_else(|| panic!("model without inflight: {m}")))
                })
                .collect()
        })
        .unwrap_or_default()
}
