//! `ailb status [--json]`.

use std::path::Path;

use crate::datapath;

pub fn status(bpffs: &Path, json: bool) -> anyhow::Result<()> {
    let st = datapath::read_status(bpffs).map_err(|e| super::access::pin_error(&e, bpffs, "ailb status"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    let s = &st.stats;
    println!(
        "ailb at {} — generation {}, c = {} (prefix holders {}), probes {}, affinity {}, load bound {}{}",
        st.bpffs,
        st.generation,
        st.config.load_factor,
        st.config.prefix_load_factor,
        st.config.probes,
        st.config.affinity,
        st.config.load_bound,
        if st.config.round_robin { ", round robin (baseline)" } else { "" }
    );
    println!(
        "picks {}  affinity hits {} breaks {}  spills {}  fallbacks {}  refused {} (no backend) {} (no fit)  established {}  closed {}  failed {}",
        s.picks, s.affinity_hits, s.affinity_breaks, s.spills, s.fallbacks, s.no_backend, s.no_fit, s.established, s.closed, s.connect_failures
    );
    if let Some(tc) = &st.tc {
        let t = &tc.stats;
        println!(
            "remote (TC on {}): flows {} ({} IPv6, counted in flight {})  NAT ports in use {}  opened {}  closed {}  reclaimed {}  dropped: table full {} no NAT port {} refused {} malformed {}  redirected {}  to stack {}",
            tc.interfaces.join(", "), tc.flows, tc.flows_ipv6, tc.counted, tc.nat_ports, t.flows_opened, t.flows_closed, t.flows_reclaimed,
            t.flows_full, t.nat_exhausted, t.refused, t.malformed, t.redirected, t.to_stack
        );
    }
    print_memory(&st.kernel_memory);
    for m in &st.models {
        println!(
            "\nmodel {} (id {}) VIPs {} — {}, table {} slots, in-flight {}, kernel memory {}",
            m.name,
            m.id,
            m.vips.join(", "),
            if m.available { "available" } else { "UNAVAILABLE" },
            m.table_size,
            m.inflight,
            bytes(m.kernel_bytes)
        );
        println!(
            "  {:>4} {:<22} {:>6} {:>7} {:>9} {:>8} {:>8} {:>11} {:>8} {:>9} {:>9}",
            "id",
            "backend",
            "weight",
            "share",
            "free MB",
            "live",
            "inflight",
            "in-fl. MB",
            "picks",
            "aff.hits",
            "rtt us"
        );
        for b in &m.backends {
            println!(
                "  {:>4} {:<22} {:>6} {:>6.1}% {:>9} {:>8} {:>8} {:>11} {:>8} {:>9} {:>9}",
                b.id,
                b.address,
                b.weight,
                b.table_share * 100.0,
                b.free_mem_mb.map_or("?".to_string(), |v| v.to_string()),
                if b.live { "yes" } else { "no" },
                b.inflight,
                b.inflight_mem_mb,
                b.picks,
                b.affinity_hits,
                b.rtt_us_avg.map_or("-".to_string(), |v| format!("{v:.0}")),
            );
        }
    }
    Ok(())
}

/// `n` bytes in KiB or MiB.
fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", n as f64 / 1024.0)
    }
}

fn print_memory(k: &datapath::memory::KernelMemory) {
    let (t, m) = (&k.table_arena, &k.member_arena);
    println!(
        "kernel memory {} in all: per model {} B, per backend {} B, per affinity entry {} B; tables {} of {} slots \
         in use ({}), members {} of {} ids ({})",
        bytes(k.total_bytes),
        k.per_model_bytes,
        k.per_backend_bytes,
        k.per_affinity_entry_bytes,
        t.used,
        t.capacity,
        bytes(t.used_bytes),
        m.used,
        m.capacity,
        bytes(m.used_bytes)
    );
}
