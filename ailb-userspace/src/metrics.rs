//! Label sets shared by the Prometheus metrics of more than one command: the daemon's
//! (`daemon::metrics`, `ailb run`) and the front door's (`gateway::metrics`, `ailb gateway`).
//! A leaf: it uses nothing of the crate, so both can use it without using each other.

use prometheus_client::encoding::EncodeLabelSet;

/// A per-model series: `{model="..."}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}
