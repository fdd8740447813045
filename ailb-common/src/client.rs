//! The client side of the socket ABI (feature `client`): the Rust twin of `docs/client/ailb.h`.
//!
//! A client tags a TCP socket with `setsockopt(SOL_AILB, ..)` BEFORE `connect()` to a model's
//! VIP; ailb's `cgroup/setsockopt` program stores the tags and `cgroup/connect4` picks the
//! backend at connect time, rewriting the destination. The backend the kernel chose is the
//! socket's peer address after connect (`getpeername`).
//!
//! ```no_run
//! use std::net::SocketAddrV4;
//! use std::time::Duration;
//! use ailb_common::client::{self, Tagging, Tags};
//!
//! let vip: SocketAddrV4 = "127.77.0.1:8000".parse()?;
//! let tags = Tags::new().conversation("conversation-42").required_memory_mb(2048);
//! let (stream, outcome) = client::connect(vip, &tags, Some(Duration::from_secs(5)))?;
//! if outcome.tagging == Tagging::NoBalancer {
//!     println!("ailb is not loaded here; connected directly to {}", outcome.backend);
//! }
//! # drop(stream);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `ENOPROTOOPT` from the first option means ailb is not loaded for the socket's cgroup (the
//! kernel does not know the level): that is [`Tagging::NoBalancer`], not an error, and the
//! connect goes where it is addressed. Bad lengths are refused here, before any system call,
//! with the field named ([`ClientError::Length`]); the kernel would answer `EINVAL`.
//!
//! For finer control: [`Socket::new`], the one-option calls ([`tag_conversation`],
//! [`tag_required_memory_mb`], [`tag_model`], [`tag_prefix`]) or [`tag`], then [`Socket::connect`].
//! [`raw`] sends unchecked options, for tests of the kernel's own input checks.
//!
//! Every `unsafe` block of the client is in [`raw`].

use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use crate::abi::{
    AILB_CONVERSATION, AILB_IDLE, AILB_MODEL, AILB_PREFIX, AILB_PREFIX_ON_REQUEST, AILB_REQUIRED_MEMORY_MB,
    MAX_CONVERSATION_LEN, MAX_MODEL_NAME_LEN,
};
use crate::prefix::PREFIX_KEYS_MAX;

/// Bytes of a rejected value shown in [`ClientError::Length`]'s message.
const SHOWN_BYTES: usize = 32;

/// One ABI option, named as the field of [`Tags`] that sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Conversation,
    RequiredMemoryMb,
    Model,
    /// The prompt's prefix keys ([`crate::prefix::sent`]).
    Prefix,
    /// The prompt's prefix keys withheld until the kernel asks for them.
    PrefixOnRequest,
    /// Not a tag: the idle/busy mark of a connected socket ([`mark_idle`]).
    Idle,
}

impl Field {
    /// The option name (`setsockopt`'s `optname` at level [`crate::abi::SOL_AILB`]).
    pub const fn optname(self) -> i32 {
        match self {
            Field::Conversation => AILB_CONVERSATION,
            Field::RequiredMemoryMb => AILB_REQUIRED_MEMORY_MB,
            Field::Model => AILB_MODEL,
            Field::Prefix => AILB_PREFIX,
            Field::PrefixOnRequest => AILB_PREFIX_ON_REQUEST,
            Field::Idle => AILB_IDLE,
        }
    }

    /// The option's name in `ailb.h`.
    pub const fn option_name(self) -> &'static str {
        match self {
            Field::Conversation => "AILB_CONVERSATION",
            Field::RequiredMemoryMb => "AILB_REQUIRED_MEMORY_MB",
            Field::Model => "AILB_MODEL",
            Field::Prefix => "AILB_PREFIX",
            Field::PrefixOnRequest => "AILB_PREFIX_ON_REQUEST",
            Field::Idle => "AILB_IDLE",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Conversation => "conversation",
            Field::RequiredMemoryMb => "required_memory_mb",
            Field::Model => "model",
            Field::Prefix => "prefix",
            Field::PrefixOnRequest => "prefix_on_request",
            Field::Idle => "idle",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A conversation id or model name of a length the kernel refuses (`EINVAL`).
    #[error("tag `{field}`: invalid value \"{shown}\" ({len} bytes): must be 1..={max} bytes")]
    Length {
        field: Field,
        /// The value's first bytes, escaped.
        shown: String,
        len: usize,
        max: usize,
    },
    /// Prefix keys the kernel refuses (`EINVAL`): none, more than it takes, or a key of 0.
    #[error("tag `prefix`: invalid value ({count} keys, {zeros} of them 0): must be 1..={max} keys, none of them 0")]
    PrefixKeys { count: usize, zeros: usize, max: usize },
    #[error("connect timeout: invalid value 0 s: must be above zero (or none, to wait as long as the kernel does)")]
    ZeroTimeout,
    #[error("creating a TCP/IPv4 socket")]
    Socket {
        #[source]
        source: io::Error,
    },
    /// `setsockopt` failed with something other than `ENOPROTOOPT`.
    #[error("setsockopt(SOL_AILB, {}) for tag `{field}`", field.option_name())]
    SetOption {
        field: Field,
        #[source]
        source: io::Error,
    },
    /// `connect()` failed: `ECONNREFUSED` from a VIP means no live backend of its model fits.
    #[error("connect to {vip}")]
    Connect {
        vip: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("reading the peer address (the backend) after connect to {vip}")]
    PeerAddr {
        vip: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("the peer address {peer} after connect to {vip} is not IPv4")]
    PeerNotIpv4 { vip: SocketAddrV4, peer: SocketAddr },
}

impl ClientError {
    /// The errno of a failed system call (`ETIMEDOUT` for a connect that ran past its
    /// timeout), `None` for errors found before any call.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            ClientError::Socket { source }
            | ClientError::SetOption { source, .. }
            | ClientError::Connect { source, .. }
            | ClientError::PeerAddr { source, .. } => {
                source.raw_os_error().or((source.kind() == io::ErrorKind::TimedOut).then_some(libc::ETIMEDOUT))
            }
            ClientError::Length { .. }
            | ClientError::PrefixKeys { .. }
            | ClientError::ZeroTimeout
            | ClientError::PeerNotIpv4 { .. } => None,
        }
    }

    /// `ENOKEY` from `connect()`: the socket withheld its prefix keys ([`Tags::prefix_on_request`])
    /// and the pick needs them; connect again on a fresh socket with them.
    pub fn keys_wanted(&self) -> bool {
        matches!(self, ClientError::Connect { .. }) && self.raw_os_error() == Some(libc::ENOKEY)
    }
}

/// What tagging a socket found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tagging {
    /// ailb took every option: the connect is routed with them.
    Accepted,
    /// `ENOPROTOOPT`: ailb is not loaded for this socket's cgroup (no balancer). The remaining
    /// options were not tried; the connect goes where it is addressed.
    NoBalancer,
    /// There was nothing to tag; whether ailb is loaded is not known.
    NoTags,
}

impl Tagging {
    pub fn is_accepted(self) -> bool {
        self == Tagging::Accepted
    }
}

/// The options to set before connect; each one is optional.
///
/// ```
/// use ailb_common::client::Tags;
/// let tags = Tags::new().conversation("conversation-42").model("llama-3-8b");
/// assert!(tags.validate().is_ok());
/// assert!(Tags::new().conversation("").validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tags<'a> {
    conversation: Option<&'a [u8]>,
    required_memory_mb: Option<u32>,
    model: Option<&'a [u8]>,
    prefix: Option<&'a [u64]>,
    prefix_on_request: bool,
}

impl<'a> Tags<'a> {
    /// No tags.
    pub const fn new() -> Self {
        Self { conversation: None, required_memory_mb: None, model: None, prefix: None, prefix_on_request: false }
    }

    /// `AILB_CONVERSATION`: 1..=[`MAX_CONVERSATION_LEN`] raw bytes. Connections of one
    /// conversation go to the same backend while it can take them (affinity).
    pub fn conversation<T: AsRef<[u8]> + ?Sized>(mut self, id: &'a T) -> Self {
        self.conversation = Some(id.as_ref());
        self
    }

    /// `AILB_REQUIRED_MEMORY_MB`: the GPU memory (MB) this request needs; 0 fits every backend.
    pub const fn required_memory_mb(mut self, mb: u32) -> Self {
        self.required_memory_mb = Some(mb);
        self
    }

    /// `AILB_MODEL`: the model name, 1..=[`MAX_MODEL_NAME_LEN`] bytes, for a VIP shared by
    /// several models.
    pub fn model<T: AsRef<[u8]> + ?Sized>(mut self, name: &'a T) -> Self {
        self.model = Some(name.as_ref());
        self
    }

    /// `AILB_PREFIX`: the prompt's prefix keys in order, 1..=[`PREFIX_KEYS_MAX`] of them, none
    /// 0: the ones [`crate::prefix::sent`] chooses. A model with a prefix mode then prefers a
    /// backend that has the longest of these prefixes cached.
    pub const fn prefix(mut self, keys: &'a [u64]) -> Self {
        self.prefix = Some(keys);
        self
    }

    /// `AILB_PREFIX_ON_REQUEST`: the prompt's prefix keys are withheld until the kernel asks for
    /// them: the connect fails with `ENOKEY` ([`ClientError::keys_wanted`]) where the pick would
    /// have read them, and goes ahead, to the backend it would have got with them, where the
    /// conversation's affinity decides. For a client whose keys are costly to make (token-exact
    /// keys: the prompt tokenized) and which continues conversations.
    pub const fn prefix_on_request(mut self) -> Self {
        self.prefix_on_request = true;
        self
    }

    pub const fn is_empty(&self) -> bool {
        self.conversation.is_none()
            && self.required_memory_mb.is_none()
            && self.model.is_none()
            && self.prefix.is_none()
            && !self.prefix_on_request
    }

    /// Checks every length as the kernel will, so that a bad value never half-tags a socket.
    pub fn validate(&self) -> Result<(), ClientError> {
        if let Some(id) = self.conversation {
            check_len(Field::Conversation, id, MAX_CONVERSATION_LEN)?;
        }
        if let Some(name) = self.model {
            check_len(Field::Model, name, MAX_MODEL_NAME_LEN)?;
        }
        if let Some(keys) = self.prefix {
            check_keys(keys)?;
        }
        Ok(())
    }
}

fn check_keys(keys: &[u64]) -> Result<(), ClientError> {
    let zeros = keys.iter().filter(|&&k| k == 0).count();
    if (1..=PREFIX_KEYS_MAX).contains(&keys.len()) && zeros == 0 {
        return Ok(());
    }
    Err(ClientError::PrefixKeys { count: keys.len(), zeros, max: PREFIX_KEYS_MAX })
}

/// The option's bytes: each key native-endian, in order.
fn key_bytes(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_ne_bytes()).collect()
}

fn check_len(field: Field, value: &[u8], max: usize) -> Result<(), ClientError> {
    if (1..=max).contains(&value.len()) {
        return Ok(());
    }
    let mut shown = value[..value.len().min(SHOWN_BYTES)].escape_ascii().to_string();
    if value.len() > SHOWN_BYTES {
        shown.push_str("...");
    }
    Err(ClientError::Length { field, shown, len: value.len(), max })
}

/// One option; `ENOPROTOOPT` is [`Tagging::NoBalancer`].
fn set(fd: BorrowedFd<'_>, field: Field, value: &[u8]) -> Result<Tagging, ClientError> {
    match raw::setsockopt(fd, crate::abi::SOL_AILB, field.optname(), value) {
        Ok(()) => Ok(Tagging::Accepted),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(Tagging::NoBalancer),
        Err(source) => Err(ClientError::SetOption { field, source }),
    }
}

/// `ailb_tag_conversation`: tags `fd` with a conversation id of 1..=[`MAX_CONVERSATION_LEN`] bytes.
pub fn tag_conversation(fd: impl AsFd, id: &[u8]) -> Result<Tagging, ClientError> {
    check_len(Field::Conversation, id, MAX_CONVERSATION_LEN)?;
    set(fd.as_fd(), Field::Conversation, id)
}

/// `ailb_require_memory_mb`: tags `fd` with the GPU memory (MB) the request needs.
pub fn tag_required_memory_mb(fd: impl AsFd, mb: u32) -> Result<Tagging, ClientError> {
    set(fd.as_fd(), Field::RequiredMemoryMb, &mb.to_ne_bytes())
}

/// `ailb_tag_model`: tags `fd` with a model name of 1..=[`MAX_MODEL_NAME_LEN`] bytes.
pub fn tag_model(fd: impl AsFd, name: &[u8]) -> Result<Tagging, ClientError> {
    check_len(Field::Model, name, MAX_MODEL_NAME_LEN)?;
    set(fd.as_fd(), Field::Model, name)
}

/// `ailb_tag_prefix`: tags `fd` with a prompt's prefix keys (1..=[`PREFIX_KEYS_MAX`], none 0).
pub fn tag_prefix(fd: impl AsFd, keys: &[u64]) -> Result<Tagging, ClientError> {
    check_keys(keys)?;
    set(fd.as_fd(), Field::Prefix, &key_bytes(keys))
}

/// `ailb_prefix_on_request`: before connect, `true` withholds the prompt's prefix keys until the
/// kernel asks for them ([`Tags::prefix_on_request`]); `false` turns that off.
pub fn tag_prefix_on_request(fd: impl AsFd, on: bool) -> Result<Tagging, ClientError> {
    set(fd.as_fd(), Field::PrefixOnRequest, &u32::from(on).to_ne_bytes())
}

/// `ailb_mark_idle`: marks a connected socket idle (`true`: kept open between requests, not
/// counted in flight at its backend) or busy again (`false`: a request is about to go on it).
/// A connection kept for reuse must be marked idle while it waits, or the kernel's load bound
/// would count it as a request.
pub fn mark_idle(fd: impl AsFd, idle: bool) -> Result<Tagging, ClientError> {
    set(fd.as_fd(), Field::Idle, &u32::from(idle).to_ne_bytes())
}

/// Sets every option of `tags` on `fd` (conversation, memory, model, prefix, prefix on request),
/// after checking them all. Stops at the first `ENOPROTOOPT` ([`Tagging::NoBalancer`]); the
/// first other failure is an error, and the options before it stay set.
pub fn tag(fd: impl AsFd, tags: &Tags<'_>) -> Result<Tagging, ClientError> {
    tags.validate()?;
    let fd = fd.as_fd();
    let mem = tags.required_memory_mb.map(u32::to_ne_bytes);
    let keys = tags.prefix.map(key_bytes);
    let on_request = 1u32.to_ne_bytes();
    let options = [
        (Field::Conversation, tags.conversation),
        (Field::RequiredMemoryMb, mem.as_ref().map(|b| &b[..])),
        (Field::Model, tags.model),
        (Field::Prefix, keys.as_deref()),
        (Field::PrefixOnRequest, tags.prefix_on_request.then_some(&on_request[..])),
    ];
    let mut tagging = Tagging::NoTags;
    for (field, value) in options {
        let Some(value) = value else { continue };
        tagging = set(fd, field, value)?;
        if tagging == Tagging::NoBalancer {
            break;
        }
    }
    Ok(tagging)
}

/// How a [`connect`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub tagging: Tagging,
    /// The peer address after connect: the backend ailb picked (the VIP itself without ailb,
    /// or when the VIP is not ailb's).
    pub backend: SocketAddrV4,
}

/// A TCP/IPv4 socket (close-on-exec) not connected yet: tag it, then [`Socket::connect`].
#[derive(Debug)]
pub struct Socket(socket2::Socket);

impl Socket {
    pub fn new() -> Result<Self, ClientError> {
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
            .map(Self)
            .map_err(|source| ClientError::Socket { source })
    }

    /// [`tag`] on this socket.
    pub fn tag(&self, tags: &Tags<'_>) -> Result<Tagging, ClientError> {
        tag(self, tags)
    }

    /// Connects to `vip` (waiting at most `timeout`, if given) and returns the stream with
    /// the backend the kernel chose (the peer address).
    pub fn connect(
        self,
        vip: SocketAddrV4,
        timeout: Option<Duration>,
    ) -> Result<(TcpStream, SocketAddrV4), ClientError> {
        let addr = socket2::SockAddr::from(vip);
        let res = match timeout {
            Some(t) if t.is_zero() => return Err(ClientError::ZeroTimeout),
            Some(t) => self.0.connect_timeout(&addr, t),
            None => self.0.connect(&addr),
        };
        res.map_err(|source| ClientError::Connect { vip, source })?;
        let stream = TcpStream::from(self.0);
        match stream.peer_addr() {
            Ok(SocketAddr::V4(backend)) => Ok((stream, backend)),
            Ok(peer) => Err(ClientError::PeerNotIpv4 { vip, peer }),
            Err(source) => Err(ClientError::PeerAddr { vip, source }),
        }
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A new socket tagged with `tags`, connected to `vip` (waiting at most `timeout`, if given).
/// Bad tags are refused before the socket is created.
pub fn connect(
    vip: SocketAddrV4,
    tags: &Tags<'_>,
    timeout: Option<Duration>,
) -> Result<(TcpStream, Outcome), ClientError> {
    tags.validate()?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(ClientError::ZeroTimeout);
    }
    let socket = Socket::new()?;
    let tagging = socket.tag(tags)?;
    let (stream, backend) = socket.connect(vip, timeout)?;
    Ok((stream, Outcome { tagging, backend }))
}

/// Unchecked `setsockopt(2)`, for tests of the kernel's input checks (lengths the ABI refuses,
/// unknown option names, a null buffer) and for options outside the ABI. Tagging goes through
/// [`tag`] and the `tag_*` functions, which check lengths first.
pub mod raw {
    #![allow(unsafe_code)]

    use std::io;
    use std::os::fd::{AsFd, AsRawFd};

    /// `setsockopt(fd, level, optname, value.as_ptr(), value.len())`, any level and length.
    pub fn setsockopt(fd: impl AsFd, level: i32, optname: i32, value: &[u8]) -> io::Result<()> {
        let len = socklen(value.len())?;
        // SAFETY: `value` points to `len` readable bytes that outlive the call; the kernel
        // only reads them. `fd` is borrowed, so it stays open during the call.
        let rc = unsafe { libc::setsockopt(fd.as_fd().as_raw_fd(), level, optname, value.as_ptr().cast(), len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `setsockopt(fd, level, optname, NULL, len)`: with a nonzero `len` the kernel's copy of
    /// the buffer fails (`EFAULT`) before any cgroup program sees the option.
    pub fn setsockopt_null(fd: impl AsFd, level: i32, optname: i32, len: usize) -> io::Result<()> {
        let len = socklen(len)?;
        // SAFETY: a null buffer is never dereferenced in this process; the kernel checks
        // user pointers and fails the copy with EFAULT. `fd` is borrowed for the call.
        let rc = unsafe { libc::setsockopt(fd.as_fd().as_raw_fd(), level, optname, std::ptr::null(), len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn socklen(len: usize) -> io::Result<libc::socklen_t> {
        libc::socklen_t::try_from(len).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("option length {len} does not fit a socklen_t"))
        })
    }
}

#[cfg(test)]
mod tests;
