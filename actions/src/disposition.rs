//! What an executor's error means for the action.

/// What an error of the executor service says about the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// The effect was not applied and may run again on the next call
    /// (a declined-for-now, a rate limit). Stored as a retryable failure.
    Retryable,
    /// The effect was not applied and must not run again (invalid account,
    /// refused for good). Stored as a final failure and replayed.
    Final,
    /// The effect may or may not have been applied (connection reset after
    /// sending). Stored as unknown, to be reconciled.
    Unknown,
}

/// Decides the [`Disposition`] of an executor error of type `E`.
///
/// Implemented for closures `Fn(&E) -> Disposition`, and by
/// [`FinalOnError`], the default.
pub trait ClassifyEffectError<E> {
    /// The disposition of `error`.
    fn classify(&self, error: &E) -> Disposition;
}

impl<E, F> ClassifyEffectError<E> for F
where
    F: Fn(&E) -> Disposition,
{
    fn classify(&self, error: &E) -> Disposition {
        self(error)
    }
}

/// The default classifier: every executor error is a final failure, stored
/// and replayed, so nothing repeats an effect unless the application says
/// the error is [`Disposition::Retryable`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinalOnError;

impl<E> ClassifyEffectError<E> for FinalOnError {
    fn classify(&self, _error: &E) -> Disposition {
        Disposition::Final
    }
}
