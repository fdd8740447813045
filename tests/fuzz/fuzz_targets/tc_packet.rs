//! Packets through the TC program (`ailb_tc_ingress`) with `BPF_PROG_TEST_RUN`: a sequence of
//! frames per input (the format is in `ailb_fuzz::tc`), each checked as it comes back. Besides
//! no crash and no error from the kernel:
//! - the frame keeps its length; with the TC mode off it comes back untouched;
//! - a rewritten frame was IPv4 / TCP with a right IPv4 checksum (the program drops any other
//!   to a VIP or of a flow), changed only in its addresses, ports, checksums, TTL (by one at
//!   most) and MAC addresses, and both checksums verify whenever they verified before;
//! - after every packet the flow table is whole (forward and reply entries in pairs, every
//!   count entry with its flow) and the in-flight counters and the TC counters count exactly
//!   the flows counted.
//!
//! Needs root and BPF: without them it prints `tc_packet: skipped: REASON` and exits with 69
//! before fuzzing anything, which `cargo xtask fuzz` reports as skipped.
#![no_main]

use std::sync::{Mutex, OnceLock};

use ailb_fuzz::tc::{
    checksums, endpoints, fit_total_length, fix_checksums, layout, outcome_branches, rewritable, set_endpoints,
    Fixture, ETH_HLEN, MAX_FRAME, MIN_FRAME, TC_ACT_SHOT,
};
use libfuzzer_sys::fuzz_target;

/// The exit status that says "skipped" to `cargo xtask fuzz` (EX_UNAVAILABLE; libFuzzer's own
/// are 77 for a crash and 70 for a timeout).
const SKIPPED: i32 = 69;

static FIXTURE: OnceLock<Mutex<Fixture>> = OnceLock::new();

fuzz_target!(
    init: {
        match Fixture::load() {
            Ok(f) => {
                let _ = FIXTURE.set(Mutex::new(f));
            }
            Err(e) => {
                eprintln!("tc_packet: skipped: {}", e.0);
                std::process::exit(SKIPPED);
            }
        }
    },
    |data: &[u8]| {
        let Some((&config, mut rest)) = data.split_first() else { return };
        let mut f = FIXTURE.get().expect("loaded in init").lock().unwrap_or_else(|p| p.into_inner());
        f.configure(config);
        let off = config & 3 == 0;
        let mut first = None;
        let mut last = None;
        let mut stats = f.tc_stats();
        while let [ctl, hi, lo, tail @ ..] = rest {
            let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
            let (bytes, next) = tail.split_at(len);
            rest = next;
            if bytes.len() < MIN_FRAME || bytes.len() > MAX_FRAME {
                continue;
            }
            let mut frame = bytes.to_vec();
            if ctl & 2 != 0 {
                if let Some((src, dst)) = last {
                    set_endpoints(&mut frame, dst, src);
                }
            } else if ctl & 4 != 0 {
                if let Some((src, dst)) = first {
                    set_endpoints(&mut frame, src, dst);
                }
            }
            if ctl & 8 != 0 {
                fit_total_length(&mut frame);
            }
            if ctl & 1 != 0 {
                fix_checksums(&mut frame);
            }
            let Some((verdict, out)) = f.run(&frame) else { continue };
            assert_eq!(out.len(), frame.len(), "the program changed the frame's length");
            if off {
                assert_eq!(out, frame, "TC mode off changed a frame");
                assert_ne!(verdict, TC_ACT_SHOT, "TC mode off dropped a frame");
            }
            let rewritten = verdict != TC_ACT_SHOT && out != frame;
            if rewritten {
                check_rewrite(&frame, &out);
                first = first.or(endpoints(&frame));
                last = endpoints(&out);
            }
            let (now, entries) = f.check_flows();
            outcome_branches(&stats, &now, verdict, rewritten, entries);
            stats = now;
        }
        f.reset();
    }
);

/// What a rewrite may and must do (see the module's comment).
fn check_rewrite(frame: &[u8], out: &[u8]) {
    let l = layout(frame).expect("a rewritten frame is IPv4 with its header whole");
    assert_eq!(frame[ETH_HLEN + 9], 6, "a rewritten frame is TCP");
    let may = rewritable(l);
    for i in (0..frame.len()).filter(|&i| !may(i)) {
        assert_eq!(out[i], frame[i], "byte {i} changed in a rewrite");
    }
    let (ttl_in, ttl_out) = (frame[ETH_HLEN + 8], out[ETH_HLEN + 8]);
    assert!(ttl_out == ttl_in || ttl_out.checked_add(1) == Some(ttl_in), "TTL {ttl_in} -> {ttl_out}");
    let (ip_in, tcp_in) = checksums(frame);
    let (ip_out, tcp_out) = checksums(out);
    assert_eq!(ip_in, Some(true), "a frame with a wrong IPv4 checksum was rewritten");
    assert_eq!(ip_out, Some(true), "the rewrite left a wrong IPv4 checksum");
    if tcp_in == Some(true) {
        assert_eq!(tcp_out, Some(true), "the rewrite broke a right TCP checksum");
    }
}
