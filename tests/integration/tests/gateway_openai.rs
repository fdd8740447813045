//! The front door with real clients: `ailb gateway` runs INSIDE the test's child cgroup in front
//! of `ailb-sim` servers (one VIP), and
//! - the official `openai` Python client (the venv `target/client-venv` that `cargo xtask setup`
//!   creates), unchanged and also inside the cgroup, gets a streamed and a non-streamed chat
//!   completion; a 10-turn chat that resends its history lands on one backend; with
//!   `X-Session-ID` set through `default_headers` its requests stick to one backend; and 12
//!   sessions sent down its keep-alive pool spread over several backends;
//! - `curl` asks for 8 GB with `X-Required-Memory: 8`, and every answer comes from the one
//!   backend with that much free memory, though it has the smallest weight.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ailb_tests::{base_config, preflight, run_cmd, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use serde_json::Value;

const MODEL: &str = "sim-7b";
const TURNS: usize = 10;

/// `ailb run` with `backends` (address, weight, free MB) behind `vip`, the gateway on `listen`
/// inside `cg`, and one `ailb-sim` per backend.
fn front_door(
    name: &str,
    cg: &CgroupGuard,
    vip: &str,
    listen: &str,
    backends: &[(&str, u32, u32)],
) -> (Vec<SimServer>, Daemon, GatewayProcess) {
    let bin = preflight();
    let sims: Vec<SimServer> = backends.iter().map(|b| SimServer::start(b.0, MODEL, &["--time-scale", "50"])).collect();
    let mut cfg = base_config(name, cg).service(MODEL, vip);
    for &(addr, w, mem) in backends {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w).free_memory_mb(mem));
    }
    cfg.extra = format!("[gateway]\nlisten = [\"{listen}\"]\n");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = listen.parse().expect("gateway address");
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), cg, listen);
    (sims, daemon, gateway)
}

/// The python of the client venv, or why there is none.
fn client_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/client-venv");
    let python = venv.join("bin/python3");
    if !python.is_file() {
        return Err(format!("no {} (`cargo xtask setup` creates it with the openai client)", python.display()));
    }
    let probe = Command::new(&python).args(["-c", "import openai; print(openai.__version__)"]).output();
    match probe {
        Ok(out) if out.status.success() => Ok(python),
        Ok(out) => {
            Err(format!("{} cannot import openai: {}", python.display(), String::from_utf8_lossy(&out.stderr).trim()))
        }
        Err(e) => Err(format!("running {}: {e}", python.display())),
    }
}

/// `prog args...` as a command that first moves itself into `cg` (a shell writes its own pid
/// to `cgroup.procs`, then execs), so the program's very first socket is in the cgroup.
fn in_cgroup(cg: &CgroupGuard, prog: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""]).arg(cg.path()).arg(prog).args(args);
    cmd
}

#[test]
fn the_openai_python_client_works_unchanged_and_its_conversations_stick() {
    let python = match client_python() {
        Ok(p) => p,
        Err(why) => {
            return ailb_tests::report_skipped(
                "the_openai_python_client_works_unchanged_and_its_conversations_stick",
                &why,
            )
        }
    };
    let cg = CgroupGuard::new("gw-openai");
    let backends = [("127.0.10.11:18011", 1, 20000), ("127.0.10.12:18012", 1, 20000), ("127.0.10.13:18013", 1, 20000)];
    let listen = "127.0.10.1:18000";
    let (_sims, daemon, gateway) = front_door("gw-openai", &cg, "127.77.10.1:8000", listen, &backends);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/openai_chat.py");
    let script = script.to_str().expect("UTF-8 path");
    let base_url = format!("http://{listen}/v1");
    let out = run_cmd(&mut in_cgroup(&cg, &python, &[script, &base_url, MODEL]), Duration::from_secs(120));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the openai script failed ({}):\n{stderr}\n{stdout}\ngateway log:\n{}",
        out.status,
        gateway.log()
    );
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let by_case = |case: &str| -> Vec<&Value> { lines.iter().filter(|l| l["case"] == case).collect() };
    let backend = |l: &Value| l["backend"].as_str().unwrap_or("").to_string();
    let names: BTreeSet<String> = backends.iter().map(|b| b.0.to_string()).collect();

    let cgroup = by_case("cgroup");
    let cg_name = cg.path().file_name().and_then(|n| n.to_str()).expect("cgroup name");
    assert!(
        cgroup[0]["path"].as_str().is_some_and(|p| p.ends_with(cg_name)),
        "the client ran in the cgroup: {cgroup:?}"
    );
    for case in ["plain", "stream"] {
        let l = by_case(case);
        assert_eq!(l.len(), 1, "{case}: {stdout}");
        assert!(names.contains(&backend(l[0])), "{case}: x-ailb-backend names a backend: {}", l[0]);
    }
    assert!(by_case("stream")[0]["chunks"].as_u64().unwrap_or(0) > 0, "{stdout}");
    for case in ["history", "session"] {
        let turns = by_case(case);
        assert_eq!(turns.len(), TURNS, "{case}: {stdout}");
        let used: BTreeSet<String> = turns.iter().map(|l| backend(l)).collect();
        assert_eq!(used.len(), 1, "{case}: the {TURNS} turns reached {used:?}; gateway log:\n{}", gateway.log());
        assert!(used.is_subset(&names), "{case}: {used:?}");
    }
    // The client keeps its connections alive; the gateway picks per request all the same.
    let spread: BTreeSet<String> = by_case("spread").iter().map(|l| backend(l)).collect();
    assert!(
        spread.len() > 1,
        "12 sessions down one client's pool all reached {spread:?}: picked once, not per request"
    );
    // An unknown model: the client raises its NotFoundError, with OpenAI's code and a message
    // naming the model.
    let unknown = by_case("unknown");
    assert_eq!(unknown.len(), 1, "{stdout}");
    assert_eq!((unknown[0]["status"].as_u64(), unknown[0]["code"].as_str()), (Some(404), Some("model_not_found")));
    assert!(unknown[0]["message"].as_str().is_some_and(|m| m.contains("no-such-model")), "{}", unknown[0]);
    eprintln!("openai client: {stdout}");
    drop(gateway);
    drop(daemon);
}

#[test]
fn curl_with_x_required_memory_lands_on_a_backend_with_that_much_free() {
    if !Command::new("sh").args(["-c", "command -v curl"]).stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        return ailb_tests::report_skipped(
            "curl_with_x_required_memory_lands_on_a_backend_with_that_much_free",
            "curl is not installed (command -v curl found nothing)",
        );
    }
    const NEED_MB: u32 = 8 * 1024;
    // Those without 8 GB free carry 8 of the 9 weight units: a pick blind to memory lands
    // on them most of the time.
    let backends = [("127.0.10.21:18021", 5, 4000), ("127.0.10.22:18022", 3, 8000), ("127.0.10.23:18023", 1, 24000)];
    let cg = CgroupGuard::new("gw-curl");
    let listen = "127.0.10.2:18001";
    let (_sims, daemon, gateway) = front_door("gw-curl", &cg, "127.77.10.2:8000", listen, &backends);
    let fit: BTreeSet<&str> = backends.iter().filter(|b| b.2 >= NEED_MB).map(|b| b.0).collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..20 {
        let body =
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"question {i}"}}],"max_tokens":4}}"#);
        let out = run_cmd(
            Command::new("curl").args(["-sS", "-D", "-", "-o", "/dev/null", "-w", "%{http_code}"]).args([
                "-H",
                "Content-Type: application/json",
                "-H",
                "X-Required-Memory: 8",
                "--data",
                &body,
                &format!("http://{listen}/v1/chat/completions"),
            ]),
            Duration::from_secs(30),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.ends_with("200"),
            "request {i}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let b = text
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("x-ailb-backend")))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| panic!("request {i}: no x-ailb-backend in {text}"));
        assert!(
            fit.contains(b.as_str()),
            "request {i} needing {NEED_MB} MB landed on {b}, which has less free; {fit:?} fit; log:\n{}",
            gateway.log()
        );
        *seen.entry(b).or_default() += 1;
    }
    eprintln!("X-Required-Memory: 8 answered by {seen:?}");

    // Bad requests with curl: OpenAI-shaped errors that name the problem.
    let url = format!("http://{listen}/v1/chat/completions");
    let curl = |args: &[&str]| -> (String, Value) {
        let out = run_cmd(
            Command::new("curl")
                .args(["-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json"])
                .args(args),
            Duration::from_secs(30),
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl {args:?}: {text}"));
        (code.to_string(), serde_json::from_str(body).unwrap_or_else(|e| panic!("curl {args:?}: {e}: {body}")))
    };
    let (code, v) = curl(&["--data", r#"{"model": "#, &url]);
    assert_eq!(code, "400", "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("invalid JSON")), "{v}");
    let big = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(big.path(), vec![b' '; (32 << 20) + 1]).unwrap();
    let (code, v) = curl(&["--data-binary", &format!("@{}", big.path().display()), &url]);
    assert_eq!(code, "413", "{v}");
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    // HTTP/2 with prior knowledge on the same port.
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"over h2"}}],"max_tokens":2}}"#);
    let out = run_cmd(
        Command::new("curl").args([
            "-sS",
            "--http2-prior-knowledge",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/json",
            "--data",
            &body,
            &url,
        ]),
        Duration::from_secs(30),
    );
    let head = String::from_utf8_lossy(&out.stdout);
    assert!(
        head.starts_with("HTTP/2 200"),
        "curl --http2-prior-knowledge: {head}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(head.to_ascii_lowercase().contains("x-ailb-backend:"), "{head}");
    drop(gateway);
    drop(daemon);
}
