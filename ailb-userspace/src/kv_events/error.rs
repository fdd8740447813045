//! The one error type of KV-event decoding and applying.

/// What was wrong with a KV-event message or batch. The batch it names is skipped whole; the
/// index and the batches before and after it are untouched.
#[derive(Debug, thiserror::Error)]
pub enum KvEventError {
    /// A publisher message is `[topic, seq, payload]`: three frames.
    #[error("kv event message: {count} frames, expected 3 (topic, sequence number, payload)")]
    Frames { count: usize },
    /// A replay answer ends with `[seq, payload]`, after at most a delimiter and a topic.
    #[error("kv event replay: {count} frames, expected 2 to 4 (delimiter, topic, sequence number, payload)")]
    ReplayFrames { count: usize },
    /// The sequence number frame is 8 bytes, big-endian.
    #[error("kv event message: sequence number frame of {len} bytes, expected 8")]
    Sequence { len: usize },
    /// The payload is not one msgpack value.
    #[error("kv event batch: not msgpack")]
    Msgpack(#[source] rmpv::decode::Error),
    /// Bytes follow the batch's msgpack value.
    #[error("kv event batch: {extra} bytes after the batch")]
    TrailingBytes { extra: usize },
    /// A field is missing or has a value of the wrong type or range.
    #[error("kv event batch: field `{field}`: {value}: {reason}")]
    Field { field: String, value: String, reason: &'static str },
    /// More places (medium, KV-cache group, locality, tier) than the index tracks per block.
    #[error("kv event batch: `{field}`: {value}: more than {max} places (media, KV-cache groups, localities, tiers)")]
    TooManyPlaces { field: String, value: String, max: usize },
}

impl KvEventError {
    /// A field's error; `value` is shortened to a readable length.
    pub(crate) fn field(field: impl Into<String>, value: impl std::fmt::Display, reason: &'static str) -> Self {
        const MAX: usize = 80;
        let mut value = value.to_string();
        if value.len() > MAX {
            let mut cut = MAX;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            value.push_str("...");
        }
        Self::Field { field: field.into(), value, reason }
    }
}
