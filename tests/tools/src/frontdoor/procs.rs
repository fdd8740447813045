//! CPU time of a process tree, from `/proc`: a router may be one process with threads (the
//! front door, the peer routers) or a master with worker processes (nginx), so the bench sums
//! the tree (every pid reached through `/proc/PID/task/TID/children`).

use std::path::Path;

/// User and system CPU seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTime {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuTime {
    pub fn total_s(self) -> f64 {
        self.user_s + self.sys_s
    }

    /// `self - before`, each part at least 0.
    pub fn since(self, before: CpuTime) -> CpuTime {
        CpuTime { user_s: (self.user_s - before.user_s).max(0.0), sys_s: (self.sys_s - before.sys_s).max(0.0) }
    }
}

/// `(utime, stime)` in clock ticks of a `/proc/PID/stat` line: fields 14 and 15, counted after
/// the command name, which is in parentheses and may itself hold spaces and parentheses.
pub fn stat_user_sys(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (the state), so fields 14 and 15 are its 12th and 13th.
    let mut fields = rest.split_whitespace().skip(11);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The pids of every child listed in a `/proc/PID/task/TID/children` file.
pub fn parse_children(text: &str) -> Vec<u32> {
    text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// `pid` and all its descendants that run now (depth first, `pid` first).
pub fn tree_pids(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if out.contains(&p) {
            continue;
        }
        out.push(p);
        let tasks = Path::new("/proc").join(p.to_string()).join("task");
        let Ok(dir) = std::fs::read_dir(&tasks) else { continue };
        for t in dir.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                todo.extend(parse_children(&text));
            }
        }
    }
    out
}

/// The CPU time the tree under `pid` has used so far (each process with all its threads),
/// `None` when `pid` itself is gone.
pub fn tree_cpu(pid: u32) -> Option<CpuTime> {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    if hz <= 0.0 {
        return None;
    }
    let mut sum = (0u64, 0u64);
    for (i, p) in tree_pids(pid).into_iter().enumerate() {
        let stat = std::fs::read_to_string(Path::new("/proc").join(p.to_string()).join("stat"));
        match stat.ok().as_deref().and_then(stat_user_sys) {
            Some((u, s)) => sum = (sum.0 + u, sum.1 + s),
            None if i == 0 => return None,
            None => {}
        }
    }
    Some(CpuTime { user_s: sum.0 as f64 / hz, sys_s: sum.1 as f64 / hz })
}

#[cfg(test)]
mod tests;
