//! Helpers shared by the fuzz targets in `fuzz_targets/`: the checks a target makes besides
//! "no panic" that more than one target needs.

pub mod tc;

use ailb_userspace::fuzzing::Sample;

/// Equal as the parsers mean it: NaN equals NaN, and a float printed and read back by
/// `serde_json` may land one unit in the last place away.
pub fn same_f64(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= f64::EPSILON * a.abs().max(b.abs())
}

/// Samples written back as exposition text, one line each, so that reading them again must
/// give the same samples.
pub fn exposition_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for s in samples {
        out.push_str(&s.name);
        if !s.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in s.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                out.push_str(&format!("{k}=\"{v}\""));
            }
            out.push('}');
        }
        let value = match s.value {
            v if v.is_nan() => "NaN".to_string(),
            f64::INFINITY => "+Inf".to_string(),
            f64::NEG_INFINITY => "-Inf".to_string(),
            // `{:e}` is the shortest form that reads back exactly (and never has a letter other
            // than `e`, which the parser requires).
            v => format!("{v:e}"),
        };
        out.push(' ');
        out.push_str(&value);
        out.push('\n');
    }
    out
}

/// Whether two sample lists are the same, NaN values included.
pub fn same_samples(a: &[Sample], b: &[Sample]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.name == y.name && x.labels == y.labels && same_f64(x.value, y.value))
}
