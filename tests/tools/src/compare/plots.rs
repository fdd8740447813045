//! The comparison's plots, hand-written SVG: the E2E latency CDFs and every GPU's utilisation
//! over time.

use std::fmt::Write as _;

use super::outcome::Outcome;

/// A hand-written SVG: the E2E latency CDF of every policy (log x axis).
pub fn cdf_svg(outs: &[Outcome]) -> String {
    let (w, h, ml, mb) = (720.0, 420.0, 60.0, 40.0);
    let all: Vec<f64> = outs.iter().flat_map(|o| o.e2e_sorted.iter().copied()).filter(|v| *v > 0.0).collect();
    let lo = all.iter().copied().fold(f64::MAX, f64::min).max(1.0).log10().floor();
    let hi = all.iter().copied().fold(1.0, f64::max).log10().ceil().max(lo + 1.0);
    let x = |v: f64| ml + (v.max(1.0).log10() - lo) / (hi - lo) * (w - ml - 20.0);
    let y = |q: f64| h - mb - q * (h - mb - 20.0);
    let colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{ml}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{ml}\" y1=\"20\" x2=\"{ml}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - mb,
        w - 20.0,
        h - mb,
        h - mb
    );
    let mut e = lo;
    while e <= hi {
        let px = x(10f64.powf(e));
        let _ =
            writeln!(s, "<text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", h - mb + 16.0, 10f64.powf(e));
        e += 1.0;
    }
    for q in [0.0, 0.5, 0.95, 1.0] {
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{q}</text>", ml - 6.0, y(q) + 4.0);
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">end-to-end latency, ms (log), successful requests; y: share of all requests</text>",
        w / 2.0,
        h - 6.0
    );
    for (k, o) in outs.iter().enumerate() {
        let n = o.requests().max(1) as f64;
        let pts: Vec<String> = o
            .e2e_sorted
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(*v), y((i + 1) as f64 / n)))
            .collect();
        let c = colors[k % colors.len()];
        let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>", pts.join(" "));
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            ml + 10.0,
            30.0 + 16.0 * k as f64,
            o.policy.title()
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A hand-written SVG: every GPU's sampled utilisation over time, one panel per policy (same
/// axes), with the spread of the per-GPU means in each panel's title.
pub fn util_svg(outs: &[Outcome]) -> String {
    let (pw, ph, ml, mt, gap) = (640.0, 150.0, 50.0, 30.0, 40.0);
    let w = ml + pw + 170.0;
    let h = mt + outs.len() as f64 * (ph + gap) + 20.0;
    let t_max = outs.iter().filter_map(|o| o.util_series.last().map(|r| r.0)).fold(1.0, f64::max);
    let colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{ml}\" y=\"18\">GPU utilisation over time (sampled every 250 ms), per policy; x: seconds of replay</text>\n"
    );
    for (k, o) in outs.iter().enumerate() {
        let top = mt + k as f64 * (ph + gap) + 16.0;
        let x = |t: f64| ml + t / t_max * pw;
        let y = |u: f64| top + ph - u.clamp(0.0, 1.0) * ph;
        let _ = writeln!(
            s,
            "<text x=\"{ml}\" y=\"{:.1}\" font-weight=\"bold\">{}: mean {:.0} %, spread of the per-GPU means {:.0} points \
             (dashed: last arrival)</text>",
            top - 4.0,
            o.policy.title(),
            o.util_mean() * 100.0,
            o.util_spread() * 100.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{top:.1}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>",
            x(o.window_s.min(t_max)),
            top + ph
        );
        let _ = writeln!(
            s,
            "<rect x=\"{ml}\" y=\"{top:.1}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        );
        for u in [0.0, 0.5, 1.0] {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text>",
                ml - 4.0,
                y(u) + 4.0,
                u * 100.0
            );
        }
        let mut t = 0.0;
        let step = (t_max / 6.0).max(1.0).round();
        while t <= t_max {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0}</text>",
                x(t),
                top + ph + 14.0
            );
            t += step;
        }
        for (g, gpu) in o.gpus.iter().enumerate() {
            let pts: Vec<String> = o
                .util_series
                .iter()
                .filter_map(|(t, row)| {
                    row.get(g).filter(|u| u.is_finite()).map(|u| format!("{:.1},{:.1}", x(*t), y(*u)))
                })
                .collect();
            let c = colors[g % colors.len()];
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.2\" points=\"{}\"/>",
                pts.join(" ")
            );
            if k == 0 {
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{} {}</text>",
                    ml + pw + 10.0,
                    top + 12.0 + 14.0 * g as f64,
                    gpu.host(),
                    gpu.profile
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
