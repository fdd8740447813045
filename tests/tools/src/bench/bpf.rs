//! Section 2: the ailb programs' run time per connection from the kernel's BPF statistics,
//! with a 1,000-backend model and 100,000 affinity entries; and the connect loop (a child mode of
//! this binary, run inside the bench's cgroup) that makes the connections.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::process::Command;

use ailb_common::client::{self, Tags};
use ailb_tests::{CgroupGuard, Daemon};

use super::netns::{output_in, run, Netns};
use super::{say, AFFINITY_ENTRIES, BIG_VIP, MEASURE_CONNECTS, PREFIX_BLOCKS, PREFIX_TENANTS, VIP};

/// One measured case: its label, connect4 runs, connect4 ns per run, all programs' ns per
/// connection.
type Row = (&'static str, u64, f64, f64);

/// Creates the affinity entries, measures each case and writes the table.
pub(super) fn connect4_run_time(ns: &Netns, cg: &CgroupGuard, daemon: &Daemon, report: &mut String) {
    let progs = program_ids(cg);
    let stats = BpfStats::enable();
    say(&format!("creating {AFFINITY_ENTRIES} affinity entries on the 1000-backend model"));
    spawn_loop(ns, cg, BIG_VIP, AFFINITY_ENTRIES, AFFINITY_ENTRIES, "c");
    say(&format!(
        "learning {PREFIX_BLOCKS} prefix blocks on the 1000-backend model ({PREFIX_TENANTS} prompts of 16 blocks)"
    ));
    spawn_loop(ns, cg, BIG_VIP, PREFIX_TENANTS, 0, &format!("keys:{PREFIX_TENANTS}:0"));
    let st = daemon.status();
    let held_keys = format!("keys:{PREFIX_TENANTS}:0");
    // Held up to block 15 or 8, then blocks of a prompt of the connect's own, never sent before.
    let last_new = format!("part:{PREFIX_TENANTS}:{}:15", 20 * PREFIX_TENANTS);
    let half_new = format!("part:{PREFIX_TENANTS}:{}:8", 40 * PREFIX_TENANTS);
    let new_keys = format!("keys:{MEASURE_CONNECTS}:{}", 10 * PREFIX_TENANTS);
    let mut rows: Vec<(Row, String)> = Vec::new();
    // The prefix map's lookups per search, from the 1000-backend model's counters.
    let searches = || {
        let st = daemon.status();
        let m = st["models"].as_array().and_then(|ms| ms.iter().find(|m| m["name"] == "bench-1000").cloned());
        let n = |f: &str| m.as_ref().and_then(|m| m["prefix"][f].as_u64()).unwrap_or(0);
        (n("lookups"), n("map_lookups"))
    };
    for (label, vip, convs, prefix) in [
        ("1000 backends, conversation with an affinity entry (hit)", BIG_VIP, AFFINITY_ENTRIES, "c"),
        ("1000 backends, new conversation (miss, entry written)", BIG_VIP, MEASURE_CONNECTS, "new"),
        ("1000 backends, no conversation (socket cookie)", BIG_VIP, 0, "-"),
        (
            "1000 backends, no conversation, 16 prefix keys all held (100,000 blocks in the map)",
            BIG_VIP,
            0,
            held_keys.as_str(),
        ),
        (
            "1000 backends, no conversation, 16 prefix keys, the first 15 held (a conversation's next turn)",
            BIG_VIP,
            0,
            last_new.as_str(),
        ),
        (
            "1000 backends, no conversation, 16 prefix keys, the first 8 held (the search's worst case)",
            BIG_VIP,
            0,
            half_new.as_str(),
        ),
        ("1000 backends, no conversation, 16 prefix keys none held (learnt at the SYN)", BIG_VIP, 0, new_keys.as_str()),
        ("3 backends, no conversation", VIP, 0, "-"),
    ] {
        let (l0, m0) = searches();
        let row = measure(ns, cg, progs, label, vip, convs, prefix);
        let (l1, m1) = searches();
        let per_search = if l1 > l0 { format!("{:.2}", (m1 - m0) as f64 / (l1 - l0) as f64) } else { "-".to_string() };
        rows.push((row, per_search));
    }
    drop(stats);
    // The sweep of the map and the filter's rebuild, the map now full: what the daemon pays for each.
    let rebuild = ailb_userspace::datapath::prefix::PrefixMap::open(daemon.bpffs()).and_then(|mut map| {
        let (fill, started) = (map.filter().fill(), std::time::Instant::now());
        let swept = map.sweep(ailb_userspace::datapath::monotonic_ns())?;
        Ok((swept, started.elapsed(), fill, map.filter().fill()))
    });
    let rebuild = match rebuild {
        Ok((swept, took, before, after)) => format!(
            "Sweeping the prefix map (entries past their lifetime out) and rebuilding its filter from the keys left, \
             after the rows, took {:.0} ms for {} keys kept and {} removed; {:.0} % of the filter's bits were set \
             before (the rows learn new keys faster than the daemon rebuilds, at most every 5 s), {:.0} % after.",
            took.as_secs_f64() * 1e3,
            swept.kept,
            swept.removed,
            before * 100.0,
            after * 100.0
        ),
        Err(e) => format!("The prefix map could not be swept: {e}."),
    };
    let _ = writeln!(
        report,
        "\n## connect4 run time (kernel BPF statistics)\n\n`kernel.bpf_stats_enabled=1`, average of `run_time_ns / run_cnt` \
         over {MEASURE_CONNECTS} connects per row, {AFFINITY_ENTRIES} affinity entries present (affinity hits before: {}); \
         the 1000-backend model has `prefix = \"approximate\"` and {PREFIX_BLOCKS} learnt prefix blocks (the prefix map: {}).\n\n\
         The rows with keys never sent before learn them at the SYN: the map grows to about 150,000 blocks in the \
         first-15 row and to its bound (262,144, least recently used out) in the first-8 and none-held rows.\n\n\
         The last column adds the setsockopt and sock_ops programs' time (tagging, in-flight \
         counting, close) per connection; the one before it, the prefix map's lookups per search (`map_lookups` over \
         `lookups` of `ailb status`: the filter in front of the map spares the others).\n\n| case | connect4 runs | connect4 ns per run | \
         prefix map lookups per search | all ailb programs, ns per connection |\n|---|---:|---:|---:|---:|",
        st["stats"]["affinity_hits"],
        st["models"].as_array().and_then(|ms| ms.iter().find(|m| m["name"] == "bench-1000")).map(|m| m["prefix"].to_string()).unwrap_or_default()
    );
    for ((label, runs, avg, per_conn), per_search) in rows {
        let _ = writeln!(report, "| {label} | {runs} | {avg:.0} | {per_search} | {per_conn:.0} |");
    }
    let _ = writeln!(report, "\n{rebuild}");
}

/// `MEASURE_CONNECTS` connects to `vip` (conversations as in [`connect_loop`]) between two
/// reads of the programs' statistics.
fn measure(
    ns: &Netns,
    cg: &CgroupGuard,
    progs: [u64; 3],
    label: &'static str,
    vip: &str,
    convs: usize,
    prefix: &str,
) -> Row {
    let before = progs.map(connect4_stats);
    spawn_loop(ns, cg, vip, MEASURE_CONNECTS, convs, prefix);
    let after = progs.map(connect4_stats);
    let runs = after[0].0 - before[0].0;
    let avg = if runs > 0 { (after[0].1 - before[0].1) as f64 / runs as f64 } else { f64::NAN };
    // All three programs' time for this phase, per connect.
    let total: u64 = (0..3).map(|i| after[i].1 - before[i].1).sum();
    let per_conn = total as f64 / MEASURE_CONNECTS as f64;
    say(&format!("{label}: {avg:.0} ns per connect4 run ({runs} runs), {per_conn:.0} ns of BPF per connection"));
    (label, runs, avg, per_conn)
}

/// (run_cnt, run_time_ns) of the loaded `ailb_connect4` program(s) attached by this bench.
pub(crate) fn connect4_stats(prog_id: u64) -> (u64, u64) {
    let out =
        run(Command::new("bpftool").args(["prog", "show", "id", &prog_id.to_string(), "--json"]), "bpftool prog show");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bpftool json");
    (v["run_cnt"].as_u64().unwrap_or(0), v["run_time_ns"].as_u64().unwrap_or(0))
}

/// The ids of the (connect4, setsockopt, sock_ops) programs attached to `cg`.
pub(crate) fn program_ids(cg: &CgroupGuard) -> [u64; 3] {
    let out = run(
        Command::new("bpftool").args(["cgroup", "show", cg.path().to_str().expect("utf-8"), "--json"]),
        "bpftool cgroup show",
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("bpftool json");
    ["cgroup_inet4_connect", "cgroup_setsockopt", "cgroup_sock_ops"].map(|t| {
        v.as_array()
            .and_then(|a| a.iter().find(|p| p["attach_type"] == t))
            .and_then(|p| p["id"].as_u64())
            .unwrap_or_else(|| panic!("no {t} program attached to {}: {out}", cg.path().display()))
    })
}

/// Restores `kernel.bpf_stats_enabled` on drop.
pub(crate) struct BpfStats(String);

impl BpfStats {
    pub(crate) fn enable() -> Self {
        let old = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_else(|_| "0".into());
        std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").expect("enable kernel.bpf_stats_enabled");
        Self(old.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// Child mode: `ailb-bench --connect-loop VIP COUNT CONVERSATIONS PREFIX` makes COUNT connects
/// (conversation `PREFIX-<i % CONVERSATIONS>`, none when CONVERSATIONS is 0) and closes each.
/// A PREFIX `keys:T:O` tags connect `i` instead with the 16 prefix keys of prompt `O + i % T`
/// (16 text chunks of its own); `part:T:O:H` with those of prompt `i % T`'s first `H` chunks
/// followed by prompt `O + i`'s last `16 - H` (a prompt that shares its first `H` blocks).
pub(crate) fn connect_loop(args: &[String]) {
    let vip: std::net::SocketAddrV4 = args[0].parse().expect("vip");
    let count: usize = args[1].parse().expect("count");
    let convs: usize = args[2].parse().expect("conversations");
    let prefix = &args[3];
    let (mut ok, mut refused, mut other) = (0u64, 0u64, 0u64);
    let keyed: Option<(usize, usize)> = prefix.strip_prefix("keys:").and_then(|r| {
        let (t, o) = r.split_once(':')?;
        Some((t.parse().ok()?, o.parse().ok()?))
    });
    let part: Option<(usize, usize, usize)> = prefix.strip_prefix("part:").and_then(|r| {
        let mut f = r.split(':').map(|x| x.parse::<usize>().ok());
        Some((f.next()??, f.next()??, f.next()??))
    });
    for i in 0..count {
        let id;
        let keys;
        let tags = if let Some((tenants, offset)) = keyed {
            keys = prompt_keys(offset + i % tenants.max(1));
            Tags::new().prefix(&keys)
        } else if let Some((tenants, offset, shared)) = part {
            let mut text = prompt_text(i % tenants.max(1));
            let chunk = ailb_common::prefix::TEXT_CHUNK_BYTES;
            text[shared * chunk..].copy_from_slice(&prompt_text(offset + i)[shared * chunk..]);
            keys = ailb_common::prefix::text_keys(&text);
            Tags::new().prefix(&keys)
        } else if convs > 0 {
            id = format!("{prefix}-{}", i % convs);
            Tags::new().conversation(&id)
        } else {
            Tags::new()
        };
        // The stream is dropped (closed) at once. A failed setsockopt counts as `other`.
        match client::connect(vip, &tags, None) {
            Ok(_) => ok += 1,
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => refused += 1,
            Err(_) => other += 1,
        }
    }
    println!("{ok} {refused} {other}");
}

/// The 16 keys of prompt `n`: 16 text chunks that name it.
fn prompt_keys(n: usize) -> Vec<u64> {
    ailb_common::prefix::text_keys(&prompt_text(n))
}

/// Prompt `n`'s text: 16 text chunks that name it.
fn prompt_text(n: usize) -> Vec<u8> {
    let chunk = ailb_common::prefix::TEXT_CHUNK_BYTES;
    format!("prompt {n} ").bytes().cycle().take(16 * chunk).collect()
}

fn spawn_loop(ns: &Netns, cg: &CgroupGuard, vip: &str, count: usize, convs: usize, prefix: &str) {
    let me = std::env::current_exe().expect("current exe");
    let c = count.to_string();
    let v = convs.to_string();
    let args = ["--connect-loop", vip, &c, &v, prefix];
    let out = output_in(ns.command(me.to_str().expect("utf-8"), &args), Some(cg));
    assert!(out.status.success(), "connect loop failed: {}", String::from_utf8_lossy(&out.stderr));
}
