//! The target's own credential.

use std::fmt;

use http::header::{AUTHORIZATION, HeaderName, HeaderValue};

use super::ClientError;

/// The credential the upstream client sends to its target.
///
/// Whatever credential the gateway's client sent is always dropped; this one
/// replaces it. `Debug` never prints the secret.
#[derive(Clone, Default)]
pub enum Auth {
    /// No credential (a local model server, a fake upstream).
    #[default]
    None,
    /// `Authorization: Bearer <secret>` (OpenAI and most compatible APIs).
    Bearer(String),
    /// A header of its own: `x-api-key` (Anthropic), `api-key` (Azure
    /// OpenAI), `x-goog-api-key` (Gemini).
    Header {
        /// The header name.
        name: HeaderName,
        /// The secret, sent verbatim as the header value.
        value: String,
    },
}

impl Auth {
    /// `Authorization: Bearer <secret>`.
    pub fn bearer(secret: impl Into<String>) -> Self {
        Self::Bearer(secret.into())
    }

    /// A credential in a header of its own.
    pub fn header(name: HeaderName, value: impl Into<String>) -> Self {
        Self::Header {
            name,
            value: value.into(),
        }
    }

    /// `x-api-key: <secret>` (Anthropic).
    pub fn x_api_key(secret: impl Into<String>) -> Self {
        Self::header(HeaderName::from_static("x-api-key"), secret)
    }

    /// `api-key: <secret>` (Azure OpenAI).
    pub fn api_key(secret: impl Into<String>) -> Self {
        Self::header(HeaderName::from_static("api-key"), secret)
    }

    /// The header to send, marked sensitive (never indexed by HPACK, shown
    /// as `Sensitive` by `HeaderValue`'s `Debug`).
    pub(crate) fn to_header(&self) -> Result<Option<(HeaderName, HeaderValue)>, ClientError> {
        let (name, text) = match self {
            Self::None => return Ok(None),
            Self::Bearer(secret) => (AUTHORIZATION, format!("Bearer {secret}")),
            Self::Header { name, value } => (name.clone(), value.clone()),
        };
        let mut value = HeaderValue::try_from(text).map_err(|_| ClientError::InvalidCredential)?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }

    /// What kind of credential this is, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Bearer(_) => "bearer",
            Self::Header { .. } => "header",
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Bearer(_) => f.debug_tuple("Bearer").field(&"[redacted]").finish(),
            Self::Header { name, .. } => f
                .debug_struct("Header")
                .field("name", name)
                .field("value", &"[redacted]")
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        for auth in [
            Auth::bearer("sk-very-secret"),
            Auth::x_api_key("sk-very-secret"),
            Auth::api_key("sk-very-secret"),
        ] {
            let text = format!("{auth:?}");
            assert!(!text.contains("very-secret"), "{text}");
            assert!(text.contains("[redacted]"), "{text}");
            let (_, value) = auth.to_header().unwrap().unwrap();
            assert!(value.is_sensitive());
            assert!(!format!("{value:?}").contains("very-secret"));
        }
    }

    #[test]
    fn headers_per_kind() {
        let (name, value) = Auth::bearer("k1").to_header().unwrap().unwrap();
        assert_eq!(name, AUTHORIZATION);
        assert_eq!(value, "Bearer k1");
        let (name, value) = Auth::x_api_key("k2").to_header().unwrap().unwrap();
        assert_eq!(name.as_str(), "x-api-key");
        assert_eq!(value, "k2");
        let (name, _) = Auth::api_key("k3").to_header().unwrap().unwrap();
        assert_eq!(name.as_str(), "api-key");
        assert!(Auth::None.to_header().unwrap().is_none());
    }

    #[test]
    fn a_secret_with_a_newline_is_rejected_without_echoing_it() {
        let err = Auth::bearer("sk-abc\r\nx-evil: 1").to_header().unwrap_err();
        assert!(matches!(err, ClientError::InvalidCredential));
        assert!(!err.to_string().contains("sk-abc"));
    }
}
