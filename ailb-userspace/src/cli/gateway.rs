//! `ailb gateway`: the front door (see [`crate::gateway`]). Run it unprivileged, inside the
//! cgroup `ailb run` attaches to.

use std::path::Path;

pub fn gateway(config: Option<&Path>) -> anyhow::Result<()> {
    crate::gateway::run(config)?;
    Ok(())
}
