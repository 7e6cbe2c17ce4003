//! Kubernetes names a spec carries (a Secret, a BackupPolicy, a container, a volume, a label
//! key): checked at admission by the schema's `pattern` and `maxLength` (which every API
//! server version enforces) and again in code before any request is built from them, so a
//! name such as `../../team-b/secrets/creds` never reaches a request path.

/// A DNS-1123 subdomain (most object names): at most 253 characters.
pub const SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
pub const SUBDOMAIN_MAX: usize = 253;
/// A DNS-1123 label (container and volume names): at most 63 characters.
pub const LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
pub const LABEL_MAX: usize = 63;
/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// A key of a Secret's data (what `secretKeyRef.key` accepts): letters, digits, `-`, `_`
/// and `.`, at most 253 characters, not `.`, `..` or starting with `..`.
pub const SECRET_KEY_PATTERN: &str = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$";
/// The longest label value; names that become label values (a ScheduledBackup's, a
/// BackupPolicy's) are held to it.
pub const LABEL_VALUE_MAX: usize = 63;

/// Why a name was refused: the field, the value (cut) and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?} is not {form}")]
pub struct NameError {
    pub field: &'static str,
    pub value: String,
    pub form: &'static str,
}

fn refuse(field: &'static str, value: &str, form: &'static str) -> NameError {
    NameError {
        field,
        value: value.chars().take(80).collect(),
        form,
    }
}

fn label_chars(part: &str, extra: &[u8]) -> bool {
    let b = part.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(c);
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.iter().all(inner)
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
}

/// A DNS-1123 label: lowercase letters, digits and `-`, starting and ending alphanumeric,
/// at most 63 characters.
///
/// # Errors
/// Anything else.
pub fn dns_label(field: &'static str, value: &str) -> Result<(), NameError> {
    if value.len() <= LABEL_MAX && label_chars(value, b"-") {
        Ok(())
    } else {
        Err(refuse(
            field,
            value,
            "a DNS-1123 label (lowercase letters, digits and '-', alphanumeric at both ends, at most 63 characters), e.g. mariadb",
        ))
    }
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
///
/// # Errors
/// Anything else (a `/`, `..`, upper case, empty…).
pub fn dns_subdomain(field: &'static str, value: &str) -> Result<(), NameError> {
    if value.len() <= SUBDOMAIN_MAX && value.split('.').all(|p| label_chars(p, b"-")) {
        Ok(())
    } else {
        Err(refuse(
            field,
            value,
            "a Kubernetes object name (lowercase letters, digits, '-' and '.', alphanumeric at both ends, at most 253 characters), e.g. store-credentials",
        ))
    }
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 characters
/// of letters, digits, `-`, `_` and `.`, alphanumeric at both ends.
///
/// # Errors
/// Anything else.
pub fn label_key(field: &'static str, value: &str) -> Result<(), NameError> {
    let (prefix, name) = match value.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    let name_ok = name.len() <= LABEL_VALUE_MAX && {
        let b = name.as_bytes();
        let edge = |c: &u8| c.is_ascii_alphanumeric();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
            && b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
    };
    if name_ok && prefix.is_none_or(|p| dns_subdomain(field, p).is_ok()) {
        Ok(())
    } else {
        Err(refuse(
            field,
            value,
            "a label key ([prefix/]name: the name at most 63 letters, digits, '-', '_' or '.'), e.g. tidemark.io/role",
        ))
    }
}

/// A key of a Secret's data: letters, digits, `-`, `_` and `.`, at most 253 characters,
/// not `.` or `..` and not starting with `..` (the API server's own rule for keys).
///
/// # Errors
/// Anything else.
pub fn secret_key(field: &'static str, value: &str) -> Result<(), NameError> {
    let chars_ok = !value.is_empty()
        && value.len() <= SUBDOMAIN_MAX
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    if chars_ok && value != "." && !value.starts_with("..") {
        Ok(())
    } else {
        Err(refuse(
            field,
            value,
            "a Secret key (letters, digits, '-', '_' and '.', at most 253 characters, not '.' or '..'), e.g. password",
        ))
    }
}

/// A name that becomes a label value on what the operator creates: at most 63 characters.
///
/// # Errors
/// Longer.
pub fn label_value_name(field: &'static str, value: &str) -> Result<(), NameError> {
    if value.len() <= LABEL_VALUE_MAX {
        Ok(())
    } else {
        Err(refuse(
            field,
            value,
            "at most 63 characters (it labels the objects the operator creates for it)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_specs_are_kubernetes_names() {
        for ok in ["s3", "store-creds", "a.b-c", &"a".repeat(253)] {
            assert!(dns_subdomain("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "team-b/store-creds",
            "../../team-b/secrets/store-creds",
            "..",
            "A",
            "-a",
            "a-",
            "a..b",
            "a b",
            "a%2Fb",
            &"a".repeat(254),
        ] {
            let e = dns_subdomain("spec.objectStore.credentialsSecret", bad).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("spec.objectStore.credentialsSecret: ")
                    && e.to_string().contains("Kubernetes object name"),
                "{e}"
            );
        }
        for ok in [
            "password",
            "AWS_SECRET_ACCESS_KEY",
            "root-password",
            "tls.key",
            "a..b",
        ] {
            assert!(secret_key("k", ok).is_ok(), "{ok}");
        }
        let pattern = regex::Regex::new(SECRET_KEY_PATTERN).unwrap();
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "..x",
            "a/b",
            "a b",
            "é",
            &"k".repeat(254),
        ] {
            let e = secret_key("spec.source.passwordFrom.key", bad).unwrap_err();
            assert!(e.to_string().contains("a Secret key"), "{e}");
            // The schema's pattern (every API server) refuses the same, length aside.
            assert!(bad.len() > 253 || !pattern.is_match(bad), "{bad}");
        }
        for ok in ["password", ".hidden", "a..b", "tls.key", "_x"] {
            assert!(secret_key("k", ok).is_ok() && pattern.is_match(ok), "{ok}");
        }
        assert!(dns_label("c", "mariadb").is_ok());
        assert!(dns_label("c", "a.b").is_err());
        assert!(dns_label("c", &"a".repeat(64)).is_err());
        for ok in [
            "tidemark.io/role",
            "role",
            "app.kubernetes.io/component",
            "A_b.c",
        ] {
            assert!(label_key("k", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/role",
            "a/b/c",
            "Tidemark.io/role",
            "role-",
            &"r".repeat(64),
        ] {
            assert!(label_key("k", bad).is_err(), "{bad}");
        }
        assert!(label_value_name("metadata.name", &"s".repeat(63)).is_ok());
        assert!(label_value_name("metadata.name", &"s".repeat(64)).is_err());
    }

    /// The schema's patterns (what the API server checks) and the code's checks agree.
    #[test]
    fn patterns_agree_with_the_code() {
        let sub = regex_lite(SUBDOMAIN_PATTERN);
        let lab = regex_lite(LABEL_PATTERN);
        let key = regex_lite(LABEL_KEY_PATTERN);
        for v in [
            "s3",
            "a.b",
            "a..b",
            "-a",
            "A",
            "a/b",
            "tidemark.io/role",
            "a_b",
            "x-",
            "0",
            "a.b/c",
            "a/b/c",
            "",
            ".",
            "a.",
        ] {
            assert_eq!(sub(v), dns_subdomain("f", v).is_ok(), "subdomain {v:?}");
            assert_eq!(lab(v), dns_label("f", v).is_ok(), "label {v:?}");
            assert_eq!(key(v), label_key("f", v).is_ok(), "label key {v:?}");
        }
    }

    /// A matcher for the patterns above from the `regex` crate the tests already use.
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).unwrap();
        move |v| re.is_match(v)
    }
}
