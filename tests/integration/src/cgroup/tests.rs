use super::*;

#[test]
fn finds_cgroup2_in_a_hybrid_layout() {
    let mounts = "sysfs /sys sysfs rw 0 0\n\
                      tmpfs /sys/fs/cgroup tmpfs ro 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n";
    assert_eq!(parse_cgroup2_mount(mounts), Some(PathBuf::from("/sys/fs/cgroup/unified")));
}

#[test]
fn decodes_octal_escapes_and_reports_absence() {
    assert_eq!(parse_cgroup2_mount("none /mnt/my\\040cg cgroup2 rw 0 0\n"), Some(PathBuf::from("/mnt/my cg")));
    assert_eq!(parse_cgroup2_mount("proc /proc proc rw 0 0\n"), None);
}
