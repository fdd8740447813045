use super::*;
use crate::datapath::status::{BackendStatus, ModelStatus, Status};

fn backend(free: Option<u32>, cap: Option<u32>, hinted: u64, live: bool) -> BackendStatus {
    BackendStatus {
        id: 1,
        address: "10.0.0.1:8000".into(),
        weight: 1,
        cap: 4,
        free_mem_mb: free,
        mem_capacity_mb: cap,
        live,
        table_slots: 0,
        table_share: 0.0,
        inflight: 0,
        inflight_mem_mb: hinted,
        picks: 0,
        affinity_hits: 0,
        established: 0,
        closed: 0,
        connect_failures: 0,
        rtt_us_avg: None,
    }
}

fn status(models: Vec<ModelStatus>) -> Status {
    Status { models, ..Default::default() }
}

fn model(name: &str, inflight: u64, backends: Vec<BackendStatus>) -> ModelStatus {
    ModelStatus {
        id: 0,
        name: name.into(),
        vips: vec![],
        available: true,
        table_size: 0,
        table_digest: None,
        kernel_bytes: 0,
        inflight,
        prefix: Default::default(),
        backends,
    }
}

#[test]
fn model_gauges_divide_the_kernels_count_by_the_planned_capacity() {
    let st = status(vec![
        model(
            "a",
            6,
            vec![
                // 8000 free, idle capacity 8000, 3000 hinted in flight: 5000 free now.
                backend(Some(8000), Some(8000), 3000, true),
                // Free now is the reported 2000 (below capacity - hints).
                backend(Some(2000), Some(16000), 1000, true),
                backend(None, None, 0, true),          // unknown: not counted
                backend(Some(50_000), None, 0, false), // not live: not counted
            ],
        ),
        model("b", 3, vec![]),
    ]);
    let loads = BTreeMap::from([("a".to_string(), ModelLoad { capacity: 8.0, queued: 2.0 })]);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatusCollector(st, loads)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "ailb_model_inflight{model=\"a\"} 6.0",
        "ailb_model_capacity{model=\"a\"} 8.0",
        "ailb_model_saturation{model=\"a\"} 0.75",
        "ailb_model_queued_requests{model=\"a\"} 2.0",
        "ailb_model_memory_headroom_mb{model=\"a\"} 7000.0",
        "ailb_model_inflight{model=\"b\"} 3.0",
        "ailb_model_capacity{model=\"b\"} 0.0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    assert!(!text.contains("ailb_model_saturation{model=\"b\"}"), "no capacity, no ratio:\n{text}");
    assert!(!text.contains("ailb_tc_"), "no TC datapath, no TC metrics:\n{text}");
}

#[test]
fn tc_counters_are_served_with_the_end_reasons_apart() {
    let stats = ailb_common::TcStats {
        flows_opened: 10,
        flows_closed: 9,
        ended_rst: 2,
        ended_idle: 3,
        flows_full: 4,
        nat_exhausted: 5,
        refused: 6,
        malformed: 7,
        redirected: 100,
        to_stack: 1,
        ..Default::default()
    };
    let tc =
        crate::datapath::tc::TcStatus { flows: 3, flows_ipv6: 2, counted: 1, nat_ports: 1, interfaces: vec![], stats };
    let st = Status { tc: Some(tc), ..Default::default() };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatusCollector(st, BTreeMap::new())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "ailb_tc_flows 3",
        "ailb_tc_flows_ipv6 2",
        "ailb_tc_flows_counted 1",
        "ailb_tc_nat_ports_in_use 1",
        "ailb_tc_flows_opened_total 10",
        "ailb_tc_flows_ended_total{reason=\"fin\"} 4",
        "ailb_tc_flows_ended_total{reason=\"rst\"} 2",
        "ailb_tc_flows_ended_total{reason=\"idle\"} 3",
        "ailb_tc_dropped_total{reason=\"flows_full\"} 4",
        "ailb_tc_dropped_total{reason=\"nat_exhausted\"} 5",
        "ailb_tc_dropped_total{reason=\"refused\"} 6",
        "ailb_tc_dropped_total{reason=\"malformed\"} 7",
        "ailb_tc_redirected_total 100",
        "ailb_tc_to_stack_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
}
