//! Trust and client identity: the rustls configuration a client uses.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::ClientError;

/// What a client trusts and presents; see the builder's trust methods.
#[derive(Debug, Clone)]
pub(crate) struct TlsOptions {
    /// The Mozilla roots compiled in (webpki-roots).
    pub(crate) webpki_roots: bool,
    /// The platform's trust store (rustls-native-certs: `SSL_CERT_FILE`,
    /// `SSL_CERT_DIR`, then the distribution's bundle).
    pub(crate) native_roots: bool,
    /// PEM bundles whose certificates are added to the roots.
    pub(crate) ca_files: Vec<PathBuf>,
    /// PEM certificate chain and PEM private key presented to the server.
    pub(crate) client_identity: Option<(PathBuf, PathBuf)>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        Self {
            webpki_roots: true,
            native_roots: false,
            ca_files: Vec::new(),
            client_identity: None,
        }
    }
}

impl TlsOptions {
    fn is_default(&self) -> bool {
        self.webpki_roots
            && !self.native_roots
            && self.ca_files.is_empty()
            && self.client_identity.is_none()
    }

    /// The rustls client configuration (ALPN is set by the connector).
    /// The default trust (webpki roots only) is built once per process.
    pub(crate) fn client_config(&self) -> Result<rustls::ClientConfig, ClientError> {
        if self.is_default() {
            return default_config();
        }
        let roots = self.roots()?;
        let builder = config_builder()?.with_root_certificates(roots);
        match &self.client_identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert_file, key_file)) => {
                let chain = read_certificates(cert_file).map_err(|reason| {
                    ClientError::ClientCertificate {
                        path: cert_file.clone(),
                        reason,
                    }
                })?;
                let key =
                    PrivateKeyDer::from_pem_file(key_file).map_err(|e| ClientError::ClientKey {
                        path: key_file.clone(),
                        reason: pem_reason(&e),
                    })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| ClientError::ClientKey {
                        path: key_file.clone(),
                        reason: format!("does not fit the certificate: {e}"),
                    })
            }
        }
    }

    fn roots(&self) -> Result<RootCertStore, ClientError> {
        let mut roots = RootCertStore::empty();
        if self.webpki_roots {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if self.native_roots {
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let detail = found
                    .errors
                    .first()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                return Err(ClientError::NativeRoots(format!(
                    "no usable certificate in the platform trust store{detail}"
                )));
            }
        }
        for path in &self.ca_files {
            let certs = read_certificates(path).map_err(|reason| ClientError::CaFile {
                path: path.clone(),
                reason,
            })?;
            for cert in certs {
                roots.add(cert).map_err(|e| ClientError::CaFile {
                    path: path.clone(),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
        }
        if roots.is_empty() {
            return Err(ClientError::NoTrustRoots);
        }
        Ok(roots)
    }
}

/// ring picked explicitly: the process default panics when another crate
/// in the build also enables aws-lc-rs.
fn config_builder()
-> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, ClientError> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))
}

/// The webpki roots compiled in, no client certificate: built once.
fn default_config() -> Result<rustls::ClientConfig, ClientError> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            config_builder()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(ClientError::Tls)
}

/// Every certificate of a PEM file; at least one.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_reason(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_reason(&e))?;
    if certs.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".to_owned());
    }
    Ok(certs)
}

/// The reason a PEM file could not be read; never its contents.
fn pem_reason(error: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match error {
        Error::Io(e) => format!("cannot read: {e}"),
        Error::NoItemsFound => "no matching PEM item in the file".to_owned(),
        _ => "not a valid PEM file".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_is_shared() {
        let a = TlsOptions::default().client_config().unwrap();
        let b = TlsOptions::default().client_config().unwrap();
        assert_eq!(a.alpn_protocols, b.alpn_protocols);
        assert!(!a.client_auth_cert_resolver.has_certs());
        assert!(!b.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn no_roots_at_all_is_an_error() {
        let options = TlsOptions {
            webpki_roots: false,
            ..TlsOptions::default()
        };
        assert!(matches!(
            options.client_config(),
            Err(ClientError::NoTrustRoots)
        ));
    }

    #[test]
    fn a_missing_ca_file_names_the_path() {
        let options = TlsOptions {
            ca_files: vec![PathBuf::from("/nonexistent/ca.pem")],
            ..TlsOptions::default()
        };
        let error = options.client_config().unwrap_err();
        assert!(matches!(error, ClientError::CaFile { .. }), "{error}");
        let text = error.to_string();
        assert!(text.contains("/nonexistent/ca.pem"), "{text}");
        assert!(text.contains("cannot read"), "{text}");
    }
}
