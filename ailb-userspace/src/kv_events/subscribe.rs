//! The sockets: one engine's KV-event publisher followed into its [`BlockIndex`], and its replay
//! socket asked for the batches a gap lost (the protocol is in `docs/prefix.md`).
//!
//! ZMQ's PUB drops messages for a slow subscriber, and a subscriber that connects late misses
//! what came before; both show as a sequence gap. A gap is filled from the replay socket when the
//! engine still holds the batches; otherwise what the index held is dropped
//! ([`BlockIndex::resync`]) and it relearns from the live stream.

use std::time::Duration;

use bytes::Bytes;
use zeromq::{prelude::*, DealerSocket, SubSocket, ZmqMessage};

use super::{wire, BlockIndex, Receipt};

/// What went wrong on an engine's sockets.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error("kv events {endpoint}: cannot connect")]
    Connect {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("kv events {endpoint}: receiving failed")]
    Receive {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("kv events replay {endpoint}: sending the request failed")]
    ReplaySend {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("kv events replay {endpoint}: no answer within {timeout:?}")]
    ReplayTimeout { endpoint: String, timeout: Duration },
}

/// How a received message was followed.
#[derive(Debug)]
pub struct Followed {
    /// What the live message did (after a replay, usually `Duplicate`: the replay sent it).
    pub receipt: Receipt,
    /// Batches the replay socket sent and the index applied.
    pub replayed: u64,
    /// The gap could not be filled: the index dropped what it held and went on from here.
    pub resynced: bool,
}

/// One engine's publisher (and replay socket, if it has one), subscribed to every topic.
pub struct Subscriber {
    endpoint: String,
    replay: Option<String>,
    replay_timeout: Duration,
    sub: SubSocket,
}

impl Subscriber {
    /// Connects to `endpoint` (`tcp://host:port`, the engine's `--kv-events-config` endpoint);
    /// `replay` is its `replay_endpoint`, asked within `replay_timeout` per answer.
    pub async fn connect(
        endpoint: &str,
        replay: Option<&str>,
        replay_timeout: Duration,
    ) -> Result<Subscriber, SubscribeError> {
        let connect = |source| SubscribeError::Connect { endpoint: endpoint.to_string(), source };
        let mut sub = SubSocket::new();
        sub.connect(endpoint).await.map_err(connect)?;
        sub.subscribe("").await.map_err(connect)?;
        Ok(Subscriber { endpoint: endpoint.to_string(), replay: replay.map(str::to_string), replay_timeout, sub })
    }

    /// Receives the next message and applies it to `index`, filling a gap first.
    pub async fn next(&mut self, index: &mut BlockIndex) -> Result<Followed, SubscribeError> {
        let message = self
            .sub
            .recv()
            .await
            .map_err(|source| SubscribeError::Receive { endpoint: self.endpoint.clone(), source })?;
        let frames: Vec<&[u8]> = message.iter().map(|f| f.as_ref()).collect();
        let Ok(live) = wire::split_message(&frames) else {
            // Not a publisher's message: `receive` logs it and reports it skipped.
            return Ok(Followed { receipt: index.receive(&frames), replayed: 0, resynced: false });
        };
        let receipt = index.receive_payload(live.seq, live.payload);
        let Receipt::Gap { expected, got } = receipt else {
            return Ok(Followed { receipt, replayed: 0, resynced: false });
        };
        let (replayed, filled) = self.replay(index, expected).await?;
        let resynced = !filled;
        if resynced {
            tracing::warn!(endpoint = %self.endpoint, expected, got, "kv events lost and not replayable: the engine's blocks are relearnt");
            index.resync(got);
        }
        let receipt = index.receive_payload(live.seq, live.payload);
        Ok(Followed { receipt, replayed, resynced })
    }

    /// Asks the replay socket for every batch from `from` and applies them: `(applied, filled)`,
    /// `filled` false when there is no replay socket or it no longer holds batch `from`.
    async fn replay(&self, index: &mut BlockIndex, from: u64) -> Result<(u64, bool), SubscribeError> {
        let Some(endpoint) = &self.replay else { return Ok((0, false)) };
        let mut dealer = DealerSocket::new();
        dealer
            .connect(endpoint)
            .await
            .map_err(|source| SubscribeError::Connect { endpoint: endpoint.clone(), source })?;
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&wire::replay_request(from)));
        dealer
            .send(request)
            .await
            .map_err(|source| SubscribeError::ReplaySend { endpoint: endpoint.clone(), source })?;
        let mut applied = 0;
        let mut filled = true;
        loop {
            let answer = tokio::time::timeout(self.replay_timeout, dealer.recv())
                .await
                .map_err(|_| SubscribeError::ReplayTimeout {
                    endpoint: endpoint.clone(),
                    timeout: self.replay_timeout,
                })?
                .map_err(|source| SubscribeError::Receive { endpoint: endpoint.clone(), source })?;
            let frames: Vec<&[u8]> = answer.iter().map(|f| f.as_ref()).collect();
            match wire::split_replay(&frames) {
                Ok(wire::Replayed::End) => break,
                Ok(wire::Replayed::Batch { seq, payload }) => match index.receive_payload(seq, payload) {
                    Receipt::Applied(_) | Receipt::Restarted(_) | Receipt::Skipped { .. } => applied += 1,
                    Receipt::Duplicate { .. } => {}
                    // The engine's buffer starts after `from`: what is missing is gone.
                    Receipt::Gap { .. } => filled = false,
                },
                Err(error) => {
                    tracing::warn!(endpoint = %endpoint, error = %crate::error_chain(&error), "kv events replay: answer skipped");
                }
            }
        }
        // A replay socket is one request's: nothing is left to send on it.
        let _unsent = dealer.close().await;
        Ok((applied, filled && index.expected().is_some_and(|e| e > from)))
    }
}
