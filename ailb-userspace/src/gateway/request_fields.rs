//! The first parse of a request body: a JSON object whose fields the routing rules read
//! ([`ROUTING_FIELDS`]) are kept, and every other value is checked by the same parser
//! (strings and their escapes, numbers, nesting depth) but kept nowhere, so a body is accepted
//! or refused exactly as a parse into a `Value` would, at a fraction of its allocations.
//!
//! The chat messages are the bulk of a body that routing reads: they are kept as borrowed
//! text ([`Message`]: the role and the content's text, slices of the body unless the JSON
//! escaped them), not as `Value`s, so a message costs no allocation of its own beyond its
//! place in one `Vec`. The scalar fields whose wrong values an error quotes (`model`,
//! `max_tokens`, ...) are kept as `Value`s (numbers and short strings).

use std::borrow::Cow;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::Deserialize;
use serde_json::Value;

/// The top-level fields of a body that the rules read. Every other field is parsed and checked
/// as JSON like these, but not kept: a request's `tools`, `response_format` or sampling
/// settings cost no allocation here, and only the model server reads them.
pub(super) const ROUTING_FIELDS: [&str; 13] = [
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "prompt_cache_key",
    "instructions",
    "system",
    "previous_response_id",
    "max_output_tokens",
    "priority",
    "service_tier",
];

/// A body: its routing fields when it is an object, else what it is.
#[expect(
    clippy::large_enum_variant,
    reason = "made once per request and taken apart at once; a Box would add an allocation to every request"
)]
pub(super) enum Top<'a> {
    Object(Fields<'a>),
    Other(&'static str),
}

/// The routing fields of a body object (a repeated field keeps its last value, as a parse into
/// a `Value` does).
#[derive(Debug, Default, PartialEq)]
pub struct Fields<'a> {
    pub model: Option<StrOr<'a>>,
    pub messages: Option<Messages<'a>>,
    pub prompt: Option<Value>,
    pub input: Option<Value>,
    pub max_tokens: Option<Value>,
    pub max_completion_tokens: Option<Value>,
    /// Its text when it is a string.
    pub prompt_cache_key: Option<Text<'a>>,
    /// The Responses API's system text.
    pub instructions: Option<StrOr<'a>>,
    /// The Anthropic Messages API's system prompt: a string or an array of text blocks.
    pub system: Option<Value>,
    /// The Responses API's stored response this request continues.
    pub previous_response_id: Option<StrOr<'a>>,
    /// The Responses API's `max_tokens`.
    pub max_output_tokens: Option<Value>,
    /// The request's priority (read only when tenants are configured).
    pub priority: Option<Value>,
    /// OpenAI's `service_tier` (`"flex"`, `"default"`, `"priority"`, ...).
    pub service_tier: Option<Value>,
}

/// A value that is read as text when it is a string, and quoted in an error when it is not.
#[derive(Debug, PartialEq)]
pub enum StrOr<'a> {
    Str(Cow<'a, str>),
    Other(Value),
}

/// A value's text when it is a string (`None` for any other value, which is checked and skipped).
#[derive(Debug, Default, PartialEq)]
pub struct Text<'a>(pub Option<Cow<'a, str>>);

/// The `messages` field.
#[derive(Debug, Default, PartialEq)]
pub enum Messages<'a> {
    List(Vec<Message<'a>>),
    /// Not an array.
    #[default]
    NotList,
}

/// One chat message as the rules read it: a message that is not an object has neither.
#[derive(Debug, Default, PartialEq)]
pub struct Message<'a> {
    /// `role` when it is a string.
    pub role: Option<Cow<'a, str>>,
    pub content: Content<'a>,
}

/// A message's `content`.
#[derive(Debug, Default, PartialEq)]
pub enum Content<'a> {
    Text(Cow<'a, str>),
    /// An array: the `text` of each part that has a string one, in order.
    Parts(Vec<Cow<'a, str>>),
    /// Absent, or neither a string nor an array.
    #[default]
    None,
}

impl Content<'_> {
    /// Bytes of its text: a string, or its parts' texts joined by newlines.
    pub fn text_len(&self) -> usize {
        match self {
            Content::Text(s) => s.len(),
            Content::Parts(p) => p.iter().map(|t| t.len()).sum::<usize>() + p.len().saturating_sub(1),
            Content::None => 0,
        }
    }

    /// Appends its text (as [`Content::text_len`] counts it) to `out`.
    pub fn write_text(&self, out: &mut Vec<u8>) {
        match self {
            Content::Text(s) => out.extend_from_slice(s.as_bytes()),
            Content::Parts(parts) => {
                for (i, t) in parts.iter().enumerate() {
                    if i > 0 {
                        out.push(b'\n');
                    }
                    out.extend_from_slice(t.as_bytes());
                }
            }
            Content::None => {}
        }
    }
}

/// The text of a JSON content value kept as a `Value` (a Responses input item's `content`): a
/// string, or the `text` of each part that has one, joined with newlines as a chat message's
/// parts are ([`Content::write_text`]); `None` for anything else, or parts without text.
pub(super) fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts.iter().filter_map(|p| p.get("text")?.as_str()).collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

/// Visitor methods for the JSON kinds a type does not keep: each value is checked by the parser
/// (a map's or an array's members through [`Skip`]) and becomes the type's default.
macro_rules! skip_kinds {
    (scalars) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
    (str) => {
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
    (map) => {
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<Skip, Skip>()?.is_some() {}
            Ok(Default::default())
        }
    };
    (seq) => {
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Skip::seq(seq).map(|_| Default::default())
        }
    };
}

impl<'de: 'a, 'a> Deserialize<'de> for Top<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> serde::de::Visitor<'de> for TopVisitor {
    type Value = Top<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        let mut f = Fields::default();
        while let Some(Field(name)) = map.next_key()? {
            match name {
                Some("model") => f.model = Some(map.next_value()?),
                Some("messages") => f.messages = Some(map.next_value()?),
                Some("prompt") => f.prompt = Some(map.next_value()?),
                Some("input") => f.input = Some(map.next_value()?),
                Some("max_tokens") => f.max_tokens = Some(map.next_value()?),
                Some("max_completion_tokens") => f.max_completion_tokens = Some(map.next_value()?),
                Some("prompt_cache_key") => f.prompt_cache_key = Some(map.next_value()?),
                Some("instructions") => f.instructions = Some(map.next_value()?),
                Some("system") => f.system = Some(map.next_value()?),
                Some("previous_response_id") => f.previous_response_id = Some(map.next_value()?),
                Some("max_output_tokens") => f.max_output_tokens = Some(map.next_value()?),
                Some("priority") => f.priority = Some(map.next_value()?),
                Some("service_tier") => f.service_tier = Some(map.next_value()?),
                _ => map.next_value::<Skip>().map(drop)?,
            }
        }
        Ok(Top::Object(f))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Top<'de>, A::Error> {
        Skip::seq(seq).map(|_| Top::Other("an array"))
    }

    fn visit_unit<E>(self) -> Result<Top<'de>, E> {
        Ok(Top::Other("null"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Top<'de>, E> {
        Ok(Top::Other("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Top<'de>, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Top<'de>, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Top<'de>, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Top<'de>, E> {
        Ok(Top::Other("a string"))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrOr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = StrOr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Str(Cow::Owned(v.to_string())))
            }
            fn visit_unit<E>(self) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Other(Value::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Other(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Other(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Other(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<StrOr<'de>, E> {
                Ok(StrOr::Other(v.into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<StrOr<'de>, A::Error> {
                Value::deserialize(MapAccessDeserializer::new(map)).map(StrOr::Other)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<StrOr<'de>, A::Error> {
                Value::deserialize(SeqAccessDeserializer::new(seq)).map(StrOr::Other)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            skip_kinds!(scalars);
            skip_kinds!(map);
            skip_kinds!(seq);
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Messages<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Messages<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Messages<'de>, A::Error> {
                let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
                while let Some(m) = seq.next_element()? {
                    list.push(m);
                }
                Ok(Messages::List(list))
            }
            skip_kinds!(scalars);
            skip_kinds!(str);
            skip_kinds!(map);
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Message<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Message<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Message<'de>, A::Error> {
                let mut m = Message::default();
                while let Some(Field(name)) = map.next_key()? {
                    match name {
                        Some("role") => m.role = map.next_value::<Text>()?.0,
                        Some("content") => m.content = map.next_value()?,
                        _ => map.next_value::<Skip>().map(drop)?,
                    }
                }
                Ok(m)
            }
            skip_kinds!(scalars);
            skip_kinds!(str);
            skip_kinds!(seq);
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Content<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Owned(v.to_string())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
                let mut texts = Vec::new();
                while let Some(Part(t)) = seq.next_element()? {
                    texts.extend(t);
                }
                Ok(Content::Parts(texts))
            }
            skip_kinds!(scalars);
            skip_kinds!(map);
        }
        d.deserialize_any(V)
    }
}

/// A content part: its `text` when it is an object with a string one.
#[derive(Default)]
struct Part<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Part<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Part<'de>, A::Error> {
                let mut text = None;
                while let Some(Field(name)) = map.next_key()? {
                    match name {
                        Some("text") => text = map.next_value::<Text>()?.0,
                        _ => map.next_value::<Skip>().map(drop)?,
                    }
                }
                Ok(Part(text))
            }
            skip_kinds!(scalars);
            skip_kinds!(str);
            skip_kinds!(seq);
        }
        d.deserialize_any(V)
    }
}

/// A key: which of the [`ROUTING_FIELDS`] or of the message keys the rules read it is, if
/// any (compared without a copy).
struct Field(Option<&'static str>);

/// The keys of a message and of a content part that the rules read.
const MESSAGE_FIELDS: [&str; 3] = ["role", "content", "text"];

impl<'de> serde::Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<Field, E> {
                Ok(Field(ROUTING_FIELDS.iter().chain(&MESSAGE_FIELDS).copied().find(|f| *f == v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Any JSON value, checked by the same parser as a `Value` (strings, escapes, numbers, depth)
/// but kept nowhere.
struct Skip;

impl Skip {
    fn seq<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
}

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Skip;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                Ok(Skip)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Skip, A::Error> {
                Skip::seq(seq)
            }
            fn visit_unit<E>(self) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
                Ok(Skip)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests;
