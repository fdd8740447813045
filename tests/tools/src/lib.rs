//! The benchmark, comparison and demo tools of ailb, built on the integration-test harness
//! (`ailb-tests`: cgroups, the daemon, rnacos, the fake NVML library) and on the simulated GPUs
//! and the replay (`ailb-sim`). Each binary in `src/bin/` is a thin `main` over the modules here.
//!
//! [`sim_gpus`]: a simulated GPU fleet as processes (`ailb-sim` servers, their fake NVML
//! libraries, and the `ailb agent` of each), shared by `ailb-demo` and `ailb-compare`.

pub mod compare;
pub mod sim_gpus;
