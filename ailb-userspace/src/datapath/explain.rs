//! Which backend a conversation gets right now, and why: the kernel's own pick
//! (`ailb_common::pick::pick_prefixed`) run in userspace over a copy of the pinned maps, with
//! the request's prefix keys when it has some (the prefix map's entries for them are copied
//! too). The pick is an IPv4 client's; for a model with IPv6 backends an IPv6 client's too,
//! which may differ.

use std::{collections::HashMap, net::SocketAddr, path::Path};

use ailb_common::{
    hash::conversation_hash,
    maps,
    pick::{pick_prefixed, ClientFamily, Outcome, PickRequest, PrefixQuery, PrefixUse, PrefixVerdict, VecMaps},
    prefix::PREFIX_KEYS_MAX,
    AffinityKey, BackendAddr6, MAX_BACKENDS, MAX_MEMBERS, MAX_MODELS, MAX_TABLE_SIZE, NO_BACKEND,
};
use serde::Serialize;

use super::{
    map_err,
    prefix::PrefixMap,
    store::WriterMaps,
    values::{backend_address, model_name},
    DatapathError, Maps,
};

#[derive(Debug, Serialize)]
pub struct ConversationExplain {
    pub model: String,
    pub conversation: String,
    pub hash: String,
    /// The backend a connection of this conversation gets now (`None`: refused).
    pub backend: Option<String>,
    pub outcome: String,
    pub why: String,
    /// The affinity entry in the kernel, if any.
    pub affinity_backend: Option<String>,
    pub affinity_age_ms: Option<u64>,
    /// For a model with IPv6 backends: the backend an IPv6 client's connection gets now
    /// (`backend` is an IPv4 client's, which never reaches an IPv6 backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_ipv6_client: Option<String>,
    /// The prefix step, for a request that carries prefix keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixExplain>,
}

/// What the prefix step found for a request's keys.
#[derive(Debug, Serialize)]
pub struct PrefixExplain {
    /// Keys the request sends (at most 16: every k-th block's and the last).
    pub sent: u8,
    /// How many of them some holder has (the longest cached prefix, in keys sent).
    pub found: u8,
    /// `not_asked` (the model has no prefix mode), `not_held`, `used`, `overruled_load`,
    /// `overruled_memory` or `gone`.
    pub usage: &'static str,
    /// The backends the map names for the longest prefix found (those that count now).
    pub holders: Vec<String>,
    /// Whether one of them is exact: its engine reports the prefix held now (precise mode).
    pub exact: bool,
    /// Precise mode: the holders among them whose engine evicted the prefix within the model's
    /// `prefix_ttl`. They still count, after any exact holder: the tenant's requests go back
    /// where its prompt was, rather than to wherever a piece of it is left.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<String>,
    pub why: &'static str,
}

/// The verdict's name, as `/metrics` and `ailb status` count it.
pub fn usage_name(u: PrefixUse) -> &'static str {
    match u {
        PrefixUse::NotAsked => "not_asked",
        PrefixUse::NotHeld => "not_held",
        PrefixUse::Used => "used",
        PrefixUse::OverruledLoad => "overruled_load",
        PrefixUse::OverruledMemory => "overruled_memory",
        PrefixUse::Gone => "gone",
    }
}

fn usage_why(u: PrefixUse) -> &'static str {
    match u {
        PrefixUse::NotAsked => "the model has no prefix mode (prefix = \"off\"): the keys are not searched",
        PrefixUse::NotHeld => {
            "no backend holds its first block: the weighted table places it by that block's key, as every request that starts with it"
        }
        PrefixUse::Used => "a holder of its longest cached prefix can take it",
        PrefixUse::OverruledLoad => {
            "every holder of its longest cached prefix is at its cap or load bound (balancer.prefix_load_factor)"
        }
        PrefixUse::OverruledMemory => "holders under their bound could not hold the memory hint, even idle",
        PrefixUse::Gone => "no holder of its longest cached prefix is a live member of the model now",
    }
}

/// The pick for a connection of `conversation` to `model` with the memory hint
/// `required_mem_mb` and the prefix keys `prefix` (none: empty).
pub fn explain_conversation(
    dir: &Path,
    model: &str,
    conversation: &str,
    required_mem_mb: u32,
    prefix: &[u64],
) -> Result<ConversationExplain, DatapathError> {
    let maps = Maps::open(dir)?;
    let gc = maps.global_config()?;
    let (midx, state) = find_model(&maps, dir, model)?;
    let (mut copy, addrs6) = copy_maps(&maps, state.active_slot())?;
    let prefix = &prefix[..prefix.len().min(PREFIX_KEYS_MAX)];
    if !prefix.is_empty() {
        let pm = PrefixMap::open(dir)?;
        for &key in prefix {
            if let Some(h) = pm.holders(midx, key)? {
                copy.prefix.insert((midx, key), h);
            }
        }
    }
    let model_inflight =
        maps.inflight.get(&(ailb_common::INFLIGHT_MODEL_BASE + midx), 0).map_err(map_err(maps::INFLIGHT))?;
    let hash = conversation_hash(conversation.as_bytes());
    let affinity = maps
        .affinity
        .get(&AffinityKey { model: midx, space: ailb_common::AFFINITY_SPACE_CONVERSATION, conversation: hash }, 0)
        .ok();
    let now = super::sys::monotonic_ns();
    let req = PickRequest {
        model: midx,
        hash,
        has_conversation: true,
        required_mem_mb,
        affinity,
        now_ns: now,
        model_inflight,
        // With round robin: the next connect's turn.
        turn: maps.inflight.get(&(ailb_common::INFLIGHT_TURN_BASE + midx), 0).map_err(map_err(maps::INFLIGHT))?,
        // A conversation, as the socket ABI and the front door tag it.
        affinity_bounded: false,
    };
    let view = state.view();
    let query = PrefixQuery::for_connect(prefix, &view, now);
    let query = (!prefix.is_empty()).then_some(&query);
    let (res, verdict) = pick_prefixed(&copy, &view, &gc, &req, ClientFamily::Ipv4, query);
    let addr = |id: u32| -> Option<SocketAddr> {
        copy.backends
            .get(id as usize)
            .filter(|_| id != NO_BACKEND)
            .map(|b| backend_address(b, &addrs6.get(&id).copied().unwrap_or(BackendAddr6::default())))
    };
    let backend_ipv6_client = (!addrs6.is_empty()).then(|| {
        let (r6, _) = pick_prefixed(&copy, &view, &gc, &req, ClientFamily::Ipv6, query);
        addr(r6.backend).map_or_else(|| "refused".to_string(), |a| a.to_string())
    });
    let why = why(res.outcome, res.affinity_break);
    Ok(ConversationExplain {
        model: model.to_string(),
        conversation: conversation.to_string(),
        hash: format!("{hash:#018x}"),
        backend: addr(res.backend).map(|a| a.to_string()),
        outcome: format!("{:?}", res.outcome),
        why,
        affinity_backend: affinity.and_then(|a| addr(a.backend)).map(|a| a.to_string()),
        affinity_age_ms: affinity.map(|a| now.saturating_sub(a.last_seen_ns) / 1_000_000),
        backend_ipv6_client,
        prefix: query.map(|q| {
            prefix_explain(&copy, midx, q, state.flags & ailb_common::MODEL_PREFIX_EVENTS != 0, verdict, addr)
        }),
    })
}

fn prefix_explain(
    copy: &VecMaps,
    model: u32,
    q: &PrefixQuery<'_>,
    precise: bool,
    v: PrefixVerdict,
    addr: impl Fn(u32) -> Option<SocketAddr>,
) -> PrefixExplain {
    let entry =
        (v.found as usize).checked_sub(1).and_then(|last| q.keys.get(last)).and_then(|k| copy.prefix.get(&(model, *k)));
    let named = |keep: &dyn Fn(&ailb_common::PrefixHolders, usize) -> bool| -> Vec<String> {
        entry
            .map(|h| {
                (0..h.ids.len())
                    .filter(|&i| h.fresh(i, q.now_tick, q.ttl_ticks) && keep(h, i))
                    .filter_map(|i| addr(h.ids[i]))
                    .map(|a| a.to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    PrefixExplain {
        sent: v.sent,
        found: v.found,
        usage: usage_name(v.usage),
        holders: named(&|_, _| true),
        exact: v.exact,
        evicted: if precise { named(&|h, i| !h.exact(i)) } else { Vec::new() },
        why: usage_why(v.usage),
    }
}

/// The model named `model` in the kernel's maps: its index and state.
fn find_model(maps: &Maps, dir: &Path, model: &str) -> Result<(u32, ailb_common::ModelState), DatapathError> {
    for idx in 0..MAX_MODELS {
        let st = maps.models.get(&idx, 0).map_err(map_err(maps::MODELS))?;
        if model_name(&st) == model {
            return Ok((idx, st));
        }
    }
    Err(DatapathError::State {
        path: dir.to_path_buf(),
        reason: format!("no model named {model:?} in the kernel maps"),
    })
}

/// What the pick reads, copied from the pinned maps: the active table and members, every
/// backend with its in-flight counts; and the IPv6 backends' addresses.
fn copy_maps(
    maps: &Maps,
    slot: &ailb_common::abi::TableSlot,
) -> Result<(VecMaps, HashMap<u32, BackendAddr6>), DatapathError> {
    let mut copy = VecMaps { table_offset: slot.table_offset, member_offset: slot.member_offset, ..Default::default() };
    if slot.size > 0 {
        copy.table = maps.table(slot.table_offset, slot.size.min(MAX_TABLE_SIZE))?;
        copy.members = maps.members(slot.member_offset, slot.members.min(MAX_MEMBERS))?;
    }
    let mut addrs6 = HashMap::new();
    for id in 0..MAX_BACKENDS {
        let b = maps.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))?;
        if b.is_ipv6() {
            addrs6.insert(id, maps.backend_addr6(id)?);
        }
        copy.backends.push(b);
        copy.inflight.push(maps.inflight.get(&id, 0).map_err(map_err(maps::INFLIGHT))?);
        let mem = ailb_common::INFLIGHT_MEM_BASE + id;
        copy.inflight_mem.push(maps.inflight.get(&mem, 0).map_err(map_err(maps::INFLIGHT))?);
    }
    Ok((copy, addrs6))
}

/// Why the pick came out as it did, in words.
fn why(outcome: Outcome, affinity_break: bool) -> String {
    match outcome {
        Outcome::Prefix => "a backend holding the longest cached prefix of its prompt is live, under its load bound \
                            and fits the hint"
            .to_string(),
        Outcome::AffinityHit => "its affinity entry's backend is live, under its cap and fits the hint (now, or \
                                 once idle while the conversation is within affinity_wait)"
            .to_string(),
        Outcome::Primary => format!(
            "{}the first table slot for its hash is under its load bound",
            if affinity_break { "affinity broken (backend no longer usable); " } else { "no affinity entry; " }
        ),
        Outcome::Spill => {
            "the first probed slot could not take it (load bound, cap or memory hint); a later probe was taken"
                .to_string()
        }
        Outcome::Fallback => "no probed slot qualified; the least loaded member that fits was taken (or, when \
                              none has the hinted memory free now, the one where it should finish first: it waits there)"
            .to_string(),
        Outcome::NoBackend => "the model has no live backend: connects are refused (ECONNREFUSED)".to_string(),
        Outcome::NoFit => {
            "no live backend fits the memory hint or is under its cap: refused (ECONNREFUSED)".to_string()
        }
    }
}
