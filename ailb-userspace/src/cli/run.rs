//! `ailb run`: the daemon.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

use crate::{
    config::{self, ValidConfig},
    datapath::{self, Writer},
    discovery, policy,
};

fn apply(writer: &mut Writer, cfg: &ValidConfig) -> anyhow::Result<()> {
    let snapshot = discovery::from_static(cfg);
    let plan = policy::plan(&snapshot, cfg, &mut policy::PolicyState::default());
    let report = writer.apply(&plan, cfg)?;
    info!(
        generation = report.generation,
        live_backends = report.live_backends,
        tables_rebuilt = ?report.tables_rebuilt,
        retired = report.retired_backends,
        "tables applied"
    );
    Ok(())
}

pub fn run(config_path: Option<&Path>) -> anyhow::Result<()> {
    let cfg = config::load_valid(config_path)?;
    let origin = config_path.map_or("<embedded default>".to_string(), |p| p.display().to_string());
    if cfg.cgroup == "/" {
        info!("attaching to the cgroup2 root: every process on this host is balanced (deployment mode)");
    }
    let cgroup = datapath::resolve_cgroup(&cfg.cgroup)?;
    let opened = datapath::open_or_load(&cfg.bpffs)?;
    let fresh = opened.attach.is_fresh();
    // On a fresh start the first tables are written before the programs are attached.
    let mut writer = Writer::new(opened.maps)?;
    if let Err(e) = apply(&mut writer, &cfg) {
        if fresh {
            let _cleanup = datapath::teardown(&cfg.bpffs);
        }
        return Err(e);
    }
    if let Err(e) = opened.attach.attach(&cgroup) {
        let _cleanup = datapath::teardown(&cfg.bpffs);
        return Err(e.into());
    }
    info!(config = %origin, cgroup = %cgroup.display(), bpffs = %cfg.bpffs.display(), fresh, "ailb ready");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(serve(writer, cfg, config_path.map(Path::to_path_buf)))
}

async fn serve(mut writer: Writer, mut cfg: ValidConfig, path: Option<PathBuf>) -> anyhow::Result<()> {
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    // Frees the ids of removed backends once their connections have drained.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                match config::load_valid(path.as_deref()) {
                    Ok(new) => {
                        if new.bpffs != cfg.bpffs || new.cgroup != cfg.cgroup {
                            error!("reload: daemon.bpffs and daemon.cgroup cannot change while running; keeping the old config");
                            continue;
                        }
                        match apply(&mut writer, &new) {
                            Ok(()) => cfg = new,
                            Err(e) => error!(error = %format!("{e:#}"), "reload: applying failed; tables may be partly updated, retrying on the next reload"),
                        }
                    }
                    Err(e) => error!(error = %e, "reload: invalid config, keeping the previous one"),
                }
            }
            _ = tick.tick() => {
                if let Err(e) = writer.reap() {
                    error!(error = %e, "freeing drained backend ids failed");
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    info!("exiting; programs and maps stay pinned and keep routing (fail-static). `ailb teardown` removes them");
    Ok(())
}
