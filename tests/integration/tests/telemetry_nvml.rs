//! `NvmlSource` (nvml-wrapper) against a FAKE `libnvidia-ml.so` built from
//! `tests/integration/fixtures/fake_nvml.c`, whose values come from a `state` file next to it, re-read on
//! every call. No root, no GPU. Each test builds its own library in its own directory, so the
//! tests run in parallel without sharing the environment (`FAKE_NVML_STATE` is not set here).
//! What this shows: our calls through nvml-wrapper, MiB conversion, selection and error mapping.
//! Nothing here says how a real driver behaves.

use std::path::Path;

use ailb_tests::agent_harness::FakeNvml;

use ailb_userspace::telemetry::{
    nvml::{DeviceSelector, NvmlSource},
    GpuSample, TelemetryError,
};

/// The fake NVML of the shared harness, opened through `NvmlSource`.
trait OpenFake {
    fn open(&self) -> NvmlSource;
}

impl OpenFake for FakeNvml {
    fn open(&self) -> NvmlSource {
        NvmlSource::open(Some(Path::new(&self.lib()))).unwrap_or_else(|e| panic!("open fake NVML: {e}"))
    }
}

const TWO_GPUS: &str = "count 2
0 name NVIDIA A100-SXM4-80GB
0 uuid GPU-11111111-2222-3333-4444-555555555555
0 total_mb 81920
0 used_mb 1000
0 util 35
1 name NVIDIA H100 80GB HBM3
1 uuid GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee
1 total_mb 81559
1 used_mb 70000
1 util 97
";

fn a100() -> GpuSample {
    GpuSample {
        index: 0,
        name: "NVIDIA A100-SXM4-80GB".into(),
        uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
        memory_total_mb: 81920,
        memory_free_mb: 80920,
        memory_used_mb: 1000,
        util_pct: 35,
    }
}

#[test]
fn values_through_nvml_wrapper_match_the_file() {
    let fake = FakeNvml::build(TWO_GPUS);
    let nvml = fake.open();
    let devices = nvml.devices().unwrap_or_else(|e| panic!("devices: {e}"));
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0], a100());
    assert_eq!(
        devices[1],
        GpuSample {
            index: 1,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            memory_total_mb: 81559,
            memory_free_mb: 11559,
            memory_used_mb: 70000,
            util_pct: 97,
        }
    );
}

#[test]
fn a_changed_file_shows_on_the_next_sample() {
    let fake = FakeNvml::build(TWO_GPUS);
    let nvml = fake.open();
    assert_eq!(nvml.sample(&DeviceSelector::Index(0)).unwrap().util_pct, 35);
    fake.set(&TWO_GPUS.replace("0 used_mb 1000", "0 used_mb 40960").replace("0 util 35", "0 util 80"));
    let s = nvml.sample(&DeviceSelector::Index(0)).unwrap_or_else(|e| panic!("sample: {e}"));
    assert_eq!((s.memory_used_mb, s.memory_free_mb, s.util_pct), (40960, 40960, 80));
    // An explicit free (NVML's free is not always total - used: reserved memory).
    fake.set(&format!("{TWO_GPUS}0 free_mb 500\n"));
    assert_eq!(nvml.sample(&DeviceSelector::Index(0)).unwrap().memory_free_mb, 500);
}

#[test]
fn selection_by_index_and_by_uuid() {
    let fake = FakeNvml::build(TWO_GPUS);
    let nvml = fake.open();
    let by_uuid = nvml
        .sample(&DeviceSelector::Uuid("GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into()))
        .unwrap_or_else(|e| panic!("by uuid: {e}"));
    assert_eq!(by_uuid.index, 1, "the index comes from NVML for a UUID");
    assert_eq!(by_uuid, nvml.sample(&DeviceSelector::Index(1)).unwrap());
    assert_eq!(nvml.sample(&DeviceSelector::Uuid(a100().uuid)).unwrap(), a100());

    let e = nvml.sample(&DeviceSelector::Index(2)).expect_err("index 2 of 2 GPUs");
    assert!(matches!(e, TelemetryError::NvmlNoDevice { ref device, .. } if device == "2"), "{e:?}");
    let e = nvml.sample(&DeviceSelector::Uuid("GPU-nope".into())).expect_err("unknown uuid");
    assert!(matches!(e, TelemetryError::NvmlNoDevice { .. }), "{e:?}");
    assert_eq!(e.to_string(), "gpu GPU-nope: not found by NVML (nvidia-smi -L lists the GPUs)");
}

#[test]
fn a_failing_query_is_an_error_not_a_panic() {
    let fake = FakeNvml::build(TWO_GPUS);
    let nvml = fake.open();
    fake.set(&format!("{TWO_GPUS}fail memory 15\n"));
    let e = nvml.sample(&DeviceSelector::Index(0)).expect_err("memory fails");
    assert!(matches!(e, TelemetryError::NvmlQuery { query: "memory info", ref device, .. } if device == "0"), "{e:?}");
    assert!(nvml.devices().is_err());
    for what in ["util", "name", "uuid", "count", "handle"] {
        fake.set(&format!("{TWO_GPUS}fail {what}\n"));
        assert!(nvml.devices().is_err(), "fail {what}");
    }
    // Back to normal: the same source recovers.
    fake.set(TWO_GPUS);
    assert_eq!(nvml.sample(&DeviceSelector::Index(0)).unwrap(), a100());
}

#[test]
fn a_missing_library_is_a_plain_words_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libnvidia-ml.so");
    let e = NvmlSource::open(Some(&path)).expect_err("no library there");
    assert!(matches!(e, TelemetryError::NvmlLibrary { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "no NVML library at {}: install the NVIDIA driver, or set nvml = false to take memory and \
             utilisation from the model server",
            path.display()
        )
    );
}

#[test]
fn a_driver_that_does_not_initialise_is_a_plain_words_error() {
    let fake = FakeNvml::build("");
    fake.clear_state(); // fake: no state = driver not loaded
    let e = NvmlSource::open(Some(Path::new(&fake.lib()))).expect_err("driver not loaded");
    assert!(matches!(e, TelemetryError::NvmlInit { .. }), "{e:?}");
    assert!(e.to_string().contains("did not initialise: load the NVIDIA driver"), "{e}");
    fake.set(&format!("{TWO_GPUS}fail init\n"));
    assert!(matches!(NvmlSource::open(Some(Path::new(&fake.lib()))), Err(TelemetryError::NvmlInit { .. })));
}

#[test]
fn no_gpus_is_an_empty_list() {
    let fake = FakeNvml::build("count 0\n");
    assert_eq!(fake.open().devices().unwrap(), vec![]);
}
