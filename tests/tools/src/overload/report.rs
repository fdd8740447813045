//! The bench's report: the phases' tables, the goals as measured, the peer's row and where the
//! fleet's slots went.

use super::*;

pub(super) fn percentile(mut v: Vec<Duration>, p: f64) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

pub(super) fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

pub(super) fn ttfts(records: &[Record], interactive: bool) -> Vec<Duration> {
    records.iter().filter(|r| (r.tenant != Tenant::Batch) == interactive).filter_map(|r| r.ttft).collect()
}

pub(super) fn count(records: &[Record], tenant: Tenant, status: impl Fn(u16) -> bool) -> usize {
    records.iter().filter(|r| r.tenant == tenant && status(r.status)).count()
}

/// The alone phase router by router: the interactive TTFT per tenant, and where the fleet's
/// slots went (`rows`: name, records, samples).
pub(super) fn render_slots(r: &mut String, rows: &[(&str, &[Record], &[slots::Sample])]) {
    let per_server = (SLOTS / BACKENDS.len()) as u64;
    let limit = u64::from(FREE_MB) * BACKENDS.len() as u64;
    let _ = writeln!(r, "\n## The alone phase (0.9 X), router by router\n");
    let _ = writeln!(
        r,
        "The same arrivals (same seeds) to each. The plain front door has the same admission without tenants: its \
         queue is first come, first served, as SMG's servers' queues are.\n"
    );
    let _ = writeln!(r, "| router | TTFT p50 ms | TTFT P95 ms | alpha P95 ms | beta P95 ms | served |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for (name, records, _) in rows {
        let of = |t: Tenant| records.iter().filter(|x| x.tenant == t).filter_map(|x| x.ttft).collect::<Vec<_>>();
        let _ = writeln!(
            r,
            "| {name} | {} | {} | {} | {} | {} |",
            ms(percentile(ttfts(records, true), 0.5)),
            ms(percentile(ttfts(records, true), 0.95)),
            ms(percentile(of(Tenant::Alpha), 0.95)),
            ms(percentile(of(Tenant::Beta), 0.95)),
            records.iter().filter(|x| x.status == 200).count(),
        );
    }
    let _ = writeln!(
        r,
        "\nWhere the fleet's slots went (each server's `/sim/state` every {} ms). Shares of the sampled time unless \
         in requests. *Held*: requests sent and at no server (waiting in the router, or on their way). *Slot idle \
         while held*: a server had a free slot while the router held a request; *queued beside room*: a server \
         queued a request while the other had a free slot. *Kernel excess*: the kernel's connections in flight \
         less the servers' running and queued requests; *kernel full*: its hinted memory left no room for a \
         request while a server had a free slot.\n",
        slots::EVERY.as_millis()
    );
    let _ = writeln!(
        r,
        "| router | samples | slots busy | held (mean) | queued at servers (mean) | slot idle while held | idle slots while held (mean) | queued beside room | kernel excess (mean) | kernel full, slot free |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|---|");
    for (name, _, samples) in rows {
        let s = slots::summarize(samples, per_server, limit, u64::from(NEED_MB));
        let opt = |v: Option<f64>, pct: bool| match v {
            Some(v) if pct => format!("{:.1} %", v * 100.0),
            Some(v) => format!("{v:.3}"),
            None => "-".into(),
        };
        let _ = writeln!(
            r,
            "| {name} | {} | {:.1} % | {:.2} | {:.2} | {:.1} % | {:.3} | {:.1} % | {} | {} |",
            s.samples,
            s.busy * 100.0,
            s.held,
            s.queued,
            s.idle_while_held * 100.0,
            s.idle_slots_while_held,
            s.queued_beside_room * 100.0,
            opt(s.kernel_excess, false),
            opt(s.kernel_full_slot_free, true),
        );
    }
}

#[expect(clippy::too_many_arguments, reason = "each phase's results, rendered side by side once")]
pub(super) fn render(
    x: f64,
    dur: Duration,
    lag: u64,
    alone: &[Record],
    over: &[Record],
    inversions: f64,
    shares: &[Record],
    paths: &[(&str, &str, Option<Tenant>)],
    fast: &[Vec<Duration>],
) -> String {
    let mut r = String::new();
    let _ = writeln!(r, "# Front door with tenants under overload\n");
    let _ = writeln!(
        r,
        "Two `ailb-sim` servers (1000 MB free each), admission by fleet memory, 250 MB per request: {SLOTS} in \
         flight at once; {MAX_TOKENS} tokens streamed per request. Fleet rate X = {x:.1} req/s ({SLOTS} \
         closed-loop clients straight to the servers, each running {} at once at most). Phases of {} s, \
         Poisson arrivals. The scheduler's `fair_lag_tokens`: {lag}{}.\n",
        SLOTS / BACKENDS.len(),
        dur.as_secs(),
        if lag == 0 { " (the default: by weight at every request)" } else { "" }
    );
    render_overload(&mut r, alone, over, inversions);
    render_shares(&mut r, shares, dur);
    render_fast(&mut r, paths, fast);
    r
}

/// The overload phase against the alone phase: interactive TTFT, what each tenant got, and
/// the scheduler's inversions.
fn render_overload(r: &mut String, alone: &[Record], over: &[Record], inversions: f64) {
    let (p95_alone, p95_over, ratio) = p95_ratio(alone, over);
    let _ = writeln!(r, "## Interactive TTFT under 4.5 X offered (batch 3.6 X = 80 %, priority 0)\n");
    let _ = writeln!(
        r,
        "4.5 X rather than 5 X: with the batch tenant at 80 % of 5 X the interactive tenants would offer \
         1.0 X on their own, a saturated alone phase whose TTFT grows without bound; at 0.9 X they leave \
         the fleet a tenth of headroom, and the batch tenant brings the total to 4.5 X.\n"
    );
    let _ = writeln!(r, "| | offered | interactive TTFT p50 ms | interactive TTFT P95 ms | ratio to alone | goal |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    let _ = writeln!(
        r,
        "| alone (alpha 0.6 X + beta 0.3 X) | 0.9 X | {} | {} | 1.00 | |",
        ms(percentile(ttfts(alone, true), 0.5)),
        ms(p95_alone)
    );
    let _ = writeln!(
        r,
        "| with batch | 4.5 X | {} | {} | {ratio:.2} | <= 1.5: {} |",
        ms(percentile(ttfts(over, true), 0.5)),
        ms(p95_over),
        if ratio <= 1.5 { "met" } else { "NOT met" }
    );
    let _ = writeln!(r, "\n| tenant (overload phase) | sent | 200 | 429 | 503 | other |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for t in [Tenant::Alpha, Tenant::Beta, Tenant::Batch] {
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {} | {} |",
            t.name(),
            count(over, t, |_| true),
            count(over, t, |s| s == 200),
            count(over, t, |s| s == 429),
            count(over, t, |s| s == 503),
            count(over, t, |s| !matches!(s, 200 | 429 | 503)),
        );
    }
    let _ = writeln!(
        r,
        "\nRefused for room while a lower band waited (`ailb_gateway_scheduler_inversions_total`, overload \
         phase): **{inversions}** (goal 0: {}).\n",
        if inversions == 0.0 { "met" } else { "NOT met" }
    );
}

/// The shares of two backlogged tenants against their weights.
fn render_shares(r: &mut String, shares: &[Record], dur: Duration) {
    let _ = writeln!(r, "## Shares while backlogged (alpha and beta at 2.5 X each, one band)\n");
    let from = dur / 3;
    let (a, b, share) = alpha_share(shares, dur);
    let off = (share / 0.75 - 1.0).abs();
    let _ = writeln!(r, "| tenant | weight | served (sent after {} s) | share | weight share |", from.as_secs());
    let _ = writeln!(r, "|---|---|---|---|---|");
    let _ = writeln!(r, "| alpha | 3 | {a} | {share:.3} | 0.750 |");
    let _ = writeln!(r, "| beta | 1 | {b} | {:.3} | 0.250 |", 1.0 - share);
    let _ = writeln!(
        r,
        "\nalpha's share is {:.1} % off its weight share (goal within 10 %: {}).\n",
        off * 100.0,
        if off <= 0.1 { "met" } else { "NOT met" }
    );
}

/// The fast path: what each front door adds when nothing queues.
fn render_fast(r: &mut String, paths: &[(&str, &str, Option<Tenant>)], fast: &[Vec<Duration>]) {
    let _ = writeln!(r, "## Fast path: nothing queued, one request at a time, interleaved rounds\n");
    let _ = writeln!(r, "| path | requests | p50 ms | p99 ms | added p50 over direct ms |");
    let _ = writeln!(r, "|---|---|---|---|---|");
    let direct = percentile(fast[0].clone(), 0.5);
    for ((name, _, _), lat) in paths.iter().zip(fast) {
        let p50 = percentile(lat.clone(), 0.5);
        let added = match (p50, direct) {
            (Some(p), Some(d)) => format!("{:.3}", (p.as_secs_f64() - d.as_secs_f64()) * 1e3),
            _ => "-".into(),
        };
        let us = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.3}", d.as_secs_f64() * 1e3));
        let _ =
            writeln!(r, "| {name} | {} | {} | {} | {added} |", lat.len(), us(p50), us(percentile(lat.clone(), 0.99)));
    }
}

/// The interactive TTFT P95 of `alone` and `over`, and their ratio.
pub(super) fn p95_ratio(alone: &[Record], over: &[Record]) -> (Option<Duration>, Option<Duration>, f64) {
    let (a, o) = (percentile(ttfts(alone, true), 0.95), percentile(ttfts(over, true), 0.95));
    let ratio = match (a, o) {
        (Some(a), Some(o)) if !a.is_zero() => o.as_secs_f64() / a.as_secs_f64(),
        _ => f64::NAN,
    };
    (a, o, ratio)
}

/// alpha's share of the requests served that were sent after the first third of `shares`.
pub(super) fn alpha_share(shares: &[Record], dur: Duration) -> (usize, usize, f64) {
    let from = dur / 3;
    let done = |t| shares.iter().filter(|r| r.tenant == t && r.status == 200 && r.sent >= from).count();
    let (a, b) = (done(Tenant::Alpha), done(Tenant::Beta));
    (a, b, a as f64 / (a + b).max(1) as f64)
}

/// The peer row beside ailb's, phase by phase.
pub(super) fn render_smg(r: &mut String, smg: &SmgRun, ailb: (&[Record], &[Record], &[Record]), dur: Duration) {
    let _ = writeln!(r, "\n## The peer: SMG's priority scheduler and tenants, the same phases\n");
    let SmgRun::Ran { argv, alone, over, shares, scheduler, .. } = smg else {
        if let SmgRun::Skipped(why) = smg {
            let _ = writeln!(r, "Not run: {why}.");
        }
        return;
    };
    let _ = writeln!(
        r,
        "SMG 1.13.0 in front of the same two servers: `smg {}`, with this priority scheduler config \
         (every request asks `x-smg-priority: interactive`; the tenant comes from `{SMG_TENANT_HEADER}`):\n\n```yaml\n{}```\n",
        argv.join(" "),
        SMG_PRIORITY_YAML
    );
    let _ = writeln!(
        r,
        "No tenant rate limit in this row: SMG enforces `--tenant-rate-limit-enabled` only on its gRPC \
         router's endpoints, not with HTTP workers such as these servers (its tenant rate limiting \
         reference); its priority scheduler and tenant classes are what applies.\n"
    );
    let (a_alone, a_over, a_ratio) = p95_ratio(ailb.0, ailb.1);
    let (s_alone, s_over, s_ratio) = p95_ratio(alone, over);
    let _ = writeln!(r, "| router | interactive TTFT P95 alone ms | with batch (4.5 X) ms | ratio | goal <= 1.5 |");
    let _ = writeln!(r, "|---|---|---|---|---|");
    let met = |x: f64| if x <= 1.5 { "met" } else { "NOT met" };
    let _ = writeln!(r, "| ailb front door | {} | {} | {a_ratio:.2} | {} |", ms(a_alone), ms(a_over), met(a_ratio));
    let _ = writeln!(r, "| SMG | {} | {} | {s_ratio:.2} | {} |", ms(s_alone), ms(s_over), met(s_ratio));
    let _ = writeln!(r, "\n| SMG, tenant (overload phase) | sent | 200 | 429 | 408 | 503 | other |");
    let _ = writeln!(r, "|---|---|---|---|---|---|---|");
    for t in [Tenant::Alpha, Tenant::Beta, Tenant::Batch] {
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.name(),
            count(over, t, |_| true),
            count(over, t, |s| s == 200),
            count(over, t, |s| s == 429),
            count(over, t, |s| s == 408),
            count(over, t, |s| s == 503),
            count(over, t, |s| !matches!(s, 200 | 429 | 408 | 503)),
        );
    }
    let (aa, ab, a_share) = alpha_share(ailb.2, dur);
    let (sa, sb, s_share) = alpha_share(shares, dur);
    let _ = writeln!(r, "\n| router | alpha served | beta served | alpha's share (weight share 0.750) |");
    let _ = writeln!(r, "|---|---|---|---|");
    let _ = writeln!(r, "| ailb front door (weights 3:1) | {aa} | {ab} | {a_share:.3} |");
    let _ = writeln!(r, "| SMG (one class, FIFO: it has no tenant weights) | {sa} | {sb} | {s_share:.3} |");
    let _ = writeln!(
        r,
        "\nSMG's scheduler after the overload phase (its nonzero `smg_scheduler_*` series, which show it \
         admitted by class and clamped batch to `bulk`):\n\n```text\n{}\n```",
        scheduler.join("\n")
    );
}
