//! The report of the real-engine race: `real-engine.md` (the setup, the routers' command lines
//! and a table per workload), `real-engine.json` (the numbers) and `real-engine.svg` (per
//! workload, the share of prompt tokens read from the servers' caches and the TTFT P50 and P95
//! of each policy) under `--out-dir`.

use std::fmt::Write as _;
use std::net::SocketAddrV4;

use plotters::prelude::*;
use serde_json::json;

use super::workload::Kind;
use super::{prefix_token_count, Row, Setup};
use crate::chart::{label_font, panel_font, title_font, DrawError, AXIS};
use crate::compare::args::Args;
use crate::compare::peers;
use crate::compare::plots::style;
use crate::compare::policy::Policy;

pub fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"))
}

/// Writes the three files; returns the Markdown.
pub fn write(args: &Args, setup: &Setup, rows: &[Row]) -> anyhow::Result<String> {
    use anyhow::Context;
    let md = markdown(args, setup, rows);
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    std::fs::write(args.out_dir.join("real-engine.md"), &md).context("writing real-engine.md")?;
    std::fs::write(args.out_dir.join("real-engine.json"), format!("{:#}\n", to_json(setup, rows)))
        .context("writing real-engine.json")?;
    let svg = svg(setup, rows).map_err(|e| anyhow::anyhow!("drawing real-engine.svg: {e}"))?;
    std::fs::write(args.out_dir.join("real-engine.svg"), svg).context("writing real-engine.svg")?;
    Ok(md)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let cores = cpu.lines().filter(|l| l.starts_with("processor")).count();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: u64 = mem
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    format!("{cores} CPU cores ({}), {:.1} GiB of memory", model.unwrap_or("unknown"), kib as f64 / (1 << 20) as f64)
}

/// `real-engine.md`: the setup and method, a section per workload, the policies not run and
/// the peer routers' command lines.
pub fn markdown(args: &Args, setup: &Setup, rows: &[Row]) -> String {
    let mut md = String::from("# The race on real vLLM servers\n\n");
    setup_and_method(&mut md, args, setup);
    for (kind, what, _) in &setup.workloads {
        let _ = writeln!(md, "## {}\n\n{what}.\n", kind.key());
        let rows: Vec<&Row> = rows.iter().filter(|r| r.workload == *kind).collect();
        policy_table(&mut md, &rows);
        against_the_oracle(&mut md, &rows);
        prefix_counters(&mut md, &rows);
        router_kv_events(&mut md, &rows);
        failures(&mut md, &rows);
        md.push('\n');
    }
    for (p, why) in &setup.not_run {
        let _ = writeln!(md, "Not run: {}: {why}.\n", p.title());
    }
    routers_command_lines(&mut md, args, rows);
    md
}

/// The command, the machine, the servers and how every policy was measured.
fn setup_and_method(md: &mut String, args: &Args, setup: &Setup) {
    let cmd: Vec<String> = std::env::args().collect();
    let _ = writeln!(md, "Command: `{}`\n", cmd.join(" "));
    let _ = writeln!(md, "Machine: {}.\n", machine());
    // No OpenAI server ran when every policy asked for was SMG's gRPC one.
    if !setup.ready_s.is_empty() {
        let _ = writeln!(
            md,
            "Servers: {} vLLM for CPU servers of the tiny model, KV blocks of {} tokens, {} blocks each \
             (`--num-gpu-blocks-override`), `--max-model-len {}`; ready {:.0} s after their start, {} MiB resident each.\n",
            setup.servers,
            setup.block_size.map_or("?".into(), |b| b.to_string()),
            setup.kv_blocks.map_or("?".into(), |b| b.to_string()),
            args.max_model_len,
            setup.ready_s.iter().cloned().fold(0.0, f64::max),
            setup.rss_mib.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
        );
    }
    if let Some(s) = setup.grpc_ready_s {
        let _ = writeln!(
            md,
            "SMG with the engines' KV events ({}) ran after the other policies, on {} fresh servers of the \
             same engine, model and cache behind vLLM's gRPC server (`vllm.entrypoints.grpc_server` with SMG's \
             `smg-grpc-servicer`), publishing KV events, ready {s:.0} s after their start. They have no HTTP \
             port: their caches were emptied through SMG's `POST /flush_cache` before each workload (every \
             server reported flushed; the probe found nothing cached after it), \"from cache\" is the answers' \
             `usage` (the same as \"by usage\"; on the OpenAI servers the two agree), and requests per server \
             are not known. Over gRPC SMG tokenizes and renders the chat template itself and the servers \
             skip theirs, so its TTFT is not measured on the same serving path as the other rows'.\n",
            Policy::SmgKvEvents.title(),
            setup.servers,
        );
    }
    let _ = writeln!(
        md,
        "Every policy gets the same requests in the same order, {} in flight (a closed loop), each server's \
         prefix cache reset and the reset checked before it. \"From cache\" is the servers' own count: \
         `vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`, deltas over the policy's run, \
         summed over the servers; \"by usage\" is the same share from the answers' `cached_tokens`. TTFT and \
         end-to-end times are the client's, from its `connect()`. \"ailb exclusions\": how often `ailb run` took \
         a server out of its table during the run (a `/health` or `/metrics` answer missing or later than its \
         sampling interval).\n",
        args.concurrency
    );
}

/// One workload's table: a line per policy.
fn policy_table(md: &mut String, rows: &[&Row]) {
    md.push_str(
        "| policy | from cache | by usage | TTFT P50 ms | TTFT P95 ms | E2E P50 ms | failures | req/s | requests per server | router CPU s | ailb exclusions |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} % | {} | {} | {} | {} | {} of {} | {:.2} | {} | {} | {} |",
            r.policy.title(),
            r.hit_share() * 100.0,
            r.usage_cached_share().map_or("-".into(), |s| format!("{:.1} %", s * 100.0)),
            fmt_ms(r.ttft(50.0)),
            fmt_ms(r.ttft(95.0)),
            fmt_ms(r.e2e(50.0)),
            r.failures(),
            r.records.len(),
            r.rate(),
            if r.per_server.is_empty() {
                "n/a".to_string()
            } else {
                r.per_server.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
            },
            r.router_cpu_s.map_or("-".into(), |c| format!("{c:.1}")),
            r.exclusions.map_or("-".into(), |n| n.to_string()),
        );
    }
}

/// What SMG's index took in from the engines' KV events, for its row that reads them.
fn router_kv_events(md: &mut String, rows: &[&Row]) {
    for r in rows {
        if let Some((batches, blocks)) = r.router_kv_events {
            let _ = writeln!(
                md,
                "\n{}: SMG's index took in {batches:.0} KV-event batches, {blocks:.0} blocks, during the run \
                 (`smg_kv_event_batches_total`, `smg_kv_event_blocks_total`).",
                r.policy.title()
            );
        }
    }
}

/// Precise mode's cached tokens against the oracle's, where both ran.
fn against_the_oracle(md: &mut String, rows: &[&Row]) {
    let of = |p: Policy| rows.iter().find(|r| r.policy == p);
    if let (Some(precise), Some(pinned)) = (of(Policy::AilbGatewayPrecise), of(Policy::TenantPinned)) {
        let _ = writeln!(
            md,
            "\n{} cached tokens / {} cached tokens: **{}** ({:.0} / {:.0} prompt tokens from the caches; goal: at \
             least 90 %).",
            Policy::AilbGatewayPrecise.title(),
            Policy::TenantPinned.title(),
            ratio(precise.hit_tokens, pinned.hit_tokens),
            precise.hit_tokens,
            pinned.hit_tokens
        );
    }
}

/// The kernel's prefix counters of the policies that read them, and what they predicted.
fn prefix_counters(md: &mut String, rows: &[&Row]) {
    for r in rows {
        if let Some(p) = &r.prefix {
            let _ = writeln!(md, "\n{}: the kernel's prefix counters at the end of the run: `{p}`.", r.policy.title());
            // What the router predicted cached (keys found over keys sent) against what
            // vLLM's own counters say was read from the caches.
            let n = |k: &str| p[k].as_f64().unwrap_or(0.0);
            let (predicted, how) = crate::compare::report::predicted_cached(r.policy, &n);
            let _ = writeln!(
                md,
                "Predicted cached ({how}): {}; vLLM read {} of the prompt tokens from its caches.",
                predicted.map_or("-".to_string(), |x| format!("{:.1} %", 100.0 * x)),
                ratio(r.hit_tokens, r.queried_tokens)
            );
        }
    }
}

/// The failures of every policy, counted by their message (its first 120 characters).
fn failures(md: &mut String, rows: &[&Row]) {
    let kinds: std::collections::BTreeMap<String, usize> = rows
        .iter()
        .flat_map(|r| r.records.iter())
        .filter_map(|r| r.error.clone())
        .fold(Default::default(), |mut m, e| {
            *m.entry(e.chars().take(120).collect()).or_default() += 1;
            m
        });
    if !kinds.is_empty() {
        md.push_str("\nFailures:\n\n");
        for (e, n) in kinds {
            let _ = writeln!(md, "- {n} x `{}`", e.replace('`', "'"));
        }
    }
}

/// Each peer router's command line, once per workload, with the run's addresses as
/// placeholders.
fn routers_command_lines(md: &mut String, args: &Args, rows: &[Row]) {
    md.push_str("## The routers' command lines\n\n");
    let (listen, metrics) =
        (SocketAddrV4::new([127, 0, 10, 250].into(), 0), SocketAddrV4::new([127, 0, 10, 249].into(), 0));
    let mut seen = Vec::new();
    for r in rows {
        if peers::binary(r.policy).is_none() || seen.contains(&(r.policy, r.workload)) {
            continue;
        }
        seen.push((r.policy, r.workload));
        let scheme = if r.policy.grpc_workers() { "grpc" } else { "http" };
        let mut a = peers::args(r.policy, listen, metrics, &[format!("{scheme}://SERVER")]);
        if let Some(at) = a.iter().position(|x| x == "--prefix-token-count") {
            a[at + 1] = prefix_token_count(r.workload, args).to_string();
        }
        if r.policy.grpc_workers() {
            a.extend(["--model-path".to_string(), "MODEL_DIR".to_string()]);
        }
        // The run's own addresses change per policy: the listen and Prometheus ports and the
        // servers are written as placeholders.
        for (i, x) in a.clone().iter().enumerate().skip(1) {
            if a[i - 1] == "--port" || a[i - 1] == "--prometheus-port" {
                a[i] = if x == "0" { "PORT".into() } else { x.clone() };
            }
        }
        let _ = writeln!(
            md,
            "- {} ({}): `{} {}`",
            r.policy.title(),
            r.workload.key(),
            peers::binary(r.policy).unwrap_or(""),
            a.join(" ")
        );
    }
    md.push('\n');
}

/// `a / b` as a percentage, `-` when `b` is 0.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.1} %", a / b * 100.0)
    } else {
        "-".to_string()
    }
}

fn to_json(setup: &Setup, rows: &[Row]) -> serde_json::Value {
    json!({
        "servers": setup.servers, "block_size": setup.block_size, "kv_blocks": setup.kv_blocks,
        "grpc_ready_s": setup.grpc_ready_s,
        "rows": rows.iter().map(|r| json!({
            "workload": r.workload.key(), "policy": r.policy.key(), "requests": r.records.len(),
            "failures": r.failures(), "wall_s": r.wall_s, "requests_per_s": r.rate(),
            "queried_tokens": r.queried_tokens, "hit_tokens": r.hit_tokens, "hit_share": r.hit_share(),
            "usage_cached_share": r.usage_cached_share(),
            "ttft_ms": {"p50": r.ttft(50.0), "p95": r.ttft(95.0)}, "e2e_ms": {"p50": r.e2e(50.0), "p95": r.e2e(95.0)},
            "per_server": r.per_server, "router_cpu_s": r.router_cpu_s, "ailb_exclusions": r.exclusions,
            "router_kv_events": r.router_kv_events.map(|(b, n)| json!({"batches": b, "blocks": n})),
            "prefix": r.prefix,
        })).collect::<Vec<_>>(),
    })
}

/// Per workload, two panels of horizontal bars, one bar per policy in its colour: the share
/// of prompt tokens from the caches, and the TTFT P50 (the bar) and P95 (the thin line).
pub fn svg(setup: &Setup, rows: &[Row]) -> Result<String, DrawError> {
    let kinds: Vec<Kind> = setup.workloads.iter().map(|w| w.0).collect();
    let per = rows.iter().filter(|r| Some(&r.workload) == kinds.first()).count().max(1);
    let panel_h = 60 + 28 * per as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (960, 40 + panel_h * kinds.len() as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let (title, body) = root.split_vertically(40);
        title.draw_text(
            "Real vLLM servers: prompt tokens from the prefix caches, and time to first token",
            &title_font(),
            (10, 12),
        )?;
        for (k, area) in kinds.iter().zip(body.split_evenly((kinds.len(), 1))) {
            let rs: Vec<&Row> = rows.iter().filter(|r| r.workload == *k).collect();
            let (left, right) = area.split_horizontally(480);
            let names: Vec<String> = rs.iter().map(|r| r.policy.title().to_string()).collect();
            let n = rs.len() as f64;
            let label = |y: &f64| names.get(*y as usize).cloned().unwrap_or_default();
            let mut c = ChartBuilder::on(&left)
                .caption(format!("{}: prompt tokens from cache, %", k.key()), panel_font())
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(190)
                .build_cartesian_2d(0.0..100.0, 0.0..n)?;
            c.configure_mesh()
                .disable_y_mesh()
                .y_labels(rs.len() * 2 + 1)
                .y_label_formatter(&|y| if y.fract() == 0.5 { label(y) } else { String::new() })
                .label_style(label_font())
                .axis_style(AXIS)
                .draw()?;
            c.draw_series(rs.iter().enumerate().map(|(i, r)| {
                let col = style(r.policy).color;
                Rectangle::new([(0.0, i as f64 + 0.15), (r.hit_share() * 100.0, i as f64 + 0.85)], col.filled())
            }))?;
            let hi = rs.iter().filter_map(|r| r.ttft(95.0)).fold(1.0, f64::max) * 1.1;
            let mut c = ChartBuilder::on(&right)
                .caption(format!("{}: TTFT P50 (bar) and P95 (line), ms", k.key()), panel_font())
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(10)
                .build_cartesian_2d(0.0..hi, 0.0..n)?;
            c.configure_mesh().disable_y_mesh().y_labels(0).label_style(label_font()).axis_style(AXIS).draw()?;
            c.draw_series(rs.iter().enumerate().filter_map(|(i, r)| {
                let col = style(r.policy).color;
                Some(Rectangle::new([(0.0, i as f64 + 0.25), (r.ttft(50.0)?, i as f64 + 0.75)], col.filled()))
            }))?;
            c.draw_series(rs.iter().enumerate().filter_map(|(i, r)| {
                let col = style(r.policy).color;
                Some(PathElement::new(
                    vec![(0.0, i as f64 + 0.5), (r.ttft(95.0)?, i as f64 + 0.5)],
                    col.stroke_width(2),
                ))
            }))?;
        }
        root.present()?;
    }
    Ok(out)
}
