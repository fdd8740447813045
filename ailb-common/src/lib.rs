//! Shared between the eBPF programs (`no_std`) and userspace.
//!
//! * [`abi`]: constants of the client ABI and `#[repr(C)]` map keys and values.
//! * [`hash`]: the conversation hash (FNV-1a 64 with a murmur3 finaliser) that the kernel
//!   computes from `setsockopt(SOL_AILB, AILB_CONVERSATION, ..)` bytes and that `ailb hash` prints.
//! * [`pick`]: the per-connection backend pick, exactly as `cgroup/connect4` runs it.
//! * [`prefix`]: prefix keys, a prompt's chained block keys (the keys themselves with feature
//!   `std`), and which of them a request sends to the kernel.
//! * [`maglev`] (feature `std`): the deterministic weighted Maglev table builder.
//! * `client` (feature `client`): the safe Rust client of the socket ABI, the twin of
//!   `docs/client/ailb.h`: tag a socket with a conversation id, a memory need and a model
//!   (`client::Tags`, `client::tag`), connect to a VIP and read back the backend the kernel
//!   chose (`client::connect`); `ENOPROTOOPT` (ailb not loaded) is `client::Tagging::NoBalancer`.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_code)]

pub mod abi;
#[cfg(feature = "client")]
pub mod client;
pub mod hash;
#[cfg(feature = "std")]
pub mod maglev;
pub mod pick;
pub mod prefix;

pub use abi::*;
