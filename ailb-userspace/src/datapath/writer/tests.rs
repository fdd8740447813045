//! The writer's state machine against the in-memory maps: golden dumps of their contents and
//! of the writes, in order (the format is in `datapath/fake.rs`).

use std::net::SocketAddr;

use super::Writer;
use crate::{
    config::{Config, ValidConfig},
    datapath::{fake::FakeMaps, WriterMaps},
    discovery::from_static,
    policy::{plan, ModelPlan, Plan, PlannedBackend, PolicyState},
};

const CONFIG: &str = r#"
[[services]]
model = "llama"
vip = "127.77.0.1:8000"
[[backends]]
model = "llama"
address = "10.1.0.1:80"
"#;

struct Fixture {
    cfg: ValidConfig,
    /// A backend as the policy plans it, for [`Fixture::backend`] to vary.
    template: PlannedBackend,
}

impl Fixture {
    fn new() -> Self {
        let cfg = Config::parse(CONFIG, "writer-test").and_then(|c| c.validate()).expect("the test config is valid");
        let planned = plan(&from_static(&cfg.backends), &cfg.models, &cfg.policy, &mut PolicyState::default());
        let template = planned["llama"].backends[0].clone();
        Self { cfg, template }
    }

    /// Backend `10.1.0.<last>:80`; eligible with a weight > 0.
    fn backend(&self, last: u8, weight: u32) -> PlannedBackend {
        PlannedBackend {
            address: SocketAddr::new([10, 1, 0, last].into(), 80),
            weight,
            cap: 0,
            free_memory_mb: None,
            memory_capacity_mb: None,
            eligible: weight > 0,
            ..self.template.clone()
        }
    }

    /// A model with VIP `127.77.0.<vip>:8000` and `backends` as (last address byte, weight).
    fn model(&self, vip: u8, backends: &[(u8, u32)]) -> ModelPlan {
        let backends: Vec<PlannedBackend> = backends.iter().map(|&(last, w)| self.backend(last, w)).collect();
        ModelPlan {
            vips: vec![SocketAddr::new([127, 77, 0, vip].into(), 8000)],
            available: backends.iter().any(|b| b.eligible),
            backends,
            ..Default::default()
        }
    }

    /// Applies `plan` and returns the writes it made.
    fn apply(&self, w: &mut Writer<FakeMaps>, plan: &Plan) -> String {
        w.apply(plan, &self.cfg.balancer).expect("apply");
        w.maps_mut().take_writes()
    }
}

fn plan_of(models: impl IntoIterator<Item = (&'static str, ModelPlan)>) -> Plan {
    models.into_iter().map(|(n, m)| (n.to_string(), m)).collect()
}

fn writer() -> Writer<FakeMaps> {
    Writer::new(FakeMaps::default()).expect("a writer over empty maps")
}

/// The lines of `text` that start with `prefix`.
fn lines(text: &str, prefix: &str) -> String {
    text.lines().filter(|l| l.starts_with(prefix)).map(|l| format!("{l}\n")).collect()
}

#[track_caller]
fn assert_text(got: &str, want: &str) {
    assert!(got == want, "got:\n{got}\nwant:\n{want}");
}

#[test]
fn first_apply_writes_backends_then_the_inactive_rows_then_flips() {
    let f = Fixture::new();
    let mut w = writer();
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    // Backends before the table that names them; the rows of slot 1 (inactive: a fresh entry
    // has active 0) before the entry that describes them, then the flip; the config last.
    assert_text(
        &writes,
        "\
set BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
set BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
set TABLE: POS=0 SHARES=0:511,1:510 HEAD=0,0,0,0,1,1,1,1
set MEMBERS: POS=0 IDS=0,1
set MODEL: IDX=0 NAME=llama ACTIVE=0 FLAGS=- TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
set NAME: HASH=0x0fb5a83c342144d2 MODEL=0
set CONFIG: ABI=13 GEN=1 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    assert_text(
        &w.maps().dump(),
        "\
CONFIG: ABI=13 GEN=1 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
TABLE: MODEL=0 POS=0 SHARES=0:511,1:510 HEAD=0,0,0,0,1,1,1,1
MEMBERS: MODEL=0 POS=0 IDS=0,1
BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
NAME: HASH=0x0fb5a83c342144d2 MODEL=0
",
    );
}

#[test]
fn ids_are_kept_across_reloads_and_new_backends_take_the_lowest_free() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(2, 100), (3, 100)]))]));
    f.apply(
        &mut w,
        &plan_of([("llama", f.model(1, &[(1, 100), (2, 100), (3, 100)])), ("qwen", f.model(2, &[(1, 50)]))]),
    );
    assert_text(
        &lines(&w.maps().dump(), "BE:"),
        "\
BE: ID=0 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=1 ADDR=10.1.0.3:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=2 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=3 ADDR=10.1.0.1:80 MODEL=1 WEIGHT=50 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
",
    );
}

#[test]
fn a_removed_backends_id_is_reused_only_once_nothing_is_in_flight() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    w.maps_mut().inflight.insert(0, 3);
    let report = w.apply(&plan_of([("llama", f.model(1, &[(2, 100), (3, 100)]))]), &f.cfg.balancer).unwrap();
    assert_eq!(report.retired_backends, 0, "10.1.0.1 has connections in flight");
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(2, 100), (3, 100), (4, 100)]))]));
    assert_text(
        &lines(&w.maps().dump(), "BE:"),
        "\
BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=0 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=off
BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=2 ADDR=10.1.0.3:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=3 ADDR=10.1.0.4:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
",
    );
    w.maps_mut().take_writes();
    assert_eq!(w.reap().unwrap(), 0, "still in flight");
    w.maps_mut().inflight.insert(0, 0);
    assert_eq!(w.reap().unwrap(), 1);
    // Freed, it leaves the prefix map: the next backend to get id 0 inherits no blocks.
    assert_text(
        &w.maps_mut().take_writes(),
        "\
set BE: ID=0 ZERO
clear PREFIX: MODEL=0 ID=0
",
    );
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(2, 100), (3, 100), (4, 100), (5, 100)]))]));
    assert_text(
        &lines(&w.maps().dump(), "BE:"),
        "\
BE: ID=0 ADDR=10.1.0.5:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=2 ADDR=10.1.0.3:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=3 ADDR=10.1.0.4:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
",
    );
}

#[test]
fn a_removed_backend_with_nothing_in_flight_is_freed_at_once() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    let report = w.apply(&plan_of([("llama", f.model(1, &[(2, 100)]))]), &f.cfg.balancer).unwrap();
    assert_eq!(report.retired_backends, 1);
    assert_text(
        &lines(&w.maps_mut().take_writes(), "set BE:"),
        "\
set BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=0 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=off
set BE: ID=0 ZERO
",
    );
}

#[test]
fn swaps_read_no_model_entry_and_a_restarted_writer_swaps_from_the_pinned_ones() {
    let f = Fixture::new();
    let first = plan_of([("llama", f.model(1, &[(1, 100), (2, 100)])), ("qwen", f.model(2, &[(3, 100)]))]);
    let next = plan_of([("llama", f.model(1, &[(1, 100), (2, 300)])), ("qwen", f.model(2, &[(3, 100), (4, 100)]))]);
    let mut kept = writer();
    f.apply(&mut kept, &first);
    let mut restarted = writer();
    f.apply(&mut restarted, &first);
    let mut restarted = Writer::new(restarted.into_maps()).unwrap();
    let reads = restarted.maps().model_reads.get();
    let kept_writes = f.apply(&mut kept, &next);
    let restarted_writes = f.apply(&mut restarted, &next);
    assert_eq!(restarted.maps().model_reads.get(), reads, "an apply reads no model entry from the map");
    assert!(restarted_writes.contains("set MODEL:"), "both tables were swapped:\n{restarted_writes}");
    // A restarted writer's first apply also writes every model name once (it does not read their values back).
    let but_names =
        |w: &str| w.lines().filter(|l| !l.starts_with("set NAME:")).map(|l| format!("{l}\n")).collect::<String>();
    assert_eq!(
        but_names(&restarted_writes),
        but_names(&kept_writes),
        "the entries read back at the start are the ones a running writer keeps"
    );
}

#[test]
fn a_restarted_writer_reads_back_each_backends_capacity_and_the_table_weights() {
    let f = Fixture::new();
    let mut m = f.model(1, &[(1, 100), (2, 100), (3, 0)]);
    m.backends[0].memory_capacity_mb = Some(24_000);
    m.backends[0].free_memory_mb = Some(4_000);
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", m)]));
    let w = Writer::new(w.into_maps()).unwrap();
    let addr = SocketAddr::new([10, 1, 0, 1].into(), 80);
    assert_eq!(w.capacities(), vec![("llama".to_string(), addr, 24_000)], "the backend without one is left out");
    let weights = w.table_weights();
    assert_eq!(weights.len(), 1);
    assert_eq!(weights["llama"].values().copied().collect::<Vec<_>>(), vec![100, 100]);
}

#[test]
fn identical_plans_rewrite_no_backend_and_no_table_even_after_a_restart() {
    let f = Fixture::new();
    let p = plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]);
    let mut w = writer();
    f.apply(&mut w, &p);
    let report = w.apply(&p, &f.cfg.balancer).unwrap();
    assert!(report.tables_rebuilt.is_empty());
    // Only the config: the model names are written when they change (and once by the first
    // apply of a writer, below).
    assert_text(
        &w.maps_mut().take_writes(),
        "\
set CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    let before = w.maps().dump();
    // A new daemon over the same maps: it reads ids and tables back.
    let mut w = Writer::new(w.into_maps()).unwrap();
    assert_text(
        &f.apply(&mut w, &p),
        "\
set NAME: HASH=0x0fb5a83c342144d2 MODEL=0
set CONFIG: ABI=13 GEN=3 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    assert_text(&lines(&before, "BE:"), &lines(&w.maps().dump(), "BE:"));
    assert!(w.capacities().is_empty(), "no backend reported a capacity");
    // A backend added after the restart takes the lowest free id, the others keep theirs.
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100), (3, 100)]))]));
    assert_text(
        &lines(&writes, "set BE:"),
        "\
set BE: ID=2 ADDR=10.1.0.3:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
",
    );
}

#[test]
fn a_weight_change_fills_the_inactive_rows_before_flipping_active() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 300)]))]));
    // Slot 1 is active, so the new table goes to a free extent (the old one at 0 is still
    // live), slot 0 describes it while ACTIVE is still 1, then one write flips ACTIVE to 0.
    assert_text(
        &writes,
        "\
set BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=300 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
set TABLE: POS=1024 SHARES=0:247,1:774 HEAD=1,1,0,0,1,1,1,1
set MEMBERS: POS=16 IDS=0,1
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=size:1021,members:2,weight:400,gen:2,at:1024/16 SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set MODEL: IDX=0 NAME=llama ACTIVE=0 FLAGS=available TTL_MS=0 SLOT0=size:1021,members:2,weight:400,gen:2,at:1024/16 SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    assert_text(
        &w.maps().dump(),
        "\
CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
MODEL: IDX=0 NAME=llama ACTIVE=0 FLAGS=available TTL_MS=0 SLOT0=size:1021,members:2,weight:400,gen:2,at:1024/16 SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
TABLE: MODEL=0 POS=1024 SHARES=0:247,1:774 HEAD=1,1,0,0,1,1,1,1
MEMBERS: MODEL=0 POS=16 IDS=0,1
BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=300 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
NAME: HASH=0x0fb5a83c342144d2 MODEL=0
",
    );
}

#[test]
fn a_removed_model_clears_its_entries() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)])), ("qwen", f.model(2, &[(3, 100)]))]));
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    // Its VIP and name go, its entry is zeroed, its backend is retired and (nothing in
    // flight) freed. Its table's extents are released: unreachable through a zeroed entry,
    // reused after the grace.
    assert_text(
        &writes,
        "\
remove VIP: ADDR=127.77.0.2:8000 MODEL=1 FLAGS=0
remove NAME: HASH=0xf532bd89b9930d21 MODEL=1
set MODEL: IDX=1 ZERO
set BE: ID=2 ADDR=10.1.0.3:80 MODEL=1 WEIGHT=0 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=off
set BE: ID=2 ZERO
clear PREFIX: MODEL=1 ID=2
set CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    assert_text(
        &w.maps().dump(),
        "\
CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
TABLE: MODEL=0 POS=0 SHARES=0:511,1:510 HEAD=0,0,0,0,1,1,1,1
MEMBERS: MODEL=0 POS=0 IDS=0,1
BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
NAME: HASH=0x0fb5a83c342144d2 MODEL=0
",
    );
}

#[test]
fn a_model_without_live_backends_is_unavailable_until_one_returns() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    // Every backend excluded: the entry loses MODEL_AVAILABLE (connects are refused) and
    // keeps its last table, unused; no table is written.
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 0), (2, 0)]))]));
    assert_text(
        &writes,
        "\
set BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=0 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=off
set BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=0 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=off
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=- TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
    // Back: the table is swapped in again (into the other slot), available only at the flip.
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    assert_text(
        &writes,
        "\
set BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
set BE: ID=1 ADDR=10.1.0.2:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
set TABLE: POS=1024 SHARES=0:511,1:510 HEAD=0,0,0,0,1,1,1,1
set MEMBERS: POS=16 IDS=0,1
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=- TTL_MS=0 SLOT0=size:1021,members:2,weight:200,gen:3,at:1024/16 SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set MODEL: IDX=0 NAME=llama ACTIVE=0 FLAGS=available TTL_MS=0 SLOT0=size:1021,members:2,weight:200,gen:3,at:1024/16 SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set CONFIG: ABI=13 GEN=3 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
}

#[test]
fn a_ttl_change_alone_updates_the_model_entry_without_a_swap() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    let mut m = f.model(1, &[(1, 100), (2, 100)]);
    m.affinity_ttl = Some(std::time::Duration::from_secs(60));
    assert_text(
        &f.apply(&mut w, &plan_of([("llama", m)])),
        "\
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=60000 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set CONFIG: ABI=13 GEN=2 LOAD=1250 PREFIX_LOAD=2000 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
",
    );
}

#[test]
fn a_swapped_out_extent_is_reused_only_after_the_grace() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 300)]))]));
    // Within the grace the extent at 0 is not reused, even though it is free of any table.
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 200)]))]));
    assert_text(&lines(&writes, "set TABLE:"), "set TABLE: POS=2048 SHARES=0:332,1:689 HEAD=1,0,0,0,1,1,1,1\n");
    std::thread::sleep(crate::datapath::arena::GRACE);
    let writes = f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)]))]));
    assert_text(&lines(&writes, "set TABLE:"), "set TABLE: POS=0 SHARES=0:511,1:510 HEAD=0,0,0,0,1,1,1,1\n");
    assert_eq!(w.arena_use().0, (2048, u64::from(ailb_common::DEFAULT_TABLE_SLOTS)), "two tables' extents in use");
}

#[test]
fn an_arena_too_small_for_a_table_is_an_error_naming_the_limit() {
    let f = Fixture::new();
    // Room for one 2,039-slot table (11 backends: 2 chunks) and not a second beside it.
    let mut w = Writer::new(FakeMaps::with_arenas(3, 8)).unwrap();
    let eleven: Vec<(u8, u32)> = (1..=11).map(|i| (i, 100)).collect();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &eleven))]));
    let mut heavier = eleven.clone();
    heavier[0].1 = 200;
    let e = w.apply(&plan_of([("llama", f.model(1, &heavier)), ("qwen", f.model(2, &[(20, 100)]))]), &f.cfg.balancer);
    assert_eq!(
        e.unwrap_err().to_string(),
        "limits.table_slots = 3072 is full: 2048 more needed, 1024 free (raise it; a new size takes effect after \
         `ailb teardown`)"
    );
}

/// Swaps are written a batch of models at a time: every table, then every member list, then
/// the entries, each model's description before its flip. Each entry comes after its own
/// model's table and members, the one order a connect depends on.
#[test]
fn swaps_of_several_models_write_the_tables_then_the_members_then_the_entries() {
    let f = Fixture::new();
    let mut w = writer();
    let writes = f.apply(
        &mut w,
        &plan_of([
            ("llama", f.model(1, &[(1, 100), (2, 100)])),
            ("qwen", f.model(2, &[(3, 100)])),
            ("mistral", f.model(3, &[(4, 100), (5, 300)])),
        ]),
    );
    let swaps: String = writes
        .lines()
        .filter(|l| ["set TABLE:", "set MEMBERS:", "set MODEL:"].iter().any(|p| l.starts_with(p)))
        .map(|l| format!("{}\n", l.split(" SHARES=").next().unwrap_or(l)))
        .collect();
    // Plan order is by name: llama (index 0), mistral (1), qwen (2).
    assert_text(
        &swaps,
        "\
set TABLE: POS=0
set TABLE: POS=1024
set TABLE: POS=2048
set MEMBERS: POS=0 IDS=0,1
set MEMBERS: POS=16 IDS=2,3
set MEMBERS: POS=32 IDS=4
set MODEL: IDX=0 NAME=llama ACTIVE=0 FLAGS=- TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
set MODEL: IDX=1 NAME=mistral ACTIVE=0 FLAGS=- TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:400,gen:1,at:1024/16
set MODEL: IDX=1 NAME=mistral ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:400,gen:1,at:1024/16
set MODEL: IDX=2 NAME=qwen ACTIVE=0 FLAGS=- TTL_MS=0 SLOT0=- SLOT1=size:1021,members:1,weight:100,gen:1,at:2048/32
set MODEL: IDX=2 NAME=qwen ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:1,weight:100,gen:1,at:2048/32
",
    );
}

/// More models than one batch: the first batch's entries are written before the next batch's
/// tables, and every entry after its own table.
#[test]
fn a_recompute_of_more_models_than_a_batch_writes_them_batch_by_batch() {
    let f = Fixture::new();
    let n = super::swap::SWAP_BATCH + 3;
    let names: Vec<&'static str> = (0..n).map(|i| &*format!("m{i:03}").leak()).collect();
    let plan_with =
        |w: u32| plan_of(names.iter().enumerate().map(|(i, &name)| (name, f.model(i as u8, &[(i as u8, w)]))));
    let mut w = writer();
    for weight in [100, 200] {
        let writes = f.apply(&mut w, &plan_with(weight));
        let kinds: Vec<&str> = writes
            .lines()
            .filter_map(|l| ["set TABLE:", "set MEMBERS:", "set MODEL:"].into_iter().find(|p| l.starts_with(p)))
            .collect();
        let batch = super::swap::SWAP_BATCH;
        let mut want = Vec::new();
        for size in [batch, n - batch] {
            want.extend(std::iter::repeat_n("set TABLE:", size));
            want.extend(std::iter::repeat_n("set MEMBERS:", size));
            want.extend(std::iter::repeat_n("set MODEL:", 2 * size));
        }
        assert_eq!(kinds, want, "weight {weight}");
    }
}

/// With room for one spare table, a recompute of every model still fits: when the arena is
/// full, the queued swaps are written, which releases the tables they replace.
#[test]
fn a_recompute_of_every_model_needs_room_for_one_more_table_only() {
    let f = Fixture::new();
    // Two live tables of 1 chunk and member lists of 1 chunk, and one spare of each.
    let mut w = Writer::new(FakeMaps::with_arenas(3, 3)).unwrap();
    let both =
        |w2: u32| plan_of([("llama", f.model(1, &[(1, 100), (2, w2)])), ("qwen", f.model(2, &[(3, 100), (4, w2)]))]);
    f.apply(&mut w, &both(100));
    let writes = f.apply(&mut w, &both(300));
    assert_eq!(lines(&writes, "set TABLE:").lines().count(), 2, "both tables swapped:\n{writes}");
    // Two live tables and a replaced one still in its grace: the whole arena.
    assert_eq!(w.arena_use().0, (3072, 3072));
    assert_eq!(w.arena_use().1, (48, 48));
}

#[test]
fn a_restart_takes_over_the_live_extents_and_allocates_around_them() {
    let f = Fixture::new();
    let mut w = writer();
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (2, 100)])), ("qwen", f.model(2, &[(3, 100)]))]));
    f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100)])), ("qwen", f.model(2, &[(3, 100)]))]));
    // llama now lives at 2048 (0 released), qwen at 1024; a new daemon must not hand out
    // either live extent, and may reuse 0 (no old daemon's connect can still read it).
    let mut w = Writer::new(w.into_maps()).unwrap();
    assert_eq!(w.arena_use().0 .0, 2048);
    let writes =
        f.apply(&mut w, &plan_of([("llama", f.model(1, &[(1, 100), (4, 100)])), ("qwen", f.model(2, &[(3, 100)]))]));
    assert_text(&lines(&writes, "set TABLE:"), "set TABLE: POS=0 SHARES=0:511,1:510 HEAD=1,1,1,0,1,1,1,0\n");
}

/// A model with a backend and a VIP of each family: the IPv6 backend's address is written
/// before its entry (which names it IPv6; the entries go in one batch after every address),
/// the IPv6 VIP goes to its own map, and a restarted writer reads both back (same ids,
/// nothing rewritten, the address in the table weights).
#[test]
fn ipv6_backends_and_vips_are_written_apart_and_read_back() {
    let f = Fixture::new();
    let v6: SocketAddr = "[2001:db8::2]:80".parse().unwrap();
    let mut m = f.model(1, &[(1, 100)]);
    m.vips.push("[fd00::77]:8000".parse().unwrap());
    m.backends.push(PlannedBackend { address: v6, ..f.backend(2, 300) });
    let p = plan_of([("llama", m)]);
    let mut w = writer();
    let writes = f.apply(&mut w, &p);
    assert_text(
        &lines(&writes, "set BE"),
        "set BE6: ID=1 ADDR=2001:db8::2\n\
         set BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live\n\
         set BE: ID=1 ADDR=IPV6:80 MODEL=0 WEIGHT=300 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live\n",
    );
    assert_text(
        &lines(&writes, "set VIP"),
        "set VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0\nset VIP6: ADDR=[fd00::77]:8000 MODEL=0 FLAGS=0\n",
    );
    assert!(w.maps().backend(1).unwrap().is_ipv6());

    let mut again = Writer::new(w.into_maps()).expect("restart");
    assert_eq!(again.table_weights()["llama"].get(&v6), Some(&300), "{:?}", again.table_weights());
    let writes = f.apply(&mut again, &p);
    assert_text(&lines(&writes, "set BE"), "");
    assert_text(&lines(&writes, "set VIP"), "");

    // The IPv6 VIP leaves; the IPv6 backend leaves with a connection in flight: not live,
    // still IPv6, so a restart still knows its address.
    let mut m = f.model(1, &[(1, 100)]);
    m.vips.truncate(1);
    again.maps_mut().inflight.insert(1, 1);
    let writes = f.apply(&mut again, &plan_of([("llama", m)]));
    assert!(writes.contains("remove VIP6: ADDR=[fd00::77]:8000"), "{writes}");
    assert!(writes.contains("set BE: ID=1 ADDR=IPV6:80 MODEL=0 WEIGHT=0"), "{writes}");
    let b = again.maps().backend(1).unwrap();
    assert!(b.is_ipv6() && !b.is_live(), "{b:?}");
}
