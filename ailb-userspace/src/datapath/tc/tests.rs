use super::*;

#[test]
fn attachment_pins_name_their_kind_and_parse_back() {
    let dir = Path::new("/sys/fs/bpf/x");
    for a in [
        Attachment::Tcx { interface: "eth0".into() },
        Attachment::Clsact { interface: "veth.1-a".into(), priority: 49152, handle: 0x1_0001 },
    ] {
        let pin = a.pin(dir);
        assert_eq!(pin.parent(), Some(dir.join("links").as_path()));
        let name = pin.file_name().and_then(|n| n.to_str()).unwrap();
        assert_eq!(Attachment::parse(name), Some(a));
    }
    // The cgroup links and anything else under links/ are no TC attachment.
    for other in [programs::CONNECT4, "clsact:x:1:eth0", "clsact:1:2", "tcx-eth0"] {
        assert_eq!(Attachment::parse(other), None, "{other}");
    }
}

fn link_create_error(errno: i32) -> DatapathError {
    let e = aya::sys::SyscallError { call: "bpf_mprog_attach", io_error: std::io::Error::from_raw_os_error(errno) };
    DatapathError::Interface { name: "eth0".into(), source: Box::new(aya::programs::ProgramError::SyscallError(e)) }
}

#[test]
fn only_a_kernel_without_tcx_falls_back_to_clsact() {
    for errno in [libc::EINVAL, libc::EOPNOTSUPP, 524] {
        assert!(tcx_unsupported(&link_create_error(errno)), "errno {errno}");
    }
    // No such interface, no permission, a busy attach point: clsact would fail the same way.
    for errno in [libc::ENODEV, libc::EPERM, libc::EEXIST] {
        assert!(!tcx_unsupported(&link_create_error(errno)), "errno {errno}");
    }
    assert!(!tcx_unsupported(&DatapathError::MissingProgram { name: "x" }));
}
