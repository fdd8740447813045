//! The kernel's run-time statistics of BPF programs (`kernel.bpf_stats_enabled=1`: each
//! program's `run_cnt` and `run_time_ns`), read with bpftool, for tests that print what a
//! program costs per run.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::run_cmd;

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Statistics collection switched on; the previous setting is restored on drop.
pub struct StatsEnabled(String);

impl StatsEnabled {
    pub fn enable() -> Result<Self, String> {
        let old = std::fs::read_to_string(SYSCTL).map_err(|e| format!("read {SYSCTL}: {e}"))?;
        std::fs::write(SYSCTL, "1").map_err(|e| format!("write 1 to {SYSCTL}: {e}"))?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(SYSCTL, &self.0);
    }
}

/// A program's runs and their total time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    pub cnt: u64,
    pub ns: u64,
}

impl Runs {
    /// The runs between `before` and `self`.
    pub fn since(self, before: Runs) -> Runs {
        Runs { cnt: self.cnt.saturating_sub(before.cnt), ns: self.ns.saturating_sub(before.ns) }
    }

    pub fn ns_per_run(self) -> f64 {
        self.ns as f64 / self.cnt.max(1) as f64
    }
}

fn bpftool(args: &[&str]) -> Result<Value, String> {
    let out = run_cmd(Command::new("bpftool").args(args).arg("--json"), Duration::from_secs(10));
    if !out.status.success() {
        return Err(format!("bpftool {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bpftool {}: not JSON: {e}", args.join(" ")))
}

/// The runs of program `id` so far.
pub fn prog_runs(id: u64) -> Result<Runs, String> {
    let p = bpftool(&["prog", "show", "id", &id.to_string()])?;
    Ok(Runs { cnt: p["run_cnt"].as_u64().unwrap_or(0), ns: p["run_time_ns"].as_u64().unwrap_or(0) })
}

/// The id of the program behind the BPF link pinned at `pin`.
pub fn link_prog_id(pin: &Path) -> Result<u64, String> {
    let pin_s = pin.to_str().ok_or_else(|| format!("{pin:?} is not UTF-8"))?;
    let l = bpftool(&["link", "show", "pinned", pin_s])?;
    l["prog_id"].as_u64().ok_or_else(|| format!("no prog_id for the link {pin_s}: {l}"))
}

/// The id of the program in slot `slot` of the program array pinned at `pin` (a program
/// array's value, read from user space, is the program's id).
pub fn prog_array_id(pin: &Path, slot: u32) -> Result<u64, String> {
    let pin_s = pin.to_str().ok_or_else(|| format!("{pin:?} is not UTF-8"))?;
    let key: Vec<String> = slot.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let mut args = vec!["map", "lookup", "pinned", pin_s, "key"];
    args.extend(key.iter().map(String::as_str));
    let v = bpftool(&args)?;
    let value = &v["value"];
    if let Some(id) = value.as_u64() {
        return Ok(id);
    }
    // Older bpftool prints the value as its bytes ("0x05", ...), little-endian.
    let bytes: Option<Vec<u8>> = value.as_array().map(|a| {
        a.iter()
            .filter_map(|b| b.as_str().and_then(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok()))
            .collect()
    });
    match bytes.as_deref() {
        Some([a, b, c, d, ..]) => Ok(u64::from(u32::from_le_bytes([*a, *b, *c, *d]))),
        _ => Err(format!("slot {slot} of {pin_s}: no program id in {v}")),
    }
}
