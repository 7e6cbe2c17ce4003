//! Client-side encryption (issue 19 §2): payloads and binlog segments are encrypted with
//! [age](https://age-encryption.org/v1) to X25519 recipients before they leave the machine,
//! so the store only ever holds ciphertext. `metadata.json` and the segment index stay
//! plaintext (retention plans without keys); each encrypted object records the
//! *fingerprints* of the recipients it was encrypted to, never the keys.
//!
//! A fingerprint is the first 16 hex digits of the sha256 of the recipient's `age1…` text:
//! `printf %s age1… | sha256sum | cut -c1-16` gives the same.
//!
//! Identities (secret keys) are read from a file or a Secret's value in age's own identity
//! file form (`AGE-SECRET-KEY-1…` lines, `#` comments); no secret ever appears in an error
//! or a log.

use std::fmt;
use std::str::FromStr;

use age::secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

pub use crate::format::Encryption;

/// The environment variable that may hold age identities themselves (a Secret given to a
/// pod as a variable). Every program tidemark starts runs without it.
pub const IDENTITY_ENV: &str = "TIDEMARK_IDENTITY";

/// The scheme recorded for age (`"encryption": {"scheme": "age", …}`).
pub const AGE: &str = "age";
/// Most recipients a store encrypts to (each costs a header stanza per object).
pub const MAX_RECIPIENTS: usize = 16;
/// Most identities one file or Secret may hold.
pub const MAX_IDENTITIES: usize = 64;
/// Largest identity file read (an identity line is 74 characters).
pub const MAX_IDENTITY_FILE: u64 = 64 << 10;
/// What a recipient looks like, for errors.
pub const RECIPIENT_FORM: &str = "an age X25519 public key (age1… , 62 characters)";

/// A key setting that is not one.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("recipient {value:?}: expected {RECIPIENT_FORM}")]
    Recipient { value: String },
    #[error("{count} recipients: at most {MAX_RECIPIENTS}")]
    TooManyRecipients { count: usize },
    #[error(
        "{source_name}, line {line}: not an age identity (expected a line AGE-SECRET-KEY-1…, or a # comment); the line is not shown"
    )]
    Identity { source_name: String, line: usize },
    #[error("{source_name}: no identity in it (expected lines AGE-SECRET-KEY-1…)")]
    NoIdentity { source_name: String },
    #[error("{source_name}: more than {MAX_IDENTITIES} identities")]
    TooManyIdentities { source_name: String },
    #[error("{source_name}: larger than {MAX_IDENTITY_FILE} bytes; not an identity file")]
    TooLarge { source_name: String },
    #[error("reading identity file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A value as an error may show it: an identity given where a public key or a path was
/// expected is never shown.
fn shown(value: &str) -> String {
    if value
        .trim_start()
        .to_ascii_uppercase()
        .starts_with("AGE-SECRET-KEY-")
    {
        "(an age identity — a secret key — not shown)".to_owned()
    } else {
        value.chars().take(100).collect()
    }
}

/// The fingerprint recorded for `recipient`.
pub fn fingerprint(recipient: &age::x25519::Recipient) -> String {
    let digest = Sha256::digest(recipient.to_string().as_bytes());
    hex::encode(&digest[..8])
}

/// The public keys new objects are encrypted to.
#[derive(Clone)]
pub struct Recipients {
    keys: Vec<age::x25519::Recipient>,
    fingerprints: Vec<String>,
}

impl fmt::Debug for Recipients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Recipients")
            .field(&self.fingerprints)
            .finish()
    }
}

impl Recipients {
    /// How many recipients.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Never: a set is made of at least one recipient.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses `values` (each `age1…`; a value may hold several, split by commas or white
    /// space, as an environment variable does). `None` for no recipient at all.
    ///
    /// # Errors
    /// A value that is not an X25519 recipient (shown: it is a public key); too many.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Option<Self>, KeyError> {
        let mut keys: Vec<age::x25519::Recipient> = Vec::new();
        for v in values {
            for part in v
                .as_ref()
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
            {
                let key = age::x25519::Recipient::from_str(part)
                    .map_err(|_| KeyError::Recipient { value: shown(part) })?;
                if !keys.iter().any(|k| k.to_string() == key.to_string()) {
                    keys.push(key);
                }
                if keys.len() > MAX_RECIPIENTS {
                    return Err(KeyError::TooManyRecipients { count: keys.len() });
                }
            }
        }
        if keys.is_empty() {
            return Ok(None);
        }
        let fingerprints = keys.iter().map(fingerprint).collect();
        Ok(Some(Recipients { keys, fingerprints }))
    }

    /// What an object encrypted to these recipients records.
    pub fn record(&self) -> Encryption {
        Encryption {
            scheme: AGE.to_owned(),
            recipients: self.fingerprints.clone(),
        }
    }

    /// A new age encryptor to every recipient.
    pub(crate) fn encryptor(&self) -> std::io::Result<age::Encryptor> {
        age::Encryptor::with_recipients(self.keys.iter().map(|k| k as &dyn age::Recipient))
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// The secret keys objects are decrypted with.
pub struct Identities {
    keys: Vec<age::x25519::Identity>,
    fingerprints: Vec<String>,
}

impl fmt::Debug for Identities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Identities")
            .field(&self.fingerprints)
            .finish()
    }
}

impl Identities {
    /// Parses identity text (age's identity file form) from `source_name` (a path or
    /// `Secret ns/name key`, for errors).
    ///
    /// # Errors
    /// A line that is neither an identity nor a comment (never shown); none; too many.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, KeyError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let key = age::x25519::Identity::from_str(line).map_err(|_| KeyError::Identity {
                source_name: source_name.to_owned(),
                line: i + 1,
            })?;
            keys.push(key);
            if keys.len() > MAX_IDENTITIES {
                return Err(KeyError::TooManyIdentities {
                    source_name: source_name.to_owned(),
                });
            }
        }
        if keys.is_empty() {
            return Err(KeyError::NoIdentity {
                source_name: source_name.to_owned(),
            });
        }
        let fingerprints = keys.iter().map(|k| fingerprint(&k.to_public())).collect();
        Ok(Identities { keys, fingerprints })
    }

    /// Reads an identity file (at most [`MAX_IDENTITY_FILE`] bytes).
    ///
    /// # Errors
    /// The file cannot be read, is too large, or is not an identity file.
    pub fn read_file(path: &std::path::Path) -> Result<Self, KeyError> {
        use std::io::Read;
        let name = shown(&path.display().to_string());
        let read = |source| KeyError::Read {
            path: name.clone(),
            source,
        };
        let f = std::fs::File::open(path).map_err(read)?;
        let mut text = String::new();
        f.take(MAX_IDENTITY_FILE + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_IDENTITY_FILE {
            return Err(KeyError::TooLarge { source_name: name });
        }
        Identities::parse(&text, &name)
    }

    /// These and `other` together.
    #[must_use]
    pub fn merge(mut self, other: Identities) -> Self {
        for (k, f) in other.keys.into_iter().zip(other.fingerprints) {
            if !self.fingerprints.contains(&f) {
                self.keys.push(k);
                self.fingerprints.push(f);
            }
        }
        self
    }

    /// The fingerprints of these identities' public keys.
    pub fn fingerprints(&self) -> &[String] {
        &self.fingerprints
    }

    /// Whether one of these identities is among the recipients `encryption` records.
    pub fn opens(&self, encryption: &Encryption) -> bool {
        encryption
            .recipients
            .iter()
            .any(|r| self.fingerprints.contains(r))
    }

    pub(crate) fn as_age(&self) -> impl Iterator<Item = &dyn age::Identity> {
        self.keys.iter().map(|k| k as &dyn age::Identity)
    }
}

/// A new identity and its recipient (for `tidemark keygen` and tests): the identity file
/// text, with age-keygen's comments, and the `age1…` public key.
pub fn generate() -> (String, String) {
    let id = age::x25519::Identity::generate();
    let public = id.to_public().to_string();
    let created = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
    let text = format!(
        "# created: {created}\n# public key: {public}\n{}\n",
        id.to_string().expose_secret()
    );
    (text, public)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn recipients_and_identities_meet_by_fingerprint() {
        let (id_text, public) = generate();
        let (_, other) = generate();
        let r = Recipients::parse(&[format!("{public}, {other}")])
            .unwrap()
            .unwrap();
        let e = r.record();
        assert_eq!(e.scheme, "age");
        assert_eq!(e.recipients.len(), 2);
        let ids = Identities::parse(&id_text, "test").unwrap();
        assert!(ids.opens(&e));
        let only_other = Recipients::parse(&[other]).unwrap().unwrap().record();
        assert!(!ids.opens(&only_other));
        // The documented shell form gives the same fingerprint.
        let hex = hex::encode(Sha256::digest(public.as_bytes()));
        assert_eq!(ids.fingerprints()[0], hex[..16]);
    }

    #[test]
    fn bad_keys_are_named_and_secrets_never_shown() {
        let e = Recipients::parse(&["age1nope"]).unwrap_err().to_string();
        assert!(e.contains("age1nope") && e.contains("age1…"), "{e}");
        assert!(Recipients::parse::<&str>(&[]).unwrap().is_none());
        let secret = "AGE-SECRET-KEY-1NOTAREALKEYBUTSECRETLOOKING";
        let e = Identities::parse(&format!("# c\n\n{secret}\n"), "id.txt")
            .unwrap_err()
            .to_string();
        assert!(e.contains("id.txt, line 3"), "{e}");
        assert!(!e.contains("NOTAREAL"), "the line was shown: {e}");
        let e = Identities::parse("# nothing\n", "id.txt").unwrap_err();
        assert!(matches!(e, KeyError::NoIdentity { .. }), "{e}");
        let (_, p) = generate();
        let many: Vec<String> = (0..=MAX_RECIPIENTS).map(|_| generate().1).collect();
        assert!(Recipients::parse(&many).is_err());
        assert!(
            Recipients::parse(&[p.clone(), p])
                .unwrap()
                .unwrap()
                .keys
                .len()
                == 1
        );
        // A secret key given as a recipient or as a path is never echoed.
        let e = Recipients::parse(&[secret]).unwrap_err().to_string();
        assert!(!e.contains("NOTAREAL"), "{e}");
        let e = Identities::read_file(std::path::Path::new(secret))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("NOTAREAL"), "{e}");
    }
}
