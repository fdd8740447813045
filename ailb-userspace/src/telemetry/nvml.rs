//! GPU memory and utilisation from NVML, through nvml-wrapper's safe API.
//!
//! NVML calls are ioctls into the driver that answer in microseconds, so the source is sync; an
//! async caller may use it directly or from `spawn_blocking`. Dropping the source calls
//! `nvmlShutdown` (nvml-wrapper's `Drop`); keep one open for the life of the agent.

use std::{ffi::OsStr, fmt, path::Path};

use nvml_wrapper::{error::NvmlError, Device, Nvml};

use super::{GpuSample, TelemetryError};

/// The library name the dynamic loader looks up when no path is given (nvml-wrapper's default).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

const MIB: u64 = 1024 * 1024;

/// Which GPU to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// NVML index (the `nvidia-smi` index unless `CUDA_DEVICE_ORDER` games are played).
    Index(u32),
    /// `GPU-xxxxxxxx-...` as `nvidia-smi -L` prints it.
    Uuid(String),
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Index(i) => write!(f, "{i}"),
            DeviceSelector::Uuid(u) => f.write_str(u),
        }
    }
}

/// An initialised NVML.
pub struct NvmlSource {
    nvml: Nvml,
    lib: String,
}

impl fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlSource").field("lib", &self.lib).finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// Loads NVML from `lib_path`, or `libnvidia-ml.so.1` on the loader's search path, and
    /// initialises it.
    pub fn open(lib_path: Option<&Path>) -> Result<Self, TelemetryError> {
        let mut builder = Nvml::builder();
        let lib = match lib_path {
            Some(p) => {
                builder.lib_path(p.as_os_str());
                p.display().to_string()
            }
            None => {
                builder.lib_path(OsStr::new(DEFAULT_LIB));
                DEFAULT_LIB.to_string()
            }
        };
        match builder.init() {
            Ok(nvml) => Ok(NvmlSource { nvml, lib }),
            // dlopen failed, or the file is not an NVML library (no nvmlInit_v2).
            Err(e @ (NvmlError::LibloadingError(_) | NvmlError::FailedToLoadSymbol(_))) => {
                Err(TelemetryError::NvmlLibrary { path: lib, source: e })
            }
            Err(e) => Err(TelemetryError::NvmlInit { path: lib, source: e }),
        }
    }

    /// The library path or name this source was opened with.
    pub fn lib(&self) -> &str {
        &self.lib
    }

    /// Every GPU NVML sees, in index order.
    pub fn devices(&self) -> Result<Vec<GpuSample>, TelemetryError> {
        let count = self.nvml.device_count().map_err(|source| TelemetryError::NvmlQuery {
            device: "*".to_string(),
            query: "device count",
            source,
        })?;
        (0..count).map(|i| self.sample(&DeviceSelector::Index(i))).collect()
    }

    /// One GPU now.
    pub fn sample(&self, selector: &DeviceSelector) -> Result<GpuSample, TelemetryError> {
        let device = match selector {
            DeviceSelector::Index(i) => self.nvml.device_by_index(*i),
            DeviceSelector::Uuid(u) => self.nvml.device_by_uuid(u.as_str()),
        };
        let device = device.map_err(|source| match source {
            NvmlError::InvalidArg | NvmlError::NotFound => {
                TelemetryError::NvmlNoDevice { device: selector.to_string(), source }
            }
            source => TelemetryError::NvmlQuery { device: selector.to_string(), query: "device handle", source },
        })?;
        read(&device, selector)
    }
}

fn read(device: &Device<'_>, selector: &DeviceSelector) -> Result<GpuSample, TelemetryError> {
    let q =
        |query: &'static str| move |source| TelemetryError::NvmlQuery { device: selector.to_string(), query, source };
    let index = match selector {
        DeviceSelector::Index(i) => *i,
        DeviceSelector::Uuid(_) => device.index().map_err(q("index"))?,
    };
    let memory = device.memory_info().map_err(q("memory info"))?;
    let util = device.utilization_rates().map_err(q("utilization rates"))?;
    Ok(GpuSample {
        index,
        name: device.name().map_err(q("name"))?,
        uuid: device.uuid().map_err(q("uuid"))?,
        memory_total_mb: memory.total / MIB,
        memory_free_mb: memory.free / MIB,
        memory_used_mb: memory.used / MIB,
        util_pct: util.gpu.min(100),
    })
}
