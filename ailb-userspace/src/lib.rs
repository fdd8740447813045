//! ailb's gateway side: config, discovery, policy, the kernel data path and the CLI.
//! `unsafe` is denied everywhere except the raw system calls in `datapath::sys`.
#![deny(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod discovery;
pub mod metrics;
pub mod policy;
pub mod telemetry;
pub mod validate;
