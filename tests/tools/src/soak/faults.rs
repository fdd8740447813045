//! The soak's faults, one at a time on a schedule: after a warm-up, every `slot` seconds the
//! next of [`SCHEDULE`], each waited out (and recovered from) before the next one's slot.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::{
    affinity,
    fleet::{Fleet, LOW_FREE_MB},
};

/// A fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// `ailb run` SIGKILLed, restarted after [`DAEMON_DOWN`]; the pinned programs and maps route
    /// meanwhile.
    DaemonKill,
    /// An invalid config and SIGHUP (the daemon must keep running on its last good tables and
    /// log the error); then the config restored and SIGHUP.
    InvalidReload,
    /// One GPU's free memory, as its agent reads it, below every request's need, then back.
    LowMemory,
    /// A simulated GPU server SIGKILLed, restarted after the outage.
    SimKill,
    /// An agent SIGKILLed (its ephemeral instance expires), restarted once it has.
    AgentKill,
    /// rnacos SIGKILLed for the outage (60 s in a full run), then restarted.
    RegistryKill,
}

/// The order of the faults.
pub const SCHEDULE: [Fault; 6] =
    [Fault::DaemonKill, Fault::InvalidReload, Fault::LowMemory, Fault::SimKill, Fault::AgentKill, Fault::RegistryKill];

/// How long the daemon stays dead.
pub const DAEMON_DOWN: Duration = Duration::from_secs(5);

impl Fault {
    pub fn title(self) -> &'static str {
        match self {
            Self::DaemonKill => "daemon SIGKILL + restart",
            Self::InvalidReload => "SIGHUP with an invalid config",
            Self::LowMemory => "backend free memory below the need",
            Self::SimKill => "GPU server SIGKILL + restart",
            Self::AgentKill => "agent SIGKILL + restart",
            Self::RegistryKill => "rnacos SIGKILL + restart",
        }
    }
    /// A short label for the plot.
    pub fn label(self) -> &'static str {
        match self {
            Self::DaemonKill => "daemon kill",
            Self::InvalidReload => "bad SIGHUP",
            Self::LowMemory => "low memory",
            Self::SimKill => "server kill",
            Self::AgentKill => "agent kill",
            Self::RegistryKill => "rnacos kill",
        }
    }
}

/// What happened during one fault, its times in seconds since the soak started.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub fault: Fault,
    /// The fault's start (the kill, the bad SIGHUP, the memory drop).
    pub start_s: f64,
    /// The fault's end: the restart (or the restored config, the memory back).
    pub end_s: f64,
    /// Everything back as before: every GPU live in the table again.
    pub recovered_s: Option<f64>,
    /// The backend concerned, if one.
    pub backend: Option<String>,
    /// When the table first showed the backend gone (sim and agent kills).
    pub gone_s: Option<f64>,
    /// Daemon kill: whether each model's active table (its digest) and its backends' ids were
    /// the same before the kill and after the restarted daemon's first apply (`None`: not
    /// read). Equal tables and ids give every conversation the same table pick, and the daemon
    /// never writes the affinity map: then the restart itself moved no conversation.
    pub picks_kept: Option<bool>,
    /// Daemon kill: the pinned affinity map before the kill against after the restarted daemon's
    /// first apply (`None`: not read).
    pub affinity: Option<affinity::Kept>,
    /// What was seen, in words.
    pub detail: String,
}

/// Per model: its active table's digest and its backends' (id, address), from `ailb status`.
type PickState = Vec<(String, Option<String>, Vec<(u64, String)>)>;

fn pick_state(fleet: &Fleet) -> Option<PickState> {
    let st = fleet.status()?;
    st["models"]
        .as_array()?
        .iter()
        .map(|m| {
            let mut ids = m["backends"]
                .as_array()?
                .iter()
                .map(|b| Some((b["id"].as_u64()?, b["address"].as_str()?.to_string())))
                .collect::<Option<Vec<_>>>()?;
            ids.sort();
            Some((m["name"].as_str()?.to_string(), m["table_digest"].as_str().map(String::from), ids))
        })
        .collect()
}

/// Backend id -> address over every model of a [`PickState`].
fn addresses(p: &PickState) -> affinity::Addresses {
    p.iter().flat_map(|(_, _, ids)| ids.iter().map(|(id, a)| (*id as u32, a.clone()))).collect()
}

/// The table digests of a [`PickState`], in words.
fn digests(p: Option<&PickState>) -> String {
    p.map_or("unreadable".into(), |p| {
        p.iter()
            .map(|(m, d, ids)| format!("{m} table {} over {} ids", d.as_deref().unwrap_or("-"), ids.len()))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Polls `f` every 100 ms until it holds or `limit` passes: the time it first held.
fn wait_for(t0: Instant, limit: Duration, mut f: impl FnMut() -> bool) -> Option<f64> {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return Some(t0.elapsed().as_secs_f64());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one fault; `outage` is how long a server, the memory drop or rnacos stay down.
pub fn run(fault: Fault, fleet: &mut Fleet, t0: Instant, outage: Duration) -> anyhow::Result<Event> {
    let mut ev = Event {
        fault,
        start_s: t0.elapsed().as_secs_f64(),
        end_s: 0.0,
        recovered_s: None,
        backend: None,
        gone_s: None,
        picks_kept: None,
        affinity: None,
        detail: String::new(),
    };
    match fault {
        Fault::DaemonKill => daemon_kill(&mut ev, fleet, t0),
        Fault::InvalidReload => invalid_reload(&mut ev, fleet, t0),
        Fault::LowMemory => low_memory(&mut ev, fleet, t0, outage),
        Fault::SimKill => sim_kill(&mut ev, fleet, t0, outage)?,
        Fault::AgentKill => agent_kill(&mut ev, fleet, t0)?,
        Fault::RegistryKill => registry_kill(&mut ev, fleet, t0, outage),
    }
    Ok(ev)
}

/// The daemon SIGKILLed, restarted after [`DAEMON_DOWN`]; its tables, backend ids and affinity
/// entries compared before the kill and after the new daemon's first apply.
fn daemon_kill(ev: &mut Event, fleet: &mut Fleet, t0: Instant) {
    let now = || t0.elapsed().as_secs_f64();
    let n = fleet.sims.len();
    let picks_before = pick_state(fleet);
    let entries_before = affinity::read(fleet.daemon.bpffs());
    fleet.daemon.kill9();
    std::thread::sleep(DAEMON_DOWN);
    // The pins keep the last generation; the new daemon's first apply bumps it.
    let before = fleet.status().and_then(|s| s["generation"].as_u64()).unwrap_or(0);
    ev.end_s = now();
    fleet.daemon.restart();
    ev.recovered_s = wait_for(t0, Duration::from_secs(60), || {
        fleet.status().and_then(|s| s["generation"].as_u64()).is_some_and(|g| g > before) && fleet.live() == n
    });
    let applied = ev.recovered_s.map_or("not within 60 s".into(), |r| format!("{:.1} s after its start", r - ev.end_s));
    let picks_after = pick_state(fleet);
    let entries_after = affinity::read(fleet.daemon.bpffs());
    ev.picks_kept = picks_before.as_ref().zip(picks_after.as_ref()).map(|(b, a)| a == b);
    if let (Some(b), Some(a), Some(pb), Some(pa)) =
        (&entries_before, &entries_after, picks_before.as_ref(), picks_after.as_ref())
    {
        ev.affinity = Some(affinity::compare(b, a, &addresses(pb), &addresses(pa)));
    }
    let same = match ev.picks_kept {
        Some(true) => "the same as before the kill",
        Some(false) => "CHANGED from before the kill",
        None => "unreadable",
    };
    ev.detail = format!(
        "down {:.1} s; the new daemon applied a new generation with every backend live {applied}; active tables \
         and backend ids then {same} (before: {}; after: {})",
        ev.end_s - ev.start_s,
        digests(picks_before.as_ref()),
        digests(picks_after.as_ref()),
    );
}

/// An invalid config and SIGHUP; what the daemon did and logged in the next 3 s; the config
/// restored.
fn invalid_reload(ev: &mut Event, fleet: &mut Fleet, t0: Instant) {
    let now = || t0.elapsed().as_secs_f64();
    let n = fleet.sims.len();
    let log_before = fleet.daemon.log().len();
    fleet.daemon.reload_raw("[daemon\nthis is not a valid config\n");
    std::thread::sleep(Duration::from_secs(3));
    let running = fleet.daemon.is_running();
    let live = fleet.live();
    let log = fleet.daemon.log();
    let new = log.get(log_before..).unwrap_or_default();
    let logged = new.lines().find(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("error") || l.contains("warn") || l.contains("invalid")
    });
    ev.end_s = now();
    fleet.daemon.reload(&fleet.cfg.clone());
    ev.recovered_s = Some(now());
    ev.detail = format!(
        "3 s after the bad SIGHUP: daemon running {running}, {live} of {n} backends live; logged: {}",
        logged
            .map(|l| format!("`{}`", l.trim().chars().take(240).collect::<String>()))
            .unwrap_or_else(|| "nothing".into())
    );
}

/// The first GPU's free memory below every request's need for the outage.
fn low_memory(ev: &mut Event, fleet: &mut Fleet, t0: Instant, outage: Duration) {
    let now = || t0.elapsed().as_secs_f64();
    ev.backend = Some(fleet.sims[0].addr.to_string());
    fleet.low_memory(Some(0));
    std::thread::sleep(outage);
    fleet.low_memory(None);
    ev.end_s = now();
    ev.recovered_s = Some(now());
    ev.detail = format!("{} reported {LOW_FREE_MB} MB free for {:.0} s", fleet.sims[0].addr, outage.as_secs_f64());
}

/// The last GPU server SIGKILLed, restarted once the outage has passed.
fn sim_kill(ev: &mut Event, fleet: &mut Fleet, t0: Instant, outage: Duration) -> anyhow::Result<()> {
    let now = || t0.elapsed().as_secs_f64();
    let n = fleet.sims.len();
    let i = n - 1;
    ev.backend = Some(fleet.sims[i].addr.to_string());
    fleet.kill_sim(i);
    ev.gone_s = wait_for(t0, Duration::from_secs(30), || fleet.live() < n);
    let left = outage.saturating_sub(Duration::from_secs_f64(now() - ev.start_s));
    std::thread::sleep(left);
    ev.end_s = now();
    fleet.restart_sim(i).context("restarting the killed GPU server")?;
    ev.recovered_s = wait_for(t0, Duration::from_secs(60), || fleet.live() == n);
    ev.detail = detail_gone(ev, "server");
    Ok(())
}

/// The second-to-last GPU's agent SIGKILLed, restarted once the table has dropped its backend.
fn agent_kill(ev: &mut Event, fleet: &mut Fleet, t0: Instant) -> anyhow::Result<()> {
    let now = || t0.elapsed().as_secs_f64();
    let n = fleet.sims.len();
    let i = n - 2;
    ev.backend = Some(fleet.sims[i].addr.to_string());
    fleet.kill_agent(i);
    ev.gone_s = wait_for(t0, Duration::from_secs(90), || fleet.live() < n);
    ev.end_s = now();
    fleet.restart_agent(i).context("restarting the killed agent")?;
    ev.recovered_s = wait_for(t0, Duration::from_secs(60), || fleet.live() == n);
    ev.detail = detail_gone(ev, "agent");
    Ok(())
}

/// rnacos SIGKILLed for the outage, the live backends watched meanwhile, then restarted.
fn registry_kill(ev: &mut Event, fleet: &mut Fleet, t0: Instant, outage: Duration) {
    let now = || t0.elapsed().as_secs_f64();
    let n = fleet.sims.len();
    fleet.nacos.stop();
    let mut min_live = n;
    let until = Instant::now() + outage;
    while Instant::now() < until {
        min_live = min_live.min(fleet.live());
        std::thread::sleep(Duration::from_millis(500));
    }
    ev.end_s = now();
    fleet.nacos.restart();
    ev.recovered_s = wait_for(t0, Duration::from_secs(90), || fleet.live() == n);
    ev.detail = format!("down {:.0} s; fewest live backends meanwhile: {min_live} of {n}", ev.end_s - ev.start_s);
}

/// "the table dropped it after X s; live again Y s after the restart".
fn detail_gone(ev: &Event, what: &str) -> String {
    let gone = ev.gone_s.map_or("never (within the wait)".to_string(), |g| format!("after {:.1} s", g - ev.start_s));
    let back =
        ev.recovered_s.map_or("not within 60 s".to_string(), |r| format!("{:.1} s after the restart", r - ev.end_s));
    format!(
        "{what} of {} killed: the table dropped the backend {gone}; live again {back}",
        ev.backend.as_deref().unwrap_or("?")
    )
}
