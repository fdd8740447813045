//! The one error type of the telemetry sources.

use nvml_wrapper::error::NvmlError;
use reqwest::{StatusCode, Url};

/// What went wrong reading NVML or a model server. Messages are lowercase and name the object.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The NVML shared library could not be loaded (no driver installed, or a wrong path).
    #[error(
        "no NVML library at {path}: install the NVIDIA driver, or set nvml = false to take memory \
         and utilisation from the model server"
    )]
    NvmlLibrary {
        path: String,
        #[source]
        source: NvmlError,
    },
    /// The library loaded but `nvmlInit` failed (driver not loaded, no permission, ...).
    #[error(
        "NVML at {path} did not initialise: load the NVIDIA driver (nvidia-smi must work), or set \
         nvml = false to take memory and utilisation from the model server"
    )]
    NvmlInit {
        path: String,
        #[source]
        source: NvmlError,
    },
    /// No GPU matches the selector.
    #[error("gpu {device}: not found by NVML (nvidia-smi -L lists the GPUs)")]
    NvmlNoDevice {
        device: String,
        #[source]
        source: NvmlError,
    },
    /// A query on a present GPU (or the device count) failed.
    #[error("gpu {device}: NVML query {query} failed")]
    NvmlQuery {
        device: String,
        query: &'static str,
        #[source]
        source: NvmlError,
    },
    /// The HTTP client could not be built.
    #[error("model server: http client could not be built")]
    Client(#[source] reqwest::Error),
    /// The metrics request failed on the way (after connecting) or timed out mid-body.
    #[error("metrics {url}: request failed")]
    MetricsRequest {
        url: Url,
        #[source]
        source: reqwest::Error,
    },
    /// The metrics endpoint answered, but not 2xx.
    #[error("metrics {url}: http status {status}")]
    MetricsStatus { url: Url, status: StatusCode },
    /// The metrics body is larger than the bound.
    #[error("metrics {url}: body over {limit} bytes")]
    MetricsTooLarge { url: Url, limit: usize },
    /// The metrics body is not Prometheus text exposition format.
    #[error("metrics {url}: not prometheus text, line {line}: {reason}")]
    MetricsParse { url: Url, line: usize, reason: String },
}
