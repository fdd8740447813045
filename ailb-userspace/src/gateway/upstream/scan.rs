//! An upstream's response head scanned in place: the status line, then each header's name and
//! value, found with `memchr`.
//!
//! Why not `httparse` here: its general parse (every byte of the head classified through its
//! tables, a slot array of 100 headers set up for each call) was about two thirds of the
//! instructions the front door spent on a response head. A response head needs less: the
//! version and the status, and each header's name (a token) and value, which the caller
//! checks byte by byte anyway as it copies it. What is accepted is what `httparse` accepted
//! by default: `\r\n` or `\n` line ends, empty lines before the status line skipped, a status
//! line with or without a reason, no space before a header's colon, no folded lines, at most
//! [`MAX_HEADERS`] headers; spaces and tabs around a value are not part of it.

use memchr::memchr;

use crate::gateway::http::MAX_HEADERS;

/// What is wrong with a response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("a malformed response head (a status line that is not `HTTP/1.x NNN reason`)")]
    StatusLine,
    #[error("a response head without a valid status")]
    Status,
    #[error("a malformed response head (a header line without a colon)")]
    NoColon,
    #[error("a malformed response head (a header name that is not a token)")]
    HeaderName,
    #[error("a malformed response head (more than {MAX_HEADERS} headers)")]
    TooManyHeaders,
}

/// A whole response head at the start of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Its length, the blank line included.
    pub len: usize,
    /// The HTTP/1 minor version (0 or 1).
    pub minor: u8,
    /// The status, 100 to 999.
    pub code: u16,
    /// How many of the slots hold its headers.
    pub headers: usize,
}

/// A header's name and value, borrowed from the buffer.
pub type Slot<'a> = (&'a [u8], &'a [u8]);

/// Scans the head at the start of `buf` into `slots` (`Ok(None)`: not whole yet); a head
/// with more headers than `slots` holds is [`Malformed::TooManyHeaders`] (the caller may
/// scan it again into more, up to [`MAX_HEADERS`]).
pub fn scan<'a>(buf: &'a [u8], slots: &mut [Slot<'a>]) -> Result<Option<Scanned>, Malformed> {
    let mut at = 0;
    let status = loop {
        let Some((line, next)) = line(buf, at) else {
            // A buffer that cannot start a status line fails now, not at the length limit.
            let rest = &buf[at..];
            let n = rest.len().min(PREFIX.len());
            return if rest[..n] == PREFIX[..n] || rest.iter().all(|b| matches!(b, b'\r')) {
                Ok(None)
            } else {
                Err(Malformed::StatusLine)
            };
        };
        at = next;
        if !line.is_empty() {
            break line;
        }
    };
    let (minor, code) = status_line(status)?;
    let mut headers = 0;
    loop {
        let Some((line, next)) = line(buf, at) else { return Ok(None) };
        at = next;
        if line.is_empty() {
            return Ok(Some(Scanned { len: at, minor, code, headers }));
        }
        let colon = memchr(b':', line).ok_or(Malformed::NoColon)?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| TOKEN[usize::from(b)]) {
            return Err(Malformed::HeaderName);
        }
        let slot = slots.get_mut(headers).ok_or(Malformed::TooManyHeaders)?;
        *slot = (name, trim(&line[colon + 1..]));
        headers += 1;
    }
}

const PREFIX: &[u8] = b"HTTP/1.";

/// The line that starts at `at`, without its end, and where the next starts.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = &buf[at..];
    let nl = memchr(b'\n', rest)?;
    let line = &rest[..nl];
    Some((line.strip_suffix(b"\r").unwrap_or(line), at + nl + 1))
}

/// `HTTP/1.x NNN[ reason]`: the minor version and the status.
fn status_line(line: &[u8]) -> Result<(u8, u16), Malformed> {
    let (Some(version), Some(rest)) = (line.get(..PREFIX.len() + 2), line.get(PREFIX.len() + 2..)) else {
        return Err(Malformed::StatusLine);
    };
    let minor = match version {
        [p @ .., b'0', b' '] if p == PREFIX => 0,
        [p @ .., b'1', b' '] if p == PREFIX => 1,
        _ => return Err(Malformed::StatusLine),
    };
    let (digits, reason) = rest.split_at(rest.len().min(3));
    let [a @ b'1'..=b'9', b @ b'0'..=b'9', c @ b'0'..=b'9'] = *digits else { return Err(Malformed::Status) };
    let reason_ok = match reason {
        [] => true,
        [b' ', text @ ..] => text.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f)),
        _ => false,
    };
    if !reason_ok {
        return Err(Malformed::StatusLine);
    }
    Ok((minor, u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0')))
}

/// `v` without the spaces and tabs around it.
fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |i| i + 1);
    &v[start..end]
}

/// The bytes of a token (RFC 9110, `tchar`).
const TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(c, b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-')
            || matches!(c, b'.' | b'^' | b'_' | b'`' | b'|' | b'~');
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests;
