//! A small JSON tree used for strict decoding and canonical encoding.
//!
//! `serde_json::Value` is not used for either job: its objects silently keep the last of duplicate
//! keys, and its key order depends on a cargo feature (`preserve_order`) that any other crate in a
//! build may switch on. The hash chain needs one byte-exact form, so this module owns it:
//! objects are written with keys sorted by their UTF-8 bytes, no whitespace, integers in plain
//! decimal and strings escaped the way `serde_json` escapes them (only `"`, `\` and control
//! characters; everything else verbatim UTF-8).

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A parsed JSON value. Objects keep every key/value pair in input order, duplicates included,
/// so the typed layer can report a duplicate key together with its path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// An integer that fits in `i128` (covers both `u64` and `i64`).
    Int(i128),
    /// Any number with a fraction or exponent, or an integer too large for `i128`.
    Float,
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// A human word for the JSON type, used in "expected X, found Y" messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Int(_) => "an integer",
            Json::Float => "a non-integer number",
            Json::Str(_) => "a string",
            Json::Arr(_) => "an array",
            Json::Obj(_) => "an object",
        }
    }

    /// Shorthand for building objects in encoders.
    pub(crate) fn obj() -> ObjBuilder {
        ObjBuilder(Vec::new())
    }
}

/// Builds an object; absent optional fields are simply not pushed.
pub(crate) struct ObjBuilder(Vec<(String, Json)>);

impl ObjBuilder {
    pub(crate) fn field(mut self, key: &str, value: Json) -> Self {
        self.0.push((key.to_owned(), value));
        self
    }
    pub(crate) fn str(self, key: &str, value: &str) -> Self {
        self.field(key, Json::Str(value.to_owned()))
    }
    pub(crate) fn opt_str(self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.str(key, v),
            None => self,
        }
    }
    pub(crate) fn opt_field(self, key: &str, value: Option<Json>) -> Self {
        match value {
            Some(v) => self.field(key, v),
            None => self,
        }
    }
    pub(crate) fn int(self, key: &str, value: impl Into<i128>) -> Self {
        self.field(key, Json::Int(value.into()))
    }
    pub(crate) fn bool(self, key: &str, value: bool) -> Self {
        self.field(key, Json::Bool(value))
    }
    pub(crate) fn build(self) -> Json {
        Json::Obj(self.0)
    }
}

/// Parses `input` as exactly one JSON value (trailing non-whitespace is an error). Nesting depth
/// is bounded by `serde_json`'s recursion limit (128), so hostile input cannot overflow the stack.
pub(crate) fn parse(input: &str) -> Result<Json, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(input);
    let value = Json::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

/// `serde_json`'s private marker for numbers when its `arbitrary_precision` feature is on
/// (which another crate in the build could enable through feature unification).
const ARBITRARY_PRECISION_TOKEN: &str = "$serde_json::private::Number";

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Json, E> {
        Ok(Json::Int(v))
    }
    fn visit_f64<E>(self, _v: f64) -> Result<Json, E> {
        Ok(Json::Float)
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Json>()? {
            items.push(item);
        }
        Ok(Json::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut pairs: Vec<(String, Json)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if pairs.is_empty() && key == ARBITRARY_PRECISION_TOKEN {
                let digits: String = map.next_value()?;
                return Ok(match digits.parse::<i128>() {
                    Ok(n) => Json::Int(n),
                    Err(_) => Json::Float,
                });
            }
            let value = map.next_value::<Json>()?;
            pairs.push((key, value));
        }
        Ok(Json::Obj(pairs))
    }
}

/// Writes `value` in the canonical form (sorted keys, no whitespace).
pub(crate) fn write_canonical(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(n) => out.push_str(&n.to_string()),
        // Encoders never produce non-integers; writing `null` keeps this total.
        Json::Float => out.push_str("null"),
        Json::Str(s) => write_string(s, out),
        Json::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Json::Obj(pairs) => {
            let mut sorted: Vec<&(String, Json)> = pairs.iter().collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

/// Writes a JSON string literal with `serde_json`'s escaping rules.
pub(crate) fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping does not depend on any feature flag.
    let quoted = serde_json::to_string(s).expect("serialising a str cannot fail");
    out.push_str(&quoted);
}

/// Canonical text of a value.
pub(crate) fn canonical(value: &Json) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        let v = parse(r#" { "b" : 1, "a" : [true, null, "x\n"], "A": -3 } "#).unwrap();
        assert_eq!(canonical(&v), r#"{"A":-3,"a":[true,null,"x\n"],"b":1}"#);
    }

    #[test]
    fn duplicate_keys_are_kept_for_the_typed_layer_to_report() {
        let v = parse(r#"{"a":1,"a":2}"#).unwrap();
        assert_eq!(
            v,
            Json::Obj(vec![("a".into(), Json::Int(1)), ("a".into(), Json::Int(2))])
        );
    }

    #[test]
    fn fractions_and_exponents_are_not_integers() {
        assert_eq!(parse("1.0").unwrap(), Json::Float);
        assert_eq!(parse("1e3").unwrap(), Json::Float);
        assert_eq!(parse("-7").unwrap(), Json::Int(-7));
    }

    #[test]
    fn trailing_data_is_rejected() {
        assert!(parse("{} x").is_err());
        assert!(parse("{}{}").is_err());
    }

    #[test]
    fn deep_nesting_is_rejected_without_overflowing_the_stack() {
        let deep = "[".repeat(100_000);
        assert!(parse(&deep).is_err());
    }
}
