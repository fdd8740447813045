//! The soak's report: `soak.md` (every number from the run, the goals met or not), the
//! timeline `soak-timeline.svg` and the data behind both, `soak-data.json`.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use serde_json::json;

use super::affinity;
use super::analyze::{self, classify, continuity, growth, inflight_check, Class, DETECT_S, TURN_WINDOW_S};
use super::faults::{Event, Fault, DAEMON_DOWN};
use super::fleet::{AGENT_PUBLISH, LOW_FREE_MB, NACOS_POLL};
use super::load::{Entry, Rec};
use super::sample::MAX_TRIES;
use super::{plot, Args, SoakRun};
use ailb_sim::BLOCK_TOKENS;

/// The growth allowed to RSS and fds after warm-up, percent.
pub const FLAT_PCT: f64 = 10.0;

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

/// The command that reproduces a run of `minutes`.
pub fn command(args: &Args, extra: &str) -> String {
    let mut c = args.reproduce.clone();
    if (args.minutes - 20.0).abs() > f64::EPSILON {
        let _ = write!(c, " --minutes {}", args.minutes);
    }
    c.push_str(extra);
    c
}

/// Writes the report, the timeline and the data under `--out-dir`; returns the Markdown.
pub fn write(args: &Args, run: &SoakRun) -> anyhow::Result<String> {
    let md = markdown(args, run);
    let dir = &args.out_dir;
    std::fs::write(dir.join("soak-timeline.svg"), plot::timeline_svg(run)?).context("writing soak-timeline.svg")?;
    let data = json!({
        "plan": run.plan, "events": run.events, "samples": run.samples,
        "final_inflight": run.final_inflight, "final_open": run.final_open,
        "requests": run.records.len(),
    });
    std::fs::write(dir.join("soak-data.json"), format!("{data:#}\n")).context("writing soak-data.json")?;
    Ok(md)
}

fn markdown(args: &Args, run: &SoakRun) -> String {
    let mut md = String::new();
    let p = &run.plan;
    let _ = writeln!(md, "# Chaos soak\n");
    if args.minutes < 20.0 {
        let _ = writeln!(md, "**A short run of {:.0} minutes, not the 20-minute soak.**\n", args.minutes);
    }
    let _ = writeln!(
        md,
        "Reproduce (as root, from the repository root): `{}`. Written by `ailb-soak` (`tests/tools/src/soak/`).\n",
        command(args, "")
    );
    let _ = writeln!(
        md,
        "Fleet: {} x A100-80GB + {} x RTX 3090 simulated GPUs (`ailb-sim`, time scale {}), rnacos, one `ailb agent` per \
         GPU (publishing every {AGENT_PUBLISH}), `ailb run` with Nacos discovery (polled every {NACOS_POLL}), the \
         AI-aware policy, affinity and the load bound, attached to a child cgroup; `ailb gateway` inside it. Load: the \
         Mooncake conversation trace looped at {:.2} of its rate (speed {}: the default fleet's stable load, \
         `ailb-fleet-model`) for {:.0} s, its conversations split by a hash of their id between {}. Faults: one every \
         {:.0} s from {:.0} s; servers, \
         memory and rnacos stay down {:.0} s; the daemon {} s.\n",
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.load,
        run.speed,
        p.duration_s,
        streams(args, run),
        p.slot_s,
        p.warm_s,
        p.outage_s,
        DAEMON_DOWN.as_secs()
    );
    goals(&mut md, run);
    faults(&mut md, run);
    requests(&mut md, run);
    tc_flows(&mut md, run);
    low_memory(&mut md, run);
    footprints(&mut md, run);
    let _ = writeln!(md, "![timeline](soak-timeline.svg)\n");
    md
}

/// The TC share's requests left out, in words.
fn tc_left_out(run: &SoakRun) -> String {
    let (out, all) = run.tc_left_out;
    if run.split.tc_max_blocks == 0 {
        return format!(
            "Every request of the TC share is sent (`--tc-all-requests`), also the {out} of {all} that need more KV \
             cache than the smallest GPU holds: the TC path sees a SYN, not the request, so it cannot keep them off \
             that GPU."
        );
    }
    format!(
        "The TC path sees a SYN, not the request, so it cannot keep a long context off a GPU too small for it (the \
         socket ABI tags the need, the front door reads it from the body): of the TC share's {all} requests, the {out} \
         ({:.1} %) that need more than the smallest GPU's pool ({} blocks of {BLOCK_TOKENS} tokens, prompt and output) \
         are not sent (`--tc-all-requests` sends them; on an RTX 3090 they fail with HTTP 400).",
        out as f64 * 100.0 / all.max(1) as f64,
        run.split.tc_max_blocks
    )
}

/// The entry points in words, for the fleet's paragraph.
fn streams(args: &Args, run: &SoakRun) -> String {
    let abi_fd = "the **socket ABI** (tagged connects to the VIP from the cgroup) and the **front door** (plain HTTP \
                  to the gateway)";
    if run.split.tc_lanes == 0 {
        return format!(
            "{abi_fd}. The **TC datapath** (remote clients) is not driven in this run (`--no-tc`): everything runs on \
             the host's loopback"
        );
    }
    format!(
        "{abi_fd}, a third each, and **TC** (remote clients: plain HTTP from a client network namespace to a TC VIP, \
         the kernel's TC program on the gateway namespace's veths picking the backend at the SYN, masquerade mode), \
         the last third, over {} client addresses, each with a VIP and a load worker of its own, each conversation \
         always from the same address (the model has `remote_affinity = \"client_address\"`: the TC path keeps a \
         client address, not a conversation, on its backend; it sees no conversation id). Topology \
         (`tests/tools/src/soak/net.rs`): client namespace -- veth -- gateway namespace (rnacos, the agents, `ailb \
         run`, `ailb gateway`, the socket-ABI and front-door workers, their loopback addresses as on a host) -- veth \
         -- backends namespace (the servers on 10.201.2.x), all made by the soak and deleted after it. {} {}",
        run.split.tc_lanes,
        tc_left_out(run),
        if args.tc_client_no_gso {
            "The clients' veth sends one TCP segment per packet (`gso_max_segs 1`, `--tc-client-no-gso`)"
        } else {
            "The clients' veth sends GSO packets as the kernel makes them (up to 64 KB, many segments each), which \
             the TC path forwards as they are"
        }
    )
}

fn goals(md: &mut String, run: &SoakRun) {
    let _ = writeln!(md, "## Goals\n\n| goal | measured | |\n| --- | --- | --- |");
    failure_goals(md, run);
    for e in run.events.iter().filter(|e| e.fault == Fault::DaemonKill) {
        restart_goal(md, run, e);
    }
    inflight_goals(md, run);
    footprint_goal(md, run);
    goals_reading(md, run);
}

/// The failed requests: none that a healthy backend could have served, and those that met a
/// dead server bounded by the time the table takes to drop it.
fn failure_goals(md: &mut String, run: &SoakRun) {
    let failed: Vec<&Rec> = run.records.iter().filter(|r| !r.ok).collect();
    let avoidable = failed.iter().filter(|r| classify(r, &run.events) == Class::Avoidable).count();
    let dead = failed.len() - avoidable;
    let _ = writeln!(
        md,
        "| 0 failed requests that a healthy backend could have served | {avoidable} of {} requests | {} |",
        run.records.len(),
        met(avoidable == 0)
    );
    let kills: Vec<f64> = run
        .events
        .iter()
        .filter(|e| e.fault == Fault::SimKill)
        .map(|e| e.gone_s.map_or(f64::INFINITY, |g| g - e.start_s))
        .collect();
    let detect = kills.iter().map(|d| format!("{d:.1} s")).collect::<Vec<_>>().join(", ");
    if kills.is_empty() {
        let _ = writeln!(md, "| failures that met a dead server | no GPU server was killed in this run | - |");
    } else {
        let _ = writeln!(
            md,
            "| failures that met a dead server bounded by the health and poll intervals: the table drops a killed \
             server within {DETECT_S} s (agent health probe every {AGENT_PUBLISH}, Nacos write timeout 500 ms, daemon \
             poll {NACOS_POLL}); only requests in flight on it or sent within those {DETECT_S} s count here | {dead} \
             failures; the table dropped the killed server after {detect} | {} |",
            met(kills.iter().all(|d| *d <= DETECT_S))
        );
    }
}

/// The daemon restart `e`: the goal (the kernel's affinity entries kept), then its context
/// (the tables across the restart and without it, the conversations' next turns).
fn restart_goal(md: &mut String, run: &SoakRun, e: &Event) {
    let kept = match &e.affinity {
        Some(a) => format!(
            "{} of {} affinity entries that no request used during the restart came back with the same backend \
             (id and address); of the {} entries before the kill, {} used meanwhile kept their backend and {} were \
             re-picked by the kernel (its load bound or memory fit, not the daemon)",
            a.untouched_kept,
            a.untouched_kept + a.untouched_lost,
            a.before,
            a.touched_same,
            a.touched_moved
        ),
        None => "the affinity map could not be read around the restart".into(),
    };
    let _ = writeln!(
        md,
        "| 100 % of conversations keep their backend across the daemon restart at {:.0} s: every conversation the \
         kernel keeps on a backend (its affinity entry) keeps it; the restart itself moves none | {kept} | {} |",
        e.start_s,
        met(e.affinity.as_ref().is_some_and(affinity::Kept::met))
    );
    let tables = match e.picks_kept {
        Some(true) => "the same before the kill and after the restarted daemon's first apply",
        Some(false) => "changed between the kill and the restarted daemon's first apply (details under Faults)",
        None => "not read",
    };
    let _ = writeln!(
        md,
        "| (context, not the goal) the active tables and backend ids across the restart: they decide only new \
         conversations' first picks | {tables} | - |"
    );
    let restart = e.recovered_s.unwrap_or(e.end_s);
    table_moves_row(md, run, e, restart);
    turns_row(md, run, e, restart);
}

/// Context of a restart: how often the telemetry moved the tables away from it.
fn table_moves_row(md: &mut String, run: &SoakRun, e: &Event, restart: f64) {
    let moves = analyze::table_moves(&run.samples, e.start_s, restart - e.start_s + 2.0);
    if moves.minutes > 0.0 {
        let seen = match moves.after_seen_before {
            Some(true) => "one of those the old daemon had applied in the same length of time before the kill",
            Some(false) => "none of those the old daemon had applied in the same length of time before the kill",
            None => "not sampled",
        };
        let _ = writeln!(
            md,
            "| (context, not the goal) the active tables without the restart: the telemetry moves them | the \
             samples saw the tables change {} times in {:.1} minutes away from the restart ({:.1} a minute); the \
             tables after the restart were {seen} | - |",
            moves.changes,
            moves.minutes,
            moves.changes as f64 / moves.minutes
        );
    }
}

/// Context of a restart: per entry point, the conversations whose next turn kept its backend
/// across the restart and across a cut without a fault.
fn turns_row(md: &mut String, run: &SoakRun, e: &Event, restart: f64) {
    let mut turns = Vec::new();
    for entry in run.entries() {
        let c = continuity(&run.records, entry, e.start_s, TURN_WINDOW_S.max(restart - e.start_s + 5.0));
        // The baseline: a cut halfway to the next fault, where nothing happens.
        let base = continuity(&run.records, entry, e.start_s + run.plan.slot_s / 2.0, TURN_WINDOW_S);
        turns.push(format!(
            "{}: {} of {} ({}) across the restart, {} of {} ({}) across a cut {:.0} s later without a fault",
            entry.title(),
            c.kept,
            c.conversations,
            fmt_pct(c.percent()),
            base.kept,
            base.conversations,
            fmt_pct(base.percent()),
            run.plan.slot_s / 2.0,
        ));
    }
    let _ = writeln!(
        md,
        "| (context, not the goal) conversations whose next turn went to the backend of their last turn | {} | - |",
        turns.join("; ")
    );
}

/// The kernel's in-flight count: equal to the open connections at every sample, 0 at the end.
fn inflight_goals(md: &mut String, run: &SoakRun) {
    let ic = inflight_check(run.samples.iter());
    let _ = writeln!(
        md,
        "| the kernel's in-flight count equals the open connections at every sample | equal at {} of {} samples \
         ({} needed more than one listing, {:.2} listings a sample on average, at most {} of {MAX_TRIES}); \
         largest gap of a sample that never agreed: {} | {} |",
        ic.equal,
        ic.samples,
        ic.retried,
        ic.tries as f64 / ic.samples.max(1) as f64,
        ic.max_tries,
        ic.max_gap,
        met(ic.samples > 0 && ic.equal == ic.samples)
    );
    let _ = writeln!(
        md,
        "| in-flight exactly 0 at the end | {} (open connections then: {}) | {} |",
        run.final_inflight.map_or("unreadable".into(), |v| v.to_string()),
        run.final_open,
        met(run.final_inflight == Some(0))
    );
}

/// The processes' RSS and open fds flat after the warm-up.
fn footprint_goal(md: &mut String, run: &SoakRun) {
    let g = growth(&run.samples, run.plan.warm_s);
    let flat = g.iter().filter(|g| g.flat(FLAT_PCT)).count();
    let _ = writeln!(
        md,
        "| RSS and open fds of the daemon, the gateway and the agents flat after warm-up: no growth above {FLAT_PCT:.0} % \
         (RSS median, fds floor) | {flat} of {} processes (table below) | {} |\n",
        g.len(),
        met(!g.is_empty() && flat == g.len())
    );
}

/// How to read the goals: how a sample is taken, and what the restart's rows can and cannot
/// tell.
fn goals_reading(md: &mut String, run: &SoakRun) {
    let rate = run.records.len() as f64 / run.plan.duration_s.max(1.0);
    let _ = writeln!(
        md,
        "Reading them: the in-flight count and the connections cannot be read at one instant, while about {rate:.0} \
         requests a second open and close connections. So a sample is one listing of the cgroup's connections to the \
         backends (`ss`) between two reads of the kernel's counters (the pinned `AILB_INFLIGHT` of every backend id \
         listed in the run, summed, microseconds each), taken again, up to {MAX_TRIES} times, until both reads equal the \
         listing's count: the counters and the open connections were then the same when the listing began and when it \
         ended. A leak, or a connection counted twice or never, shows as samples that never agree and as a count above \
         0 once the load has drained. The front door runs with \
         `upstream_reuse = \"never\"` here: the kernel does not count the pool's idle connections, and nothing outside the \
         gateway can tell them from busy ones.{} A conversation's turns may go to different backends without any fault (the \
         load bound, the memory fit, and the table following the telemetry move them; the cut without a fault measures how \
         often), so turns across a restart cannot tell what the restart did; nor can the tables, which the telemetry rewrites \
         without any fault. What a restart could break is the kernel's own state, which the goal's row compares: the \
         pinned affinity map read just before the kill and after the restarted daemon's first apply; an entry no \
         request used in between must come back with the same backend id, naming the same address (a daemon that \
         recreated the map, or renumbered its backends, fails it).\n",
        tc_listing(run)
    );
}

/// What the listing counts of the TC stream, in words (empty without it).
fn tc_listing(run: &SoakRun) -> String {
    let Some(peak) = run.samples.iter().filter_map(|s| s.open_tc).max() else { return String::new() };
    let mean = run.samples.iter().filter_map(|s| s.open_tc).sum::<u64>() as f64 / run.samples.len().max(1) as f64;
    format!(
        " With the TC stream the counters also count its flows (from the SYN the TC program forwards to the first FIN \
         or RST), and the listing also counts the remote clients' ESTABLISHED sockets to the TC VIPs in the client \
         namespace (`ss -N`): {mean:.1} of them a sample on average, {peak} at most."
    )
}

fn fmt_pct(p: Option<f64>) -> String {
    p.map_or("-".into(), |p| format!("{p:.1} %"))
}

fn faults(md: &mut String, run: &SoakRun) {
    let _ = writeln!(md, "## Faults\n\n| fault | start, s | end, s | all live again, s | what was seen |\n| --- | --- | --- | --- | --- |");
    for e in &run.events {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {} | {} |",
            e.fault.title(),
            e.start_s,
            e.end_s,
            e.recovered_s.map_or("-".into(), |r| format!("{r:.1}")),
            e.detail.replace('|', "/")
        );
    }
    md.push('\n');
}

fn requests(md: &mut String, run: &SoakRun) {
    let _ = writeln!(
        md,
        "## Requests\n\n| entry point | requests | failed | of which a healthy backend could have served | e2e p50 / p95 / p99, ms | sent late p99, ms |\n| --- | --- | --- | --- | --- | --- |"
    );
    for entry in run.entries() {
        let rs: Vec<&Rec> = run.records.iter().filter(|r| r.entry == entry).collect();
        let failed: Vec<&&Rec> = rs.iter().filter(|r| !r.ok).collect();
        let avoidable = failed.iter().filter(|r| classify(r, &run.events) == Class::Avoidable).count();
        let e2e: Vec<f64> = rs.iter().filter(|r| r.ok).map(|r| r.e2e_ms).collect();
        let late: Vec<f64> = rs.iter().map(|r| r.late_ms).collect();
        let q = |v: &[f64], p| analyze::percentile(v, p).map_or("-".into(), |x| format!("{x:.0}"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {avoidable} | {} / {} / {} | {} |",
            entry.title(),
            rs.len(),
            failed.len(),
            q(&e2e, 50.0),
            q(&e2e, 95.0),
            q(&e2e, 99.0),
            q(&late, 99.0)
        );
    }
    let mut kinds: BTreeMap<(String, &str, &str), usize> = BTreeMap::new();
    for r in run.records.iter().filter(|r| !r.ok) {
        let class = match classify(r, &run.events) {
            Class::Avoidable => "a healthy backend could have served",
            Class::DeadServer => "met a dead server",
        };
        let err = r.error.clone().unwrap_or_else(|| format!("HTTP {:?}", r.status));
        let short: String = err.chars().filter(|c| !c.is_ascii_digit() || err.starts_with("HTTP")).take(90).collect();
        *kinds.entry((short, r.entry.title(), class)).or_default() += 1;
    }
    let avoidable: Vec<&Rec> =
        run.records.iter().filter(|r| !r.ok && classify(r, &run.events) == Class::Avoidable).collect();
    if !avoidable.is_empty() {
        let _ = writeln!(
            md,
            "\nThe failures a healthy backend could have served (the first 40):\n\n| sent, s | entry point | backend | error |\n| --- | --- | --- | --- |"
        );
        for r in avoidable.iter().take(40) {
            let err = r.error.clone().unwrap_or_default().chars().take(160).collect::<String>();
            let _ = writeln!(
                md,
                "| {:.1} | {} | {} | `{}` |",
                r.sent_s,
                r.entry.title(),
                r.backend.as_deref().unwrap_or("-"),
                err.replace('|', "/").replace('`', "'")
            );
        }
    }
    if !kinds.is_empty() {
        let _ = writeln!(md, "\nFailures by error (digits removed):\n\n| error | entry point | class | count |\n| --- | --- | --- | --- |");
        for ((err, entry, class), n) in &kinds {
            let _ = writeln!(md, "| `{}` | {entry} | {class} | {n} |", err.replace('|', "/").replace('`', "'"));
        }
    }
    md.push('\n');
}

/// The TC datapath's flow table and counters once the load had drained.
fn tc_flows(md: &mut String, run: &SoakRun) {
    let Some(tc) = &run.final_tc else { return };
    let n = |v: &serde_json::Value| v.as_u64().map_or("-".into(), |x| x.to_string());
    let st = &tc["stats"];
    let tc_requests = run.records.iter().filter(|r| r.entry == Entry::Tc).count();
    let _ = writeln!(
        md,
        "## TC flows\n\nThe TC program's flow table and counters (`ailb status`, `tc`) once the load had drained: \
         {tc_requests} TC requests, one connection each. Flows opened {}, closed {} (of which an RST ended {}, the idle \
         reclaim {}); left in the table: {} flows, {} counted, {} NAT ports. SYNs dropped: flow table full {}, no NAT \
         port {}, refused by the pick {}; malformed packets {}. Packets redirected {}, handed to the stack {}.\n",
        n(&st["flows_opened"]),
        n(&st["flows_closed"]),
        n(&st["ended_rst"]),
        n(&st["ended_idle"]),
        n(&tc["flows"]),
        n(&tc["counted"]),
        n(&tc["nat_ports"]),
        n(&st["flows_full"]),
        n(&st["nat_exhausted"]),
        n(&st["refused"]),
        n(&st["malformed"]),
        n(&st["redirected"]),
        n(&st["to_stack"]),
    );
    let peak_tc = run.samples.iter().filter_map(|s| Some((s.open_tc?, s.t_s))).max_by_key(|p| p.0);
    let peak_one = run
        .samples
        .iter()
        .flat_map(|s| s.inflight_by_backend.iter().map(move |(b, n)| (*n, b.as_str(), s.t_s)))
        .max_by_key(|p| p.0);
    if let (Some((tc, t_tc)), Some((one, b, t_one))) = (peak_tc, peak_one) {
        let _ = writeln!(
            md,
            "The remote clients' open connections peaked at {tc} (at {t_tc:.0} s); the most connections in flight \
             on one backend at a sample: {one} on {b} (at {t_one:.0} s). Client-address affinity is kept while the \
             backend is live and under its cap, whatever its load (the load bound applies to a fresh pick only), so \
             the conversations of one client address stay on its backend however long its queue.\n"
        );
    }
}

/// Where the low-memory backend's requests went: served by it during the fault, and in an
/// equal window just before.
fn low_memory(md: &mut String, run: &SoakRun) {
    let Some(e) = run.events.iter().find(|e| e.fault == Fault::LowMemory) else { return };
    let Some(b) = e.backend.as_deref() else { return };
    let share = |from: f64, to: f64, entry: Entry| {
        let rs: Vec<&Rec> =
            run.records.iter().filter(|r| r.entry == entry && r.ok && r.sent_s >= from && r.sent_s < to).collect();
        (rs.iter().filter(|r| r.backend.as_deref() == Some(b)).count(), rs.len())
    };
    let len = e.end_s - e.start_s;
    // The agent publishes within a publish interval and the daemon polls 100 ms later.
    let during_from = e.start_s + 1.0;
    let _ = writeln!(
        md,
        "## Free memory below the need\n\n{b} reported {LOW_FREE_MB} MB free from {:.0} s to {:.0} s. Requests answered by it \
         (from 1 s after the drop, for the table to learn it), against the same length of time just before:\n\n\
         | entry point | before | during |\n| --- | --- | --- |",
        e.start_s,
        e.end_s
    );
    for entry in run.entries() {
        let (b0, n0) = share(e.start_s - len, e.start_s, entry);
        let (b1, n1) = share(during_from, e.end_s, entry);
        let _ = writeln!(md, "| {} | {b0} of {n0} | {b1} of {n1} |", entry.title());
    }
    md.push('\n');
}

fn footprints(md: &mut String, run: &SoakRun) {
    let _ = writeln!(
        md,
        "## Footprints after warm-up\n\nPer process, over the longest run of samples in which it kept its pid after {:.0} s (a \
         process restarted by a fault starts afresh). RSS: median of the first and last tenth, and the peak. Open fds: \
         median of the first and last tenth and the peak, which follow the connections of the moment (a request in \
         flight holds one or two), and the floor, the fewest in each tenth: what the process holds besides, which a leak \
         raises. Met when neither the RSS median nor the fds' floor ends more than {FLAT_PCT:.0} % above where it \
         started: a leak shows as growth; a fall (back towards the idle baseline after a busy start) is shown, and is \
         no growth.\n\n\
         | process | samples | RSS start -> end (peak), MiB | change | fds start -> end (peak) | change | fds floor start -> end | change | no growth above {FLAT_PCT:.0} % |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        run.plan.warm_s
    );
    for g in growth(&run.samples, run.plan.warm_s) {
        let mib = |kb: u64| kb as f64 / 1024.0;
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} -> {:.1} ({:.1}) | {:+.1} % | {} -> {} ({}) | {:+.1} % | {} -> {} | {:+.1} % | {} |",
            g.role,
            g.samples,
            mib(g.rss_start_kb),
            mib(g.rss_end_kb),
            mib(g.rss_max_kb),
            g.rss_pct(),
            g.fds_start,
            g.fds_end,
            g.fds_max,
            g.fds_pct(),
            g.fds_floor_start,
            g.fds_floor_end,
            g.fds_floor_pct(),
            met(g.flat(FLAT_PCT))
        );
    }
    md.push('\n');
}
