//! `ailb run` as an unprivileged user (`nobody`) with exactly the capabilities it needs:
//! CAP_BPF (maps, BTF, program loads, pins), CAP_NET_ADMIN (the cgroup socket program types)
//! and CAP_PERFMON (the verifier accepts the programs' reads of stack slots not written on
//! every path only with it). It attaches to a child cgroup and routes; its pins are 0600 and
//! its pin directory 0700, owned by that user; a user without access is told the errno and
//! the way out; with one of the three capabilities dropped it fails naming the missing one.
//!
//! Started with `setpriv`, so the capabilities are the inheritable, ambient and bounding sets
//! of the exec'ed `ailb`. The `ailb` binary (`AILB_BIN`) must be readable and executable by
//! `nobody`, and the pin directory's parent (bpffs) writable by it (here `/sys/fs/bpf` is
//! 1777; elsewhere an operator creates the pin directory beforehand: see the README).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ailb_tests::client::{assert_all_ok, count_by_backend};
use ailb_tests::{
    base_config, client_bin, preflight, run_cmd, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon, Launch,
    TestClient, TestConfig,
};

const MODEL: &str = "lp-7b";
const VIP: &str = "127.77.41.1:8000";
const BACKENDS: [&str; 2] = ["127.0.41.11:18941", "127.0.41.12:18942"];
/// The documented capability set, in setpriv's spelling.
const CAPS: [&str; 3] = ["bpf", "net_admin", "perfmon"];
/// `nobody` / `nogroup`.
const NOBODY: u32 = 65534;

/// `setpriv` as `user` with exactly `caps` (inheritable, ambient and bounding sets); a numeric
/// user without a passwd entry gets no supplementary groups.
fn setpriv(user: &str, group: &str, caps: &[&str]) -> Vec<String> {
    let groups = if user.parse::<u32>().is_ok() { "--clear-groups" } else { "--init-groups" };
    let set = std::iter::once("-all".to_string()).chain(caps.iter().map(|c| format!("+{c}"))).collect::<Vec<_>>();
    let set = set.join(",");
    vec![
        "setpriv".into(),
        format!("--reuid={user}"),
        format!("--regid={group}"),
        groups.into(),
        format!("--inh-caps={set}"),
        format!("--ambient-caps={set}"),
        format!("--bounding-set={set}"),
    ]
}

/// Fails with the reason when this host cannot run the test as designed.
fn require_setup(bin: &Path) {
    let out = Command::new("setpriv").arg("--version").output();
    if !out.is_ok_and(|o| o.status.success()) {
        panic!("setpriv (util-linux) is needed to start ailb as an unprivileged user");
    }
    let mut cur = Some(bin);
    while let Some(p) = cur {
        let mode = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode();
        if mode & 0o001 == 0 {
            panic!(
                "{} (mode {:o}) is not executable/searchable by other users: nobody cannot start {}; copy the \
                 binary to e.g. /tmp/<name>/ailb (chmod 755) and set AILB_BIN",
                p.display(),
                mode & 0o7777,
                bin.display()
            );
        }
        cur = p.parent().filter(|p| !p.as_os_str().is_empty());
    }
    let bpffs = std::fs::metadata("/sys/fs/bpf").expect("/sys/fs/bpf");
    if bpffs.mode() & 0o002 == 0 {
        panic!(
            "/sys/fs/bpf (mode {:o}) is not writable by other users: this test lets the daemon create its own pin \
             directory there",
            bpffs.mode() & 0o7777
        );
    }
}

fn config(cg: &CgroupGuard, name: &str) -> TestConfig {
    let mut cfg = base_config(name, cg).service(MODEL, VIP);
    for a in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, a, 1));
    }
    cfg
}

/// `Uid` and `CapEff` of a process, from `/proc/<pid>/status`.
fn uid_and_caps(pid: u32) -> (u32, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("no {name} in {status}")).trim()
    };
    let uid = field("Uid:").split_whitespace().next().expect("real uid").parse().expect("uid");
    (uid, u64::from_str_radix(field("CapEff:"), 16).expect("CapEff hex"))
}

fn assert_mode(path: &Path, want: u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(m.mode() & 0o7777, want, "{} has mode {:o}, want {want:o}", path.display(), m.mode() & 0o7777);
    assert_eq!(m.uid(), NOBODY, "{} is owned by uid {}, want nobody", path.display(), m.uid());
}

#[test]
fn the_daemon_runs_as_nobody_with_three_capabilities_and_routes() {
    let bin = preflight();
    require_setup(&bin);
    let cg = CgroupGuard::new("least-priv");
    let _servers = BackendServer::start_all(&BACKENDS);
    let cfg = config(&cg, "least-priv");
    let launch = Launch { wrapper: setpriv("nobody", "nogroup", &CAPS), env: Vec::new() };
    let daemon = Daemon::start_with(&bin, &cfg, launch);

    // The process is nobody with exactly CAP_BPF (39), CAP_NET_ADMIN (12), CAP_PERFMON (38).
    let (uid, caps) = uid_and_caps(daemon.pid().expect("daemon pid"));
    assert_eq!(uid, NOBODY, "the daemon runs as nobody");
    assert_eq!(
        caps,
        (1 << 39) | (1 << 12) | (1 << 38),
        "CapEff {caps:#x}: exactly CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON"
    );

    // It routes: every connection from the child cgroup reaches one of the backends.
    let results = TestClient::new(client_bin!()).connect(Some(&cg), &ConnectOpts::new(VIP, 40));
    assert_all_ok(&results, "connections through the unprivileged daemon");
    let counts = count_by_backend(&results);
    assert!(BACKENDS.iter().all(|b| counts.get(*b).copied().unwrap_or(0) > 0), "both backends get some: {counts:?}");

    // Pins 0600 and directories 0700, all owned by nobody.
    let dir = daemon.bpffs().to_path_buf();
    assert_mode(&dir, 0o700);
    assert_mode(&dir.join("links"), 0o700);
    let mut pins = 0;
    for sub in [dir.clone(), dir.join("links")] {
        for e in std::fs::read_dir(&sub).expect("read pin dir") {
            let p = e.expect("entry").path();
            if p.is_file() || std::fs::symlink_metadata(&p).is_ok_and(|m| !m.is_dir()) {
                assert_mode(&p, 0o600);
                pins += 1;
            }
        }
    }
    assert!(pins >= 14, "the 11 maps and 3 links are pinned: {pins} pins");

    // The owner reads its pins without any capability; another user is told the errno and how.
    let status_as = |user: &str, group: &str| {
        let mut argv = setpriv(user, group, &[]);
        argv.extend([bin.display().to_string(), "status".into(), "--bpffs".into(), dir.display().to_string()]);
        run_cmd(Command::new(&argv[0]).args(&argv[1..]), Duration::from_secs(30))
    };
    let own = status_as("nobody", "nogroup");
    assert!(own.status.success(), "status as the pins' owner: {}", String::from_utf8_lossy(&own.stderr));
    assert!(String::from_utf8_lossy(&own.stdout).contains(MODEL), "status lists the model");
    let other = status_as("65533", "65533");
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "status as another user must fail");
    assert!(err.contains("permission denied (EACCES)") && err.contains("or as root"), "names errno and way out: {err}");
    assert!(err.contains(&format!("owned by uid {NOBODY}")), "names the owner: {err}");
    assert!(!err.contains("is `ailb run` started"), "the daemon runs: no 'started?' hint: {err}");
    drop(daemon);
}

#[test]
fn without_one_of_the_three_capabilities_start_up_fails_naming_it() {
    let bin = preflight();
    require_setup(&bin);
    for drop_cap in CAPS {
        let name = format!("least-priv-no-{}", drop_cap.replace('_', "-"));
        let cg = CgroupGuard::new(&name);
        let cfg = config(&cg, &name);
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = tmp.path().join("ailb.toml");
        std::fs::write(&path, cfg.to_toml()).expect("write config");
        let caps: Vec<&str> = CAPS.iter().copied().filter(|c| *c != drop_cap).collect();
        let argv = setpriv("nobody", "nogroup", &caps);
        let out = run_cmd(
            Command::new(&argv[0]).args(&argv[1..]).arg(&bin).arg("run").arg("--config").arg(&path),
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        let tail = &err[err.len().saturating_sub(600)..];
        assert!(!out.status.success(), "ailb run without {drop_cap} must fail; stderr tail: {tail}");
        let want = format!("this process lacks CAP_{}", drop_cap.to_uppercase());
        assert!(tail.contains(&want), "without {drop_cap}: the error ends naming it ({want}): {tail}");
        assert!(tail.contains("needs CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON"), "names the whole set: {tail}");
        assert!(!Path::new(&cfg.bpffs).exists(), "a failed start leaves no pins at {}", cfg.bpffs);
    }
}

/// A daemon started by hand (not [`Daemon`], which refuses an existing pin directory): on drop
/// it is killed by pid and its pins are torn down as root.
struct RawDaemon {
    child: std::process::Child,
    bin: std::path::PathBuf,
    bpffs: String,
}

impl Drop for RawDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = run_cmd(Command::new(&self.bin).args(["teardown", "--bpffs", &self.bpffs]), Duration::from_secs(30));
    }
}

#[test]
fn an_empty_pin_directory_made_by_the_operator_is_used() {
    let bin = preflight();
    require_setup(&bin);
    let cg = CgroupGuard::new("least-priv-opdir");
    let cfg = config(&cg, "least-priv-opdir");
    // The operator's step: `install -d -o nobody -g nogroup -m 0700 <daemon.bpffs>`.
    std::fs::create_dir(&cfg.bpffs).unwrap_or_else(|e| panic!("mkdir {}: {e}", cfg.bpffs));
    std::os::unix::fs::chown(&cfg.bpffs, Some(NOBODY), Some(NOBODY)).expect("chown");
    std::fs::set_permissions(&cfg.bpffs, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = tmp.path().join("ailb.toml");
    std::fs::write(&path, cfg.to_toml()).expect("write config");
    let log = tmp.path().join("daemon.log");
    let f = std::fs::File::create(&log).expect("log");
    let argv = setpriv("nobody", "nogroup", &CAPS);
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .arg(&bin)
        .args(["run", "--config"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .stdout(f.try_clone().expect("fd"))
        .stderr(f)
        .spawn()
        .expect("spawn setpriv ailb run");
    let mut d = RawDaemon { child, bin: bin.clone(), bpffs: cfg.bpffs.clone() };
    ailb_tests::wait_until("the daemon to attach in the operator's directory", Duration::from_secs(30), || {
        if let Ok(Some(st)) = d.child.try_wait() {
            panic!("ailb run exited ({st}); log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        let out = run_cmd(Command::new(&bin).args(["status", "--bpffs", &cfg.bpffs]), Duration::from_secs(30));
        out.status.success().then_some(())
    });
    let dir = Path::new(&cfg.bpffs);
    assert_mode(dir, 0o700);
    assert_mode(&dir.join("links"), 0o700);
    assert_mode(&dir.join("AILB_SERVICES"), 0o600);
    assert_mode(&dir.join("links").join("ailb_connect4"), 0o600);
    let _ = d.child.kill();
    let _ = d.child.wait();
    drop(d);
    assert!(!dir.exists(), "teardown removed {}", dir.display());
}
