use std::collections::{HashMap, HashSet};

use super::*;
use crate::replay::trace::BLOCK_TOKENS;

fn opts() -> SharedPrefixOpts {
    SharedPrefixOpts { requests: 400, tenants: 7, system_blocks: 5, question_blocks: 2, ..Default::default() }
}

#[test]
fn the_same_options_give_the_same_requests_and_another_seed_others() {
    let a = generate(&opts());
    assert_eq!(a.len(), 400);
    assert_eq!(a, generate(&opts()));
    let b = generate(&SharedPrefixOpts { seed: 2, ..opts() });
    assert_ne!(a, b);
}

#[test]
fn tenants_share_exactly_their_system_blocks() {
    let o = opts();
    let reqs = generate(&o);
    let mut seen_tenants = HashSet::new();
    let mut owner: HashMap<u64, Option<usize>> = HashMap::new();
    for r in &reqs {
        seen_tenants.insert(r.tenant);
        assert_eq!(r.hash_ids.len(), (o.system_blocks + o.question_blocks) as usize);
        let system: Vec<u64> = system_ids(&o, r.tenant).collect();
        assert_eq!(r.hash_ids[..o.system_blocks as usize], system[..], "request at {} ms", r.at_ms);
        for &id in &r.hash_ids[..o.system_blocks as usize] {
            // A system block belongs to one tenant only.
            assert_eq!(*owner.entry(id).or_insert(Some(r.tenant)), Some(r.tenant), "system block {id}");
        }
        for &id in &r.hash_ids[o.system_blocks as usize..] {
            // A question block is in no other request.
            assert!(owner.insert(id, None).is_none(), "question block {id} appears twice");
        }
    }
    assert_eq!(seen_tenants.len(), o.tenants, "400 requests over 7 tenants reach them all");
    // Two requests of different tenants share no leading block; of one tenant, exactly the system blocks.
    let (a, b) = (&reqs[0], reqs.iter().find(|r| r.tenant == reqs[0].tenant && r.at_ms != reqs[0].at_ms).unwrap());
    let shared = a.hash_ids.iter().zip(&b.hash_ids).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, o.system_blocks as usize);
    let c = reqs.iter().find(|r| r.tenant != a.tenant).unwrap();
    assert_ne!(a.hash_ids[0], c.hash_ids[0]);
}

#[test]
fn prompts_cover_their_blocks_and_arrivals_are_poisson_at_the_rate() {
    let o = SharedPrefixOpts { requests: 4000, requests_per_s: 8.0, ..opts() };
    let reqs = generate(&o);
    let block = BLOCK_TOKENS as u32;
    for r in &reqs {
        // The question's last block is partial (128..=512 tokens), the rest full.
        let min = (o.system_blocks + o.question_blocks - 1) * block + block / 4;
        assert!((min..=(o.system_blocks + o.question_blocks) * block).contains(&r.input_length), "{}", r.input_length);
        assert!((100..=300).contains(&r.output_length), "{}", r.output_length);
    }
    assert!(reqs.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "sorted by arrival");
    let span_s = reqs.last().unwrap().at_ms as f64 / 1000.0;
    let rate = reqs.len() as f64 / span_s;
    assert!((7.5..8.5).contains(&rate), "mean rate {rate:.2}/s, asked 8/s");
    // Exponential gaps: their standard deviation is about their mean.
    let gaps: Vec<f64> = reqs.windows(2).map(|w| (w[1].at_ms - w[0].at_ms) as f64).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    assert!((0.9..1.1).contains(&(sd / mean)), "gap sd / mean {:.2}", sd / mean);
}

#[test]
fn bad_options_are_named() {
    let bad = [
        (SharedPrefixOpts { tenants: 0, ..opts() }, "tenants"),
        (SharedPrefixOpts { system_blocks: 0, ..opts() }, "system blocks"),
        (SharedPrefixOpts { question_blocks: 0, ..opts() }, "question blocks"),
        (SharedPrefixOpts { requests_per_s: 0.0, ..opts() }, "rate"),
        (SharedPrefixOpts { requests_per_s: f64::NAN, ..opts() }, "rate"),
        (SharedPrefixOpts { output_tokens: 0, ..opts() }, "output tokens"),
    ];
    for (o, field) in bad {
        let e = o.validate().unwrap_err();
        assert!(e.contains(field), "{e:?} names {field}");
        assert!(generate(&o).is_empty());
    }
    assert!(opts().validate().is_ok());
}

/// The specs the replay sends: no conversation, and with prefix keys on, two users of one tenant
/// carry the same keys over the system prompt and differ after it; users of two tenants share none.
#[test]
fn users_of_a_tenant_send_the_same_prefix_keys_and_no_conversation() {
    let o = SharedPrefixOpts { requests: 60, tenants: 3, system_blocks: 12, question_blocks: 1, ..Default::default() };
    let reqs = generate(&o);
    let mut specs = crate::replay::shared_prefix_specs(&o, 0.5, "m");
    assert!(specs.iter().all(|s| s.conversation.is_empty() && s.tag_socket && !s.prefix_keys));
    assert!(specs[0].socket_prefix_keys(&specs[0].prompt()).is_empty(), "no keys unless asked");
    for s in &mut specs {
        s.prefix_keys = true;
    }
    let keys = |i: usize| specs[i].socket_prefix_keys(&specs[i].prompt());
    let same = (1..specs.len()).find(|&i| reqs[i].tenant == reqs[0].tenant).expect("a second user of tenant 0's");
    let other = (1..specs.len()).find(|&i| reqs[i].tenant != reqs[0].tenant).expect("a user of another tenant");
    let (a, b, c) = (keys(0), keys(same), keys(other));
    assert!(a.len() <= ailb_common::prefix::PREFIX_KEYS_MAX && a.len() > 12, "{} keys", a.len());
    // 12 blocks of 2,048 bytes are 384 chunks of 64; the stride is 32: 12 keys inside the system prompt.
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, 12, "keys {a:x?} and {b:x?}");
    assert!(a.iter().all(|k| !c.contains(k)), "another tenant's user shares no key");
}
