//! The Nacos source: every instance (healthy or not) of the catalog's services, read through
//! the one Nacos client ([`crate::nacos`]) and turned into a [`Snapshot`].
//!
//! - **Connect** ([`NacosSource::connect`]) builds the client and, with credentials, logs in.
//!   A server that refuses the credentials (401/403) is a start-up error. A server that cannot
//!   be reached is *not*: the daemon starts fail-static, and login is retried on the next read.
//! - **Read** ([`NacosSource::discover`]) reads every service, failing over between servers as
//!   the session does. Any service that no server could read makes the whole read an error,
//!   so the caller keeps its last good snapshot. Hosts with an unusable address or field are
//!   dropped (logged when the set changes, counted in [`NacosSource::dropped_total`]). The
//!   configured clusters are sent as the documented filter *and* applied to the answer, so a
//!   server that ignores the filter changes nothing.
//! - **Watch**: the caller polls every `poll_interval` and compares snapshots (`PartialEq`);
//!   [`NacosSource::changed`] completes early on a v1 UDP push (see [`crate::nacos::push`]).

use std::{collections::HashMap, time::Duration};

use super::{
    source::{BoxFuture, DiscoverySettings, SnapshotSource, SourceError, ValidSource},
    Instance, ServiceInfo, Snapshot,
};
use crate::{
    metadata::InstanceMetadata,
    nacos::{
        http::{ReqwestTransport, Transport},
        push::PushReceiver,
        NacosApi, NacosError, Session, ValidNacos,
    },
};

/// The Nacos discovery source. `T` is the HTTP seam; the daemon uses the default.
pub struct NacosSource<T: Transport = ReqwestTransport> {
    session: Session<T>,
    /// `(model, nacos services)`.
    catalog: Vec<(String, Vec<String>)>,
    push: Option<PushReceiver>,
    dropped_total: u64,
    /// Hosts dropped per service at the last read (a warning only when this changes).
    last_dropped: HashMap<String, Vec<String>>,
}

/// [`NacosSource`] as the daemon reads it: polling plus the v1 UDP push.
pub struct NacosAdapter {
    src: NacosSource,
    cfg: ValidNacos,
}

impl NacosAdapter {
    /// Connects ([`NacosSource::connect`]) to read `catalog`: `(model, its services)`.
    pub async fn connect(cfg: &ValidNacos, catalog: &[(String, Vec<String>)]) -> Result<Self, SourceError> {
        let src = NacosSource::connect(cfg, catalog).await.map_err(SourceError::Nacos)?;
        Ok(Self { src, cfg: cfg.clone() })
    }
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
    /// A reload may change the catalog; the Nacos settings themselves need a restart.
    fn reconfigure(&mut self, settings: &DiscoverySettings) -> Result<(), SourceError> {
        let ValidSource::Nacos(n) = &settings.source else {
            return Err(SourceError::SwitchSource { from: "nacos", to: settings.source.kind() });
        };
        if **n != self.cfg {
            return Err(SourceError::NacosSettings);
        }
        self.src.set_catalog(&settings.catalog);
        Ok(())
    }
}

impl NacosSource<ReqwestTransport> {
    /// Builds the client (rustls, `tls_ca_file`), binds the UDP push socket and logs in. Errors:
    /// an unreadable CA file, or a server that refused the credentials. Unreachable servers
    /// are logged and retried by [`Self::discover`].
    pub async fn connect(cfg: &ValidNacos, catalog: &[(String, Vec<String>)]) -> Result<Self, NacosError> {
        Self::from_session(Session::new(cfg)?, catalog).await
    }
}

impl<T: Transport> NacosSource<T> {
    /// [`NacosSource::connect`] over any transport.
    pub async fn with_transport(
        cfg: &ValidNacos,
        catalog: &[(String, Vec<String>)],
        transport: T,
    ) -> Result<Self, NacosError> {
        Self::from_session(Session::with_transport(cfg, transport), catalog).await
    }

    async fn from_session(mut session: Session<T>, catalog: &[(String, Vec<String>)]) -> Result<Self, NacosError> {
        let cfg = session.config();
        let push = if cfg.udp_push && cfg.api != NacosApi::V3 {
            match PushReceiver::bind() {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "nacos: cannot bind the udp push socket; polling only");
                    None
                }
            }
        } else {
            None
        };
        session.set_push_port(push.as_ref().map(PushReceiver::port));
        let mut src = Self { session, catalog: Vec::new(), push, dropped_total: 0, last_dropped: HashMap::new() };
        src.set_catalog(catalog);
        src.session.login_first().await?;
        Ok(src)
    }

    /// Replaces the watched services (a config reload).
    pub fn set_catalog(&mut self, catalog: &[(String, Vec<String>)]) {
        self.catalog = catalog.to_vec();
        if let Some(p) = &mut self.push {
            p.watch(&self.session.config().group, catalog.iter().flat_map(|(_, s)| s.iter().cloned()));
        }
    }

    /// How often the caller should call [`Self::discover`].
    pub fn poll_interval(&self) -> Duration {
        self.session.config().poll_interval
    }

    /// Hosts dropped so far (counted at every read that drops them).
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// The local UDP port offered for pushes, if push is on.
    pub fn push_port(&self) -> Option<u16> {
        self.push.as_ref().map(PushReceiver::port)
    }

    /// Push datagrams received and understood so far.
    pub fn pushes_received(&self) -> u64 {
        self.push.as_ref().map_or(0, PushReceiver::received)
    }

    /// Completes when a UDP push for a watched service arrives (after acking it); never when
    /// push is off. Cancel-safe: meant for `select!` next to the poll timer.
    pub async fn changed(&mut self) {
        match &mut self.push {
            Some(p) => p.next().await,
            None => std::future::pending().await,
        }
    }

    /// One full read of every catalog service. Instances are sorted (model, service, cluster,
    /// address) so that equal registry states give equal snapshots.
    pub async fn discover(&mut self) -> Result<Snapshot, NacosError> {
        let mut snap = Snapshot::default();
        let catalog = self.catalog.clone();
        for (model, services) in &catalog {
            for service in services {
                let list = self.session.list_instances(service).await?;
                let dropped_before = self.last_dropped.insert(service.clone(), list.dropped.clone());
                if !list.dropped.is_empty() {
                    self.dropped_total += list.dropped.len() as u64;
                    if dropped_before.as_ref() != Some(&list.dropped) {
                        tracing::warn!(model = %model, service = %service, dropped = ?list.dropped, "nacos: hosts dropped");
                    }
                }
                let cfg = self.session.config();
                let clusters = &cfg.clusters;
                snap.instances.extend(
                    list.hosts.into_iter().filter(|h| clusters.is_empty() || clusters.contains(&h.cluster)).map(|h| {
                        Instance {
                            model: model.clone(),
                            service: service.clone(),
                            group: cfg.group.clone(),
                            cluster: h.cluster,
                            address: h.address,
                            weight: h.weight,
                            healthy: h.healthy,
                            enabled: h.enabled,
                            metadata: InstanceMetadata::parse(h.metadata),
                        }
                    }),
                );
                snap.services.push(ServiceInfo {
                    model: model.clone(),
                    service: service.clone(),
                    reach_protection_threshold: list.reach_protection_threshold,
                });
            }
        }
        snap.instances.sort_by(|a, b| {
            (&a.model, &a.service, &a.cluster, a.address).cmp(&(&b.model, &b.service, &b.cluster, b.address))
        });
        Ok(snap)
    }
}

#[cfg(test)]
mod tests;
