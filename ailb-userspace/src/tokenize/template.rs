//! A model's chat template rendered as transformers renders it for vLLM
//! (`apply_chat_template`): Jinja2 with `trim_blocks` and `lstrip_blocks`, loop controls,
//! Python's string and dict methods, `raise_exception`, `strftime_now`, and a `tojson` that
//! writes what Python's `json.dumps(ensure_ascii=False)` writes.
//!
//! Not supported: transformers' `{% generation %}` block (a template that uses it fails to
//! parse, with minijinja's error); `tojson`'s `separators` and `sort_keys`; and `tojson` writes
//! an object's keys sorted where Python keeps their order (templates that dump tools' JSON
//! schemas may then differ from the engine's text).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{syntax::SyntaxConfig, value::Kwargs, Environment, Error, ErrorKind, Value};

/// The template's name in the environment.
pub(super) const CHAT: &str = "chat";

/// An environment holding `source` as [`CHAT`].
pub(super) fn environment(source: String) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, format!("the chat template raised: {message}")))
    });
    env.add_function("strftime_now", |format: String| strftime_now(&format));
    env.add_filter("tojson", tojson);
    env.add_template_owned(CHAT, source)?;
    Ok(env)
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "` between items
/// without an indent; with one, items on their own lines.
fn tojson(value: Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: not JSON: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The engine's `strftime_now`: the current UTC time in a strftime format (`%Y %m %d %b %B %H
/// %M %S %%`, what chat templates use to date their system prompt).
fn strftime_now(format: &str) -> Result<String, Error> {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(format, secs)
}

pub(super) fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let name = MONTHS[(month - 1) as usize];
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", rem / 3_600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: format {format:?}: unsupported directive %{}", other.unwrap_or(' ')),
                ))
            }
        }
    }
    Ok(out)
}
