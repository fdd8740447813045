//! Command line: one file per subcommand.

pub mod access;
pub mod agent;
pub mod explain;
pub mod gateway;
pub mod run;
pub mod status;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ailb", version, about = "eBPF-accelerated, AI-aware load balancer for LLM inference fleets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Default pin directory (matches the config default).
const DEFAULT_BPFFS: &str = "/sys/fs/bpf/ailb";

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: load, pin and attach the programs and keep the tables in step
    /// with the config (SIGHUP reloads it). Without --config: the embedded loopback demo.
    Run {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the front door: an OpenAI-style HTTP server that opens a fresh, tagged upstream
    /// connection per request. Run it unprivileged INSIDE the cgroup `ailb run` attaches to.
    /// Reads the catalog and `[gateway]` of the same config (without --config: the embedded default).
    Gateway {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config file and exit (0: valid).
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Per model and backend: weight, table share, in-flight, picks, affinity hits (from the pinned maps).
    Status {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Why each backend of a model has its weight, and which backend a conversation gets now;
    /// with `--request`, first the routing inputs the front door finds in an HTTP request.
    Explain {
        #[arg(long, required_unless_present = "request", conflicts_with = "request")]
        model: Option<String>,
        /// A request body (JSON; `-` for standard input): explain the front door's routing
        /// inputs of this request (model, memory, conversation, prefix keys), then its pick.
        #[arg(long)]
        request: Option<PathBuf>,
        /// The request's path, with `--request`.
        #[arg(long, default_value = "/v1/chat/completions", requires = "request")]
        path: String,
        /// A request header ("Name: value"; repeatable), with `--request`.
        #[arg(short = 'H', long = "header", requires = "request")]
        headers: Vec<String>,
        /// The client's address, with `--request`: for a tenant matched by `cidrs`.
        #[arg(long, requires = "request")]
        client_ip: Option<std::net::IpAddr>,
        #[arg(long)]
        conversation: Option<String>,
        /// Memory hint (MB) for the conversation's pick, as AILB_REQUIRED_MEMORY_MB would give.
        #[arg(long, default_value_t = 0)]
        memory_mb: u32,
        /// The daemon's config (for daemon.listen and daemon.bpffs).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The daemon's HTTP endpoint (overrides the config's daemon.listen).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        #[arg(long)]
        bpffs: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Print the kernel's hash of a conversation id (what `setsockopt(SOL_AILB, AILB_CONVERSATION)` stores).
    Hash { conversation: String },
    /// Run the GPU node agent: register local model-server instances in Nacos and publish
    /// their telemetry as metadata (SIGTERM drains).
    Agent {
        #[arg(long)]
        config: PathBuf,
    },
    /// Detach every program and remove every pin (the directory too).
    Teardown {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("AILB_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let result = match cli.command {
        Command::Run { config } => run::run(config.as_deref()),
        Command::Gateway { config } => gateway::gateway(config.as_deref()),
        // The whole file, `[gateway]` included (which `ailb run` itself does not read).
        Command::Check { config } => crate::gateway::load(config.as_deref())
            .map(|(c, _)| {
                println!("config ok: {} model(s), {} static backend(s)", c.models.len(), c.backends.len());
            })
            .map_err(anyhow::Error::from),
        Command::Status { bpffs, json } => status::status(&bpffs, json),
        Command::Explain {
            model,
            request,
            path,
            headers,
            client_ip,
            conversation,
            memory_mb,
            config,
            listen,
            bpffs,
            json,
        } => (|| {
            let cfg = config.as_deref().map(|p| config::load_valid(Some(p))).transpose()?;
            let listen = listen.or(cfg.as_ref().and_then(|c| c.listen));
            let bpffs = bpffs.or(cfg.as_ref().map(|c| c.bpffs.clone())).unwrap_or_else(|| PathBuf::from(DEFAULT_BPFFS));
            let what = match (request, model) {
                (Some(body), _) => explain::What::Request(explain::request_inputs(
                    config.as_deref(),
                    &body,
                    &path,
                    &headers,
                    client_ip,
                )?),
                (None, Some(model)) => explain::What::Model { model, conversation, memory_mb },
                (None, None) => anyhow::bail!("--model or --request is needed"),
            };
            explain::explain(listen, &bpffs, what, json)
        })(),
        Command::Hash { conversation } => {
            println!("{:#018x}", ailb_common::hash::conversation_hash(conversation.as_bytes()));
            Ok(())
        }
        Command::Agent { config } => agent::agent(&config),
        Command::Teardown { bpffs } => crate::datapath::teardown(&bpffs)
            .map(|n| {
                if n == 0 {
                    println!("nothing to tear down at {}", bpffs.display());
                } else {
                    println!("removed {n} pin(s) and {}; programs detached", bpffs.display());
                }
            })
            .map_err(|e| access::pin_error(&e, &bpffs, "ailb teardown")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

use crate::config;
