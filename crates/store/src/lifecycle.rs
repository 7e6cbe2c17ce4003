//! The bucket's lifecycle rules, read to check the promise of seed 002: "Deletion of the
//! actual backups from the target storage will be managed by the retention period set on
//! the S3 bucket". With `afterExpiry: lifecycle` (the default for locked chains) Tidemark
//! records an expired chain and leaves its objects to such a rule, so it reads
//! `GetBucketLifecycleConfiguration` and says when no rule will ever remove an expired
//! chain, or when a rule would remove objects the recovery window still needs (in a
//! versioned bucket an expiration hides the current version behind a delete marker: the
//! backup is gone for every reader, lock or not).
//!
//! A signed request of its own (object_store knows no lifecycle), answered within the
//! control-object bound; rules of a shape it does not know are kept as "not understood",
//! never guessed at.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::uploads::{S3Native, generic};

/// The most rules read (S3 allows 1,000 per bucket).
pub const MAX_RULES: usize = 1000;

/// One rule, as far as Tidemark reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub id: String,
    pub enabled: bool,
    /// The key prefix it applies to (`""`: the whole bucket).
    pub prefix: String,
    /// Also filtered by object tags or sizes: it may apply to none of Tidemark's objects
    /// (which carry no tags), so it counts as one that might remove too early ("too
    /// short"), never as one that removes expired chains.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub filtered: bool,
    /// Current versions older than this many days expire.
    pub expiration_days: Option<u32>,
    /// Noncurrent versions are removed this many days after they became noncurrent.
    pub noncurrent_days: Option<u32>,
}

/// What the rules mean for one cluster's prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "verdict")]
pub enum Verdict {
    /// An enabled rule expires the cluster's objects after `days`, no sooner than needed.
    Removes { rule: String, days: u32 },
    /// No enabled rule expires the cluster's current objects: expired chains stay (and are
    /// billed) for ever.
    NoRule,
    /// A rule expires current versions, but none removes noncurrent ones: in a versioned
    /// (lock-enabled) bucket an expiration only adds a delete marker, and the data stays
    /// (billed) for ever.
    NoNoncurrent { rule: String, days: u32 },
    /// An enabled rule expires objects after `days`, but a backup the window still needs
    /// is (or will be) older than that: `needed_days`.
    TooShort {
        rule: String,
        days: u32,
        needed_days: u64,
    },
    /// The rules could not be read (the provider does not expose them, or refused).
    Unknown { problem: String },
}

impl Verdict {
    /// The line `plan`, `gc` and the operator print, `None` when all is well.
    pub fn problem(&self) -> Option<String> {
        match self {
            Verdict::Removes { .. } => None,
            Verdict::NoRule => Some(
                "no enabled lifecycle rule of the bucket expires this cluster's objects: expired chains (afterExpiry: lifecycle) will never be removed; add a rule that expires current versions and noncurrent ones (docs/cli.md#immutable-backups), or set afterExpiry: delete".to_owned(),
            ),
            Verdict::NoNoncurrent { rule, days } => Some(format!(
                "the bucket's lifecycle rule {rule:?} expires this cluster's objects after {days} days, but no rule removes noncurrent versions (NoncurrentVersionExpiration): in a lock-enabled, hence versioned, bucket the expired chains stay behind delete markers, billed for ever; add NoncurrentDays to the rule"
            )),
            Verdict::TooShort {
                rule,
                days,
                needed_days,
            } => Some(format!(
                "the bucket's lifecycle rule {rule:?} expires objects after {days} days, but backups the recovery window needs are (or will be) {needed_days} days old: it would remove them; make it at least {needed_days} days"
            )),
            Verdict::Unknown { problem } => Some(format!(
                "the bucket's lifecycle rules could not be read ({problem}): check that a rule removes expired chains, and none removes what the window needs"
            )),
        }
    }
}

/// Judges `rules` for the objects under `root` (the cluster's prefix in the bucket), whose
/// kept backups must live `needed_days` (the oldest kept backup's age, or the window,
/// whichever is longer).
pub fn verdict(rules: &[Rule], root: &str, needed_days: u64) -> Verdict {
    let root = format!("{}/", root.trim_end_matches('/'));
    let overlapping =
        |r: &&Rule| r.enabled && (root.starts_with(&r.prefix) || r.prefix.starts_with(&root));
    let expiring = |r: &&Rule| r.expiration_days.is_some();
    // Any rule that may bite counts for "too short", filtered ones too.
    if let Some(early) = rules
        .iter()
        .filter(overlapping)
        .filter(expiring)
        .filter(|r| u64::from(r.expiration_days.unwrap_or(u32::MAX)) < needed_days)
        .min_by_key(|r| r.expiration_days.unwrap_or(u32::MAX))
    {
        return Verdict::TooShort {
            rule: early.id.clone(),
            days: early.expiration_days.unwrap_or(u32::MAX),
            needed_days,
        };
    }
    // Only a rule without tag or size filters surely removes expired chains.
    let applying: Vec<&Rule> = rules
        .iter()
        .filter(overlapping)
        .filter(expiring)
        .filter(|r| !r.filtered)
        .collect();
    let removes_noncurrent = rules
        .iter()
        .filter(overlapping)
        .any(|r| r.noncurrent_days.is_some() && !r.filtered);
    // The shortest applying rule is the one that bites first.
    let Some(shortest) = applying
        .iter()
        .min_by_key(|r| r.expiration_days.unwrap_or(u32::MAX))
    else {
        return Verdict::NoRule;
    };
    let days = shortest.expiration_days.unwrap_or(u32::MAX);
    if !removes_noncurrent {
        return Verdict::NoNoncurrent {
            rule: shortest.id.clone(),
            days,
        };
    }
    Verdict::Removes {
        rule: shortest.id.clone(),
        days,
    }
}

impl S3Native {
    /// The bucket's lifecycle rules (`GetBucketLifecycleConfiguration`); empty when it has
    /// none.
    ///
    /// # Errors
    /// The request failed or was refused; the answer is not a lifecycle configuration.
    pub async fn lifecycle(&self) -> object_store::Result<Vec<Rule>> {
        let mut url = url::Url::parse(&self.bucket_url).map_err(generic)?;
        url.set_query(Some("lifecycle"));
        let (status, body) = self
            .send(http::Method::GET, &url, &[], Bytes::new())
            .await?;
        if status == http::StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        if !status.is_success() {
            return Err(generic(format!(
                "GetBucketLifecycleConfiguration answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            )));
        }
        parse(&body)
    }

    /// Replaces the bucket's lifecycle configuration with `xml`
    /// (`PutBucketLifecycleConfiguration`): what a test, or an administrator through
    /// Tidemark's credentials, sets.
    ///
    /// # Errors
    /// The server refused.
    pub async fn put_lifecycle(&self, xml: &str) -> object_store::Result<()> {
        use base64::Engine as _;
        use md5::Digest as _;
        let mut url = url::Url::parse(&self.bucket_url).map_err(generic)?;
        url.set_query(Some("lifecycle"));
        let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(xml));
        let (status, body) = self
            .send(
                http::Method::PUT,
                &url,
                &[("content-md5", md5)],
                Bytes::from(xml.to_owned()),
            )
            .await?;
        if !status.is_success() {
            return Err(generic(format!(
                "PutBucketLifecycleConfiguration answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            )));
        }
        Ok(())
    }
}

/// Reads a `LifecycleConfiguration` document (at most [`MAX_RULES`] rules).
fn parse(body: &[u8]) -> object_store::Result<Vec<Rule>> {
    let c: ConfigurationXml = quick_xml::de::from_reader(body).map_err(generic)?;
    Ok(c.rule
        .into_iter()
        .take(MAX_RULES)
        .map(|r| Rule {
            filtered: r.filter.as_ref().is_some_and(|f| {
                f.tag.is_some()
                    || f.object_size_greater_than.is_some()
                    || f.object_size_less_than.is_some()
                    || f.and.as_ref().is_some_and(|a| {
                        !a.tag.is_empty()
                            || a.object_size_greater_than.is_some()
                            || a.object_size_less_than.is_some()
                    })
            }),
            id: r.id.unwrap_or_default().chars().take(255).collect(),
            enabled: r.status.as_deref() == Some("Enabled"),
            prefix: r
                .filter
                .and_then(|f| f.prefix.or_else(|| f.and.and_then(|a| a.prefix)))
                .or(r.prefix)
                .unwrap_or_default(),
            expiration_days: r.expiration.and_then(|e| e.days),
            noncurrent_days: r
                .noncurrent_version_expiration
                .and_then(|e| e.noncurrent_days),
        })
        .collect())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ConfigurationXml {
    #[serde(default)]
    rule: Vec<RuleXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RuleXml {
    #[serde(rename = "ID", default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    filter: Option<FilterXml>,
    #[serde(default)]
    expiration: Option<ExpirationXml>,
    #[serde(default)]
    noncurrent_version_expiration: Option<NoncurrentXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FilterXml {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    and: Option<AndXml>,
    #[serde(default)]
    tag: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    object_size_greater_than: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    object_size_less_than: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AndXml {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    tag: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    object_size_greater_than: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    object_size_less_than: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExpirationXml {
    #[serde(default)]
    days: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NoncurrentXml {
    #[serde(default)]
    noncurrent_days: Option<u32>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rules_are_read_and_judged_for_the_cluster_prefix() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Rule><ID>other-team</ID><Status>Enabled</Status><Filter><Prefix>other/</Prefix></Filter>
    <Expiration><Days>1</Days></Expiration></Rule>
  <Rule><ID>off</ID><Status>Disabled</Status><Prefix></Prefix>
    <Expiration><Days>2</Days></Expiration></Rule>
  <Rule><ID>backups</ID><Status>Enabled</Status><Filter><And><Prefix>prod/</Prefix></And></Filter>
    <Expiration><Days>40</Days></Expiration>
    <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule>
</LifecycleConfiguration>"#;
        let rules = parse(xml).unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[2].prefix, "prod/");
        assert_eq!(rules[2].noncurrent_days, Some(1));
        assert!(!rules[1].enabled);
        assert_eq!(
            verdict(&rules, "prod/shop", 30),
            Verdict::Removes {
                rule: "backups".into(),
                days: 40
            }
        );
        assert_eq!(
            verdict(&rules, "prod/shop", 45),
            Verdict::TooShort {
                rule: "backups".into(),
                days: 40,
                needed_days: 45
            }
        );
        // The other team's rule and the disabled one never apply here.
        assert_eq!(verdict(&rules, "staging/shop", 1), Verdict::NoRule);
        assert_eq!(verdict(&[], "prod/shop", 1), Verdict::NoRule);
        assert!(
            Verdict::NoRule
                .problem()
                .unwrap()
                .contains("never be removed")
        );
        // Without a noncurrent expiration a versioned bucket keeps the data.
        let mut current_only = rules[2].clone();
        current_only.noncurrent_days = None;
        assert_eq!(
            verdict(&[current_only], "prod/shop", 30),
            Verdict::NoNoncurrent {
                rule: "backups".into(),
                days: 40
            }
        );
        // A rule on a narrower prefix inside the cluster still bites.
        let inner = Rule {
            id: "inner".into(),
            enabled: true,
            prefix: "prod/shop/nightly/".into(),
            expiration_days: Some(3),
            noncurrent_days: None,
            filtered: false,
        };
        assert!(matches!(
            verdict(&[inner], "prod/shop", 10),
            Verdict::TooShort { days: 3, .. }
        ));
    }

    /// A rule filtered by tags or sizes may apply to none of Tidemark's (untagged)
    /// objects: it never counts as removing expired chains, but one that could bite too
    /// early is still said. Before, it was read as its prefix alone: "removes", while the
    /// chains stayed for ever.
    #[test]
    fn tag_and_size_filtered_rules_never_count_as_removing() {
        let xml = br#"<LifecycleConfiguration>
  <Rule><ID>tagged</ID><Status>Enabled</Status><Filter><Tag><Key>tier</Key><Value>tmp</Value></Tag></Filter>
    <Expiration><Days>40</Days></Expiration>
    <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule>
  <Rule><ID>big</ID><Status>Enabled</Status><Filter><And><Prefix>prod/</Prefix><ObjectSizeGreaterThan>1000</ObjectSizeGreaterThan></And></Filter>
    <Expiration><Days>5</Days></Expiration></Rule>
</LifecycleConfiguration>"#;
        let rules = parse(xml).unwrap();
        assert!(rules.iter().all(|r| r.filtered), "{rules:?}");
        assert_eq!(verdict(&rules[..1], "prod/shop", 30), Verdict::NoRule);
        assert!(matches!(
            verdict(&rules, "prod/shop", 30),
            Verdict::TooShort { days: 5, .. }
        ));
    }
}
