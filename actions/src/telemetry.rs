//! Names of the executor's metrics and span attributes, and their
//! descriptions for the installed recorder.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `failover.actions` | counter: every tool-action state change | `failover.action.state` (entered: `running`, `succeeded`, `failed`, `unknown`), `failover.action.cause` (`claim`, `complete`, `fail`, `effect_error`, `timeout`, `dropped`, `reconcile`) |
//! | `failover.action.replays` | counter: calls answered from the record, effect not run | `failover.action.state` (`succeeded`, `failed`) |
//! | `failover.action.reconciliations` | counter | `failover.action.answer` (`succeeded`, `not_applied`, `still_unknown`, `error`) |

/// Label names.
pub(crate) mod attr {
    /// The state a tool action entered (`running`, `succeeded`, `failed`,
    /// `unknown`), or was found in when answered from the store.
    pub(crate) const FAILOVER_ACTION_STATE: &str = "failover.action.state";
    /// What moved a tool action: `claim` (started, or a lapsed lease
    /// turned unknown), `complete`, `fail`, `effect_error`, `timeout`,
    /// `dropped`, `reconcile`.
    pub(crate) const FAILOVER_ACTION_CAUSE: &str = "failover.action.cause";
    /// A reconciler's answer: `succeeded`, `not_applied`, `still_unknown`,
    /// `error`.
    pub(crate) const FAILOVER_ACTION_ANSWER: &str = "failover.action.answer";
}

/// Metric names.
pub(crate) mod metric {
    /// Counter: tool-action state changes, by the state entered and the
    /// cause.
    pub(crate) const ACTIONS: &str = "failover.actions";
    /// Counter: tool-action calls answered from the store's record
    /// (a stored result or final error replayed, the effect not run).
    pub(crate) const ACTION_REPLAYS: &str = "failover.action.replays";
    /// Counter: reconciler answers about actions in state unknown.
    pub(crate) const ACTION_RECONCILIATIONS: &str = "failover.action.reconciliations";
}

/// Describes the executor's metrics (help text) to the installed recorder;
/// call once after installing it, beside
/// `tower_llm_failover::observe::describe_metrics`.
pub fn describe_metrics() {
    metrics::describe_counter!(
        metric::ACTIONS,
        "Tool-action state changes, by the state entered and the cause."
    );
    metrics::describe_counter!(
        metric::ACTION_REPLAYS,
        "Tool-action calls answered from the stored record, by state."
    );
    metrics::describe_counter!(
        metric::ACTION_RECONCILIATIONS,
        "Reconciler answers about unknown tool actions."
    );
}
