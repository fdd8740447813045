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
