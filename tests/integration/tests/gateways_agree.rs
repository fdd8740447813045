//! Gateways that agree: three `ailb run` daemons (each its own pin directory and child cgroup,
//! same config) read one rnacos. Their tables are a pure function of the registry state, the
//! seed and the policy config, so, without talking to each other:
//! 1. their tables are byte-identical (raw ids too, since all three saw the same history);
//! 2. 1,000 conversations through each reach the same backend, all of them on idle gateways;
//! 3. with one gateway loaded (held connections, its load bound spilling while they were
//!    placed), at least 99 % still agree; the exact share is printed; and with the conversations
//!    held open on every gateway, the two that saw the same history agree on all of them, while
//!    the share the loaded one agrees on is measured and printed;
//! 4. after each fleet change in the registry (a backend leaves, one joins, a weight changes)
//!    all three converge on one table within the propagation goal, and within it of each other;
//!    the raw ids may then differ (a leaving backend keeps its id on the gateway that still has
//!    connections to it), the tables by address may not; and conversations agree again.
//!
//! What does not agree (local in-flight counts, spilled conversations' affinity entries, the
//! moment each gateway polls) is in docs/multi-gateway.md, with the numbers this test prints.

mod agree_support;

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

use agree_support::{first_difference, must_dump, AddressView, Convergence, Dump};
use ailb_tests::client::{assert_all_ok, count_by_backend};
use ailb_tests::nacos::{NacosInstance, RnacosServer};
use ailb_tests::status::{inflight_by_address, live_backends, model_inflight, stat};
use ailb_tests::{
    base_config, client_bin, percent, preflight, wait_until, BackendServer, CgroupGuard, ConnectOpts, Daemon,
    TestClient, TestConfig,
};

const MODEL: &str = "agree-70b";
/// The same VIP on every gateway: each one's programs only see its own cgroup's sockets.
const VIP: &str = "127.77.31.1:8000";
/// (address, registry weight, gpu_type, gpu_util %, current_requests): six different backends.
const FLEET: [(&str, f64, &str, &str, &str); 6] = [
    ("127.0.31.11:13111", 1.0, "A100-80GB", "40", "0"),
    ("127.0.31.12:13112", 1.0, "H100-80GB", "50", "1"),
    ("127.0.31.13:13113", 2.0, "A100-80GB", "20", "0"),
    ("127.0.31.14:13114", 2.0, "L40S", "85", "2"),
    ("127.0.31.15:13115", 3.0, "H100-80GB", "60", "0"),
    ("127.0.31.16:13116", 1.5, "A100-80GB", "30", "3"),
];
/// A backend that joins after the first one left.
const NEWCOMER: &str = "127.0.31.17:13117";
const GATEWAYS: [&str; 3] = ["agree-a", "agree-b", "agree-c"];
/// The table seed: one of the inputs that must be equal on every gateway.
const SEED: u64 = 0x5eed_0a11;
const CONVERSATIONS: usize = 1000;
/// Unhinted connections gateway A holds open during the loaded phase. Enough that at the end no
/// backend is likely to sit exactly at its bound (a simulation of the bounded pick, 500 runs:
/// 0 with 900 held, 0.6 % of runs with 600): the bound spills while they are placed, when the
/// totals are small.
const BACKGROUND: usize = 800;
const REQUIRED_AGREEMENT_PCT: f64 = 99.0;
/// The propagation goal, Nacos -> pinned map, p99 (docs/benchmarks.md); the original
/// requirement is 1 s. Each gateway must see each change within the requirement, and the
/// gateways must see it within the goal of each other.
const PROPAGATION_GOAL: Duration = Duration::from_millis(250);
const PROPAGATION_REQUIREMENT: Duration = Duration::from_secs(1);

fn sock(a: &str) -> SocketAddrV4 {
    a.parse().unwrap_or_else(|e| panic!("address {a}: {e}"))
}

fn instance(addr: &str, weight: f64, gpu: &str, util: &str, requests: &str) -> NacosInstance {
    let (ip, port) = addr.split_once(':').expect("ip:port");
    let mut i = NacosInstance::new(MODEL, ip, port.parse().expect("port"))
        .meta("model_id", MODEL)
        .meta("gpu_type", gpu)
        .meta("remaining_memory", "60")
        .meta("updated_at_ms", "1")
        .meta("gpu_util", util)
        .meta("current_requests", requests)
        .meta("queue_length", "0")
        .meta("health_status", "healthy");
    i.weight = weight;
    // Persistent: nothing sends heartbeats for these instances.
    i.ephemeral = false;
    i
}

fn fleet_instance(k: usize) -> NacosInstance {
    let (a, w, g, u, r) = FLEET[k];
    instance(a, w, g, u, r)
}

/// The config every gateway runs: only the pin directory and the cgroup differ.
fn gateway_config(name: &str, cg: &CgroupGuard, nacos: &RnacosServer) -> TestConfig {
    let mut cfg = base_config(name, cg);
    cfg.seed = SEED;
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\nrequired_memory_mb = 8000\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n\n\
         [policy.gpu_capability]\n\"A100-80GB\" = 2.0\n\"H100-80GB\" = 3.0\n\"L40S\" = 1.0\n",
        nacos.url()
    );
    cfg
}

/// The backend each conversation of a run reached (every connection must succeed).
fn run_conversations(client: &TestClient, cg: &CgroupGuard, prefix: &str) -> BTreeMap<String, String> {
    let opts = ConnectOpts::new(VIP, CONVERSATIONS).conversations(CONVERSATIONS, prefix);
    let res = client.connect(Some(cg), &opts);
    assert_all_ok(&res, &format!("conversations {prefix} through {}", cg.path().display()));
    res.into_iter()
        .map(|r| (r.conversation.expect("tagged connection"), r.backend.expect("connected backend")))
        .collect()
}

/// How many conversations reached the same backend through every gateway.
fn agreeing(runs: &[BTreeMap<String, String>]) -> usize {
    runs[0].iter().filter(|(c, b)| runs[1..].iter().all(|r| r.get(*c) == Some(*b))).count()
}

fn pins(daemons: &[Daemon]) -> Vec<&Path> {
    daemons.iter().map(Daemon::bpffs).collect()
}

fn dumps(daemons: &[Daemon], scan_all: bool) -> Vec<Dump> {
    daemons.iter().map(|d| must_dump(d.bpffs(), MODEL, scan_all)).collect()
}

/// Panics unless every gateway's table, mapped to addresses, equals gateway A's.
fn assert_same_by_address(ds: &[Dump], when: &str) {
    for (k, d) in ds.iter().enumerate().skip(1) {
        assert!(
            d.by_address == ds[0].by_address,
            "{when}: the table of gateway {} differs from gateway {}'s by address: {}",
            GATEWAYS[k],
            GATEWAYS[0],
            first_difference(&ds[0].by_address, &d.by_address)
        );
    }
}

fn print_convergence(what: &str, c: &Convergence) {
    let took: Vec<String> = GATEWAYS.iter().zip(&c.took).map(|(g, t)| format!("{g} {t:?}")).collect();
    eprintln!("fleet change '{what}': converged {}; spread {:?}", took.join(", "), c.spread());
    let slowest = c.took.iter().max().copied().unwrap_or_default();
    assert!(
        slowest <= PROPAGATION_REQUIREMENT,
        "'{what}': the slowest gateway took {slowest:?}, over the {PROPAGATION_REQUIREMENT:?} requirement"
    );
    assert!(
        c.spread() <= PROPAGATION_GOAL,
        "'{what}': the gateways converged {:?} apart, over the {PROPAGATION_GOAL:?} propagation goal: {took:?}",
        c.spread()
    );
}

/// Backends whose in-flight count on `d` is at or over the load bound: a conversation whose
/// first probe lands on one spills there.
fn at_bound(d: &Daemon, view: &AddressView) -> Vec<String> {
    let st = d.status();
    let c_milli = (st["config"]["load_factor"].as_f64().expect("load_factor") * 1000.0).round() as u32;
    let total = model_inflight(&st).get(MODEL).copied().unwrap_or(0);
    let inflight = inflight_by_address(&st);
    view.members
        .iter()
        .filter(|(a, e)| {
            let n = inflight.get(&a.to_string()).copied().unwrap_or(0);
            n >= ailb_common::pick::load_bound(c_milli, total, e.weight, view.total_weight)
        })
        .map(|(a, _)| a.to_string())
        .collect()
}

#[test]
fn three_gateways_on_one_registry_agree() {
    let bin = preflight();
    let started = Instant::now();
    let nacos = RnacosServer::start();
    let mut addrs: Vec<&str> = FLEET.iter().map(|f| f.0).collect();
    addrs.push(NEWCOMER);
    let _servers = BackendServer::start_all(&addrs);
    for k in 0..FLEET.len() {
        nacos.register(&fleet_instance(k));
    }
    let cgs: Vec<CgroupGuard> = GATEWAYS.iter().map(|g| CgroupGuard::new(g)).collect();
    let daemons: Vec<Daemon> =
        GATEWAYS.iter().zip(&cgs).map(|(g, cg)| Daemon::start(&bin, &gateway_config(g, cg, &nacos))).collect();
    for d in &daemons {
        wait_until("six live backends from rnacos", Duration::from_secs(10), || {
            (live_backends(&d.status(), MODEL) == FLEET.len()).then_some(())
        });
    }
    let client = TestClient::new(client_bin!());

    // 1. Byte-identical tables: by address, and raw (all three allocated ids from scratch for
    //    the same fleet).
    let ds = dumps(&daemons, true);
    assert_same_by_address(&ds, "at start");
    for (k, d) in ds.iter().enumerate().skip(1) {
        assert_eq!(d.raw, ds[0].raw, "at start: gateway {}'s raw table (ids) differs from A's", GATEWAYS[k]);
    }
    let table = &ds[0].by_address;
    let weights: BTreeMap<String, u32> = table.members.iter().map(|(a, e)| (a.to_string(), e.weight)).collect();
    eprintln!(
        "start: {} gateways, table of {} slots, identical (raw and by address); weights {weights:?}; slots {:?}",
        GATEWAYS.len(),
        table.size,
        table.shares()
    );

    // 2. Idle gateways: every conversation reaches the same backend through each.
    let light: Vec<_> = cgs.iter().map(|cg| run_conversations(&client, cg, "agree-light")).collect();
    let same = agreeing(&light);
    eprintln!("idle gateways: {same} of {CONVERSATIONS} conversations agree ({:.1} %)", percent(same, CONVERSATIONS));
    assert_eq!(same, CONVERSATIONS, "on idle gateways every conversation must reach the same backend through each");

    // 3. Gateway A loaded: BACKGROUND unhinted connections held open through it only.
    let spilled_before = stat(&daemons[0].status(), "spills") + stat(&daemons[0].status(), "fallbacks");
    let background = client.hold(Some(&cgs[0]), &ConnectOpts::new(VIP, BACKGROUND));
    assert_all_ok(background.results(), "background connections on gateway A");
    let st = daemons[0].status();
    let spilled = stat(&st, "spills") + stat(&st, "fallbacks") - spilled_before;
    assert!(spilled > 0, "placing {BACKGROUND} held connections never hit gateway A's load bound: {}", st["stats"]);
    let saturated = at_bound(&daemons[0], table);
    eprintln!(
        "gateway A holds {BACKGROUND} connections {:?}; its load bound redirected {spilled} of them while they were \
         placed; backends at their bound now: {saturated:?}",
        count_by_backend(background.results())
    );
    // New conversation ids: the light run's ids have affinity entries, which skip the bound.
    let loaded: Vec<_> = cgs.iter().map(|cg| run_conversations(&client, cg, "agree-load")).collect();
    let same = agreeing(&loaded);
    let idle_pair = agreeing(&loaded[1..]);
    eprintln!(
        "gateway A loaded: {same} of {CONVERSATIONS} conversations agree across all three ({:.2} %); \
         the two idle gateways agree on {idle_pair}",
        percent(same, CONVERSATIONS)
    );
    assert_eq!(idle_pair, CONVERSATIONS, "the two idle gateways B and C must agree on every conversation");
    // Placing 800 connections at random leaves a backend at its bound on A in some runs (its
    // count fluctuates up to the bound, and the bound redirects the rest). A conversation whose
    // backend is at its bound on A spills there, by design: that is the local load counts the
    // gateways do not share. The requirement holds for every other conversation.
    let exposed: Vec<&String> = loaded[1].iter().filter(|(_, b)| saturated.contains(*b)).map(|(c, _)| c).collect();
    let rest = CONVERSATIONS - exposed.len();
    let same_rest = loaded[1].iter().filter(|(c, b)| !saturated.contains(*b) && loaded[0].get(*c) == Some(*b)).count();
    let spilled_exposed = exposed.iter().filter(|c| loaded[0].get(**c) != loaded[1].get(**c)).count();
    eprintln!(
        "gateway A loaded: of the {rest} conversations whose backend is under its bound on A, {same_rest} agree \
         ({:.2} %); {} went to a backend at its bound on A, {spilled_exposed} of them elsewhere there",
        percent(same_rest, rest),
        exposed.len()
    );
    assert!(
        rest >= CONVERSATIONS / 2,
        "backends at their bound on A take {} of {CONVERSATIONS} conversations",
        exposed.len()
    );
    assert!(
        percent(same_rest, rest) >= REQUIRED_AGREEMENT_PCT,
        "with gateway A loaded only {same_rest} of the {rest} conversations whose backend is under its bound on A \
         agree, under {REQUIRED_AGREEMENT_PCT} % (all three: {same} of {CONVERSATIONS}; at their bound on A: \
         {saturated:?})"
    );
    if saturated.is_empty() {
        assert_eq!(same, same_rest, "with no backend at its bound on A the two counts are the same conversations");
    }

    held_conversations(&daemons, &cgs, &client);

    fleet_changes(&nacos, &daemons, &cgs, &client, background);
    eprintln!("the whole test took {:?}", started.elapsed());
}

/// Step 3b: long conversations. Each gateway in turn holds the 1,000 conversations open at once
/// (so its own count grows from 0 to 1,000 and its bound binds early, when totals are small),
/// gateway A on top of its background. B and C see the same history, so they must agree on
/// every one; A, whose totals differ, agrees on the share printed (measured, not required: the
/// requirement's 99 % is about short conversations, step 3).
fn held_conversations(daemons: &[Daemon], cgs: &[CgroupGuard], client: &TestClient) {
    let mut runs = Vec::new();
    let mut redirected = Vec::new();
    for (d, cg) in daemons.iter().zip(cgs) {
        let before = stat(&d.status(), "spills") + stat(&d.status(), "fallbacks");
        let opts = ConnectOpts::new(VIP, CONVERSATIONS).conversations(CONVERSATIONS, "agree-held");
        let held = client.hold(Some(cg), &opts);
        assert_all_ok(held.results(), "held conversations");
        runs.push(
            held.results()
                .iter()
                .map(|r| (r.conversation.clone().expect("tagged"), r.backend.clone().expect("connected")))
                .collect::<BTreeMap<_, _>>(),
        );
        redirected.push(stat(&d.status(), "spills") + stat(&d.status(), "fallbacks") - before);
        held.release();
    }
    let same = agreeing(&runs);
    let idle_pair = agreeing(&runs[1..]);
    eprintln!(
        "1,000 conversations held open on each gateway (A also holding {BACKGROUND}): {same} agree across all three \
         ({:.2} %), B and C agree on {idle_pair}; redirected by the bound per gateway {redirected:?}",
        percent(same, CONVERSATIONS)
    );
    assert_eq!(idle_pair, CONVERSATIONS, "B and C saw the same history: every held conversation must agree");
}

/// Step 4: three fleet changes in the registry while gateway A still holds its background
/// connections; then, released, conversations agree again.
fn fleet_changes(
    nacos: &RnacosServer,
    daemons: &[Daemon],
    cgs: &[CgroupGuard],
    client: &TestClient,
    background: ailb_tests::HeldClients,
) {
    let pins = pins(daemons);
    let leaving = sock(FLEET[0].0);
    // Each t0 is taken when the registry call returned: rnacos has the change.
    nacos.deregister(&fleet_instance(0));
    let t0 = Instant::now();
    let c = agree_support::converge(&pins, MODEL, t0, Duration::from_secs(5), |v| !v.members.contains_key(&leaving));
    print_convergence("deregister 127.0.31.11", &c);

    let newcomer = sock(NEWCOMER);
    nacos.register(&instance(NEWCOMER, 2.0, "H100-80GB", "45", "0"));
    let t0 = Instant::now();
    let c = agree_support::converge(&pins, MODEL, t0, Duration::from_secs(5), |v| v.members.contains_key(&newcomer));
    print_convergence("register 127.0.31.17", &c);

    let reweighted = sock(FLEET[3].0);
    let before = c.table.weight(&reweighted);
    let (a, _, g, u, r) = FLEET[3];
    nacos.register(&instance(a, 6.0, g, u, r));
    let t0 = Instant::now();
    let c = agree_support::converge(&pins, MODEL, t0, Duration::from_secs(5), |v| v.weight(&reweighted) != before);
    print_convergence("registry weight of 127.0.31.14 2 -> 6", &c);

    let ds = dumps(daemons, true);
    assert_same_by_address(&ds, "after the fleet changes");
    let raw_same = ds.iter().all(|d| d.raw == ds[0].raw);
    let ids: Vec<_> = ds.iter().map(|d| d.raw.ids.clone()).collect();
    let draining: Vec<_> = ds.iter().map(|d| d.outside_table.keys().copied().collect::<Vec<_>>()).collect();
    eprintln!(
        "after the changes: tables identical by address; raw ids identical: {raw_same}; ids {ids:?}; \
         entries outside the table (draining) {draining:?}"
    );

    background.release();
    daemons[0].wait_inflight_zero(Duration::from_secs(5));
    let after: Vec<_> = cgs.iter().map(|cg| run_conversations(client, cg, "agree-after")).collect();
    let same = agreeing(&after);
    eprintln!("after the changes, idle again: {same} of {CONVERSATIONS} conversations agree");
    assert_eq!(same, CONVERSATIONS, "after the fleet changes every conversation must agree again");
    for (g, run) in GATEWAYS.iter().zip(&after) {
        assert!(!run.values().any(|b| *b == leaving.to_string()), "gateway {g} sent a conversation to {leaving}");
    }
}
