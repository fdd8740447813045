//! Where a router's time goes, measured two ways after the timed rounds (neither runs during
//! them: both slow the traced process down):
//!
//! - `strace -c -f` attached to every process and thread of the router over one wrk run:
//!   system calls per request, by name. Exact counts; the tracing makes the router several times
//!   slower, so calls that depend on how busy it is (`epoll_wait`, `futex`) change with it.
//! - `perf record` (sampling at 2 kHz, no call graphs) over another run, where `perf` is
//!   installed: the share of the router's CPU samples per binary (the kernel, ailb, libc) and
//!   the top symbols.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::procs::tree_pids;
use super::wrk::{self, WrkRun};

/// One line of `strace -c`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyscallCount {
    pub name: String,
    pub calls: u64,
    pub errors: u64,
}

/// The rows of an `strace -c` summary (without its `total` line).
pub fn parse_strace_summary(text: &str) -> Vec<SyscallCount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f.len() > 6 || f[0].parse::<f64>().is_err() {
            continue;
        }
        let name = f[f.len() - 1];
        if name == "total" {
            continue;
        }
        let Ok(calls) = f[3].parse::<u64>() else { continue };
        let errors = if f.len() == 6 { f[4].parse().unwrap_or(0) } else { 0 };
        out.push(SyscallCount { name: name.into(), calls, errors });
    }
    out
}

/// A Markdown table of `counts` per request of a run of `requests`, the most frequent first.
pub fn syscalls_table(counts: &[SyscallCount], requests: u64) -> String {
    let mut v = counts.to_vec();
    v.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.name.cmp(&b.name)));
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    let total: u64 = v.iter().map(|c| c.calls).sum();
    let mut t = String::from("| system call | per request | failed per request |\n|---|---:|---:|\n");
    for c in v.iter().filter(|c| per(c.calls) >= 0.01) {
        t.push_str(&format!("| `{}` | {:.2} | {:.2} |\n", c.name, per(c.calls), per(c.errors)));
    }
    t.push_str(&format!("| all | {:.2} | |\n", per(total)));
    t
}

/// A child stopped with SIGINT (by pid) so that it writes its summary, then waited for.
struct Tracer(Child);

impl Tracer {
    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on the pid of our own child, not reaped yet.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // perf and strace write their output, then exit (0 or with the signal's status).
            if self.0.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        bail!("the tracer did not stop within 30 s of SIGINT")
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls until every thread of every pid in `pids` has a tracer (10 s at most).
fn wait_traced(pids: &[u32]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let traced = |pid: &u32| -> bool {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
        dir.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("status"))
                .is_ok_and(|s| s.lines().any(|l| l.strip_prefix("TracerPid:").is_some_and(|v| v.trim() != "0")))
        })
    };
    while !pids.iter().all(traced) {
        if Instant::now() >= deadline {
            bail!("strace did not attach to every thread of {pids:?} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `strace -c -f` on the tree under `pid` over one wrk run of `seconds`: its counts and the run.
pub fn strace(
    pid: u32,
    url: &str,
    script: &Path,
    seconds: u32,
    out: &Path,
) -> anyhow::Result<(Vec<SyscallCount>, WrkRun)> {
    let pids = tree_pids(pid);
    let mut cmd = Command::new("strace");
    cmd.args(["-c", "-f", "-qq", "-o"]).arg(out);
    for p in &pids {
        cmd.args(["-p", &p.to_string()]);
    }
    let tracer = Tracer(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("spawning strace")?);
    wait_traced(&pids)?;
    let run = wrk::run(url, script, super::CONNECTIONS, seconds);
    tracer.stop()?;
    let run = run?;
    let text = std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    Ok((parse_strace_summary(&text), run))
}

/// `perf record` on the tree under `pid` over one wrk run of `seconds`; the report's text: the
/// share per binary, then the top symbols.
pub fn perf(pid: u32, url: &str, script: &Path, seconds: u32, dir: &Path) -> anyhow::Result<(String, WrkRun)> {
    let data: PathBuf = dir.join(format!("perf-{pid}.data"));
    let pids: Vec<String> = tree_pids(pid).iter().map(u32::to_string).collect();
    let tracer = Tracer(
        Command::new("perf")
            .args(["record", "-F", "2000", "-o"])
            .arg(&data)
            .args(["-p", &pids.join(",")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning perf record")?,
    );
    // perf attaches before its first sample; a short run of wrk first would only add noise, so
    // wait until it has created its output file.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !data.is_file() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = wrk::run(url, script, super::CONNECTIONS, seconds);
    tracer.stop()?;
    let run = run?;
    let report = |sort: &str, limit: &str| -> anyhow::Result<String> {
        let out = Command::new("perf")
            .args(["report", "-i"])
            .arg(&data)
            .args(["--stdio", "--no-children", "-q", "--sort", sort, "--percent-limit", limit])
            .output()
            .context("running perf report")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<String> =
            text.lines().map(str::trim_end).filter(|l| !l.is_empty()).map(|l| truncate(l, 150)).collect();
        Ok(lines.join("\n"))
    };
    let text = format!(
        "CPU samples by binary:\n\n```text\n{}\n```\n\nTop symbols (at least 1% of the samples):\n\n```text\n{}\n```\n",
        report("dso", "0.5")?,
        report("dso,sym", "1")?
    );
    Ok((text, run))
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests;
