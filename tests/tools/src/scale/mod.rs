//! `ailb-scale-bench` (root): kernel tables sized to the model, measured.
//!
//! 1. Table write time and kernel memory with 10, 100 and 1,024 models of 16 backends: the
//!    writer's first apply into freshly loaded maps (`datapath::Writer::apply`, no programs
//!    attached), and the maps' memory as the kernel charges it.
//! 2. A recompute of 1,000 models x 16 backends after every weight changed: `policy::plan`
//!    plus `Writer::apply` (every table rebuilt and swapped).
//! 3. `connect4` run time (kernel BPF statistics, `run_time_ns / run_cnt`) with one model
//!    loaded and with 1,024 for the same traffic (model 0's VIP), and with 1,024 for traffic
//!    spread over every VIP, the daemon attached to a child cgroup.
//!
//! Arguments name the sections to run (`tables`, `recompute`, `connect`; all by default);
//! `AILB_RECOMPUTE_RUNS` sets the number of recomputes (default 5, the median reported).
//! Writes `target/bench/scale.md` and prints it. Measures the release build of `ailb` for
//! section 3 (or `$AILB_BIN`); sections 1 and 2 run in this process.

mod connect;
mod tables;

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::Context;

/// Backends per model in every section.
pub const PER_MODEL: usize = 16;

thread_local! {
    static START: Instant = Instant::now();
}

fn say(msg: &str) {
    eprintln!("[scale {:>6.1}s] {msg}", START.with(|s| s.elapsed().as_secs_f64()));
}

/// Model `i`'s name and VIP (127.78.(i / 256).(i % 256):8000).
pub fn model(i: usize) -> (String, String) {
    (format!("scale-{i:04}"), format!("127.78.{}.{}:8000", i / 256, i % 256))
}

/// Backend `j` of every model: one of [`PER_MODEL`] shared loopback addresses.
pub fn backend(j: usize) -> String {
    format!("127.0.9.{}:18900", j + 1)
}

/// `ailb-scale-bench`: the connect loop (a child mode), or every section.
pub fn main(args: &[String]) -> anyhow::Result<()> {
    match args.first().map(String::as_str) {
        Some("--connect-loop") => {
            crate::bench::bpf::connect_loop(&args[1..]);
            return Ok(());
        }
        Some("--connect-spread") => {
            connect::connect_spread(&args[1..]);
            return Ok(());
        }
        _ => {}
    }
    START.with(|_| ());
    // Sections to run (all when none is named): `tables`, `recompute`, `connect`.
    const SECTIONS: [&str; 3] = ["tables", "recompute", "connect"];
    if let Some(bad) = args.iter().find(|a| !SECTIONS.contains(&a.as_str())) {
        anyhow::bail!("unknown section {bad:?}: the sections are {}", SECTIONS.join(", "));
    }
    let runs = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    ailb_tests::require_root();
    ailb_tests::ensure_bpffs();
    let bin = crate::bench::ailb_under_test()?;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# ailb at scale\n\nMachine: {} cores. Reproduce: `cargo xtask bench --only scale` (as root).\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    if runs("tables") {
        tables::write_and_memory(&mut report)?;
    }
    if runs("recompute") {
        tables::recompute(&mut report)?;
    }
    if runs("connect") {
        connect::run_time(&bin, &mut report);
    }
    let out = crate::target_dir().join("bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("scale.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    say(&format!("report written to {}", path.display()));
    Ok(())
}
