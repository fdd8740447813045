//! A strict parser of the Prometheus text exposition format (version 0.0.4), enough to read model
//! server gauges: `name{label="value",...} value [timestamp]`, `# HELP` / `# TYPE` and other
//! comments skipped. Strict on purpose: a body that is not exposition text (an HTML error page,
//! a truncated line) is an error, not an empty scrape.
//!
//! Not `prometheus-parse` 0.2: its sample regex (`\w+`) drops every name with a colon, which is
//! every vLLM and SGLang metric (`vllm:num_requests_running`), and it skips lines it cannot read,
//! so garbage parses as "no metrics".

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

/// Why a line is not exposition text (1-based line number).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParseError {
    pub(crate) line: usize,
    pub(crate) reason: String,
}

pub(crate) fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = parse_sample(line).map_err(|reason| ParseError { line: i + 1, reason })?;
        out.push(sample);
    }
    Ok(out)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err(format!("no metric name at {:?}", shorten(line)));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut fields = rest.split_ascii_whitespace();
    if !rest.starts_with([' ', '\t']) {
        return Err(format!("no space before the value of {name}"));
    }
    let value = fields.next().ok_or_else(|| format!("no value for {name}"))?;
    let value = parse_value(value).ok_or_else(|| format!("value {:?} of {name} is not a number", shorten(value)))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().map_err(|_| format!("timestamp {:?} of {name} is not an integer", shorten(ts)))?;
    }
    if fields.next().is_some() {
        return Err(format!("trailing text after the sample of {name}"));
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Parses `a="x",b="y"}` (the part after `{`), returns the text after `}`.
fn parse_labels<'a>(mut s: &'a str, labels: &mut Vec<(String, String)>) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok(after);
        }
        let key_end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
        let key = &s[..key_end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("bad label name at {:?}", shorten(s)));
        }
        s = s[key_end..].trim_start();
        s = s.strip_prefix('=').ok_or_else(|| format!("no '=' after label {key}"))?.trim_start();
        s = s.strip_prefix('"').ok_or_else(|| format!("label {key}: value not quoted"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {key}: unterminated value")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err(format!("label {key}: bad escape")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("label {key}: expected ',' or '}}'"));
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        // Rust also reads "inf" / "infinity" / "nan"; the format spells them only as above.
        _ if s.chars().any(|c| c.is_ascii_alphabetic() && c != 'e' && c != 'E') => None,
        _ => s.parse().ok(),
    }
}

fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests;
