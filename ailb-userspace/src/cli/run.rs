//! `ailb run`: start-up (validate, resolve the cgroup, load or reopen, first tables, attach),
//! then the daemon loop.

use std::{
    path::Path,
    sync::{Arc, RwLock},
};

use anyhow::Context;
use prometheus_client::registry::Registry;
use tracing::info;

use crate::{
    config,
    daemon::{
        http,
        metrics::{KernelCollector, Metrics},
        Daemon,
    },
    datapath::{self, Writer},
    discovery,
};

pub fn run(config_path: Option<&Path>) -> anyhow::Result<()> {
    let cfg = config::load_valid(config_path)?;
    let origin = config_path.map_or("<embedded default>".to_string(), |p| p.display().to_string());
    if cfg.cgroup == "/" {
        info!("attaching to the cgroup2 root: every process on this host is balanced (deployment mode)");
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(async move {
        let source = discovery::open(&cfg.discovery()).await?;
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        registry.register_collector(Box::new(KernelCollector { bpffs: cfg.bpffs.clone(), loads: metrics.loads.clone() }));
        let shared = Arc::new(http::Shared { registry, plan: RwLock::new(None) });
        if let Some(addr) = cfg.listen {
            if !addr.ip().is_loopback() {
                tracing::warn!(listen = %addr, "daemon.listen is not a loopback address: /metrics and /v1/plan are reachable from the network (they have no authentication)");
            }
            http::serve(addr, shared.clone()).await.with_context(|| format!("daemon.listen {addr}: cannot bind"))?;
        }

        let cgroup = datapath::resolve_cgroup(&cfg.cgroup)?;
        let opened = datapath::open_or_load(&cfg.bpffs, &cfg.limits).map_err(|e| crate::cli::access::run_error(&e, &cfg.bpffs))?;
        let fresh = opened.attach.is_fresh();
        let writer = Writer::new(opened.maps)?;
        let bpffs = cfg.bpffs.clone();
        let mut daemon = Daemon::new(writer, cfg, config_path.map(Path::to_path_buf), source, metrics, Some(shared));
        // On a fresh start the first tables are written before the programs are attached. With a
        // registry that cannot be read yet, the model starts unavailable (connects are refused)
        // and fills in as soon as the registry answers.
        let first = match daemon.source.discover().await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "first discovery read failed; starting with the tables as they are");
                daemon.metrics.discovery_errors.inc();
                None
            }
        };
        if let Err(e) = daemon.start(first, fresh) {
            if fresh {
                let _cleanup = datapath::teardown(&bpffs);
            }
            return Err(e);
        }
        let interfaces = daemon.cfg.tc.interfaces.clone();
        if let Err(e) = opened.attach.attach(&cgroup, &interfaces, daemon.cfg.tc.attach) {
            let _cleanup = datapath::teardown(&bpffs);
            return Err(crate::cli::access::run_error(&e, &bpffs));
        }
        daemon.tc_reclaim = datapath::tc::Reclaimer::open(&bpffs)?;
        info!(config = %origin, cgroup = %cgroup.display(), bpffs = %bpffs.display(), fresh, "ailb ready");
        daemon.run().await
    })
}
