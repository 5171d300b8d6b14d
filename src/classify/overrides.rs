//! User overrides: change the class or the recovery for a status, a
//! provider code or a provider, without forking the crate.

use http::StatusCode;

use crate::{Decision, FailureClass};

/// One override rule: a match (status, provider code, provider name and/or
/// class; every criterion given must hold) and an effect (a new class, a new
/// recovery, or both).
///
/// ```
/// use http::StatusCode;
/// use tower_llm_failover::{Decision, FailureClass, classify::Classifier, classify::Override};
///
/// let classifier = Classifier::new()
///     // A self-hosted proxy answers 400 when the model is still loading.
///     .with_override(Override::for_status(StatusCode::BAD_REQUEST).and_provider("local").class(FailureClass::Overloaded))
///     // Never move on a content filter, even after a policy change upstream.
///     .with_override(Override::for_code("content_filter").recovery(Decision::Stop))
///     // This provider's timeouts are not worth waiting for.
///     .with_override(Override::for_provider("slow-cloud").and_class(FailureClass::Timeout).recovery(Decision::Reroute));
/// # let _ = classifier;
/// ```
///
/// Rules are checked in the order they were added. The class comes from the
/// first matching rule that sets one, matched against the class the contract
/// gave; the recovery comes from the first matching rule that sets one,
/// matched against the final class. Put narrower rules first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    status: Option<StatusCode>,
    code: Option<String>,
    provider: Option<String>,
    class_is: Option<FailureClass>,
    set_class: Option<FailureClass>,
    set_recovery: Option<Decision>,
}

impl Override {
    fn empty() -> Self {
        Self {
            status: None,
            code: None,
            provider: None,
            class_is: None,
            set_class: None,
            set_recovery: None,
        }
    }

    /// Matches failures with this HTTP status (head failures; in-band
    /// errors whose `code` names a status).
    pub fn for_status(status: StatusCode) -> Self {
        Self::empty().and_status(status)
    }

    /// Matches failures whose body carries this code, type or status string
    /// (`error.code`, `error.type`, Gemini `status`, Anthropic
    /// `details.error_code`, Azure `innererror.code`, Gemini `ErrorInfo`
    /// reason, OpenRouter `metadata.error_type`); ASCII case-insensitive.
    pub fn for_code(code: impl Into<String>) -> Self {
        Self::empty().and_code(code)
    }

    /// Matches failures of this provider (the name given to
    /// `ClassifyLayer::provider` or to the `classify_*` calls); ASCII
    /// case-insensitive.
    pub fn for_provider(name: impl Into<String>) -> Self {
        Self::empty().and_provider(name)
    }

    /// Matches failures of this class.
    pub fn for_class(class: FailureClass) -> Self {
        Self::empty().and_class(class)
    }

    /// Also requires this status.
    pub(crate) fn and_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    /// Also requires this provider code.
    pub fn and_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Also requires this provider.
    pub fn and_provider(mut self, name: impl Into<String>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Also requires this class.
    pub fn and_class(mut self, class: FailureClass) -> Self {
        self.class_is = Some(class);
        self
    }

    /// Effect: classify matching failures as `class` (the recovery becomes
    /// that class's default unless a rule sets one).
    pub fn class(mut self, class: FailureClass) -> Self {
        self.set_class = Some(class);
        self
    }

    /// Effect: recover from matching failures with `recovery`.
    pub fn recovery(mut self, recovery: Decision) -> Self {
        self.set_recovery = Some(recovery);
        self
    }

    pub(crate) fn new_class(&self) -> Option<FailureClass> {
        self.set_class
    }

    pub(crate) fn new_recovery(&self) -> Option<Decision> {
        self.set_recovery
    }

    /// Whether the rule's criteria all hold for a failure.
    pub(crate) fn matches(
        &self,
        provider: Option<&str>,
        status: Option<StatusCode>,
        codes: &[&str],
        class: FailureClass,
    ) -> bool {
        self.status.is_none_or(|s| status == Some(s))
            && self
                .provider
                .as_deref()
                .is_none_or(|p| provider.is_some_and(|q| q.eq_ignore_ascii_case(p)))
            && self
                .code
                .as_deref()
                .is_none_or(|c| codes.iter().any(|k| k.eq_ignore_ascii_case(c)))
            && self.class_is.is_none_or(|k| k == class)
    }
}
