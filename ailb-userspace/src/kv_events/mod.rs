//! What an engine's KV cache holds, from its own KV events: vLLM's ZMQ publisher
//! (`--kv-events-config`), decoded ([`wire`]) and applied in sequence to a per-engine
//! [`BlockIndex`] of prefix keys, the same keys the front door makes from a prompt
//! (`ailb_common::prefix`). The format, as read from vLLM 0.32.0, is in `docs/prefix.md`.
//!
//! [`wire`] and [`index`] are pure: frames in, keys out. [`subscribe`] holds the sockets (ZMQ
//! over TCP, the `zeromq` crate): it follows one engine's publisher into its index and asks the
//! replay socket to fill gaps. [`feed`] follows every engine the daemon is told of, each on a
//! task of its own, into one [`PrefixSink`]. Uses nothing of this crate but its error chain
//! helper.
#![forbid(unsafe_code)]

mod error;
pub mod feed;
pub mod index;
pub mod subscribe;
pub mod wire;

pub use error::KvEventError;
pub use feed::{EventSource, FeedCounters, FeedSettings, FeedStats, Feeds, MemorySink, PrefixSink, Targets};
pub use index::{ApplyStats, BlockIndex, Receipt};
pub use subscribe::{Followed, SubscribeError, Subscriber};
pub use wire::{decode_batch, split_message, split_replay, EngineHash, EventBatch, KvEvent, Message, Replayed};

#[cfg(test)]
mod tests;
