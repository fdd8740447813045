//! ailb's userspace: the daemon (`ailb run`: config, discovery, policy, the kernel data path), the GPU
//! node agent (`ailb agent`), the front door (`ailb gateway`) and the CLI.
//! `unsafe` is denied everywhere except the raw system calls in `datapath::sys`.
#![deny(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod discovery;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod kv_events;
pub mod metadata;
pub mod metrics;
pub mod nacos;
pub mod policy;
pub mod telemetry;
pub mod tokenize;
pub mod validate;

/// `e: cause: cause` on one line, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
