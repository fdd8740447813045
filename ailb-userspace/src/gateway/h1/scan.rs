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
mod tests {
    use super::*;

    type Headers = Vec<(String, String)>;

    fn run(head: &[u8]) -> Result<Option<(Scanned, Headers)>, Malformed> {
        let mut slots = [(&[][..], &[][..]); MAX_HEADERS];
        let scanned = scan(head, &mut slots)?;
        Ok(scanned.map(|s| {
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (s, slots[..s.headers].iter().map(|(n, v)| (text(n), text(v))).collect())
        }))
    }

    #[test]
    fn a_head_gives_its_version_status_headers_and_length() {
        let head = b"HTTP/1.1 201 Created\r\nContent-Length:  5 \r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\nhello";
        let (s, hs) = run(head).unwrap().unwrap();
        assert_eq!((s.len, s.minor, s.code, s.headers), (head.len() - 5, 1, 201, 3));
        assert_eq!(hs, [("Content-Length", "5"), ("X-Empty", ""), ("X-Tab", "v")].map(|(n, v)| (n.into(), v.into())));
        // Bare `\n` line ends, no reason, empty lines before the status line, HTTP/1.0.
        let (s, hs) = run(b"\r\n\nHTTP/1.0 404\nA: b\n\n").unwrap().unwrap();
        assert_eq!((s.len, s.minor, s.code), (22, 0, 404));
        assert_eq!(hs, [("A".to_string(), "b".to_string())]);
        let (s, _) = run(b"HTTP/1.1 200 \r\n\r\n").unwrap().unwrap();
        assert_eq!(s.code, 200);
    }

    #[test]
    fn an_unfinished_head_waits_for_more() {
        for part in [
            &b""[..],
            b"\r",
            b"\r\n",
            b"HT",
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 200 OK\r\nA: b\r\n",
        ] {
            assert_eq!(run(part), Ok(None), "{:?}", String::from_utf8_lossy(part));
        }
    }

    #[test]
    fn malformed_heads_are_refused_with_what_is_wrong() {
        let cases: [(&[u8], Malformed); 12] = [
            (b"SSH-2.0-OpenSSH", Malformed::StatusLine),
            (b"SSH-2.0-OpenSSH\r\n\r\n", Malformed::StatusLine),
            (b"HTTP/2 200 OK\r\n\r\n", Malformed::StatusLine),
            (b"HTTP/1.1  200 OK\r\n\r\n", Malformed::Status),
            (b"HTTP/1.1 20\r\n\r\n", Malformed::Status),
            (b"HTTP/1.1 099 Low\r\n\r\n", Malformed::Status),
            (b"HTTP/1.1 2000 OK\r\n\r\n", Malformed::StatusLine),
            (b"HTTP/1.1 200 O\x7fK\r\n\r\n", Malformed::StatusLine),
            (b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n", Malformed::NoColon),
            (b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n", Malformed::HeaderName),
            (b"HTTP/1.1 200 OK\r\nA: b\r\n folded: c\r\n\r\n", Malformed::HeaderName),
            (b"HTTP/1.1 200 OK\r\n: v\r\n\r\n", Malformed::HeaderName),
        ];
        for (head, want) in cases {
            assert_eq!(run(head), Err(want), "{:?}", String::from_utf8_lossy(head));
        }
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(run(many.as_bytes()), Err(Malformed::TooManyHeaders));
        let most = format!("HTTP/1.1 200 OK\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS));
        assert_eq!(run(most.as_bytes()).unwrap().unwrap().0.headers, MAX_HEADERS);
    }

    #[test]
    fn it_agrees_with_httparse_on_what_is_a_whole_head() {
        let heads: [&[u8]; 6] = [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nDate: x\r\n\r\n{}",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.0 500 Internal Server Error\r\nConnection: close\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: \xc3\xa9t\xc3\xa9\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: 2\r\n",
            b"\r\nHTTP/1.1 204 No Content\r\n\r\n",
        ];
        for head in heads {
            let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Response::new(&mut hs);
            let want = match r.parse(head).unwrap() {
                httparse::Status::Complete(n) => Some((n, r.version.unwrap(), r.code.unwrap(), r.headers.len())),
                httparse::Status::Partial => None,
            };
            let got = run(head).unwrap().map(|(s, _)| (s.len, s.minor, s.code, s.headers));
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(head));
        }
    }
}
