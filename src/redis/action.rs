//! [`RedisActionStore`]: action claims shared by every replica.

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, Script};
use serde_json::Value;

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use crate::action::{
    ActionId, ActionRecord, ActionState, ActionStore, ArgumentsDigest, BoxFuture, Claim,
    ClaimRequest, Claimed, Reconciliation, RunToken, StateKind, StoreError, StoredError,
    Transition,
};

/// How many attempt ids a record keeps (the most recent ones), as the
/// in-memory store does.
const MAX_ATTEMPTS_RECORDED: usize = 16;

/// The longest duration the script is given, in milliseconds (100 years).
/// Lua numbers are doubles (exact to 2^53) and `PEXPIRE` refuses anything
/// but an integer, so a configured `Duration::MAX` must not reach it as
/// `u64::MAX`; beyond this it reads as "very long".
const MAX_SCRIPT_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `d` in whole milliseconds for the script, capped at [`MAX_SCRIPT_MILLIS`].
fn script_millis(d: Duration) -> u64 {
    millis(d).min(MAX_SCRIPT_MILLIS)
}

/// An [`ActionStore`] on Redis: one claim holds across every replica.
///
/// Each method is one Lua script (one atomic round trip) on the action's
/// two keys, `{<prefix>:action:<id>}` (a hash) and
/// `{<prefix>:action:<id>}:attempts` (a list), which share a hash tag and
/// so a cluster slot. An id in a tenant's namespace
/// ([`ActionId::with_tenant`]) is under
/// `{<prefix>:taction:<tenant length>:<tenant>:<id>}` instead, so two
/// tenants' `call_0` are two records. The transitions are those of the trait's table, the
/// same as [`MemoryStore`](crate::action::MemoryStore)'s. Finished records
/// (succeeded, failed) expire after [`ttl`](Self::ttl); running and
/// unknown ones never do. Leases are measured on the Redis server's clock,
/// so the replicas' clocks need not agree.
///
/// Unreachable Redis is [`StoreError::Unavailable`]: the executor fails
/// closed and runs no effect without a claim. Redis' own memory limit
/// replaces the in-memory store's record bound.
pub struct RedisActionStore<C> {
    connection: C,
    prefix: String,
    ttl: Duration,
    script: Script,
}

impl<C> RedisActionStore<C> {
    /// Default time-to-live of finished records: 7 days, as
    /// [`MemoryStore::DEFAULT_TTL`](crate::action::MemoryStore::DEFAULT_TTL).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);
}

impl<C> RedisActionStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over `connection`, with the default prefix and the default
    /// time-to-live of finished records ([`DEFAULT_TTL`](Self::DEFAULT_TTL),
    /// 7 days).
    pub fn new(connection: C) -> Self {
        Self {
            connection,
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: Self::DEFAULT_TTL,
            script: Script::new(include_str!("action.lua")),
        }
    }

    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a finished record is kept (the tombstone): a resubmission
    /// within it is answered from the record, after it the effect runs
    /// again. At least 1 ms; durations beyond 100 years count as 100 years
    /// (Redis takes whole milliseconds, and Lua numbers are doubles).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// The record's and the attempts' keys. An id without a tenant keeps
    /// the key it always had; a tenant's id is under `taction:`, with the
    /// tenant's length first, so no (tenant, id) pair spells another's key.
    fn keys(&self, action_id: &ActionId) -> (String, String) {
        let record = match action_id.tenant() {
            None => format!("{{{}:action:{}}}", self.prefix, action_id.as_str()),
            Some(tenant) => format!(
                "{{{}:taction:{}:{tenant}:{}}}",
                self.prefix,
                tenant.len(),
                action_id.as_str()
            ),
        };
        let attempts = format!("{record}:attempts");
        (record, attempts)
    }

    /// Runs the script with `op` and its arguments.
    async fn call(
        &self,
        action_id: &ActionId,
        op: &str,
        attempt_id: Option<&str>,
        args: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let (record, attempts) = self.keys(action_id);
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(record)
            .key(attempts)
            .arg(op)
            .arg(script_millis(self.ttl))
            .arg(attempt_id.unwrap_or(""))
            .arg(MAX_ATTEMPTS_RECORDED);
        for arg in args {
            invocation.arg(arg);
        }
        let mut connection = self.connection.clone();
        invocation
            .invoke_async::<Vec<String>>(&mut connection)
            .await
            .map_err(store_error)
    }

    async fn claim_op(
        &self,
        request: &ClaimRequest,
        op: &str,
        extra: &[String],
    ) -> Result<Claimed, StoreError> {
        let mut args = vec![
            request.tool.clone(),
            script_millis(request.lease).to_string(),
            request
                .arguments
                .map(|digest| digest.to_string())
                .unwrap_or_default(),
        ];
        args.extend_from_slice(extra);
        let reply = self
            .call(&request.action_id, op, request.attempt_id.as_deref(), &args)
            .await?;
        claimed(request, &reply)
    }

    async fn report(
        &self,
        action_id: &ActionId,
        run: RunToken,
        attempt_id: Option<&str>,
        state: ActionState,
    ) -> Result<Transition, StoreError> {
        let retryable = matches!(
            state,
            ActionState::Failed {
                retryable: true,
                ..
            }
        );
        let args = [
            run.get().to_string(),
            state.kind().as_str().to_owned(),
            to_json(&state)?,
            u8::from(retryable).to_string(),
        ];
        let reply = self.call(action_id, "report", attempt_id, &args).await?;
        let fields = Fields::new(&reply)?;
        match fields.tag {
            "ok" => Ok(Transition::new(
                kind(fields.before)?,
                kind(fields.after)?,
                fields.run,
            )),
            "not_found" => Err(StoreError::NotFound {
                action_id: action_id.clone(),
            }),
            "conflict" => Err(StoreError::Conflict {
                action_id: action_id.clone(),
                run,
                current: fields.run,
                found: kind(fields.before)?,
            }),
            other => Err(unexpected(other)),
        }
    }
}

impl<C> fmt::Debug for RedisActionStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisActionStore")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Redis unreachable: [`StoreError::Unavailable`]; anything else Redis
/// answered: [`StoreError::Backend`].
fn store_error(error: RedisError) -> StoreError {
    if is_unavailable(&error) {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}

fn unexpected(what: &str) -> StoreError {
    StoreError::Backend(format!("unexpected reply from the action script: {what:?}").into())
}

fn to_json(state: &ActionState) -> Result<String, StoreError> {
    serde_json::to_string(state).map_err(|e| StoreError::Backend(Box::new(e)))
}

fn from_json(json: &str) -> Result<ActionState, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Backend(Box::new(e)))
}

fn kind(name: &str) -> Result<StateKind, StoreError> {
    Ok(match name {
        "not_started" | "" => StateKind::NotStarted,
        "running" => StateKind::Running,
        "succeeded" => StateKind::Succeeded,
        "failed" => StateKind::Failed,
        "unknown" => StateKind::Unknown,
        other => return Err(unexpected(other)),
    })
}

/// A script reply: `{tag, before, after, run, payload}`.
struct Fields<'a> {
    tag: &'a str,
    before: &'a str,
    after: &'a str,
    run: RunToken,
    payload: &'a str,
}

impl<'a> Fields<'a> {
    fn new(reply: &'a [String]) -> Result<Self, StoreError> {
        let [tag, before, after, run, payload] = reply else {
            return Err(unexpected(&reply.join(",")));
        };
        Ok(Self {
            tag,
            before,
            after,
            run: RunToken::new(run.parse().map_err(|_| unexpected(run))?),
            payload,
        })
    }

    fn transition(&self) -> Result<Option<Transition>, StoreError> {
        if self.after.is_empty() {
            return Ok(None);
        }
        Ok(Some(Transition::new(
            kind(self.before)?,
            kind(self.after)?,
            self.run,
        )))
    }
}

fn claimed(request: &ClaimRequest, reply: &[String]) -> Result<Claimed, StoreError> {
    let fields = Fields::new(reply)?;
    let run = fields.run;
    let claim = match fields.tag {
        "acquired" => Claim::Acquired { run },
        "in_progress" => Claim::InProgress { run },
        "unknown" => Claim::Unknown { run },
        "succeeded" => match from_json(fields.payload)? {
            ActionState::Succeeded { result } => Claim::Succeeded { result },
            _ => return Err(unexpected(fields.payload)),
        },
        "failed" => match from_json(fields.payload)? {
            ActionState::Failed { error, .. } => Claim::Failed { error },
            _ => return Err(unexpected(fields.payload)),
        },
        "arguments_differ" => {
            return Err(StoreError::ArgumentsDiffer {
                action_id: request.action_id.clone(),
            });
        }
        "tool_mismatch" => {
            return Err(StoreError::ToolMismatch {
                action_id: request.action_id.clone(),
                recorded: fields.payload.to_owned(),
                requested: request.tool.clone(),
            });
        }
        other => return Err(unexpected(other)),
    };
    Ok(Claimed {
        claim,
        transition: fields.transition()?,
    })
}

impl<C> ActionStore for RedisActionStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(self.claim_op(request, "claim", &[]))
    }

    fn complete<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: RunToken,
        attempt_id: Option<&'a str>,
        result: Value,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Succeeded { result },
        ))
    }

    fn fail<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: RunToken,
        attempt_id: Option<&'a str>,
        error: StoredError,
        retryable: bool,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Failed { error, retryable },
        ))
    }

    fn mark_unknown<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: RunToken,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(action_id, run, attempt_id, ActionState::Unknown))
    }

    fn resolve<'a>(
        &'a self,
        request: &'a ClaimRequest,
        run: RunToken,
        answer: Reconciliation,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(async move {
            let (name, json) = match answer {
                Reconciliation::StillUnknown => ("still_unknown", String::new()),
                Reconciliation::NotApplied => ("not_applied", String::new()),
                Reconciliation::Succeeded(result) => {
                    ("succeeded", to_json(&ActionState::Succeeded { result })?)
                }
            };
            let extra = [run.get().to_string(), name.to_owned(), json];
            self.claim_op(request, "resolve", &extra).await
        })
    }

    fn get<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<Option<ActionRecord>, StoreError>> {
        Box::pin(async move {
            let reply = self.call(action_id, "get", None, &[]).await?;
            match reply.split_first() {
                Some((tag, _)) if tag == "none" => Ok(None),
                Some((tag, rest)) if tag == "record" && rest.len() >= 4 => {
                    let state = from_json(&rest[1])?;
                    let run = RunToken::new(rest[2].parse().map_err(|_| unexpected(&rest[2]))?);
                    let arguments = match rest[3].as_str() {
                        "" => None,
                        hex => Some(ArgumentsDigest::from_hex(hex).ok_or_else(|| unexpected(hex))?),
                    };
                    Ok(Some(
                        ActionRecord::new(action_id.clone(), rest[0].clone(), state, run)
                            .with_attempts(rest[4..].iter().cloned())
                            .with_arguments_digest(arguments),
                    ))
                }
                _ => Err(unexpected(&reply.join(","))),
            }
        })
    }
}
