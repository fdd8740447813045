//! Tests that use the daemon's DEFAULT pin directory `/sys/fs/bpf/ailb` (the path operators
//! and `bpftool` users see). They share that path, so they live in this one test binary and
//! take [`DEFAULT_PATH`] in turn even when the harness runs tests in parallel.
//!
//! Issue bullets: kill -9 of the daemon: new connections are still routed; restart: existing
//! conversations keep their backends; `ailb teardown`: `bpftool cgroup tree` shows no ailb
//! program and /sys/fs/bpf/ailb is gone. And: `bpftool map dump pinned
//! /sys/fs/bpf/ailb/AILB_BACKENDS` shows named fields (BTF).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use ailb_tests::client::{assert_all_ok, one_backend_per_conversation};
use ailb_tests::{
    cgroup2_mount, client_bin, preflight, run_cmd, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon,
    TestClient, TestConfig, DEFAULT_BPFFS,
};
use serde_json::Value;

static DEFAULT_PATH: Mutex<()> = Mutex::new(());

const MODEL: &str = "pinned-7b";
const VIP: &str = "127.77.7.1:8000";
/// (address, weight, free memory MB).
const BACKENDS: [(&str, u32, u32); 3] =
    [("127.0.7.11:18701", 1, 12345), ("127.0.7.12:18702", 2, 40000), ("127.0.7.13:18703", 3, 80000)];
const CONVERSATIONS: usize = 50;

fn config(cg: &CgroupGuard) -> TestConfig {
    let cgroup = cg.path().to_str().expect("UTF-8 cgroup path");
    let mut cfg = TestConfig::new(DEFAULT_BPFFS, cgroup).service(MODEL, VIP);
    for (addr, w, mem) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w).free_memory_mb(mem));
    }
    cfg
}

fn bpftool(args: &[&str]) -> String {
    let out = run_cmd(Command::new("bpftool").args(args), Duration::from_secs(30));
    if !out.status.success() {
        panic!("bpftool {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `bpftool cgroup tree` output: the program lines listed under each cgroup path.
fn programs_by_cgroup(tree: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in tree.lines() {
        if line.starts_with('/') {
            current = Some(line.trim().to_owned());
            m.entry(line.trim().to_owned()).or_default();
        } else if let Some(c) = &current {
            if !line.trim().is_empty() {
                m.entry(c.clone()).or_default().push(line.trim().to_owned());
            }
        }
    }
    m
}

/// The ailb program lines attached at or below `cg`.
fn ailb_programs_under(cg: &Path) -> Vec<String> {
    let mount = cgroup2_mount();
    let tree = bpftool(&["cgroup", "tree", mount.to_str().expect("UTF-8 mount")]);
    let ours = cg.to_str().expect("UTF-8 cgroup path");
    let mut found = Vec::new();
    for (path, progs) in programs_by_cgroup(&tree) {
        let mine = path == ours || path.starts_with(&format!("{ours}/"));
        for p in progs.iter().filter(|p| p.contains("ailb")) {
            if mine {
                found.push(format!("{path}: {p}"));
            } else {
                eprintln!("note: {path} (not this test's cgroup) has an ailb program: {p}");
            }
        }
    }
    found
}

#[test]
fn fail_static_across_kill_restart_and_teardown() {
    let _turn = DEFAULT_PATH.lock().unwrap_or_else(|e| e.into_inner());
    let bin = preflight();
    let cg = CgroupGuard::new("fail-static");
    let _servers = BackendServer::start_all(&BACKENDS.map(|b| b.0));
    let cfg = config(&cg);
    let mut daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());
    let convs = |per: usize| ConnectOpts::new(VIP, CONVERSATIONS * per).conversations(CONVERSATIONS, "fs");
    let live: Vec<&str> = BACKENDS.iter().map(|b| b.0).collect();

    let placed = one_backend_per_conversation(&client.connect(Some(&cg), &convs(2)), "before the kill");
    assert_eq!(
        ailb_programs_under(cg.path()).len(),
        4,
        "the four ailb programs (connect4 and 6, setsockopt, sockops) must be attached to the test cgroup"
    );

    // kill -9: programs stay attached through their pinned links, maps stay pinned.
    daemon.kill9();
    assert!(Path::new(DEFAULT_BPFFS).is_dir(), "{DEFAULT_BPFFS} vanished with the daemon");
    let unhinted = client.connect(Some(&cg), &ConnectOpts::new(VIP, 100));
    assert_all_ok(&unhinted, "unhinted connections with the daemon killed");
    for r in &unhinted {
        let b = r.backend.as_deref().unwrap_or("?");
        assert!(live.contains(&b), "with the daemon killed, connection {} reached {b}", r.i);
    }
    let during = one_backend_per_conversation(&client.connect(Some(&cg), &convs(1)), "with the daemon killed");
    assert_eq!(during, placed, "with the daemon killed, conversations must keep their backends");

    // Restart on the same config: it reopens the pins; conversations keep their backends.
    daemon.restart();
    let after = one_backend_per_conversation(&client.connect(Some(&cg), &convs(2)), "after the restart");
    let moved: Vec<_> = after.iter().filter(|(c, b)| placed.get(*c) != Some(*b)).collect();
    assert!(moved.is_empty(), "after the restart {} conversations changed backend: {moved:?}", moved.len());

    // Teardown: no program left on our cgroup, no pin dir, and connects are no longer
    // rewritten (nothing listens on the VIP itself).
    daemon.teardown();
    assert!(!Path::new(DEFAULT_BPFFS).exists(), "{DEFAULT_BPFFS} still exists after teardown");
    let left = ailb_programs_under(cg.path());
    assert!(left.is_empty(), "after `ailb teardown`, bpftool cgroup tree still shows: {left:?}");
    let direct = client.connect(Some(&cg), &ConnectOpts::new(VIP, 3));
    for r in &direct {
        assert_eq!(
            r.errno,
            Some(libc::ECONNREFUSED),
            "after teardown a connect to the bare VIP must be refused: {r:?}"
        );
    }
}

#[test]
fn bpftool_dumps_backends_with_named_fields() {
    let _turn = DEFAULT_PATH.lock().unwrap_or_else(|e| e.into_inner());
    let bin = preflight();
    let cg = CgroupGuard::new("btf-dump");
    let daemon = Daemon::start(&bin, &config(&cg));
    let pin = format!("{DEFAULT_BPFFS}/AILB_BACKENDS");

    // Plain output: with BTF, bpftool prints field names instead of hex bytes.
    let plain = bpftool(&["map", "dump", "pinned", &pin]);
    for field in ["\"addr\"", "\"port\"", "\"weight\"", "\"cap\"", "\"free_mem_mb\"", "\"state\""] {
        assert!(
            plain.contains(field),
            "`bpftool map dump pinned {pin}` does not show the field {field} (no BTF?); first lines:\n{}",
            plain.lines().take(15).collect::<Vec<_>>().join("\n")
        );
    }

    // JSON output: the BTF-formatted values must match the config (the BTF describes the
    // real layout, not just names): the configured (weight, free memory) pairs appear.
    let json: Value = serde_json::from_str(&bpftool(&["-j", "map", "dump", "pinned", &pin]))
        .unwrap_or_else(|e| panic!("bpftool -j map dump: {e}"));
    let mut seen: Vec<(u64, u64)> = json
        .as_array()
        .unwrap_or_else(|| panic!("bpftool -j output is not an array"))
        .iter()
        .filter_map(|e| {
            let v = &e["formatted"]["value"];
            let w = v["weight"].as_u64()?;
            (w > 0).then(|| (w, v["free_mem_mb"].as_u64().unwrap_or(0)))
        })
        .collect();
    seen.sort();
    let mut want: Vec<(u64, u64)> = BACKENDS.iter().map(|b| (u64::from(b.1), u64::from(b.2))).collect();
    want.sort();
    assert_eq!(seen, want, "(weight, free_mem_mb) of the non-empty AILB_BACKENDS entries, as bpftool formats them");
    drop(daemon);
}
