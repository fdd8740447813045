//! The first parse of a request body: a JSON object whose fields the routing rules read
//! ([`ROUTING_FIELDS`]) are kept as `Value`s, and every other value is checked by the same
//! parser (strings and their escapes, numbers, nesting depth) but kept nowhere, so a body is
//! accepted or refused exactly as a parse into a `Value` would, at a fraction of its
//! allocations.

use serde_json::Value;

/// The top-level fields of a body that the rules read. Every other field is parsed and checked
/// as JSON like these, but not kept: a request's `tools`, `response_format` or sampling
/// settings cost no allocation here, and only the model server reads them.
pub(super) const ROUTING_FIELDS: [&str; 7] =
    ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "prompt_cache_key"];

/// A body: its routing fields when it is an object, else what it is.
pub(super) enum Top {
    Object(serde_json::Map<String, Value>),
    Other(&'static str),
}

impl<'de> serde::Deserialize<'de> for Top {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> serde::de::Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut fields = serde_json::Map::new();
        while let Some(Field(name)) = map.next_key()? {
            match name {
                // A repeated field keeps its last value, as a parse into a `Value` does.
                Some(name) => drop(fields.insert(name.to_string(), map.next_value()?)),
                None => map.next_value::<Skip>().map(drop)?,
            }
        }
        Ok(Top::Object(fields))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
        Skip::seq(seq).map(|_| Top::Other("an array"))
    }

    fn visit_unit<E>(self) -> Result<Top, E> {
        Ok(Top::Other("null"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Top, E> {
        Ok(Top::Other("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Top, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Top, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Top, E> {
        Ok(Top::Other("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Top, E> {
        Ok(Top::Other("a string"))
    }
}

/// A top-level key: which of the [`ROUTING_FIELDS`] it is, if any (compared without a copy).
struct Field(Option<&'static str>);

impl<'de> serde::Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<Field, E> {
                Ok(Field(ROUTING_FIELDS.iter().copied().find(|f| *f == v)))
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
mod tests {
    use super::*;

    /// What a parse into a `Value` gives, cut down to the routing fields (or its error, or
    /// the kind of a non-object).
    fn reference(bytes: &[u8]) -> Result<Result<serde_json::Map<String, Value>, &'static str>, String> {
        match serde_json::from_slice::<Value>(bytes).map_err(|e| e.to_string())? {
            Value::Object(mut m) => {
                m.retain(|k, _| ROUTING_FIELDS.contains(&k.as_str()));
                Ok(Ok(m))
            }
            Value::Null => Ok(Err("null")),
            Value::Bool(_) => Ok(Err("a boolean")),
            Value::Number(_) => Ok(Err("a number")),
            Value::String(_) => Ok(Err("a string")),
            Value::Array(_) => Ok(Err("an array")),
        }
    }

    fn parsed(bytes: &[u8]) -> Result<Result<serde_json::Map<String, Value>, &'static str>, String> {
        match serde_json::from_slice::<Top>(bytes).map_err(|e| e.to_string())? {
            Top::Object(m) => Ok(Ok(m)),
            Top::Other(kind) => Ok(Err(kind)),
        }
    }

    #[test]
    fn accepts_refuses_and_keeps_what_a_value_parse_does() {
        let deep = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        let inputs: Vec<Vec<u8>> = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false}"#,
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"a":[1,2.5,-3e7,null,true]}}}]}"#,
            r#"{"model":"a","model":"b","prompt":["x","y"],"input":"z","prompt_cache_key":"k","max_completion_tokens":9}"#,
            r#"{"model":"m","temperature":1e400}"#,
            r#"{"model":"m","x":"\ud800"}"#,
            r#"{"model":"m","x":"\u00e9\n\"q\""}"#,
            r#"{"model":"m","x":"tab	in"}"#,
            r#"{"model":"m","x":[1,]}"#,
            r#"{"model":"m"} trailing"#,
            r#"{"model":"m","x":01}"#,
            r#"{"m\u006fdel":"escaped key"}"#,
            "[1,{\"a\":2}]",
            "null",
            "true",
            "-1.5",
            "\"s\"",
            "",
            "{\"model\":",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([deep.into_bytes(), b"{\"model\":\"m\",\"x\":\"\xff\"}".to_vec()])
        .collect();
        for bytes in &inputs {
            assert_eq!(parsed(bytes), reference(bytes), "{}", String::from_utf8_lossy(bytes));
        }
        // A repeated field keeps its last value; the others are not kept at all.
        let m = parsed(inputs[2].as_slice()).unwrap().unwrap();
        assert_eq!(m["model"], "b");
        assert!(parsed(inputs[0].as_slice()).unwrap().unwrap().get("stream").is_none());
    }
}
