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
mod tests {
    use std::{io, path::PathBuf};

    use super::*;

    fn io_error(errno: i32) -> DatapathError {
        DatapathError::Io {
            what: "look up link pin",
            path: PathBuf::from("/sys/fs/bpf/t/links/x"),
            source: io::Error::from_raw_os_error(errno),
        }
    }

    fn map_error(errno: i32) -> DatapathError {
        let syscall = aya::sys::SyscallError { call: "BPF_OBJ_GET", io_error: io::Error::from_raw_os_error(errno) };
        DatapathError::Map { name: "AILB_SERVICES".into(), source: Box::new(aya::maps::MapError::from(syscall)) }
    }

    const DIR: &str = "/sys/fs/bpf/t";

    #[test]
    fn eacces_names_the_errno_the_owner_and_the_way_out() {
        let m = message(&map_error(libc::EACCES), Path::new(DIR), "ailb status", Some(Owner { uid: 990, mode: 0o700 }));
        assert!(m.starts_with("map AILB_SERVICES: `BPF_OBJ_GET` failed: Permission denied (os error 13)\n"), "{m}");
        assert!(m.contains("permission denied (EACCES)"), "{m}");
        assert!(m.contains("owned by uid 990, mode 0700"), "{m}");
        assert!(m.contains("run `ailb status` as that user") && m.contains("or as root"), "{m}");
        assert!(!m.contains("is `ailb run` started"), "{m}");
        let m = message(&io_error(libc::EACCES), Path::new(DIR), "ailb teardown", None);
        assert!(m.starts_with("look up link pin /sys/fs/bpf/t/links/x: Permission denied (os error 13)\n"), "{m}");
        assert!(m.contains("(EACCES)") && m.contains("ailb teardown") && !m.contains("owned by"), "{m}");
    }

    #[test]
    fn eperm_names_the_capability() {
        let m = message(&map_error(libc::EPERM), Path::new(DIR), "ailb explain", None);
        assert!(m.contains("operation not permitted (EPERM)") && m.contains("CAP_BPF"), "{m}");
        assert!(!m.contains("is `ailb run` started"), "{m}");
    }

    #[test]
    fn missing_pins_keep_the_started_hint() {
        let m = message(&map_error(libc::ENOENT), Path::new(DIR), "ailb status", None);
        assert!(m.contains("No such file") && m.contains("is `ailb run` started? pins are expected in /sys/fs/bpf/t"));
        let e = DatapathError::State { path: DIR.into(), reason: "program x is not attached (yet)".into() };
        let m = message(&e, Path::new(DIR), "ailb status", None);
        assert!(m.contains("not attached (yet)") && m.contains("is `ailb run` started?"), "{m}");
    }

    #[test]
    fn run_errors_name_the_missing_capabilities() {
        let all = (1u64 << 39) | (1 << 12) | (1 << 38);
        assert!(missing_caps(all).is_empty() && missing_caps(1 << 21).is_empty());
        assert_eq!(missing_caps(all & !(1 << 38)), ["CAP_PERFMON"]);
        assert_eq!(missing_caps(0), ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]);
        let m = run_message(&map_error(libc::EPERM), Path::new(DIR), vec!["CAP_BPF"]);
        assert!(m.contains("refused it (EPERM)") && m.contains("needs CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON"), "{m}");
        assert!(m.ends_with("this process lacks CAP_BPF"), "{m}");
        // With every capability, an EACCES is about the pin directory.
        let m = run_message(&io_error(libc::EACCES), Path::new(DIR), Vec::new());
        assert!(m.contains("permission denied (EACCES)") && m.contains("ailb run"), "{m}");
        assert_eq!(
            run_message(&DatapathError::NoObject, Path::new(DIR), vec!["CAP_BPF"]),
            DatapathError::NoObject.to_string()
        );
    }

    #[test]
    fn other_errors_are_left_alone() {
        let e = DatapathError::NoObject;
        assert_eq!(message(&e, Path::new(DIR), "ailb status", None), e.to_string());
        assert_eq!(errno_name(libc::EIO), format!("errno {}", libc::EIO));
    }
}
