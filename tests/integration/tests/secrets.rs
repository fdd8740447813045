//! The Nacos password and the tokens Nacos issues never appear in what ailb shows: the logs
//! of `ailb run` and `ailb agent` at debug level, the daemon's `/metrics` and `/v1/plan`, the
//! agent's `/metrics`, `ailb status --json`, `ailb explain --json`, `ailb check`, and the
//! errors of a refused login. Against rnacos 0.8.8 with Open API auth, through a recording
//! TCP relay that captures the tokens rnacos hands out (they differ per login), with the
//! password from `password_file` (daemon) and `password_env` (agent).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ailb_tests::agent_harness::{FakeVllm, IP, SERVICE};
use ailb_tests::nacos::{free_port, http_request, RnacosServer};
use ailb_tests::{base_config, preflight, run_cmd, wait_until, CgroupGuard, Daemon, Launch};

const USER: &str = "ailb";
/// Recognizable, so that any copy of it is found.
const PASSWORD: &str = "ailb-Pw-7f3a9c-NEVER-PRINTED";
const WRONG_PASSWORD: &str = "ailb-Wrong-Pw-91c2e-NEVER-PRINTED";
const VIP: &str = "127.77.42.1:8000";
const PW_ENV: &str = "AILB_TEST_NACOS_PASSWORD";

/// A TCP relay to rnacos that keeps every byte both ways.
struct Recorder {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
}

fn pipe(mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 16384];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                seen.lock().expect("recorder").extend_from_slice(&buf[..n]);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

impl Recorder {
    fn start(upstream: u16) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let port = l.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let (c2, u2) = (conn.try_clone().expect("clone"), up.try_clone().expect("clone"));
                let (sa, sb) = (s.clone(), s.clone());
                std::thread::spawn(move || pipe(conn, up, sa));
                std::thread::spawn(move || pipe(u2, c2, sb));
            }
        });
        Self { port, seen }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("recorder")).into_owned()
    }

    /// Every `accessToken` value rnacos sent in a login answer.
    fn tokens(&self) -> Vec<String> {
        let text = self.text();
        let key = "\"accessToken\":\"";
        let mut out: Vec<String> = text
            .match_indices(key)
            .filter_map(|(i, _)| text[i + key.len()..].split('"').next().map(str::to_string))
            .filter(|t| t.len() >= 16)
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn agent_config(nacos: &str, vllm: u16, listen: u16, instance: u16, password: &str) -> String {
    format!(
        r#"
publish_interval = "250ms"
heartbeat_interval = "500ms"
drain_timeout = "1s"
listen = "127.0.0.1:{listen}"

[nacos]
servers = ["{nacos}"]
api = "v1"
username = "{USER}"
{password}
timeout = "500ms"

[[instances]]
service = "{SERVICE}"
ip = "{IP}"
port = {instance}
model_id = "{SERVICE}"
metrics_url = "http://127.0.0.1:{vllm}/metrics"
health_url = "http://127.0.0.1:{vllm}/health"
nvml = false
"#
    )
}

/// `ailb agent` with `AILB_LOG=debug` and the password in [`PW_ENV`]; its log goes to `log`.
fn spawn_agent(bin: &Path, config: &Path, log: &Path, password: &str) -> std::process::Child {
    let f = std::fs::File::create(log).expect("agent log");
    Command::new(bin)
        .args(["agent", "--config"])
        .arg(config)
        .env("AILB_LOG", "debug")
        .env(PW_ENV, password)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("fd"))
        .stderr(f)
        .spawn()
        .expect("spawn ailb agent")
}

fn get(port: u16, path: &str) -> String {
    let (status, body) = http_request(port, "GET", path, &[]).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(status, 200, "GET {path}");
    String::from_utf8_lossy(&body).into_owned()
}

fn output_text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_password_and_the_tokens_appear_in_no_log_endpoint_or_error() {
    let bin = preflight();
    let nacos = RnacosServer::start_with(&[
        ("RNACOS_ENABLE_OPEN_API_AUTH", "true"),
        ("RNACOS_INIT_ADMIN_USERNAME", USER),
        ("RNACOS_INIT_ADMIN_PASSWORD", PASSWORD),
    ]);
    let relay = Recorder::start(nacos.http_port);
    let dir = tempfile::tempdir().expect("tempdir");
    let vllm = FakeVllm::start();
    let mut shown: Vec<(String, String)> = Vec::new();

    // The agent registers the instance, logging in with the password from the environment.
    let (agent_port, instance_port) = (free_port(), free_port());
    let agent_cfg = dir.path().join("agent.toml");
    let env_line = format!("password_env = \"{PW_ENV}\"");
    std::fs::write(&agent_cfg, agent_config(&relay.url(), vllm.port, agent_port, instance_port, &env_line))
        .expect("write");
    let agent_log = dir.path().join("agent.log");
    let mut agent = spawn_agent(&bin, &agent_cfg, &agent_log, PASSWORD);

    // The daemon reads it, logging in with the password from a file.
    let pw_file = dir.path().join("nacos.pass");
    std::fs::write(&pw_file, format!("{PASSWORD}\n")).expect("write password file");
    let cg = CgroupGuard::new("secrets");
    let listen = free_port();
    let mut cfg = base_config("secrets", &cg);
    cfg.listen = Some(format!("127.0.0.1:{listen}"));
    cfg.extra = format!(
        "[[models]]\nname = \"{SERVICE}\"\nvips = [\"{VIP}\"]\n\n[discovery]\nsource = \"nacos\"\n\
         [discovery.nacos]\nservers = [\"{}\"]\nusername = \"{USER}\"\npassword_file = \"{}\"\n",
        relay.url(),
        pw_file.display()
    );
    let launch = Launch { wrapper: Vec::new(), env: vec![("AILB_LOG".into(), "debug".into())] };
    let daemon = Daemon::start_with(&bin, &cfg, launch);
    let backend = format!("{IP}:{instance_port}");
    wait_until("the agent's instance in the daemon's plan", Duration::from_secs(20), || {
        if let Ok(Some(st)) = agent.try_wait() {
            panic!("the agent exited ({st}); log:\n{}", std::fs::read_to_string(&agent_log).unwrap_or_default());
        }
        get(listen, "/v1/plan").contains(&backend).then_some(())
    });

    shown.push(("daemon /metrics".into(), get(listen, "/metrics")));
    shown.push(("daemon /v1/plan".into(), get(listen, "/v1/plan")));
    shown.push(("agent /metrics".into(), get(agent_port, "/metrics")));
    let bpffs = daemon.bpffs().display().to_string();
    let explain = run_cmd(
        Command::new(&bin).args(["explain", "--model", SERVICE, "--conversation", "conv-1", "--json"]).args([
            "--listen",
            &format!("127.0.0.1:{listen}"),
            "--bpffs",
            &bpffs,
        ]),
        Duration::from_secs(30),
    );
    assert!(explain.status.success(), "ailb explain: {}", output_text(&explain));
    shown.push(("ailb explain --json".into(), output_text(&explain)));
    let status = run_cmd(Command::new(&bin).args(["status", "--json", "--bpffs", &bpffs]), Duration::from_secs(30));
    shown.push(("ailb status --json".into(), output_text(&status)));
    let check =
        run_cmd(Command::new(&bin).arg("check").arg("--config").arg(daemon.config_path()), Duration::from_secs(30));
    assert!(check.status.success(), "ailb check: {}", output_text(&check));
    shown.push(("ailb check".into(), output_text(&check)));

    // Refused logins: `ailb run` stops with the error; `ailb agent` logs it and retries.
    let bad = dir.path().join("bad.toml");
    let mut bad_cfg = base_config("secrets-bad", &cg);
    bad_cfg.extra = format!(
        "[[models]]\nname = \"{SERVICE}\"\nvips = [\"{VIP}\"]\n\n[discovery]\nsource = \"nacos\"\n\
         [discovery.nacos]\nservers = [\"{}\"]\nusername = \"{USER}\"\npassword = \"{WRONG_PASSWORD}\"\n",
        relay.url()
    );
    std::fs::write(&bad, bad_cfg.to_toml()).expect("write");
    let refused = run_cmd(
        Command::new(&bin).args(["run", "--config"]).arg(&bad).env("AILB_LOG", "debug"),
        Duration::from_secs(30),
    );
    let refused_text = output_text(&refused);
    assert!(
        !refused.status.success() && refused_text.contains("refused"),
        "a refused login stops ailb run: {refused_text}"
    );
    assert!(!Path::new(&bad_cfg.bpffs).exists(), "nothing pinned by the refused start");
    shown.push(("ailb run with a wrong password".into(), refused_text));
    let bad_agent_cfg = dir.path().join("bad-agent.toml");
    std::fs::write(&bad_agent_cfg, agent_config(&relay.url(), vllm.port, free_port(), free_port(), &env_line))
        .expect("write");
    let bad_agent_log = dir.path().join("bad-agent.log");
    let mut bad_agent = spawn_agent(&bin, &bad_agent_cfg, &bad_agent_log, WRONG_PASSWORD);
    wait_until("the agent with a wrong password to report the refusal", Duration::from_secs(20), || {
        let log = std::fs::read_to_string(&bad_agent_log).unwrap_or_default();
        (log.contains("refused") || bad_agent.try_wait().ok().flatten().is_some()).then_some(())
    });
    let _ = bad_agent.kill();
    let _ = bad_agent.wait();
    shown
        .push(("ailb agent with a wrong password".into(), std::fs::read_to_string(&bad_agent_log).unwrap_or_default()));

    let _ = agent.kill();
    let _ = agent.wait();
    shown.push(("ailb agent log".into(), std::fs::read_to_string(&agent_log).unwrap_or_default()));
    shown.push(("ailb run log".into(), daemon.log()));

    // The check is not vacuous: the secrets crossed the relay, the logs are at debug level.
    let wire = relay.text();
    let tokens = relay.tokens();
    assert!(wire.contains(PASSWORD) && wire.contains(WRONG_PASSWORD), "both passwords were sent to Nacos");
    assert!(tokens.len() >= 2, "rnacos issued tokens to the daemon and the agent: {tokens:?}");
    assert!(daemon.log().contains("nacos: logged in"), "the daemon logged at debug level");
    for (what, text) in &shown {
        assert!(!text.is_empty(), "{what} is empty: nothing was checked");
        for secret in [PASSWORD, WRONG_PASSWORD].iter().copied().chain(tokens.iter().map(String::as_str)) {
            let kind = if secret.contains("NEVER-PRINTED") { "a password" } else { "a token" };
            assert!(!text.contains(secret), "{what} shows {kind}:\n{text}");
        }
    }
    drop(daemon);
}
