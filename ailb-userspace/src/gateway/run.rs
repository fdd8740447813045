//! Start-up of `ailb gateway`: the config loaded ([`load`]), the admission opened, one
//! thread per worker with its own runtime and listening sockets ([`run`]), until SIGINT or
//! SIGTERM.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::control::{AdmissionError, Control};
use super::service::Gateway;
use crate::config::gateway::ValidGateway;

/// Start-up failures of `ailb gateway`.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] crate::validate::ConfigError),
    #[error("gateway: listening on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("gateway: starting the tokio runtime")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
}

/// The catalog and the `[gateway]` section of the config at `path` (or the embedded
/// default), both validated.
pub fn load(path: Option<&Path>) -> Result<(crate::config::ValidConfig, ValidGateway), GatewayError> {
    let config = match path {
        Some(p) => crate::config::Config::load(p)?,
        None => crate::config::Config::embedded_default(),
    };
    let valid = config.validate()?;
    let gateway = config.gateway.validate(valid.models.keys().map(String::as_str))?;
    Ok((valid, gateway))
}

/// `ailb gateway`: serves on every `gateway.listen` address until SIGINT or SIGTERM.
///
/// One thread per worker (`worker_threads`, default one per core), each with a single-threaded
/// runtime, a listening socket of its own on every address (`SO_REUSEPORT`: the kernel spreads
/// new client connections over them) and a pool of its own ([`Gateway::worker`]): a request,
/// its upstream connection and its answer stay on one thread, so no request wakes another
/// thread (a runtime whose threads share the work wakes one for about every request).
pub fn run(path: Option<&Path>) -> Result<(), GatewayError> {
    small_pages_only();
    let (config, gateway) = load(path)?;
    for (model, t) in &gateway.tokenizers {
        tracing::info!(
            model = %model,
            path = %t.path.display(),
            byte_level = t.tokenizer.direct_path(),
            cut_after = ?t.tokenizer.cut_tokens(),
            "gateway: token-exact prefix keys (byte_level: the tokenizer's ids without the library's bookkeeping)"
        );
    }
    let workers = gateway.worker_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut listeners = bind(&gateway.listen, workers)?.into_iter();
    let first_listeners = listeners.next().unwrap_or_default();
    // The first worker's runtime, on this thread, also runs the admission's refresh task.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| GatewayError::Runtime { source })?;
    // Before any worker serves: a client that can connect finds the admission in place.
    let mut registry = Registry::default();
    let admission = Control::open(&config, &gateway, &rt, &mut registry)?;
    let gw = Gateway::with_admission(&config, gateway, registry, admission);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut threads = Vec::new();
    for (i, ls) in (1..).zip(listeners) {
        let (gw, stopped) = (gw.worker(i, workers), stopped.clone());
        let thread = std::thread::Builder::new()
            .name(format!("ailb-gateway-{i}"))
            .spawn(move || serve_worker(gw, ls, stopped))
            .map_err(|source| GatewayError::Runtime { source })?;
        threads.push(thread);
    }
    let first = gw.worker(0, workers);
    let served = rt.block_on(async {
        let tasks = spawn_serving(&first, first_listeners)?;
        shutdown_signal().await;
        tracing::info!("gateway: stopping");
        tasks.into_iter().for_each(|t| t.abort());
        Ok(())
    });
    let _ = stop.send(true);
    for t in threads {
        match t.join() {
            Ok(r) => r?,
            Err(_) => tracing::error!("gateway: a worker thread panicked"),
        }
    }
    served
}

/// Keeps this process's memory on small pages: transparent huge pages off
/// (`PR_SET_THP_DISABLE`), for every thread and every mapping faulted from now on.
///
/// Why: the allocator (mimalloc) asks for huge pages on its arenas and hands freed memory back
/// to the system after a while. A thread that works only now and then (the blocking pool that
/// tokenizes a prompt for its prefix keys) then faults its memory in afresh, each fault a 2 MiB
/// page zeroed whole, on the request's path: in the synthetic race's precise row, making the
/// keys of a 2,000-token prompt took about 3 ms at the median but up to 54 ms (one in ten over
/// 11 ms), most of it the kernel zeroing huge pages (`perf`: `clear_page_erms` under
/// `do_huge_pmd_anonymous_page`, more samples than the tokenizer's own code); on small pages,
/// at most 6.7 ms (one in ten over 4.4 ms), and half the CPU. The front door's throughput
/// showed no difference with or without them. A kernel that refuses the flag leaves things
/// as they were, with a warning.
fn small_pages_only() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(error = %e, "gateway: transparent huge pages stay on (prctl PR_SET_THP_DISABLE failed)");
    }
}

/// Worker `i`'s listening sockets, one per address of `addrs`, for each of `workers`: every
/// worker's socket on an address shares its port (`SO_REUSEPORT`; the port a first plain bind
/// got when the address asks for port 0). That first bind, without `SO_REUSEPORT`, also keeps
/// an address another process listens on refused ("address in use"), as a single socket was,
/// rather than shared with it.
fn bind(addrs: &[SocketAddr], workers: usize) -> Result<Vec<Vec<std::net::TcpListener>>, GatewayError> {
    let mut out: Vec<Vec<std::net::TcpListener>> = (0..workers.max(1)).map(|_| Vec::new()).collect();
    for &addr in addrs {
        let err = |source| GatewayError::Bind { addr, source };
        let at = socket(addr, false).and_then(|probe| probe.local_addr()).map_err(err)?;
        let at = at.as_socket().ok_or_else(|| err(std::io::ErrorKind::AddrNotAvailable.into()))?;
        for listeners in &mut out {
            let l = socket(at, true).and_then(|s| s.listen(1024).map(|()| s)).map_err(err)?;
            listeners.push(l.into());
        }
        tracing::info!(local = %at, workers, "gateway: listening");
    }
    Ok(out)
}

/// A non-blocking TCP socket bound to `addr`, sharing its port with the other workers' when
/// `shared`.
fn socket(addr: SocketAddr, shared: bool) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(shared)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// Serves `listeners` on this thread's own runtime until `stopped` turns true.
fn serve_worker(
    gw: Arc<Gateway>,
    listeners: Vec<std::net::TcpListener>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), GatewayError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| GatewayError::Runtime { source })?;
    rt.block_on(async {
        let tasks = spawn_serving(&gw, listeners)?;
        let _ = stopped.wait_for(|s| *s).await;
        tasks.into_iter().for_each(|t| t.abort());
        Ok(())
    })
}

/// One task accepting on each of `listeners` (on the current runtime).
fn spawn_serving(
    gw: &Arc<Gateway>,
    listeners: Vec<std::net::TcpListener>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, GatewayError> {
    let mut tasks = Vec::new();
    for l in listeners {
        let addr = l.local_addr().map_err(|source| GatewayError::Runtime { source })?;
        let l = tokio::net::TcpListener::from_std(l).map_err(|source| GatewayError::Bind { addr, source })?;
        tasks.push(tokio::spawn(Arc::clone(gw).serve(l)));
    }
    Ok(tasks)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "gateway: no SIGTERM handler; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests;
