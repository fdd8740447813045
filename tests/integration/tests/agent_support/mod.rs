//! Shared by the `agent_*` tests: the harness lives in `ailb_tests::agent_harness` (also used by
//! `ailb-agent-bench`).

#![allow(unused_imports, reason = "each test binary uses part of the harness")]

pub(crate) use ailb_tests::agent_harness::*;
