//! CPU time of a router process, from `/proc/PID/stat`: what a userspace router (nginx, a
//! peer router, ailb's front door) spends per request, against the kernel pick of ailb's
//! socket ABI, which costs no process anything on the request path.

use std::path::Path;

/// User + system CPU seconds process `pid` has used so far (all its threads; not children it
/// has not reaped), `None` when it has exited or its stat cannot be read.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    let ticks = stat_ticks(&stat)?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

/// `utime + stime` (clock ticks) of a `/proc/PID/stat` line: fields 14 and 15, counted after
/// the command name, which is in parentheses and may itself hold spaces and parentheses.
pub fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (the state), so fields 14 and 15 are its 12th and 13th.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds between two readings of the same process, `None` when either is missing.
pub fn used(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some((after? - before?).max(0.0))
}

#[cfg(test)]
mod tests;
