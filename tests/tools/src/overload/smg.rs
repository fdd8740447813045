//! The peer row: SMG's priority scheduler and tenants in front of the same servers, offered
//! the same phases (its settings are written into the report).

use super::*;

/// SMG's priority scheduler: every class's knobs (1.13.0 requires all of them once a class is
/// listed). The reservations must fit under the fleet's capacity ({SLOTS} slots here, where
/// its defaults reserve 160): `interactive` keeps a floor of 2 slots, the others none. Queues
/// and waits as ailb's: 64 waiting per class, 10 s. Preemption off, as its docs advise until
/// every handler honours the cancel. The tenants: alpha and beta may use `interactive`, batch
/// at most `bulk`; every request asks for `interactive` (`x-smg-priority`), so batch's are
/// clamped.
pub(super) const SMG_PRIORITY_YAML: &str = "\
classes:
  system: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 5, can_preempt: false}
  interactive: {reserved_floor: 2, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 5, can_preempt: false}
  default: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 30, can_preempt: false}
  bulk: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 120, can_preempt: false}
tenant_policies:
  \"header:alpha\": {max_class: interactive}
  \"header:beta\": {max_class: interactive}
  \"header:batch\": {max_class: bulk}
";

/// SMG's command line: its defaults as [`crate::compare::peers::args`] writes them for
/// `least_load` (with generic workers its pick is the fewest in-flight requests, the nearest to
/// ailb's least-loaded pick; its `cache_aware` would send these identical prompts to one server,
/// and this row compares admission, not routing), plus the priority scheduler with `yaml`
/// ([`SMG_PRIORITY_YAML`]), tenants from [`SMG_TENANT_HEADER`], and its concurrency limit at
/// the fleet's [`SLOTS`].
pub(super) fn smg_args(yaml: &Path) -> anyhow::Result<Vec<String>> {
    use crate::compare::{peers, policy::Policy};
    let workers: Vec<String> = BACKENDS.iter().map(|b| format!("http://{b}")).collect();
    let mut a = peers::args(Policy::SmgLeastLoad, SMG_LISTEN.parse()?, SMG_METRICS.parse()?, &workers);
    a.extend(["--priority-scheduler-enabled".into(), "--priority-scheduler-config".into()]);
    a.push(yaml.to_str().context("a UTF-8 temp path")?.to_string());
    a.extend(["--trust-tenant-header".into(), "--tenant-header-name".into(), SMG_TENANT_HEADER.into()]);
    a.extend(["--max-concurrent-requests".into(), SLOTS.to_string()]);
    Ok(a)
}

/// The peer row's phases, or why it was not run.
pub(super) enum SmgRun {
    Skipped(String),
    Ran {
        argv: Vec<String>,
        alone: Vec<Record>,
        over: Vec<Record>,
        shares: Vec<Record>,
        /// Its scheduler's metrics after the overload phase: `smg_scheduler_*` lines.
        scheduler: Vec<String>,
        /// The fleet sampled during its alone phase.
        alone_slots: Vec<slots::Sample>,
    },
}

/// Starts SMG in front of the fleet and offers it phases 2 to 4 (the rates of `x`).
pub(super) async fn smg_phases(x: f64, dur: Duration, dir: &Path) -> SmgRun {
    use crate::compare::{peers, policy::Policy};
    let venv = peers::smg_venv();
    if let Some(why) = peers::missing(Policy::SmgLeastLoad, &venv) {
        return SmgRun::Skipped(format!("SMG {why}"));
    }
    let yaml = dir.join("smg-priority.yaml");
    let argv =
        match std::fs::write(&yaml, SMG_PRIORITY_YAML).map_err(anyhow::Error::from).and_then(|()| smg_args(&yaml)) {
            Ok(a) => a,
            Err(e) => return SmgRun::Skipped(format!("SMG's config: {e:#}")),
        };
    let listen = match SMG_LISTEN.parse() {
        Ok(l) => l,
        Err(e) => return SmgRun::Skipped(format!("{SMG_LISTEN}: {e}")),
    };
    let started = tokio::task::block_in_place(|| {
        peers::start_with_args(Policy::SmgLeastLoad, &venv, listen, argv.clone(), BACKENDS.len(), dir)
    });
    let _smg = match started {
        Ok(p) => p,
        Err(e) => return SmgRun::Skipped(format!("SMG did not start: {e:#}")),
    };
    eprintln!("overload: SMG alone");
    let interactive = [(Tenant::Alpha, 0.6 * x), (Tenant::Beta, 0.3 * x)];
    let (alone, alone_slots) = phase_sampled(SMG_LISTEN, &interactive, dur, Some(None)).await;
    eprintln!("overload: SMG 4.5 X offered");
    let over = phase(SMG_LISTEN, &[interactive[0], interactive[1], (Tenant::Batch, 3.6 * x)], dur).await;
    let scheduler = metrics(SMG_METRICS)
        .await
        .lines()
        .filter(|l| l.starts_with("smg_scheduler_") && !l.ends_with(" 0"))
        .map(str::to_string)
        .collect();
    eprintln!("overload: SMG shares");
    let shares = phase(SMG_LISTEN, &[(Tenant::Alpha, 2.5 * x), (Tenant::Beta, 2.5 * x)], dur).await;
    SmgRun::Ran { argv, alone, over, shares, scheduler, alone_slots }
}
