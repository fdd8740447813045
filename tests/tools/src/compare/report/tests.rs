use clap::Parser;

use super::{trace_name, Args};

#[test]
fn the_report_names_the_trace_it_replayed() {
    let shipped = Args::parse_from(["ailb-compare", "--trace", ailb_sim::replay::SHIPPED_TRACE]);
    assert!(trace_name(&shipped).contains("tests/data/mooncake-conversation.jsonl.gz"), "{}", trace_name(&shipped));
    let other = Args::parse_from(["ailb-compare", "--trace", "/data/azure-conv.jsonl"]);
    assert_eq!(trace_name(&other), "`/data/azure-conv.jsonl`");
}
