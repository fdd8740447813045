//! Shared between the eBPF programs (`no_std`) and userspace.
//!
//! * [`abi`]: constants of the client ABI and `#[repr(C)]` map keys and values.
//! * [`hash`]: the conversation hash (FNV-1a 64 with a murmur3 finaliser) that the kernel
//!   computes from `setsockopt(SOL_AILB, AILB_CONVERSATION, ..)` bytes and that `ailb hash` prints.
//! * [`pick`]: the per-connection backend pick, exactly as `cgroup/connect4` runs it.
//! * [`maglev`] (feature `std`): the deterministic weighted Maglev table builder.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_code)]

pub mod abi;
pub mod hash;
#[cfg(feature = "std")]
pub mod maglev;
pub mod pick;

pub use abi::*;
