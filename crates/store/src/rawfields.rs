//! Fields of a newer format, kept verbatim (issue 42 §2).
//!
//! A record Tidemark rewrites (the lease, the owner, the archiver's status, `run.json`, an
//! index's shard summaries) keeps the fields it does not know, so a newer Tidemark's are not
//! lost. Kept as a `serde_json::Value` tree through `#[serde(flatten)]`, they cost many
//! times their text — serde buffers a flattened struct's every field as a tree first, then
//! builds the map: a 15 MB padding field in `_state/lease.json` took ~770 MiB on every
//! fence. [`RawFields`] keeps each unknown field as its text, once, and nothing is built
//! from a known one twice: the struct is read with the unknown fields skipped
//! (`#[serde(flatten, skip_deserializing)]` makes it a plain struct to serde), then
//! [`RawFields::unknown`] takes the unknown ones from the same text.

use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Top-level fields of a JSON object that a record does not know, as their text, in the
/// order they came.
#[derive(Debug, Clone, Default)]
pub struct RawFields(Vec<(String, Box<RawValue>)>);

impl PartialEq for RawFields {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.get() == y.get())
    }
}

impl Eq for RawFields {}

impl Serialize for RawFields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl FromIterator<(String, serde_json::Value)> for RawFields {
    /// Fields a writer adds beside the known ones.
    fn from_iter<I: IntoIterator<Item = (String, serde_json::Value)>>(iter: I) -> Self {
        RawFields(
            iter.into_iter()
                .filter_map(|(k, v)| Some((k, serde_json::value::to_raw_value(&v).ok()?)))
                .collect(),
        )
    }
}

impl RawFields {
    /// The top-level fields of the object `text` whose names are not in `known`, verbatim.
    /// A known field is skipped without being built.
    ///
    /// # Errors
    /// `text` is not a JSON object.
    pub fn unknown(text: &[u8], known: &[&str]) -> serde_json::Result<Self> {
        struct Fields<'k>(&'k [&'k str]);
        impl<'de> Visitor<'de> for Fields<'_> {
            type Value = RawFields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFields, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if self.0.contains(&key.as_str()) {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        out.push((key, map.next_value::<Box<RawValue>>()?));
                    }
                }
                Ok(RawFields(out))
            }
        }
        let mut de = serde_json::Deserializer::from_slice(text);
        let fields = de.deserialize_map(Fields(known))?;
        de.end()?;
        Ok(fields)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Their names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Adds one (tests: a newer format's field).
    ///
    /// # Errors
    /// `json` is not JSON.
    pub fn push(&mut self, name: &str, json: &str) -> serde_json::Result<()> {
        self.0
            .push((name.to_owned(), RawValue::from_string(json.to_owned())?));
        Ok(())
    }
}

/// A record whose unknown fields are kept as [`RawFields`].
pub trait Record: DeserializeOwned {
    /// The names of its fields in JSON (a test of each record checks them).
    const KNOWN: &'static [&'static str];
    fn extra_mut(&mut self) -> &mut RawFields;
}

/// Reads a record: its known fields typed, its unknown ones verbatim.
///
/// # Errors
/// `text` is not the record.
pub fn parse<T: Record>(text: &[u8]) -> serde_json::Result<T> {
    let mut record: T = serde_json::from_slice(text)?;
    *record.extra_mut() = RawFields::unknown(text, T::KNOWN)?;
    Ok(record)
}

/// Checks `T::KNOWN` against `example` (every field set): its serialized names are exactly
/// the known ones, and a newer field survives a read and a write. For the records' tests.
///
/// # Panics
/// They differ.
#[cfg(any(test, feature = "test-support"))]
#[allow(clippy::expect_used, clippy::panic)]
pub fn assert_known<T: Record + Serialize>(example: &T) {
    let text = serde_json::to_vec(example).expect("serializes");
    let names: Vec<String> =
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&text)
            .expect("an object")
            .keys()
            .cloned()
            .collect();
    let mut known: Vec<&str> = T::KNOWN.to_vec();
    known.sort_unstable();
    let mut named: Vec<&str> = names.iter().map(String::as_str).collect();
    named.sort_unstable();
    assert_eq!(named, known, "KNOWN differs from the fields written");
    let mut with_future: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&text).expect("an object");
    with_future.insert("future".into(), serde_json::json!({"a": [1, 2]}));
    let text = serde_json::to_vec(&with_future).expect("serializes");
    let read: T = parse(&text).expect("reads");
    let again: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&serde_json::to_vec(&read).expect("serializes")).expect("object");
    assert_eq!(again, with_future, "a newer field is lost on rewrite");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unknown_fields_are_kept_verbatim_and_known_ones_skipped() {
        let text = br#"{"a": 1, "pad": [0, 0,  0], "b": {"c": "x"}, "z": "\u00e9"}"#;
        let f = RawFields::unknown(text, &["a", "b"]).unwrap();
        assert_eq!(f.names().collect::<Vec<_>>(), ["pad", "z"]);
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"pad":[0, 0,  0],"z":"\u00e9"}"#
        );
        assert!(RawFields::unknown(b"[1]", &[]).is_err());
        assert!(RawFields::unknown(b"{} x", &[]).is_err());
    }
}
