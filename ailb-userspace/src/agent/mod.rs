//! `ailb agent`: the GPU node agent. For each local model-server instance it registers an
//! ephemeral Nacos instance with the metadata contract's keys (docs/metadata.md), keeps it
//! alive with heartbeats and publishes dynamic metadata by registering again, only when a
//! value moved past its threshold (so a steady fleet writes nothing but beats). SIGTERM
//! drains: disabled first, then deregistered once in-flight requests reach zero or the
//! deadline passes.
//!
//! The loop is [`Agent::tick`]: sample, decide ([`publish::moved`], pure), write or beat
//! through the one Nacos client ([`crate::nacos::Session`]). Any error (NVML, scrape, Nacos) is
//! logged when it starts or changes, counted, and retried on the next tick; a Nacos error
//! makes the next contact a full registration, which also covers a server that lost its
//! state (restart) or answers a beat with 20404.

pub mod config;
pub mod health;
pub mod metrics;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use self::{
    config::{ValidAgent, ValidInstance},
    health::HealthGate,
    metrics::{AgentMetrics, ErrorSource},
};
use crate::{
    error_chain,
    metadata::{publish, values::Values},
    nacos::{http::Transport, Beat, Endpoint, Registration, Session},
    telemetry::source::Telemetry,
};

/// One instance's state.
pub struct InstanceState<S> {
    pub inst: ValidInstance,
    source: S,
    /// The values of the last successful publish.
    published: Option<Values>,
    /// The last registration written (what beats carry).
    last_reg: Option<Registration>,
    /// The latest sample's values.
    latest: Option<Values>,
    /// Register on the next tick (start, a Nacos error, a 20404).
    need_register: bool,
    last_contact: Option<Instant>,
    last_publish: Option<Instant>,
    /// The last error per source, logged once until it changes or clears.
    last_error: [Option<String>; 3],
    /// Why derived values are unknown (the last reasons logged).
    last_unknown: Vec<String>,
    /// The failure threshold over the server's samples.
    health: HealthGate,
}

pub struct Agent<T: Transport, S: Telemetry> {
    cfg: ValidAgent,
    nacos: Session<T>,
    pub instances: Vec<InstanceState<S>>,
    pub metrics: AgentMetrics,
    draining: bool,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The instance's identity in Nacos.
fn endpoint(i: &ValidInstance) -> Endpoint {
    Endpoint { service: i.service.clone(), ip: i.ip, port: i.port, cluster: i.cluster.clone() }
}

fn slot(s: ErrorSource) -> usize {
    match s {
        ErrorSource::Nvml => 0,
        ErrorSource::Scrape => 1,
        ErrorSource::Nacos => 2,
    }
}

impl<S> InstanceState<S> {
    /// Logs an error when it is new for this source, and counts every one.
    fn error(&mut self, m: &AgentMetrics, s: ErrorSource, msg: String) {
        m.error(s);
        if self.last_error[slot(s)].as_deref() != Some(msg.as_str()) {
            warn!(instance = %self.inst.name(), source = s.label(), error = %msg, "agent: error (retrying every interval)");
            self.last_error[slot(s)] = Some(msg);
        }
    }

    /// Logs why values are left out when the reasons change, and when they clear.
    fn unknown(&mut self, reasons: &[String]) {
        if self.last_unknown == reasons {
            return;
        }
        if reasons.is_empty() {
            info!(instance = %self.inst.name(), "agent: derived values known again");
        } else {
            warn!(instance = %self.inst.name(), reasons = %reasons.join("; "), "agent: values left out of the metadata (unknown)");
        }
        self.last_unknown = reasons.to_vec();
    }

    fn ok(&mut self, s: ErrorSource) {
        if self.last_error[slot(s)].take().is_some() {
            info!(instance = %self.inst.name(), source = s.label(), "agent: recovered");
        }
    }

    /// Registers the instance with `values` (enabled unless `draining`); on success they are
    /// the published values and the registration is what later beats carry.
    async fn register<T: Transport>(
        &mut self,
        nacos: &mut Session<T>,
        m: &AgentMetrics,
        values: Values,
        draining: bool,
    ) {
        let reg = Registration {
            metadata: publish::metadata(&self.inst, &values, now_ms()),
            weight: self.inst.weight,
            enabled: !draining,
        };
        match nacos.register(&endpoint(&self.inst), &reg).await {
            Ok(()) => {
                m.publishes.inc();
                if self.published.is_none() || self.last_error[slot(ErrorSource::Nacos)].is_some() {
                    info!(instance = %self.inst.name(), health = values.health_status(), enabled = reg.enabled, "agent: registered");
                }
                self.ok(ErrorSource::Nacos);
                self.published = Some(values);
                self.last_reg = Some(reg);
                self.need_register = false;
                self.last_contact = Some(Instant::now());
                self.last_publish = Some(Instant::now());
            }
            Err(e) => {
                self.need_register = true;
                self.error(m, ErrorSource::Nacos, error_chain(&e));
            }
        }
    }

    /// Beats with the last registration; a 20404 or an error makes the next contact a
    /// registration.
    async fn beat<T: Transport>(&mut self, nacos: &mut Session<T>, m: &AgentMetrics, reg: &Registration) {
        match nacos.beat(&endpoint(&self.inst), reg).await {
            Ok(Beat::Ok) => {
                m.beats.inc();
                self.ok(ErrorSource::Nacos);
                self.last_contact = Some(Instant::now());
            }
            Ok(Beat::NotFound) => {
                m.beat_not_found.inc();
                warn!(instance = %self.inst.name(), "agent: nacos does not know the instance (20404); registering again");
                self.need_register = true;
            }
            Err(e) => {
                self.need_register = true;
                self.error(m, ErrorSource::Nacos, error_chain(&e));
            }
        }
    }
}

impl<S: Telemetry> InstanceState<S> {
    /// Samples the instance (the server's health through the failure threshold), logs and
    /// counts the sources' errors and why values are unknown, and derives the values to
    /// publish (kept as the latest).
    async fn sample(&mut self, m: &AgentMetrics, threshold: u32, draining: bool) -> Values {
        let mut sampled = self.source.sample().await;
        let server = std::mem::take(&mut sampled.sample.server);
        sampled.sample.server = self.health.filter(server, threshold, &self.inst.name());
        let mut failed = [false; 2];
        for (src, msg) in sampled.errors {
            let src = ErrorSource::from(src);
            failed[slot(src)] = true;
            self.error(m, src, msg);
        }
        for src in [ErrorSource::Nvml, ErrorSource::Scrape] {
            if !failed[slot(src)] {
                self.ok(src);
            }
        }
        // Reasons for values left out, when the metrics were read (a scrape error or a
        // server that did not answer says nothing about them).
        let server = &sampled.sample.server;
        if !failed[slot(ErrorSource::Scrape)] && (server.healthy || !server.unknown.is_empty()) {
            self.unknown(&server.unknown);
        }
        let values = Values::derive(&sampled.sample, self.inst.kv_bytes_per_token, draining);
        self.latest = Some(values.clone());
        values
    }
}

impl<T: Transport, S: Telemetry> Agent<T, S> {
    pub fn new(cfg: ValidAgent, transport: T, sources: Vec<S>, metrics: AgentMetrics) -> Self {
        let nacos = Session::with_transport(&cfg.nacos, transport);
        let instances = cfg
            .instances
            .iter()
            .cloned()
            .zip(sources)
            .map(|(inst, source)| InstanceState {
                inst,
                source,
                published: None,
                last_reg: None,
                latest: None,
                need_register: true,
                last_contact: None,
                last_publish: None,
                last_error: [None, None, None],
                last_unknown: Vec::new(),
                health: HealthGate::default(),
            })
            .collect();
        Self { cfg, nacos, instances, metrics, draining: false }
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    /// One round: sample every instance, publish what moved (or must be registered), beat
    /// what is due.
    pub async fn tick(&mut self) {
        let t = self.cfg.thresholds;
        let hb = self.cfg.heartbeat_interval;
        let m = self.metrics.clone();
        let threshold = self.cfg.health_failure_threshold;
        for st in &mut self.instances {
            let values = st.sample(&m, threshold, self.draining).await;
            if st.need_register || publish::moved(st.published.as_ref(), &values, &t) {
                st.register(&mut self.nacos, &m, values, self.draining).await;
                continue;
            }
            let due = st.last_contact.is_none_or(|c| c.elapsed() >= hb);
            if let (true, Some(reg)) = (due, st.last_reg.clone()) {
                st.beat(&mut self.nacos, &m, &reg).await;
            }
        }
        let age = self
            .instances
            .iter()
            .map(|s| s.last_publish.map_or(f64::INFINITY, |p| p.elapsed().as_secs_f64()))
            .fold(0.0, f64::max);
        self.metrics.last_publish_age_seconds.set(if age.is_finite() { age } else { -1.0 });
    }

    /// Starts draining: the next tick registers every instance disabled, `health_status=draining`.
    pub fn start_drain(&mut self) {
        self.draining = true;
        self.metrics.draining.set(1);
    }

    /// Every instance is published as draining and has nothing in flight (a dead server has
    /// nothing left to finish).
    pub fn drained(&self) -> bool {
        self.instances.iter().all(|s| {
            let published_draining = s.published.as_ref().is_some_and(|p| p.draining);
            let idle = s.latest.as_ref().is_some_and(|v| !v.healthy || v.in_flight() == Some(0.0));
            published_draining && idle
        })
    }

    /// Deregisters every instance (errors are logged and counted; the agent exits anyway).
    pub async fn deregister_all(&mut self) {
        for st in &mut self.instances {
            match self.nacos.deregister(&endpoint(&st.inst)).await {
                Ok(()) => info!(instance = %st.inst.name(), "agent: deregistered"),
                Err(e) => {
                    self.metrics.error(ErrorSource::Nacos);
                    warn!(instance = %st.inst.name(), error = %error_chain(&e), "agent: deregistration failed");
                }
            }
        }
    }

    /// Ticks every `publish_interval` until `shutdown` completes, then drains: ticks on until
    /// [`Self::drained`] or `drain_timeout`, deregisters and returns.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut every = tokio::time::interval(self.cfg.publish_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = every.tick() => self.tick().await,
                () = &mut shutdown => break,
            }
        }
        let deadline = Instant::now() + self.cfg.drain_timeout;
        info!(timeout = ?self.cfg.drain_timeout, "agent: draining: instances disabled, waiting for in-flight requests");
        self.start_drain();
        loop {
            self.tick().await;
            if self.drained() {
                info!("agent: drained");
                break;
            }
            if Instant::now() >= deadline {
                warn!("agent: drain deadline passed with requests in flight; deregistering anyway");
                break;
            }
            every.tick().await;
        }
        self.deregister_all().await;
    }
}

#[cfg(test)]
mod tests;
