//! The ratelimit config's YAML as its loader sees it: mapping keys keep their type (a key
//! `0.25:` is refused as "not of type string", not read as the string "0.25"), a repeated key
//! is allowed with the last one read (yaml.v2, non-strict), and floats and tagged values are
//! kept apart because the loader refuses them.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One YAML node.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Yaml {
    Null,
    Bool(bool),
    Int(i128),
    Str(String),
    List(Vec<Yaml>),
    /// Pairs in file order; a repeated key is kept, and read as its last occurrence.
    Map(Vec<(Yaml, Yaml)>),
    /// A float or a tagged value, with its text.
    Other(String),
}

impl Yaml {
    /// The node as the service's messages print it (Go's `%v`).
    pub(super) fn text(&self) -> String {
        match self {
            Yaml::Null => "<nil>".into(),
            Yaml::Bool(b) => b.to_string(),
            Yaml::Int(n) => n.to_string(),
            Yaml::Str(s) | Yaml::Other(s) => s.clone(),
            Yaml::List(_) => "a list".into(),
            Yaml::Map(_) => "a mapping".into(),
        }
    }
}

/// What an `Other` leaf is, for the refusal.
pub(super) fn float_or_tag(v: &Yaml) -> String {
    match v {
        Yaml::Other(t) => format!("{t} is a float or a tagged value"),
        other => other.text(),
    }
}

struct V;

impl<'de> Visitor<'de> for V {
    type Value = Yaml;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML node")
    }
    fn visit_unit<E>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }
    fn visit_none<E>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Yaml, D::Error> {
        d.deserialize_any(V)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Yaml, E> {
        Ok(Yaml::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Yaml, E> {
        Ok(Yaml::Int(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Yaml, E> {
        Ok(Yaml::Int(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Yaml, E> {
        Ok(Yaml::Other(n.to_string()))
    }
    fn visit_str<E>(self, s: &str) -> Result<Yaml, E> {
        Ok(Yaml::Str(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Yaml, E> {
        Ok(Yaml::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Yaml, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed)? {
            out.push(v);
        }
        Ok(Yaml::List(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Yaml, A::Error> {
        let mut out = Vec::new();
        while let Some(k) = map.next_key_seed(Seed)? {
            out.push((k, map.next_value_seed(Seed)?));
        }
        Ok(Yaml::Map(out))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Yaml, A::Error> {
        let (tag, variant): (String, A::Variant) = data.variant()?;
        let _: Yaml = de::VariantAccess::newtype_variant_seed(variant, Seed)?;
        Ok(Yaml::Other(format!("!{tag}")))
    }
}

struct Seed;

impl<'de> de::DeserializeSeed<'de> for Seed {
    type Value = Yaml;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Yaml, D::Error> {
        d.deserialize_any(V)
    }
}

/// A file's YAML documents; the first error ends the list (the parser would repeat it).
pub(super) fn documents(text: &str) -> Vec<Result<Yaml, String>> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        match doc.deserialize_any(V) {
            Ok(v) => out.push(Ok(v)),
            Err(e) => {
                out.push(Err(e.to_string()));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_type_and_repeats_are_kept() {
        let docs = documents("0.25: x\n1: y\na: 1\na: 2\nb: [1.5, ~, !t z]\n");
        let Ok(Yaml::Map(m)) = &docs[0] else {
            panic!("{docs:?}")
        };
        assert_eq!(m[0].0, Yaml::Other("0.25".into()));
        assert_eq!(m[1].0, Yaml::Int(1));
        assert_eq!(m[3], (Yaml::Str("a".into()), Yaml::Int(2)));
        assert_eq!(
            m[4].1,
            Yaml::List(vec![
                Yaml::Other("1.5".into()),
                Yaml::Null,
                Yaml::Other("!t".into())
            ])
        );
        assert_eq!(documents("'''\n").len(), 1);
        assert_eq!(documents("---\na: 1\n---\nb: 2\n").len(), 2);
    }
}
