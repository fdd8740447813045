//! A source of snapshots as the daemon reads it: one read at a time, plus a push
//! notification. Each kind of source implements [`SnapshotSource`] in a file of its own
//! (`static_source.rs`, `nacos/`); [`super::open`] builds the one the config names.

use std::{future::Future, path::PathBuf, pin::Pin, time::Duration};

use super::{local::LocalError, StaticBackend};
use crate::nacos::{NacosError, ValidNacos};

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

/// `[discovery]` as validated: which source, with its own settings.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidSource {
    /// The config's `[[backends]]` ([`DiscoverySettings::backends`]).
    Static,
    Nacos(Box<ValidNacos>),
}

impl ValidSource {
    /// `discovery.source` as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            ValidSource::Static => "static",
            ValidSource::Nacos(_) => "nacos",
        }
    }
}

/// What a source reads of the config: at start-up, and again at every reload
/// ([`SnapshotSource::reconfigure`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoverySettings {
    pub source: ValidSource,
    /// The static source's backends (empty with any other source).
    pub backends: Vec<StaticBackend>,
    /// How often backends with live telemetry are sampled.
    pub sample_interval: Duration,
    /// The NVML library for backends with `gpus` (`None`: the loader's default).
    pub nvml_library: Option<PathBuf>,
    /// Each catalog model with the registry services that list its backends (the catalog's
    /// `nacos_services`, at least one); a registry source reads these.
    pub catalog: Vec<(String, Vec<String>)>,
}

pub trait SnapshotSource: Send {
    /// One full read of the fleet; an error keeps the last good tables.
    fn discover(&mut self) -> BoxFuture<'_, Result<super::Snapshot, SourceError>>;
    /// Completes when the source pushes a change (never, for sources without push).
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    /// How often to read; `None`: only at start and on reload (the static source).
    fn poll_interval(&self) -> Option<Duration>;
    /// Takes the discovery settings of a reloaded config.
    fn reconfigure(&mut self, settings: &DiscoverySettings) -> Result<(), SourceError>;
    /// Instances dropped so far because the registry's answer for them was unusable.
    fn dropped_total(&self) -> u64 {
        0
    }
}
