//! The daemon's view of a discovery source: one read at a time, plus a push notification.

use std::{future::Future, pin::Pin, time::Duration};

use crate::{
    config::ValidConfig,
    discovery::{
        nacos::{error_chain, NacosSource, ValidNacos},
        Snapshot,
    },
};

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
    /// Instances dropped so far because the registry's answer for them was unusable.
    fn dropped_total(&self) -> u64 {
        0
    }
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

/// `(model, its Nacos services)` of the catalog.
fn catalog(cfg: &ValidConfig) -> Vec<(String, Vec<String>)> {
    cfg.models.iter().map(|(name, m)| (name.clone(), m.nacos_services.clone())).collect()
}

/// The Nacos source: polling plus the v1 UDP push.
pub struct NacosAdapter {
    src: NacosSource,
    cfg: ValidNacos,
}

impl SnapshotSource for NacosAdapter {
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, String>> {
        Box::pin(async move { self.src.discover().await.map_err(|e| error_chain(&e)) })
    }
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.src.changed())
    }
    fn poll_interval(&self) -> Option<Duration> {
        Some(self.src.poll_interval())
    }
    fn dropped_total(&self) -> u64 {
        self.src.dropped_total()
    }
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), String> {
        match &cfg.source {
            crate::config::ValidSource::Nacos(n) if **n == self.cfg => {
                self.src.set_catalog(&catalog(cfg));
                Ok(())
            }
            crate::config::ValidSource::Nacos(_) => {
                Err("discovery.nacos settings (servers, credentials, ...) need a restart".into())
            }
            crate::config::ValidSource::Static => Err("switching discovery.source needs a restart".into()),
        }
    }
}

/// Connects to Nacos. A refused login or an unreadable CA file stops start-up; unreachable
/// servers do not (the daemon starts fail-static and keeps reading).
pub async fn nacos(n: &ValidNacos, cfg: &ValidConfig) -> anyhow::Result<Box<dyn SnapshotSource>> {
    let src = NacosSource::connect(n, &catalog(cfg)).await.map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
    Ok(Box::new(NacosAdapter { src, cfg: n.clone() }))
}
