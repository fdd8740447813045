//! What `ailb status`, `ailb explain` and `ailb teardown` add to an error reading the pins:
//! the cause by its errno and the way out. No pins (ENOENT) means the daemon is not running;
//! EACCES means the pins belong to another user (they are 0600, their directory 0700); EPERM
//! means the kernel wants a capability for the bpf() call.
#![forbid(unsafe_code)]

use std::{os::unix::fs::MetadataExt, path::Path};

use crate::datapath::DatapathError;

/// The pin directory's owner and mode, when it can be looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub mode: u32,
}

pub fn owner_of(dir: &Path) -> Option<Owner> {
    std::fs::metadata(dir).ok().map(|m| Owner { uid: m.uid(), mode: m.mode() & 0o7777 })
}

/// The symbolic name of the errno values this advice distinguishes.
pub fn errno_name(n: i32) -> String {
    match n {
        libc::ENOENT => "ENOENT".into(),
        libc::EACCES => "EACCES".into(),
        libc::EPERM => "EPERM".into(),
        n => format!("errno {n}"),
    }
}

/// The error with its causes, then the advice for it. `what` is the command ("ailb status").
pub fn pin_error(e: &DatapathError, dir: &Path, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{}", message(e, dir, what, owner_of(dir)))
}

/// `e: cause: cause`, leaving out a cause whose text the line already ends with (several of
/// these errors print their source in their own message too).
fn chain(e: &DatapathError) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// The capabilities `ailb run` needs (with the bit numbers of `capabilities(7)`): CAP_BPF to
/// create maps, load BTF and programs and pin them; CAP_NET_ADMIN to load the cgroup
/// socket programs (connect4, sockops, setsockopt are networking program types); CAP_PERFMON
/// because the verifier accepts the programs' reads of stack slots not written on every path
/// only with it.
pub const RUN_CAPS: [(&str, u32); 3] = [("CAP_BPF", 39), ("CAP_NET_ADMIN", 12), ("CAP_PERFMON", 38)];

/// Which of [`RUN_CAPS`] an effective capability set `cap_eff` (the hex `CapEff` of
/// `/proc/<pid>/status`) lacks. CAP_SYS_ADMIN stands in for all three, as the kernel allows.
pub fn missing_caps(cap_eff: u64) -> Vec<&'static str> {
    const CAP_SYS_ADMIN: u32 = 21;
    if cap_eff & (1 << CAP_SYS_ADMIN) != 0 {
        return Vec::new();
    }
    RUN_CAPS.iter().filter(|(_, bit)| cap_eff & (1 << bit) == 0).map(|(name, _)| *name).collect()
}

/// This process's effective capabilities, from `/proc/self/status`.
fn own_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// An error of `ailb run` loading, pinning or attaching: refused by the kernel (EPERM, or
/// EACCES from the verifier) while a needed capability is missing, it names the missing ones.
pub fn run_error(e: &DatapathError, dir: &Path) -> anyhow::Error {
    anyhow::anyhow!("{}", run_message(e, dir, own_caps().map(missing_caps).unwrap_or_default()))
}

/// The text of [`run_error`], pure for the tests.
pub fn run_message(e: &DatapathError, dir: &Path, missing: Vec<&'static str>) -> String {
    match e.errno() {
        Some(n @ (libc::EPERM | libc::EACCES)) if !missing.is_empty() => {
            let all: Vec<&str> = RUN_CAPS.iter().map(|(name, _)| *name).collect();
            format!(
                "{}
the kernel refused it ({}): `ailb run` needs {} (or root); this process lacks {}",
                chain(e),
                errno_name(n),
                all.join(", "),
                missing.join(", ")
            )
        }
        Some(libc::EACCES) => message(e, dir, "ailb run", owner_of(dir)),
        _ => chain(e),
    }
}

/// The text of [`pin_error`], pure for the tests.
pub fn message(e: &DatapathError, dir: &Path, what: &str, owner: Option<Owner>) -> String {
    let chain = chain(e);
    let dir = dir.display();
    let not_ready = matches!(e, DatapathError::State { .. });
    match e.errno() {
        Some(n @ libc::EACCES) => {
            let whose = owner.map_or_else(String::new, |o| format!(" (owned by uid {}, mode {:04o})", o.uid, o.mode));
            format!(
                "{chain}\npermission denied ({}): the pins in {dir}{whose} are readable only by the user `ailb run` \
                 runs as (pins 0600, directory 0700); run `{what}` as that user (e.g. `setpriv --reuid=<user> \
                 --regid=<group> --init-groups {what} ...` or `sudo -u <user> {what} ...`) or as root",
                errno_name(n)
            )
        }
        Some(n @ libc::EPERM) => format!(
            "{chain}\noperation not permitted ({}): the kernel refused the bpf() call on the pins in {dir} (kernels \
             that block unprivileged bpf() with kernel.unprivileged_bpf_disabled want CAP_BPF for it): run \
             `{what}` as root, or as the user that owns the pins with CAP_BPF (e.g. `setpriv --reuid=<user> \
             --regid=<group> --init-groups --inh-caps=+bpf --ambient-caps=+bpf {what} ...`)",
            errno_name(n)
        ),
        Some(libc::ENOENT) => format!("{chain}\n(is `ailb run` started? pins are expected in {dir})"),
        _ if not_ready => format!("{chain}\n(is `ailb run` started? pins are expected in {dir})"),
        _ => chain,
    }
}

#[cfg(test)]
mod tests;
