//! Ctrl-C (SIGINT) and SIGTERM for the long-running tools: the handler only records the
//! request; the tool's own loops check it and return, so that every guard (the fleet's
//! processes, the daemon's pins and links, the child cgroup) is dropped and tears down what
//! it made. Killed without it, a tool leaves its programs attached to its cgroup.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() -> anyhow::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int);
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        if unsafe { libc::signal(sig, handler as libc::sighandler_t) } == libc::SIG_ERR {
            anyhow::bail!("installing the handler of signal {sig}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived since [`install`].
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// `Err` once a stop was requested: `?` it in a loop to unwind through the guards.
pub fn check(what: &str) -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted (SIGINT or SIGTERM) during {what}: tearing down what was started");
    }
    Ok(())
}
