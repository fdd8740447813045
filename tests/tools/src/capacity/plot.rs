//! The plot of `ailb-fleet-model`, hand-written SVG: every placement's E2E P95 against the
//! offered load, at N and at 2 x N requests.

use std::fmt::Write as _;

/// One placement's E2E P95 (simulated seconds) per load, at N and at 2 x N requests.
pub struct Curve {
    pub label: String,
    pub short: Vec<f64>,
    pub long: Vec<f64>,
}

/// E2E P95 against offered load, log scale: solid at N requests, dashed at 2 x N. Where the two
/// part, the placement is past what the fleet (or the placement) can carry.
pub fn svg(loads: &[f64], curves: &[Curve], n: usize) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 440.0, 64.0, 230.0, 20.0, 46.0);
    let vals: Vec<f64> =
        curves.iter().flat_map(|c| c.short.iter().chain(&c.long)).copied().filter(|v| *v > 0.0).collect();
    let lo = vals.iter().copied().fold(f64::MAX, f64::min).max(0.1).log10().floor();
    let hi = vals.iter().copied().fold(1.0, f64::max).log10().ceil().max(lo + 1.0);
    let (lmin, lmax) = (loads.iter().copied().fold(f64::MAX, f64::min), loads.iter().copied().fold(0.0, f64::max));
    let span = if lmax > lmin { lmax - lmin } else { 1.0 };
    let x = |l: f64| ml + (l - lmin) / span * (w - ml - mr);
    let y = |v: f64| h - mb - (v.max(0.1).log10() - lo) / (hi - lo) * (h - mb - mt);
    let colors = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{ml}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{ml}\" y1=\"{mt}\" x2=\"{ml}\" y2=\"{b}\" stroke=\"black\"/>\n",
        b = h - mb,
        r = w - mr,
    );
    for &l in loads {
        let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{l}</text>", x(l), h - mb + 16.0);
    }
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        let _ = writeln!(
            s,
            "<line x1=\"{ml}\" y1=\"{py:.1}\" x2=\"{r}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>",
            ml - 6.0,
            y(v) + 4.0,
            py = y(v),
            r = w - mr,
        );
        e += 1.0;
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">offered load (x the trace's rate); y: E2E P95, simulated s (log)</text>",
        (w - mr + ml) / 2.0,
        h - 8.0
    );
    for (k, c) in curves.iter().enumerate() {
        let color = colors[k % colors.len()];
        for (vals, dash) in [(&c.short, ""), (&c.long, " stroke-dasharray=\"5,4\"")] {
            let pts: Vec<String> =
                loads.iter().zip(vals.iter()).map(|(l, v)| format!("{:.1},{:.1}", x(*l), y(*v))).collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
                pts.join(" ")
            );
        }
        let ly = mt + 14.0 + k as f64 * 18.0;
        let lx = w - mr + 12.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{}\">{}</text>",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            c.label
        );
    }
    let ly = mt + 14.0 + curves.len() as f64 * 18.0 + 8.0;
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{ly}\">solid: {n} requests</text>\n<text x=\"{}\" y=\"{}\">dashed: {} requests</text>\n</svg>",
        w - mr + 12.0,
        w - mr + 12.0,
        ly + 16.0,
        2 * n
    );
    s
}
