//! Issue bullet: 200 conversations x 20 connections: every connection of a conversation
//! reaches the same backend. After one backend's weight changes, at least 99% of
//! conversations stay put; after a backend is removed, all of its conversations move to live
//! backends, and none goes to the removed one.

use std::collections::{BTreeMap, BTreeSet};

use ailb_tests::client::{assert_all_ok, backends_by_conversation};
use ailb_tests::{
    base_config, client_bin, preflight, BackendCfg, BackendServer, CgroupGuard, ConnResult, ConnectOpts, Daemon,
    TestClient, TestConfig,
};

const MODEL: &str = "aff-7b";
const VIP: &str = "127.77.2.1:8000";
const BACKENDS: [(&str, u32); 4] =
    [("127.0.2.11:18201", 2), ("127.0.2.12:18202", 2), ("127.0.2.13:18203", 3), ("127.0.2.14:18204", 3)];
const CONVERSATIONS: usize = 200;
const PER_CONVERSATION: usize = 20;
/// Connections per conversation in the phases after a change.
const AFTER_CHANGE: usize = 5;
/// The bar for a weight change: at least 99 % of conversations keep their backend. Affinity entries stay usable while their backend is
/// live with weight > 0, so ailb should keep 100 %; the 1 % slack is the requirement's own.
const MIN_STAY_PERCENT: f64 = 99.0;

/// The one backend each conversation reached; panics if a conversation reached several.
fn one_backend_each(results: &[ConnResult], phase: &str) -> BTreeMap<String, String> {
    assert_all_ok(results, phase);
    let by_conv = backends_by_conversation(results);
    assert_eq!(by_conv.len(), CONVERSATIONS, "{phase}: conversations seen");
    by_conv
        .into_iter()
        .map(|(conv, set)| {
            assert!(
                set.len() == 1,
                "{phase}: the connections of conversation {conv} reached {} backends: {set:?}",
                set.len()
            );
            (conv, set.into_iter().next().expect("one backend"))
        })
        .collect()
}

fn run_phase(client: &TestClient, cg: &CgroupGuard, per_conv: usize) -> Vec<ConnResult> {
    // Connection i is tagged with conversation i % 200: the connections of a conversation
    // are interleaved with all the others.
    client.connect(Some(cg), &ConnectOpts::new(VIP, CONVERSATIONS * per_conv).conversations(CONVERSATIONS, "aff"))
}

fn stayed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>, convs: &BTreeSet<String>) -> usize {
    convs.iter().filter(|c| before.get(*c) == after.get(*c)).count()
}

#[test]
fn conversations_stick_across_weight_change_and_move_only_off_a_removed_backend() {
    let bin = preflight();
    let cg = CgroupGuard::new("affinity");
    let _servers = BackendServer::start_all(&BACKENDS.map(|b| b.0));
    let mut cfg: TestConfig = base_config("affinity", &cg).service(MODEL, VIP);
    for (addr, w) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    let mut daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());

    // Phase 1: 200 x 20 connections, each conversation on exactly one backend.
    let first = one_backend_each(&run_phase(&client, &cg, PER_CONVERSATION), "phase 1 (200 x 20)");
    let all: BTreeSet<String> = first.keys().cloned().collect();
    let mut spread: BTreeMap<&str, usize> = BTreeMap::new();
    for b in first.values() {
        *spread.entry(b.as_str()).or_default() += 1;
    }
    eprintln!("phase 1: conversations per backend {spread:?}");

    // Phase 2: one backend's weight changes (3 -> 9).
    let changed = BACKENDS[3].0;
    cfg.backend_mut(changed).weight = 9;
    daemon.reload(&cfg);
    let second = one_backend_each(&run_phase(&client, &cg, AFTER_CHANGE), "phase 2 (after weight change)");
    let kept = stayed(&first, &second, &all);
    let kept_pct = kept as f64 * 100.0 / CONVERSATIONS as f64;
    eprintln!("phase 2: {kept} of {CONVERSATIONS} conversations stayed put");
    assert!(
        kept_pct >= MIN_STAY_PERCENT,
        "after the weight of {changed} changed 3 -> 9 only {kept} of {CONVERSATIONS} conversations ({kept_pct:.1} %) \
         kept their backend; at least {MIN_STAY_PERCENT} % must"
    );

    // Phase 3: a backend is removed from the config (its server keeps running, so a
    // connection wrongly sent there would succeed and be seen).
    let removed = BACKENDS[0].0;
    let on_removed: BTreeSet<String> =
        second.iter().filter(|(_, b)| b.as_str() == removed).map(|(c, _)| c.clone()).collect();
    assert!(
        !on_removed.is_empty(),
        "precondition: no conversation was on {removed} (weight 2 of 10, 200 conversations), the removal would test nothing"
    );
    cfg.backends.retain(|b| b.address != removed);
    daemon.reload(&cfg);
    let third = one_backend_each(&run_phase(&client, &cg, AFTER_CHANGE), "phase 3 (after removal)");
    let live: Vec<&str> = BACKENDS[1..].iter().map(|b| b.0).collect();
    for (conv, b) in &third {
        assert!(
            live.contains(&b.as_str()),
            "after {removed} was removed, conversation {conv} reached {b} (live backends: {live:?})"
        );
    }
    // The conversations of the live backends keep theirs, by the same rule as in phase 2.
    let others: BTreeSet<String> = all.difference(&on_removed).cloned().collect();
    let kept = stayed(&second, &third, &others);
    let kept_pct = kept as f64 * 100.0 / others.len() as f64;
    eprintln!(
        "phase 3: {} conversations moved off {removed}; {kept} of {} others stayed put",
        on_removed.len(),
        others.len()
    );
    assert!(
        kept_pct >= MIN_STAY_PERCENT,
        "after {removed} was removed only {kept} of the {} conversations on live backends ({kept_pct:.1} %) kept theirs",
        others.len()
    );
}
