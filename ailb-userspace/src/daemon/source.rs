//! The daemon's view of a discovery source: one read at a time, plus a push notification.

use std::{future::Future, pin::Pin, time::Duration};

use crate::{config::ValidConfig, discovery::Snapshot};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait SnapshotSource: Send {
    /// One full read of the fleet; an error keeps the last good tables.
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, String>>;
    /// Completes when the source pushes a change (never, for sources without push).
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    /// How often to read; `None`: only at start and on reload (the static source).
    fn poll_interval(&self) -> Option<Duration>;
    /// Takes the discovery settings of a reloaded config.
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), String>;
}

/// The config's `[[backends]]`.
pub struct StaticSource {
    cfg: ValidConfig,
}

impl StaticSource {
    pub fn new(cfg: &ValidConfig) -> Self {
        Self { cfg: cfg.clone() }
    }
}

impl SnapshotSource for StaticSource {
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, String>> {
        let snap = crate::discovery::from_static(&self.cfg);
        Box::pin(async move { Ok(snap) })
    }
    fn poll_interval(&self) -> Option<Duration> {
        None
    }
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), String> {
        if !matches!(cfg.source, crate::config::ValidSource::Static) {
            return Err("switching discovery.source needs a restart".into());
        }
        self.cfg = cfg.clone();
        Ok(())
    }
}

/// The Nacos source (wired in once the client lands).
pub async fn nacos(
    _n: &crate::discovery::nacos::ValidNacos,
    _cfg: &ValidConfig,
) -> anyhow::Result<Box<dyn SnapshotSource>> {
    anyhow::bail!("discovery.source = \"nacos\" is not wired into the daemon yet")
}
