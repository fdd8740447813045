//! The load: `wrk -t1 -c16 -d5s --latency -s post.lua URL`, keep-alive client connections (wrk's
//! default), each request a one-token, non-streamed chat completion POSTed as JSON, with an
//! `X-Session-ID` ([`SESSION`]): a chat client names its conversation, and the front door keeps
//! upstream connections only for requests with a conversation key (the other paths ignore the
//! header, or hash it). One fixed request keeps wrk on its cheapest path (no per-request Lua),
//! which matters when wrk shares the cores with what it measures. The script's
//! `done` hook prints wrk's own latency percentiles in whole microseconds, finer than the
//! `--latency` table (two decimals of ms); the table is the fallback.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::MODEL;

/// The conversation every request names (`X-Session-ID`).
pub const SESSION: &str = "frontdoor-bench-1";

/// The tag of the line the script's `done` hook prints.
const DONE_TAG: &str = "frontdoor-bench:";

/// The request body: one short user message, one output token, not streamed.
pub fn body() -> String {
    format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Say hi."}}],"max_tokens":1,"stream":false}}"#)
}

/// The Lua script: POST [`body`] as `application/json` with [`SESSION`]; at the end, one line with the
/// request count, the error counts and the latency percentiles in microseconds.
pub fn script() -> String {
    format!(
        "wrk.method = \"POST\"\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n\
         wrk.headers[\"X-Session-ID\"] = \"{SESSION}\"\n\
         wrk.body = '{body}'\n\
         function done(summary, latency, requests)\n\
         \x20 local e = summary.errors\n\
         \x20 io.write(string.format(\"{DONE_TAG} requests=%d non2xx=%d connect=%d read=%d write=%d timeout=%d \
         p50_us=%d p75_us=%d p90_us=%d p99_us=%d\\n\",\n\
         \x20   summary.requests, e.status, e.connect, e.read, e.write, e.timeout,\n\
         \x20   latency:percentile(50), latency:percentile(75), latency:percentile(90), latency:percentile(99)))\n\
         end\n",
        body = body()
    )
}

/// Writes [`script`] to `dir/post.lua`.
pub fn write_script(dir: &Path) -> anyhow::Result<PathBuf> {
    let p = dir.join("post.lua");
    std::fs::write(&p, script()).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// One wrk run, parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkRun {
    /// Completed requests.
    pub requests: u64,
    /// `Requests/sec:`.
    pub rps: f64,
    pub p50_us: f64,
    pub p75_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    /// Answers with a status outside 2xx and 3xx.
    pub non_2xx: u64,
    /// Socket errors: connect, read, write, timeout (no answer within wrk's 2 s).
    pub socket_errors: [u64; 4],
}

/// The kinds of [`WrkRun::socket_errors`], in order.
const SOCKET_ERRORS: [&str; 4] = ["connect", "read", "write", "timeout"];

impl WrkRun {
    /// Why this run counts as failed (`None`: every request answered 2xx/3xx, no socket error).
    pub fn failure(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.requests == 0 {
            why.push("no request completed".to_string());
        }
        if self.non_2xx > 0 {
            why.push(format!("{} non-2xx/3xx responses", self.non_2xx));
        }
        let socket: u64 = self.socket_errors.iter().sum();
        if socket > 0 {
            let kinds: Vec<String> = SOCKET_ERRORS
                .iter()
                .zip(self.socket_errors)
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            why.push(format!("{socket} socket errors ({})", kinds.join(", ")));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }
}

/// A wrk duration (`374.62us`, `1.40ms`, `2.00s`, `1.00m`) in microseconds.
pub fn duration_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

/// Parses wrk's output (with `--latency`, and the `done` line of [`script`] when present).
pub fn parse(text: &str) -> anyhow::Result<WrkRun> {
    let mut run = WrkRun::default();
    let mut have_rps = false;
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            run.rps = v.trim().parse().with_context(|| format!("Requests/sec: {v:?}"))?;
            have_rps = true;
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            run.non_2xx = v.trim().parse().with_context(|| format!("Non-2xx: {v:?}"))?;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for kv in v.split(',') {
                let mut f = kv.split_whitespace();
                let (Some(k), Some(Ok(n))) = (f.next(), f.next().map(str::parse::<u64>)) else { continue };
                if let Some(i) = SOCKET_ERRORS.iter().position(|s| *s == k) {
                    run.socket_errors[i] = n;
                }
            }
        } else if let Some((n, rest)) = line.split_once(" requests in ") {
            if rest.contains("read") {
                run.requests = n.trim().parse().with_context(|| format!("request count {n:?}"))?;
            }
        } else if let Some((pct, v)) = line.split_once('%') {
            let slot = match pct.trim() {
                "50" => &mut run.p50_us,
                "75" => &mut run.p75_us,
                "90" => &mut run.p90_us,
                "99" => &mut run.p99_us,
                _ => continue,
            };
            if let Some(us) = duration_us(v) {
                *slot = us;
            }
        }
    }
    if !have_rps {
        bail!("wrk printed no Requests/sec line");
    }
    if let Some(done) = text.lines().find_map(|l| l.trim().strip_prefix(DONE_TAG)) {
        apply_done_line(done, &mut run);
    }
    Ok(run)
}

/// The `key=value` fields of the `done` line: exact counts and microsecond percentiles.
fn apply_done_line(done: &str, run: &mut WrkRun) {
    for (k, v) in done.split_whitespace().filter_map(|kv| kv.split_once('=')) {
        let Ok(n) = v.parse::<f64>() else { continue };
        if let Some(i) = SOCKET_ERRORS.iter().position(|s| *s == k) {
            run.socket_errors[i] = n as u64;
            continue;
        }
        match k {
            "requests" => run.requests = n as u64,
            "non2xx" => run.non_2xx = n as u64,
            "p50_us" => run.p50_us = n,
            "p75_us" => run.p75_us = n,
            "p90_us" => run.p90_us = n,
            "p99_us" => run.p99_us = n,
            _ => {}
        }
    }
}

/// The wrk command line: one thread, `connections` keep-alive connections, `seconds` long.
pub fn command(url: &str, script: &Path, connections: u32, seconds: u32) -> Command {
    let mut c = Command::new("wrk");
    c.args(["-t1", "-c", &connections.to_string(), "-d", &format!("{seconds}s"), "--latency", "-s"])
        .arg(script)
        .arg(url);
    c
}

/// Runs wrk to completion and parses its output.
pub fn run(url: &str, script: &Path, connections: u32, seconds: u32) -> anyhow::Result<WrkRun> {
    let mut cmd = command(url, script, connections, seconds);
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    parse(&text).with_context(|| format!("wrk output for {url}:\n{text}{}", String::from_utf8_lossy(&out.stderr)))
}

#[cfg(test)]
mod tests;
