//! User overrides: change the class or the recovery for a status, a
//! provider code or a provider, without forking the crate.

use http::StatusCode;

use crate::{Decision, FailureClass};

/// One override rule: a match (status, provider code, provider name and/or
/// class; every criterion given must hold, an empty rule matches every
/// failure) and an effect (a new class, a new recovery, or both).
///
/// ```
/// use http::StatusCode;
/// use tower_llm_failover::{Decision, FailureClass, classify::Classifier, classify::Override};
///
/// let classifier = Classifier::new()
///     // A self-hosted proxy answers 400 when the model is still loading.
///     .with_override(Override {
///         when_status: Some(StatusCode::BAD_REQUEST),
///         when_provider: Some("local".into()),
///         class: Some(FailureClass::Overloaded),
///         ..Override::default()
///     })
///     // Never move on a content filter, even after a policy change upstream.
///     .with_override(Override {
///         when_code: Some("content_filter".into()),
///         recovery: Some(Decision::Stop),
///         ..Override::default()
///     })
///     // This provider's timeouts are not worth waiting for.
///     .with_override(Override {
///         when_provider: Some("slow-cloud".into()),
///         when_class: Some(FailureClass::Timeout),
///         recovery: Some(Decision::Reroute),
///         ..Override::default()
///     });
/// # let _ = classifier;
/// ```
///
/// Rules are checked in the order they were added. The class comes from the
/// first matching rule that sets one, matched against the class the contract
/// gave; the recovery comes from the first matching rule that sets one,
/// matched against the final class. Put narrower rules first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Override {
    /// Match failures with this HTTP status (head failures; in-band errors
    /// whose `code` names a status).
    pub when_status: Option<StatusCode>,
    /// Match failures whose body carries this code, type or status string
    /// (`error.code`, `error.type`, Gemini `status`, Anthropic
    /// `details.error_code`, Azure `innererror.code`, Gemini `ErrorInfo`
    /// reason, OpenRouter `metadata.error_type`); ASCII case-insensitive.
    pub when_code: Option<String>,
    /// Match failures of this provider (the name given to
    /// `ClassifyLayer::provider` or to the `classify_*` calls); ASCII
    /// case-insensitive.
    pub when_provider: Option<String>,
    /// Match failures of this class.
    pub when_class: Option<FailureClass>,
    /// Effect: classify matching failures as this class (the recovery
    /// becomes that class's default unless a rule sets one).
    pub class: Option<FailureClass>,
    /// Effect: recover from matching failures this way.
    pub recovery: Option<Decision>,
}

impl Override {
    pub(crate) fn new_class(&self) -> Option<FailureClass> {
        self.class
    }

    pub(crate) fn new_recovery(&self) -> Option<Decision> {
        self.recovery
    }

    /// Whether the rule's criteria all hold for a failure.
    pub(crate) fn matches(
        &self,
        provider: Option<&str>,
        status: Option<StatusCode>,
        codes: &[&str],
        class: FailureClass,
    ) -> bool {
        self.when_status.is_none_or(|s| status == Some(s))
            && self
                .when_provider
                .as_deref()
                .is_none_or(|p| provider.is_some_and(|q| q.eq_ignore_ascii_case(p)))
            && self
                .when_code
                .as_deref()
                .is_none_or(|c| codes.iter().any(|k| k.eq_ignore_ascii_case(c)))
            && self.when_class.is_none_or(|k| k == class)
    }
}
