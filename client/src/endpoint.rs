//! The base URL and the rule joining a request's path onto it.

use std::fmt;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Uri};

use super::ClientError;

/// Where requests go: the base URL split into its parts, plus the prefix
/// stripped from request paths.
#[derive(Clone)]
pub(crate) struct Endpoint {
    scheme: Scheme,
    authority: Authority,
    /// Without a trailing `/`; empty for the root.
    base_path: Box<str>,
    /// Without the `?`.
    base_query: Option<Box<str>>,
    /// Starts with `/`, no trailing `/`.
    strip_prefix: Option<Box<str>>,
}

impl Endpoint {
    pub(crate) fn parse(base_url: &str, strip_prefix: Option<&str>) -> Result<Self, ClientError> {
        let uri: Uri = base_url
            .trim()
            .parse()
            .map_err(|e: http::uri::InvalidUri| ClientError::InvalidBaseUrl(e.to_string()))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::HTTP,
            Some("https") => Scheme::HTTPS,
            Some(other) => return Err(ClientError::UnsupportedScheme(other.to_owned())),
            None => {
                return Err(ClientError::InvalidBaseUrl(
                    "no scheme (expected http:// or https://)".to_owned(),
                ));
            }
        };
        let authority = uri.authority().cloned().ok_or(ClientError::MissingHost)?;
        if authority.as_str().contains('@') {
            return Err(ClientError::CredentialsInUrl);
        }
        if authority.host().is_empty() {
            return Err(ClientError::MissingHost);
        }
        let base_path = uri.path().trim_end_matches('/').into();
        let base_query = uri.query().filter(|q| !q.is_empty()).map(Into::into);
        let strip_prefix = strip_prefix
            .map(|p| p.trim_matches('/'))
            .filter(|p| !p.is_empty())
            .map(|p| format!("/{p}").into_boxed_str());
        Ok(Self {
            scheme,
            authority,
            base_path,
            base_query,
            strip_prefix,
        })
    }

    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// `http://host:port/` for a plain-`http` endpoint (what its own pool
    /// connects to); `None` for `https`.
    pub(crate) fn plain_origin(&self) -> Option<http::Uri> {
        if self.scheme != Scheme::HTTP {
            return None;
        }
        http::Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .ok()
    }

    /// The `host` header of a request to this endpoint, made once, as
    /// hyper-util makes it (the host, and the port unless it is the
    /// scheme's default): hyper-util would parse the URI's authority for it
    /// on every request. Plain `http` only: its connections are HTTP/1.1.
    /// An `https` one may be HTTP/2, which names the host in `:authority`
    /// and carries no `host`, so hyper-util keeps deciding there.
    pub(crate) fn host_header(&self) -> Option<HeaderValue> {
        if self.scheme != Scheme::HTTP {
            return None;
        }
        let host = self.authority.host();
        match self.authority.port_u16() {
            Some(port) if port != 80 => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
            _ => HeaderValue::from_str(host).ok(),
        }
    }

    /// The upstream URI for a request's path and query.
    ///
    /// The request path loses the strip prefix when it starts with it as
    /// whole segments (`/v1` and `/v1/...`, not `/v1beta`), and what is left
    /// is appended to the base path; the queries of both are joined with `&`.
    pub(crate) fn join(&self, request: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let path = request.map_or("/", PathAndQuery::path);
        let rest = match &self.strip_prefix {
            Some(prefix) => match path.strip_prefix(&**prefix) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
                _ => path,
            },
            None => path,
        };
        let query = request
            .and_then(PathAndQuery::query)
            .filter(|q| !q.is_empty());
        // The usual case (`/v1/...` onto a base path of `/v1`, no queries):
        // the joined path is the request's own, shared rather than built
        // and parsed again.
        if let Some(request) = request
            && request.query().is_none()
            && self.base_query.is_none()
            && self.strip_prefix.as_deref() == Some(&*self.base_path)
            && rest.len() < path.len()
        {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(self.scheme.clone());
            parts.authority = Some(self.authority.clone());
            parts.path_and_query = Some(request.clone());
            if let Ok(uri) = Uri::from_parts(parts) {
                return Ok(uri);
            }
        }
        let mut out = String::with_capacity(
            self.base_path.len()
                + rest.len()
                + 2
                + self.base_query.as_deref().map_or(0, str::len)
                + query.map_or(0, str::len),
        );
        out.push_str(&self.base_path);
        if !rest.is_empty() && !rest.starts_with('/') {
            out.push('/');
        }
        out.push_str(rest);
        if out.is_empty() {
            out.push('/');
        }
        match (self.base_query.as_deref(), query) {
            (Some(a), Some(b)) => {
                out.push('?');
                out.push_str(a);
                out.push('&');
                out.push_str(b);
            }
            (Some(q), None) | (None, Some(q)) => {
                out.push('?');
                out.push_str(q);
            }
            (None, None) => {}
        }
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(out)
            .build()
    }
}

impl fmt::Debug for Endpoint {
    // The query may carry a key (`?key=...`): shown as present, never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)?;
        if self.base_query.is_some() {
            f.write_str("?[redacted]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(base: &str, request: &str) -> String {
        let target = Endpoint::parse(base, Some("/v1")).unwrap();
        let pq: PathAndQuery = request.parse().unwrap();
        target.join(Some(&pq)).unwrap().to_string()
    }

    #[test]
    fn the_gateway_prefix_is_replaced_by_the_base_path() {
        let base = "http://127.0.0.1:9101/v1";
        let want = "http://127.0.0.1:9101/v1/chat/completions";
        assert_eq!(join(base, "/v1/chat/completions"), want);
        assert_eq!(join(base, "/chat/completions"), want);
        assert_eq!(
            join("http://127.0.0.1:9101/v1/", "/v1/chat/completions"),
            want
        );
        assert_eq!(
            join("http://127.0.0.1:9101/v1///", "/chat/completions"),
            want
        );
        assert_eq!(join(base, "/v1/models"), "http://127.0.0.1:9101/v1/models");
    }

    #[test]
    fn other_base_paths() {
        assert_eq!(
            join("https://api.openai.com/v1", "/v1/chat/completions"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            join(
                "https://generativelanguage.googleapis.com/v1beta/openai",
                "/v1/chat/completions"
            ),
            "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
        );
        // No base path: the rest of the request path goes to the root.
        assert_eq!(
            join("http://localhost:11434", "/v1/chat/completions"),
            "http://localhost:11434/chat/completions"
        );
        assert_eq!(join("http://h/", "/v1/chat"), "http://h/chat");
    }

    #[test]
    fn the_prefix_is_only_stripped_as_whole_segments() {
        assert_eq!(
            join("http://h/v1", "/v1beta/models"),
            "http://h/v1/v1beta/models"
        );
        assert_eq!(join("http://h/v1", "/v1"), "http://h/v1");
        assert_eq!(join("http://h/v1", "/v1/"), "http://h/v1/");
        assert_eq!(join("http://h/v1", "/"), "http://h/v1/");
        assert_eq!(join("http://h", "/v1"), "http://h/");
    }

    #[test]
    fn queries_of_base_and_request_are_joined() {
        let azure = "https://x.openai.azure.com/openai/deployments/gpt4o?api-version=2024-06-01";
        assert_eq!(
            join(azure, "/v1/chat/completions"),
            "https://x.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01"
        );
        assert_eq!(
            join(azure, "/v1/chat/completions?trace=1"),
            "https://x.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01&trace=1"
        );
        assert_eq!(
            join("http://h/v1", "/v1/chat/completions?a=1&b=2"),
            "http://h/v1/chat/completions?a=1&b=2"
        );
        assert_eq!(join("http://h/v1?", "/v1/models?"), "http://h/v1/models");
    }

    #[test]
    fn without_a_strip_prefix_the_whole_path_is_appended() {
        let target = Endpoint::parse("http://h/api", None).unwrap();
        let pq: PathAndQuery = "/v1/chat/completions".parse().unwrap();
        assert_eq!(
            target.join(Some(&pq)).unwrap().to_string(),
            "http://h/api/v1/chat/completions"
        );
        let target = Endpoint::parse("http://h/api", Some("/")).unwrap();
        assert_eq!(
            target.join(Some(&pq)).unwrap().to_string(),
            "http://h/api/v1/chat/completions"
        );
        let target = Endpoint::parse("http://h/api", Some("openai/v1/")).unwrap();
        let pq: PathAndQuery = "/openai/v1/models".parse().unwrap();
        assert_eq!(
            target.join(Some(&pq)).unwrap().to_string(),
            "http://h/api/models"
        );
        assert_eq!(target.join(None).unwrap().to_string(), "http://h/api/");
    }

    #[test]
    fn bad_base_urls_are_typed_errors() {
        assert!(matches!(
            Endpoint::parse("ftp://h/v1", None),
            Err(ClientError::UnsupportedScheme(s)) if s == "ftp"
        ));
        assert!(matches!(
            Endpoint::parse("/v1", None),
            Err(ClientError::InvalidBaseUrl(_))
        ));
        assert!(matches!(
            Endpoint::parse("http://user:sk-secret@h/v1", None),
            Err(ClientError::CredentialsInUrl)
        ));
        assert!(matches!(
            Endpoint::parse("not a url", None),
            Err(ClientError::InvalidBaseUrl(_))
        ));
        assert!(matches!(
            Endpoint::parse("", None),
            Err(ClientError::InvalidBaseUrl(_))
        ));
    }

    #[test]
    fn debug_hides_the_base_query() {
        let target = Endpoint::parse("https://h/v1beta/openai?key=AIzaSECRET", None).unwrap();
        let text = format!("{target:?}");
        assert_eq!(text, "https://h/v1beta/openai?[redacted]");
    }
}
