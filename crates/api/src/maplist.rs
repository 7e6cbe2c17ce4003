//! Status lists that are maps (`x-kubernetes-list-type: map`), as Kubernetes 1.20 leaves them.

/// A status list that is a map (`x-kubernetes-list-type: map`: each writer owns its
/// entries), read with `null` as empty. Its schema says `nullable`: when a writer's apply
/// removes the last entry, Kubernetes 1.20's server-side apply leaves `null` there, and a
/// schema without `nullable` refuses that write — the queue could not clear its `Queued`.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    use serde::Deserialize;
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default, deserialize_with = "super::nullable")]
        conditions: Vec<String>,
    }

    /// `null` (what v1.20 leaves) and a missing list read as empty; a list as itself.
    #[test]
    fn null_is_empty() {
        for (json, expected) in [
            (r#"{"conditions": null}"#, vec![]),
            ("{}", vec![]),
            (r#"{"conditions": ["Ready"]}"#, vec!["Ready".to_owned()]),
        ] {
            let s: Status = serde_json::from_str(json).unwrap();
            assert_eq!(s.conditions, expected, "{json}");
        }
    }
}
