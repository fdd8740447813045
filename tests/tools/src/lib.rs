//! The benchmark, comparison and demo tools of ailb, built on the integration-test harness
//! (`ailb-tests`: cgroups, the daemon, rnacos, the fake NVML library) and on the simulated GPUs
//! and the replay (`ailb-sim`). Each binary in `src/bin/` is a thin `main` over the modules here.
//!
//! | module | binary |
//! | --- | --- |
//! | [`agent_bench`] | `ailb-agent-bench`: NVML change -> Nacos metadata (no root) |
//! | [`bench`] | `ailb-bench`: the data plane (root) |
//! | [`capacity`] | `ailb-fleet-model`: which offered loads the fleet carries, in simulated time (no root) |
//! | [`compare`] | `ailb-compare`: balancing policies on one simulated fleet (root) |
//! | [`demo`] | `ailb-demo`: the whole system, live (root; `cargo xtask run`) |
//! | [`frontdoor`] | `ailb-frontdoor-bench`: small requests through the front door vs direct, nginx and the peer routers (root) |
//! | [`overload`] | `ailb-overload-bench`: the front door's tenants and scheduler under 5x overload (root) |
//! | [`scale`] | `ailb-scale-bench`: table write time, kernel memory, recompute and connect4 run time at 1,024 models (root) |
//! | [`soak`] | `ailb-soak`: a chaos soak and an overload (root; `cargo xtask soak`) |
//!
//! [`stop`]: Ctrl-C and SIGTERM for the long-running tools, which then tear down what they started.
//!
//! [`sim_gpus`]: a simulated GPU fleet as processes (`ailb-sim` servers, their fake NVML
//! libraries, and the `ailb agent` of each), shared by `ailb-demo` and `ailb-compare`.

pub mod agent_bench;
pub mod bench;
pub mod capacity;
pub mod chart;
pub mod compare;
pub mod demo;
pub mod frontdoor;
pub mod overload;
pub mod scale;
pub mod sim_gpus;
pub mod soak;
pub mod stop;
pub mod tc_bench;

use std::path::{Path, PathBuf};

/// The cargo target directory this binary was built into: the parent of its profile directory
/// (`target/release/ailb-bench` -> `target`), so that it follows `CARGO_TARGET_DIR`. When the
/// running binary cannot be found, `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    exe.as_deref()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}
