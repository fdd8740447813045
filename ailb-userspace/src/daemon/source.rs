//! The daemon's view of a discovery source: one read at a time, plus a push notification.

use std::{future::Future, pin::Pin, time::Duration};

use crate::{
    config::{ValidConfig, ValidSource},
    discovery::{
        local::{LocalError, LocalTelemetry},
        nacos::NacosSource,
        Snapshot,
    },
    nacos::{NacosError, ValidNacos},
};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a source could not read, or refused a reloaded config.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A Nacos read (or the login before it) failed.
    #[error("nacos source")]
    Nacos(#[source] NacosError),
    #[error("switching discovery.source from {from} to {to} needs a restart")]
    SwitchSource { from: &'static str, to: &'static str },
    #[error("discovery.nacos settings (servers, credentials, ...) changed: they need a restart")]
    NacosSettings,
    /// The live telemetry of the static backends could not start.
    #[error("static backends' telemetry")]
    Local(#[source] LocalError),
}

/// `discovery.source` as written in the config.
fn kind(s: &ValidSource) -> &'static str {
    match s {
        ValidSource::Static => "static",
        ValidSource::Nacos(_) => "nacos",
    }
}

pub trait SnapshotSource: Send {
    /// One full read of the fleet; an error keeps the last good tables.
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, SourceError>>;
    /// Completes when the source pushes a change (never, for sources without push).
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    /// How often to read; `None`: only at start and on reload (the static source).
    fn poll_interval(&self) -> Option<Duration>;
    /// Takes the discovery settings of a reloaded config.
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), SourceError>;
    /// Instances dropped so far because the registry's answer for them was unusable.
    fn dropped_total(&self) -> u64 {
        0
    }
}

/// The config's `[[backends]]`; those with a `metrics_url` sampled on every read.
pub struct StaticSource {
    cfg: ValidConfig,
    local: Option<LocalTelemetry>,
}

impl StaticSource {
    /// Opens NVML when a backend names GPUs (its absence is then a start-up error).
    pub fn new(cfg: &ValidConfig) -> Result<Self, SourceError> {
        let local = LocalTelemetry::new(&cfg.backends, cfg.nvml_library.as_deref(), cfg.sample_interval, None)
            .map_err(SourceError::Local)?;
        Ok(Self { cfg: cfg.clone(), local })
    }
}

impl SnapshotSource for StaticSource {
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, SourceError>> {
        Box::pin(async move {
            let sampled = match &mut self.local {
                Some(l) => l.sample().await,
                None => Default::default(),
            };
            Ok(crate::discovery::from_static_sampled(&self.cfg.backends, &sampled))
        })
    }
    /// Sampled backends are read every `daemon.sample_interval`; declared ones only at start
    /// and on reload.
    fn poll_interval(&self) -> Option<Duration> {
        self.local.as_ref().map(|_| self.cfg.sample_interval)
    }
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), SourceError> {
        if !matches!(cfg.source, ValidSource::Static) {
            return Err(SourceError::SwitchSource { from: "static", to: kind(&cfg.source) });
        }
        let nvml = self.local.as_ref().and_then(LocalTelemetry::nvml);
        self.local = LocalTelemetry::new(&cfg.backends, cfg.nvml_library.as_deref(), cfg.sample_interval, nvml)
            .map_err(SourceError::Local)?;
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
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, SourceError>> {
        Box::pin(async move { self.src.discover().await.map_err(SourceError::Nacos) })
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
    fn reconfigure(&mut self, cfg: &ValidConfig) -> Result<(), SourceError> {
        match &cfg.source {
            ValidSource::Nacos(n) if **n == self.cfg => {
                self.src.set_catalog(&catalog(cfg));
                Ok(())
            }
            ValidSource::Nacos(_) => Err(SourceError::NacosSettings),
            ValidSource::Static => Err(SourceError::SwitchSource { from: "nacos", to: "static" }),
        }
    }
}

/// Connects to Nacos. A refused login or an unreadable CA file stops start-up; unreachable
/// servers do not (the daemon starts fail-static and keeps reading).
pub async fn nacos(n: &ValidNacos, cfg: &ValidConfig) -> Result<Box<dyn SnapshotSource>, SourceError> {
    let src = NacosSource::connect(n, &catalog(cfg)).await.map_err(SourceError::Nacos)?;
    Ok(Box::new(NacosAdapter { src, cfg: n.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_refuses_a_switch_to_nacos_by_name() {
        let cfg = crate::config::load_valid(None).unwrap();
        let mut src = StaticSource::new(&cfg).unwrap();
        let mut nacos = cfg.clone();
        let n = crate::nacos::NacosConfig::with_servers(["http://127.0.0.1:1"]).validate().unwrap();
        nacos.source = ValidSource::Nacos(Box::new(n));
        let e = src.reconfigure(&nacos).unwrap_err();
        assert!(matches!(e, SourceError::SwitchSource { from: "static", to: "nacos" }), "{e}");
        assert!(src.reconfigure(&cfg).is_ok());
    }
}
