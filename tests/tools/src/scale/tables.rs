//! Sections 1 and 2: the writer against freshly loaded, pinned maps (no programs attached).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ailb_userspace::{
    config::{Config, ValidConfig},
    datapath::{self, memory::read_memory, Writer},
    discovery::from_static,
    policy::{plan, Plan, PolicyState},
};
use anyhow::Context;

use super::{backend, model, say, PER_MODEL};

/// The config text of `n` models of [`PER_MODEL`] backends; backend `j` of model `i` has weight
/// `1 + (i + j + shift) % 3`, so that a new `shift` changes every model's weights.
fn config_text(n: usize, shift: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let (name, vip) = model(i);
        let _ = writeln!(s, "[[services]]\nmodel = \"{name}\"\nvip = \"{vip}\"\n");
        for j in 0..PER_MODEL {
            let w = 1 + (i + j + shift) % 3;
            let _ = writeln!(s, "[[backends]]\nmodel = \"{name}\"\naddress = \"{}\"\nweight = {w}\n", backend(j));
        }
    }
    s
}

fn valid(n: usize, shift: usize) -> anyhow::Result<ValidConfig> {
    Ok(Config::parse(&config_text(n, shift), "scale-bench")?.validate()?)
}

fn plan_of(cfg: &ValidConfig, state: &mut PolicyState) -> Plan {
    plan(&from_static(&cfg.backends), &cfg.models, &cfg.policy, state)
}

/// Pinned maps in a directory of their own, removed on drop.
struct Pins(PathBuf);

impl Pins {
    fn load(cfg: &ValidConfig) -> anyhow::Result<(Self, Writer)> {
        let dir = PathBuf::from(ailb_tests::test_bpffs("scale-bench"));
        let opened =
            datapath::open_or_load(&dir, &cfg.limits).with_context(|| format!("loading into {}", dir.display()))?;
        Ok((Self(dir), Writer::new(opened.maps)?))
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if let Err(e) = datapath::teardown(&self.0) {
            eprintln!("teardown of {}: {e}", self.0.display());
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Section 1: the first apply of 10, 100 and 1,024 models, and the kernel memory then.
pub(super) fn write_and_memory(report: &mut String) -> anyhow::Result<()> {
    let _ = writeln!(
        report,
        "## Table write time and kernel memory\n\n{PER_MODEL} backends per model; the first apply into fresh maps \
         (build every table and write it, one map update per 4 KiB chunk), median of 3. Memory: what the kernel charges \
         for every ailb map (`memlock`), with the default `[limits]` (24 MiB table arena, 256 KiB member arena).\n\n\
         | models | apply, ms | table arena in use | kernel memory, all maps | per model | per backend | per affinity entry |\n\
         |---:|---:|---:|---:|---:|---:|---:|"
    );
    for n in [10, 100, 1024] {
        let cfg = valid(n, 0)?;
        let p = plan_of(&cfg, &mut PolicyState::default());
        let mut times = Vec::new();
        let mut mem = None;
        for _ in 0..3 {
            let (pins, mut writer) = Pins::load(&cfg)?;
            let started = Instant::now();
            writer.apply(&p, &cfg.balancer)?;
            times.push(started.elapsed());
            let ((t, _), (m, _)) = writer.arena_use();
            mem = Some(read_memory(&pins.0, (t, m))?);
        }
        times.sort();
        let k = mem.expect("three runs");
        say(&format!("{n} models: apply {:.1} ms, kernel memory {} B", ms(times[1]), k.total_bytes));
        let _ = writeln!(
            report,
            "| {n} | {:.1} | {:.1} MiB | {:.1} MiB | {} B + its table | {} B | {} B |",
            ms(times[1]),
            k.table_arena.used as f64 * 4.0 / f64::from(1 << 20),
            k.total_bytes as f64 / f64::from(1 << 20),
            k.per_model_bytes,
            k.per_backend_bytes,
            k.per_affinity_entry_bytes
        );
    }
    Ok(())
}

/// Section 2: 1,000 models x 16 backends, every weight changed: snapshot + plan + apply
/// (timed together, each part shown), median of 5.
pub(super) fn recompute(report: &mut String) -> anyhow::Result<()> {
    let n = 1000;
    let cfgs = [valid(n, 0)?, valid(n, 1)?];
    let (_pins, mut writer) = Pins::load(&cfgs[0])?;
    let mut state = PolicyState::default();
    writer.apply(&plan_of(&cfgs[0], &mut state), &cfgs[0].balancer)?;
    let mut runs = Vec::new();
    // `AILB_RECOMPUTE_RUNS` (default 5): more runs for a profile of this section alone.
    let n_runs: usize =
        std::env::var("AILB_RECOMPUTE_RUNS").ok().and_then(|v| v.parse().ok()).filter(|&r| r > 0).unwrap_or(5);
    for k in 1..=n_runs {
        let cfg = &cfgs[k % 2];
        let started = Instant::now();
        let snapshot = from_static(&cfg.backends);
        let snapped = started.elapsed();
        let p = plan(&snapshot, &cfg.models, &cfg.policy, &mut state);
        drop(snapshot);
        let planned = started.elapsed();
        let r = writer.apply(&p, &cfg.balancer)?;
        let total = started.elapsed();
        anyhow::ensure!(r.tables_rebuilt.len() == n, "{} of {n} tables rebuilt", r.tables_rebuilt.len());
        runs.push((total, snapped, planned));
    }
    runs.sort();
    let (total, snapped, planned) = runs[runs.len() / 2];
    let (fastest, slowest) = (runs[0].0, runs[runs.len() - 1].0);
    say(&format!(
        "recompute of {n} models: {:.1} ms, median of {n_runs} ({:.1} to {:.1}; snapshot {:.1} ms, plan {:.1} ms, \
         apply {:.1} ms)",
        ms(total),
        ms(fastest),
        ms(slowest),
        ms(snapped),
        ms(planned - snapped),
        ms(total - planned)
    ));
    let _ = writeln!(
        report,
        "\n## Recompute of {n} models x {PER_MODEL} backends\n\nEvery backend's weight changed, so every table is \
         rebuilt and swapped: the static source's snapshot, `policy::plan` and `Writer::apply`, median of {n_runs}: \
         **{:.1} ms** ({:.1} to {:.1}; snapshot {:.1} ms, plan {:.1} ms, apply {:.1} ms: tables built on {} cores \
         while the ones built are written and swapped). Goal: under 100 ms.",
        ms(total),
        ms(fastest),
        ms(slowest),
        ms(snapped),
        ms(planned - snapped),
        ms(total - planned),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    );
    Ok(())
}
