//! Hostile input. setsockopt with 0 bytes, 4 KiB, unknown optnames, bad idle marks; malformed
//! config files. Clear errors or a safe ignore; no crash; other sockets unaffected.

use std::process::Command;
use std::time::Duration;

use ailb_tests::client::assert_all_ok;
use ailb_tests::status::{generation, stat};
use ailb_tests::{
    base_config, client_bin, preflight, run_cmd, try_run_cmd, wait_until, BackendCfg, BackendServer, CgroupGuard,
    ConnectOpts, Daemon, TestClient, TestConfig,
};

const MODEL: &str = "hostile-7b";
const VIP: &str = "127.77.6.1:8000";
const BACKENDS: [&str; 2] = ["127.0.6.11:18601", "127.0.6.12:18602"];

/// Contract: bad length -> EINVAL, unknown optname -> ENOPROTOOPT. The null pointer case
/// fails in the kernel's copy before any program runs (EFAULT), so ailb never sees it.
const EXPECTED_ERRNO: [(&str, i32); 20] = [
    ("conversation_len0", libc::EINVAL),
    ("conversation_len129", libc::EINVAL),
    ("conversation_len4096", libc::EINVAL),
    ("conversation_len8192", libc::EINVAL),
    ("memory_len3", libc::EINVAL),
    ("memory_len8", libc::EINVAL),
    ("model_len0", libc::EINVAL),
    ("model_len65", libc::EINVAL),
    ("unknown_0", libc::ENOPROTOOPT),
    ("idle_value2", libc::EINVAL),
    ("idle_len8", libc::EINVAL),
    // Prefix keys: a length that is no multiple of 8, a key of 0, more than 16 keys.
    ("prefix_len4", libc::EINVAL),
    ("prefix_key0", libc::EINVAL),
    ("prefix_len136", libc::EINVAL),
    // Keys withheld until asked: 0 or 1, four bytes.
    ("prefix_on_request_value2", libc::EINVAL),
    ("prefix_on_request_len8", libc::EINVAL),
    ("unknown_7", libc::ENOPROTOOPT),
    ("unknown_999", libc::ENOPROTOOPT),
    ("unknown_neg1", libc::ENOPROTOOPT),
    ("conversation_null_len16", libc::EFAULT),
];
/// Cases that must succeed: a conversation at the 128-byte limit and ordinary options.
const EXPECTED_OK: [&str; 3] = ["conversation_len128", "so_reuseaddr", "tcp_nodelay"];

fn config(name: &str, cg: &CgroupGuard) -> TestConfig {
    let mut cfg = base_config(name, cg).service(MODEL, VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1));
    }
    cfg
}

#[test]
fn hostile_setsockopts_are_rejected_and_harm_nothing() {
    let bin = preflight();
    let cg = CgroupGuard::new("hostile-sockopt");
    let _servers = BackendServer::start_all(&BACKENDS);
    let mut daemon = Daemon::start(&bin, &config("hostile-sockopt", &cg));
    let client = TestClient::new(client_bin!());
    let before = daemon.status();

    let cases = client.hostile(Some(&cg), VIP);
    let errno_of = |case: &str| {
        let v = cases.get(case).unwrap_or_else(|| panic!("the client did not report case {case}: {cases:?}"));
        (v["ret"].as_i64().unwrap_or(0), v["errno"].as_i64().unwrap_or(0) as i32)
    };
    for (case, want) in EXPECTED_ERRNO {
        let (ret, got) = errno_of(case);
        assert!(
            ret == -1 && got == want,
            "setsockopt case {case}: expected -1 with errno {want} ({}), got ret {ret} errno {got} ({})",
            std::io::Error::from_raw_os_error(want),
            std::io::Error::from_raw_os_error(got)
        );
    }
    for case in EXPECTED_OK {
        let (ret, got) = errno_of(case);
        assert_eq!((ret, got), (0, 0), "setsockopt case {case} must succeed");
    }
    // The same socket, after all of that, still connects through ailb; so does a fresh one.
    for case in ["connect_after_hostile", "connect_fresh_socket"] {
        let v = &cases[case];
        assert_eq!(v["ok"], true, "{case}: {v}");
        let b = v["backend"].as_str().unwrap_or("");
        assert!(BACKENDS.contains(&b), "{case} reached {b}, not a backend of {VIP}: {v}");
    }
    assert!(daemon.is_running(), "the daemon died during hostile setsockopts; log:\n{}", daemon.log());

    // Counted exactly: 14 rejected SOL_AILB options reached the program (every EINVAL and
    // ENOPROTOOPT case; not the EFAULT one), 1 was accepted (the 128-byte conversation).
    let after = daemon.status();
    let rejected = EXPECTED_ERRNO.iter().filter(|c| c.1 != libc::EFAULT).count() as u64;
    assert_eq!(stat(&after, "bad_sockopts") - stat(&before, "bad_sockopts"), rejected, "stats.bad_sockopts");
    assert_eq!(stat(&after, "sockopts") - stat(&before, "sockopts"), 1, "stats.sockopts");

    // Sockets outside the child cgroup are not ailb's: the kernel itself answers
    // ENOPROTOOPT for every SOL_AILB option and connects go where they are addressed.
    let outside = client.hostile(None, BACKENDS[0]);
    for (case, v) in &outside {
        if EXPECTED_OK[1..].contains(&case.as_str()) {
            assert_eq!(v["ret"], 0, "outside the cgroup, {case}: {v}");
        } else if case.starts_with("connect_") {
            assert_eq!(v["backend"].as_str(), Some(BACKENDS[0]), "outside the cgroup, {case}: {v}");
        } else if case != "conversation_null_len16" {
            assert_eq!(v["errno"].as_i64(), Some(libc::ENOPROTOOPT.into()), "outside the cgroup, {case}: {v}");
        }
    }

    // Normal traffic afterwards.
    let r = client.connect(Some(&cg), &ConnectOpts::new(VIP, 50).conversations(10, "after"));
    assert_all_ok(&r, "connections after the hostile ones");
    daemon.teardown();
}

/// One malformed config: a description, the text, and what stderr must contain (the field
/// and, for values that fail validation, the offending value, as the contract's
/// `config: field `F`: invalid value "V": reason` does).
struct Bad {
    what: &'static str,
    text: String,
    needles: Vec<&'static str>,
}

fn malformed(valid: &str) -> Vec<Bad> {
    let first_backend = BACKENDS[0];
    let dup = valid.replace(BACKENDS[1], first_backend);
    let services_block = format!("[[services]]\nmodel = \"{MODEL}\"\nvip = \"{VIP}\"\n");
    assert!(valid.contains(&services_block), "test bug: services block not found in {valid}");
    vec![
        Bad { what: "invalid TOML", text: valid.replace("[balancer]", "[balancer"), needles: vec!["line"] },
        Bad {
            what: "unknown field",
            text: valid.replace("[balancer]\n", "[balancer]\nbogus_knob = 1\n"),
            needles: vec!["bogus_knob"],
        },
        Bad {
            what: "bad address",
            text: valid.replace(first_backend, "127.0.0.999:1"),
            needles: vec!["backends[0].address", "127.0.0.999:1"],
        },
        Bad {
            what: "weight 70000",
            text: valid.replacen("weight = 1", "weight = 70000", 1),
            needles: vec!["backends[0].weight", "70000"],
        },
        Bad {
            what: "load_factor 0.5",
            text: valid.replace("load_factor = 1.25", "load_factor = 0.5"),
            needles: vec!["balancer.load_factor", "0.5"],
        },
        Bad { what: "probes 0", text: valid.replace("probes = 4", "probes = 0"), needles: vec!["balancer.probes"] },
        Bad { what: "duplicate backend", text: dup, needles: vec!["backends[1].address", first_backend] },
        Bad {
            what: "backend model without a service",
            text: valid.replacen(
                &format!("[[backends]]\nmodel = \"{MODEL}\""),
                "[[backends]]\nmodel = \"no-such-model\"",
                1,
            ),
            needles: vec!["backends[0].model", "no-such-model"],
        },
        Bad { what: "empty services", text: valid.replace(&services_block, ""), needles: vec!["services"] },
        Bad {
            what: "bad affinity_ttl",
            text: valid.replace("affinity_ttl = \"30m\"", "affinity_ttl = \"forever\""),
            needles: vec!["balancer.affinity_ttl", "forever"],
        },
    ]
}

#[test]
fn malformed_configs_are_rejected_with_the_field_named() {
    let bin = preflight();
    let cg = CgroupGuard::new("hostile-config");
    let cfg = config("hostile-config", &cg);
    let bpffs = std::path::PathBuf::from(&cfg.bpffs);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let valid = cfg.to_toml();

    // The base config is valid, so each case below fails for its one defect only.
    let path = dir.path().join("valid.toml");
    std::fs::write(&path, &valid).unwrap_or_else(|e| panic!("{e}"));
    let out = run_cmd(Command::new(&bin).arg("check").arg("--config").arg(&path), Duration::from_secs(10));
    assert!(out.status.success(), "the base config must be valid: {}", String::from_utf8_lossy(&out.stderr));

    for (i, bad) in malformed(&valid).into_iter().enumerate() {
        assert_ne!(bad.text, valid, "test bug: case {:?} did not change the config", bad.what);
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, &bad.text).unwrap_or_else(|e| panic!("{e}"));
        for sub in ["check", "run"] {
            // `run` must stop at the config, before loading anything: bounded, and nothing pinned.
            let res = try_run_cmd(Command::new(&bin).arg(sub).arg("--config").arg(&path), Duration::from_secs(10));
            if bpffs.exists() {
                let _ = run_cmd(Command::new(&bin).arg("teardown").arg("--bpffs").arg(&bpffs), Duration::from_secs(30));
                panic!("`ailb {sub}` with a config with {} pinned {} (torn down again)", bad.what, bpffs.display());
            }
            let out = res.unwrap_or_else(|e| panic!("`ailb {sub}` with a config with {}: {e}", bad.what));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "`ailb {sub}` accepted a config with {} (exit {}); config:\n{}",
                bad.what,
                out.status,
                bad.text
            );
            for needle in &bad.needles {
                assert!(
                    stderr.contains(needle),
                    "`ailb {sub}` with {}: stderr does not name {needle:?}:\n{stderr}",
                    bad.what
                );
            }
            eprintln!("{sub} / {}: {}", bad.what, stderr.trim().lines().last().unwrap_or(""));
        }
    }
}

#[test]
fn an_invalid_config_on_reload_keeps_the_running_one() {
    let bin = preflight();
    let cg = CgroupGuard::new("hostile-reload");
    let _servers = BackendServer::start_all(&BACKENDS);
    let cfg = config("hostile-reload", &cg);
    let mut daemon = Daemon::start(&bin, &cfg);
    let gen_before = generation(&daemon.status());

    let bad = cfg.to_toml().replace(BACKENDS[0], "127.0.0.999:1");
    daemon.reload_raw(&bad);
    // The daemon reports the rejected reload in its log, naming the field.
    wait_until("the daemon to log the rejected reload (naming backends[0].address)", Duration::from_secs(10), || {
        daemon.log().contains("backends[0].address").then_some(())
    });
    assert!(daemon.is_running(), "the daemon exited on an invalid reload; log:\n{}", daemon.log());
    assert_eq!(generation(&daemon.status()), gen_before, "an invalid config must not be applied");
    let r = TestClient::new(client_bin!()).connect(Some(&cg), &ConnectOpts::new(VIP, 50));
    assert_all_ok(&r, "connections after the rejected reload");

    // And a valid reload afterwards is applied.
    daemon.reload(&cfg);
}
