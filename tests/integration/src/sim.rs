//! `ailb-sim`, the simulated inference server (OpenAI API, vLLM-named `/metrics`), as a child
//! process killed by pid on drop; and reading one gauge of its `/metrics`. Also a small
//! tokenizing engine whose cache holds two prompts of [`topic_messages`], for the tests of
//! evictions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{wait_until, workspace_bin};

/// A running `ailb-sim --listen ADDR --model MODEL [args]`.
pub struct SimServer {
    child: Child,
    addr: String,
}

impl SimServer {
    /// Starts it with `args` after `--listen` and `--model` (e.g. `["--time-scale", "50"]`) and
    /// waits until `addr` accepts connections; panics when it exits first.
    pub fn start(addr: &str, model: &str, args: &[&str]) -> Self {
        let mut child = Command::new(workspace_bin("ailb-sim", "ailb-sim"))
            .args(["--listen", addr, "--model", model])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting ailb-sim on {addr}: {e}"));
        wait_until(&format!("ailb-sim on {addr} to accept connections"), Duration::from_secs(20), || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("ailb-sim on {addr} exited with {st}");
            }
            TcpStream::connect(addr).ok()
        });
        Self { child, addr: addr.to_string() }
    }

    /// One engine per address of `addrs` that tokenizes with the tokenizer in `tokenizer` and
    /// publishes its KV events (vLLM's format, `block`-token blocks) on a free loopback port
    /// each, at time scale 50; and those endpoints, in the same order.
    pub fn start_publishing(addrs: &[&str], model: &str, tokenizer: &str, block: u32) -> (Vec<Self>, Vec<String>) {
        let endpoints: Vec<String> =
            addrs.iter().map(|_| format!("tcp://127.0.0.1:{}", crate::nacos::free_port())).collect();
        let block = block.to_string();
        let sims = addrs
            .iter()
            .zip(&endpoints)
            .map(|(addr, ep)| {
                let args = [
                    "--tokenizer",
                    tokenizer,
                    "--kv-events-endpoint",
                    ep,
                    "--kv-block-size",
                    &block,
                    "--time-scale",
                    "50",
                ];
                SimServer::start(addr, model, &args)
            })
            .collect();
        (sims, endpoints)
    }

    /// A tokenizing engine (`tokenizer`, the model folder) publishing its KV events on
    /// `endpoint` (and its replay socket on `replay`) in blocks of `block` tokens, whose cache
    /// holds two prompts of [`topic_messages`]`(_, 140)`: a third evicts the least recently used.
    /// The pool: 4 MiB beside 13,352 MiB of weights, at 2,048 bytes a token.
    pub fn start_small(
        addr: &str,
        model: &str,
        tokenizer: &str,
        block: u32,
        endpoint: &str,
        replay: Option<&str>,
    ) -> Self {
        let block = block.to_string();
        let mut args = vec!["--tokenizer", tokenizer, "--kv-events-endpoint", endpoint, "--kv-block-size", &block];
        if let Some(r) = replay {
            args.extend(["--kv-events-replay-endpoint", r]);
        }
        args.extend(["--kv-bytes-per-token", "2048", "--gpu-memory-mb", "13356", "--time-scale", "1000"]);
        SimServer::start(addr, model, &args)
    }

    /// `ip:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The value of the gauge `name` (e.g. `vllm:num_requests_running`) in its `/metrics` now.
    /// The test process is outside the child cgroup, so this connect goes to the server itself.
    pub fn gauge(&self, name: &str) -> f64 {
        let text = http_get(&self.addr, "/metrics");
        metric_value(&text, name).unwrap_or_else(|| panic!("no {name} in the /metrics of {}:\n{text}", self.addr))
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child, which has not been waited for yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// `GET path` on `addr` with `Connection: close`: the body (panics on any failure or a status
/// other than 200).
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
        .unwrap_or_else(|e| panic!("GET {path} to {addr}: {e}"));
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap_or_else(|e| panic!("GET {path} from {addr}: reading: {e}"));
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("GET {path} from {addr}: {raw:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path} from {addr}: {head}");
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "GET {path}: chunked: {head}");
    body.to_string()
}

/// The value of the first sample of `name` (with or without labels) in a Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = if rest.starts_with('{') { rest.split_once('}')?.1 } else { rest };
        if !value.starts_with(' ') {
            return None;
        }
        value.split_whitespace().next()?.parse().ok()
    })
}

/// A chat's messages about `topic`: a short system prompt and a user message of `words` words,
/// distinct per topic from the first block on.
pub fn topic_messages(topic: &str, words: usize) -> serde_json::Value {
    let text: Vec<String> = (0..words).map(|i| format!("{topic}{}", i % 50)).collect();
    serde_json::json!([{"role": "system", "content": format!("You answer questions about {topic}.")},
                       {"role": "user", "content": text.join(" ")}])
}

#[cfg(test)]
mod tests;
