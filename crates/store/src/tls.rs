//! Which certificate authorities a store's HTTPS connections trust.
//!
//! The machine's CA roots when it has any (`SSL_CERT_FILE` and `SSL_CERT_DIR` are
//! honoured), else the Mozilla roots built into the binary — backup Jobs copy `tidemark`
//! into database images, and minimal images often carry no CA certificates at all; plus
//! a private CA bundle the user gives (`--ca-bundle`, `objectStore.caBundle`).
//!
//! The roots are given to the HTTP client explicitly, so that a machine without roots is
//! not an error: object_store's default verifier refuses to build a client without any,
//! even for a plain-`http://` endpoint.

use std::sync::OnceLock;

use object_store::{Certificate, ClientConfigKey, ClientOptions};

/// Where the trusted roots came from (for messages and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSource {
    /// The machine's certificate store.
    System,
    /// Built into the binary (webpki-root-certs: Mozilla's CA program).
    Bundled,
}

fn roots() -> &'static (RootSource, Vec<Certificate>) {
    static ROOTS: OnceLock<(RootSource, Vec<Certificate>)> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let system: Vec<Certificate> = rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .filter_map(|c| Certificate::from_der(c.as_ref()).ok())
            .collect();
        if !system.is_empty() {
            return (RootSource::System, system);
        }
        let bundled = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter_map(|c| Certificate::from_der(c.as_ref()).ok())
            .collect();
        (RootSource::Bundled, bundled)
    })
}

/// Where this process's trusted roots come from.
pub fn root_source() -> RootSource {
    roots().0
}

/// HTTP client options with the trusted roots and `ca_bundle` (PEM, one or more
/// certificates), then every client setting of the environment in the backend's own
/// variables (`K`, its config key, e.g. `AWS_PROXY_URL`; `client_key` picks the client
/// settings out of it), as the backend's `from_env` would have read them.
///
/// # Errors
/// `ca_bundle` holds no PEM certificate: the message says so.
pub(crate) fn client_options<K: std::str::FromStr>(
    ca_bundle: Option<&str>,
    denied: &[crate::deny::Cidr],
    client_key: impl Fn(K) -> Option<ClientConfigKey>,
) -> Result<ClientOptions, String> {
    let env_key = |name: &str| name.to_ascii_lowercase().parse().ok().and_then(&client_key);
    let mut options = ClientOptions::new().with_no_system_certificates(true);
    // Every connection's addresses are checked against the denied ranges.
    if !denied.is_empty() {
        options = options.with_dns_resolver(std::sync::Arc::new(crate::deny::DeniedResolver::new(
            denied,
        )));
    }
    for c in &roots().1 {
        options = options.with_root_certificate(c.clone());
    }
    if let Some(pem) = ca_bundle {
        let certs = Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| format!("the CA bundle is not PEM: {e}"))?;
        if certs.is_empty() {
            return Err(
                "the CA bundle holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)"
                    .into(),
            );
        }
        for c in certs {
            options = options.with_root_certificate(c);
        }
    }
    for (k, v) in std::env::vars() {
        if let Some(key) = env_key(&k) {
            options = options.with_config(key, v);
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_a_certificate_is_refused() {
        let none = |_: object_store::aws::AmazonS3ConfigKey| None;
        let e = client_options(Some("not a certificate"), &[], none).unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
        assert!(client_options(None, &[], none).is_ok());
    }
}
