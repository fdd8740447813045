//! The demo (`cargo xtask run` runs `ailb-demo`): rnacos, simulated GPUs with their
//! agents, the gateway on Nacos discovery, and the load generator in the child cgroup, end to
//! end; and a Ctrl-C in the middle of the load that tears everything down.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ailb_tests::interrupt::{self, Watched};
use ailb_tests::{preflight, run_cmd, workspace_bin};

fn demo(ailb: &Path) -> Command {
    let mut cmd = Command::new(workspace_bin("ailb-tools", "ailb-demo"));
    cmd.env("AILB_BIN", ailb).args(["--a100", "1", "--rtx3090", "1", "--time-scale", "20", "--every-s", "1"]);
    cmd
}

/// What a demo run left behind: its pin directory and its cgroup (both named after its pid).
fn leftovers(pid: u32) -> Vec<String> {
    let name = format!("ailb-test-demo-{pid}");
    interrupt::leftovers(|n| n == name)
}

#[test]
fn the_demo_runs_the_whole_system_and_cleans_up() {
    let ailb = preflight();
    let mut cmd = demo(&ailb);
    cmd.args(["--requests", "40"]);
    let out = run_cmd(&mut cmd, Duration::from_secs(240));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ailb-demo failed ({}):\n{stderr}\n{stdout}", out.status);
    assert!(stderr.contains("all 2 servers are in the table"), "both agents registered and went live:\n{stderr}");
    assert!(
        stderr.contains("front door `ailb gateway`") && stderr.contains("plain HTTP to the front door"),
        "the load goes through the front door by default:\n{stderr}"
    );
    assert!(stdout.contains("front door http://127.0.0.1:"), "the live view shows the front door's address:\n{stdout}");
    assert!(
        stderr.contains("load done: 40 requests, 0 failed"),
        "the synthetic mix fits every GPU, so nothing fails:\n{stderr}"
    );
    // The live view shows both GPUs with a policy weight (not "out"), from the pinned maps.
    for gpu in ["127.0.20.1:8000   a100-80gb", "127.0.20.2:8000   rtx3090-24gb"] {
        let row =
            stdout.lines().rev().find(|l| l.starts_with(gpu)).unwrap_or_else(|| panic!("no row {gpu}:\n{stdout}"));
        let weight: u32 = row.split_whitespace().nth(2).and_then(|w| w.parse().ok()).unwrap_or(0);
        assert!(weight > 0, "{gpu} has a table weight: {row}");
    }
    assert!(stderr.contains("done: nothing left running"), "{stderr}");
}

#[test]
fn ctrl_c_in_the_middle_tears_everything_down() {
    let ailb = preflight();
    let demo = Watched::spawn(demo(&ailb).args(["--requests", "100000"]));
    let pid = demo.pid();
    // Wait for the load to run (readiness from the demo's own output), then Ctrl-C.
    if !demo.wait_for_line("load: ailb-replay", Duration::from_secs(120)) {
        demo.fail("the demo never started its load");
    }
    let (status, log) = demo.interrupt(libc::SIGINT, Duration::from_secs(60));
    assert!(status.success(), "the demo exits cleanly on Ctrl-C ({status}):\n{log}");
    assert!(log.contains("Ctrl-C: stopping") && log.contains("done: nothing left running"), "{log}");
    assert_eq!(leftovers(pid), Vec::<String>::new(), "pins or cgroup left behind:\n{log}");
}
