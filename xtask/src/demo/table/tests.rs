use super::render;

#[test]
fn renders_backends_with_shares_from_slot_counts() {
    let status = serde_json::json!({
        "generation": 3,
        "stats": {"picks": 10, "affinity_hits": 4, "affinity_breaks": 0, "spills": 1,
                  "no_backend": 0, "no_fit": 0},
        "models": [{"name": "demo-7b", "vips": ["127.77.0.1:8000"], "available": true,
            "inflight": 2, "table_size": 4093,
            "backends": [{"address": "127.0.0.11:18001", "weight": 1, "table_slots": 512,
                          "inflight": 2, "picks": 10, "affinity_hits": 4}]}]
    });
    let out = render(&status, 4);
    assert!(out.contains("t=4s generation 3  picks 10  affinity hits 4"), "{out}");
    assert!(out.contains("model demo-7b [127.77.0.1:8000]"), "{out}");
    let row = out.lines().find(|l| l.contains("127.0.0.11:18001")).expect(&out);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols, ["127.0.0.11:18001", "1", "12.5%", "2", "10", "4"]);
}

#[test]
fn missing_fields_render_as_dashes() {
    let out = render(&serde_json::json!({"models": [{"backends": [{}]}]}), 0);
    assert!(out.contains("generation -"), "{out}");
}
