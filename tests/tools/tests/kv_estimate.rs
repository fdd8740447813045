//! The front door's memory estimate against what the simulated server reserves, and where the
//! kernel's pick sends the request: a request one token past a whole number of KV blocks must
//! not go to a GPU whose KV pool holds only that number of blocks (the server would refuse it
//! with a 400), but to one that holds it.
//!
//! Pure: the gateway's own routing code over its config, the simulator's own request parser and
//! block count, and `ailb_common::pick` (the function the kernel runs) over in-memory maps.

use ailb_common::hash::fmix64;
use ailb_common::pick::{pick, Outcome, PickRequest, VecMaps};
use ailb_common::{Backend, GlobalConfig, BACKEND_LIVE, NO_CAP};
use ailb_sim::{parse_chat, GpuProfile, BLOCK_TOKENS};
use ailb_userspace::config::Config;
use ailb_userspace::gateway::routing_inputs;
use hyper::header::HeaderMap;

const MODEL: u32 = 0;
const MAX_TOKENS: u64 = 16;

/// The gateway's estimate (MB) for a chat request whose prompt the simulator counts as
/// `prompt_tokens`, with `kv_block_tokens` in the config (or the default when `None`).
fn gateway_estimate(prompt_tokens: u64, block: Option<u64>) -> (u32, Vec<u8>) {
    let per_token = GpuProfile::preset("a100-80gb").unwrap().kv_bytes_per_token;
    let blocks = block.map(|b| format!("[gateway.kv_block_tokens]\n\"sim-7b\" = {b}\n")).unwrap_or_default();
    let text = format!(
        "[[models]]\nname = \"sim-7b\"\nvips = [\"127.77.11.1:8000\"]\n\
         [gateway]\n[gateway.kv_bytes_per_token]\n\"sim-7b\" = {per_token}\n{blocks}"
    );
    let config = Config::parse(&text, "test").unwrap();
    let valid = config.validate().unwrap();
    let gateway = config.gateway.validate(valid.models.keys().map(String::as_str)).unwrap();
    // The simulator counts floor(bytes / 4) tokens, the gateway ceil(bytes / 4): whole tokens agree.
    let body = serde_json::json!({
        "model": "sim-7b",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "x".repeat(prompt_tokens as usize * 4)}],
    });
    let body = serde_json::to_vec(&body).unwrap();
    let routing = routing_inputs(&valid, &gateway, "/v1/chat/completions", &HeaderMap::new(), &body).unwrap();
    (routing.inputs.memory_mb.unwrap(), body)
}

/// What an idle simulated GPU publishes as free memory (NVML: total minus the weights), which
/// the policy keeps as the backend's capacity.
fn idle_free_mb(p: &GpuProfile) -> u32 {
    (p.gpu_memory_mb - p.weights_mb) as u32
}

/// Where the kernel's pick sends `hints` MB, over 2,000 conversations, with one A100 (weight 3,
/// id 0) and one RTX 3090 (weight 1, id 1), both idle.
fn picks(hint: u32) -> [u32; 2] {
    let a100 = GpuProfile::preset("a100-80gb").unwrap();
    let rtx = GpuProfile::preset("rtx3090-24gb").unwrap();
    let backend = |i: u32, w: u32, p: &GpuProfile| Backend {
        addr: 0x0b00_007f + (i << 24),
        port: 18300u16.to_be(),
        model: MODEL,
        weight: w,
        cap: NO_CAP,
        free_mem_mb: idle_free_mb(p),
        mem_capacity_mb: idle_free_mb(p),
        state: BACKEND_LIVE,
        ..Default::default()
    };
    let (maps, state) = VecMaps::one_model(MODEL, 0, vec![backend(0, 3, &a100), backend(1, 1, &rtx)]);
    let cfg = GlobalConfig::defaults();
    let mut counts = [0; 2];
    for i in 0..2_000u64 {
        let req = PickRequest {
            model: MODEL,
            hash: fmix64(i),
            has_conversation: true,
            required_mem_mb: hint,
            affinity: None,
            now_ns: 1_000,
            model_inflight: 0,
            turn: 0,
            affinity_bounded: false,
        };
        let r = pick(&maps, &state, &cfg, &req);
        assert_ne!(r.outcome, Outcome::NoFit, "the A100 holds {hint} MB");
        counts[r.backend as usize] += 1;
    }
    counts
}

#[test]
fn just_over_a_whole_number_of_blocks_goes_to_a_gpu_that_holds_it() {
    let rtx = GpuProfile::preset("rtx3090-24gb").unwrap();
    let a100 = GpuProfile::preset("a100-80gb").unwrap();
    let rtx_tokens = rtx.kv_blocks() * BLOCK_TOKENS;
    assert_eq!(rtx_tokens, 22_016, "the RTX 3090's KV pool: 43 blocks of 512");

    // One token past the RTX 3090's pool: the server must refuse it, the A100 runs it.
    let over = rtx_tokens + 1 - MAX_TOKENS;
    let (mb, body) = gateway_estimate(over, Some(BLOCK_TOKENS));
    let sim = parse_chat(&body).unwrap().sim;
    assert_eq!(sim.prompt_tokens + sim.max_tokens, rtx_tokens + 1, "the simulator counts the same tokens");
    assert!(sim.blocks_needed() > rtx.kv_blocks() && sim.blocks_needed() <= a100.kv_blocks());
    assert_eq!(mb, 44 * 256, "44 blocks of 256 MiB");
    assert!(mb > idle_free_mb(&rtx), "{mb} MB must exceed the RTX 3090's {} MB", idle_free_mb(&rtx));
    assert_eq!(picks(mb), [2_000, 0], "every conversation goes to the A100");

    // Without block rounding (1-token blocks) the estimate fits the RTX 3090, which refuses it:
    // the front door's 400s of the soak.
    let (unrounded, _) = gateway_estimate(over, Some(1));
    assert!(unrounded <= idle_free_mb(&rtx), "{unrounded}");
    assert!(picks(unrounded)[1] > 0, "some go to the RTX 3090");

    // Exactly the RTX 3090's 43 blocks: it fits there, and the pick uses it.
    let (exact, body) = gateway_estimate(rtx_tokens - MAX_TOKENS, Some(BLOCK_TOKENS));
    assert_eq!(parse_chat(&body).unwrap().sim.blocks_needed(), rtx.kv_blocks());
    assert_eq!(exact, 43 * 256);
    assert!(picks(exact)[1] > 0, "the RTX 3090 takes its share");
}

#[test]
fn default_block_is_sixteen_tokens() {
    // 17 tokens in all = 2 blocks of 16 = 32 tokens x 0.5 MiB.
    let (mb, _) = gateway_estimate(1, None);
    assert_eq!(mb, 16);
}
