//! [`RedisActionStore`]: action claims shared by every replica.

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, RedisError, Script, ServerErrorKind};
use serde_json::Value;

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use tower_llm_actions::{
    ActionId, ActionRecord, ActionState, ActionStore, ArgumentsDigest, BoxFuture, Claim,
    ClaimRequest, Claimed, FenceToken, Reconciliation, StateKind, StoreError, StoredError,
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
/// same as [`MemoryStore`](tower_llm_actions::MemoryStore)'s. Finished records
/// (succeeded, failed) expire after [`ttl`](Self::ttl); running and
/// unknown ones never do. Leases are measured on the Redis server's clock,
/// so the replicas' clocks need not agree.
///
/// Unreachable Redis is [`StoreError::Unavailable`]: the executor fails
/// closed and runs no effect without a claim. Redis' own memory limit
/// replaces the in-memory store's record bound.
///
/// # Replication
///
/// Redis acknowledges a write once the primary applied it; replication is
/// asynchronous. If the primary dies before a claim reached a replica and
/// that replica is promoted, the claim is lost and the action can be
/// claimed, and its effect run, again.
/// [`wait_for_replicas`](Self::wait_for_replicas) narrows that window: see
/// there for what it does and does not guarantee.
pub struct RedisActionStore<C> {
    connection: C,
    prefix: String,
    ttl: Duration,
    /// `WAIT` for this many replicas after each write (0: off).
    wait_replicas: u32,
    wait_timeout: Duration,
    script: Script,
}

impl<C> RedisActionStore<C> {
    /// Default time-to-live of finished records: 7 days, as
    /// [`MemoryStore::DEFAULT_TTL`](tower_llm_actions::MemoryStore::DEFAULT_TTL).
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
            wait_replicas: 0,
            wait_timeout: Duration::ZERO,
            script: Script::new(include_str!("action.lua")),
        }
    }

    /// After every claim, resolution and report that changed a record,
    /// waits (Redis `WAIT`, in the same pipeline as the write) until
    /// `replicas` replicas acknowledged it, at most `timeout`. Off by default
    /// (`replicas` 0).
    ///
    /// When fewer acknowledge in time, the store fails closed with
    /// [`StoreError::NotReplicated`]:
    ///
    /// - a **claim** that acquired a run gives it back (the record turns
    ///   failed-retryable, `not replicated`) and the executor runs no
    ///   effect; the same call may be made again;
    /// - any other changing claim or resolution (a running record past its
    ///   lease turning unknown, a reconciled result stored) stays written on
    ///   the primary, and the caller gets the error instead of the answer;
    /// - a **report** (the effect's outcome) stays written on the primary;
    ///   the effect has run, so the executor still returns its result and
    ///   logs the error.
    ///
    /// What it guarantees: a run handed out was held by `replicas` replicas
    /// when the effect started. If the primary then dies and one of them is
    /// promoted, the action is seen running (then unknown past its lease,
    /// and reconciled), never free to claim again.
    ///
    /// What it does not: Redis stays asynchronous. The failover may promote
    /// a replica that did not acknowledge (Sentinel and Cluster prefer the
    /// most up-to-date one, but do not promise it); acknowledged means in
    /// the replica's memory, not on its disk; a write that failed closed may
    /// still reach the replicas later; and a report whose wait fails can be
    /// lost with the primary, leaving the action running there, so unknown
    /// past its lease (reconciled, not repeated). Reads (replays) do not
    /// check the count, but wait with the write's pipeline, so a missing
    /// replica costs every claim up to `timeout`.
    ///
    /// `timeout` is at least 1 ms (`WAIT` with 0 would block for ever); keep
    /// it below the connection's response timeout (1 s with
    /// [`connect`](super::connect)), or the connection gives up first and the
    /// claim fails as [`StoreError::Unavailable`].
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = replicas;
        self.wait_timeout = timeout.max(Duration::from_millis(1));
        self
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

    /// Runs the script with `op` and its arguments; with
    /// [`wait_for_replicas`](Self::wait_for_replicas) set and `replicate`,
    /// also `WAIT`s in the same pipeline and returns how many replicas
    /// acknowledged.
    async fn call(
        &self,
        action_id: &ActionId,
        op: &str,
        attempt_id: Option<&str>,
        args: &[String],
        replicate: bool,
    ) -> Result<(Vec<String>, Option<u32>), StoreError> {
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
        if !replicate || self.wait_replicas == 0 {
            let reply = invocation
                .invoke_async::<Vec<String>>(&mut connection)
                .await
                .map_err(store_error)?;
            return Ok((reply, None));
        }
        // One pipeline on one connection: `WAIT` counts this connection's
        // writes, so the script and the wait must not be split by a reconnect.
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(self.wait_replicas).arg(millis(self.wait_timeout));
        let mut pipe = ::redis::pipe();
        pipe.invoke_script(&invocation).add_command(wait.clone());
        let answer = pipe
            .query_async::<(Vec<String>, u64)>(&mut connection)
            .await;
        let (reply, acknowledged) = match answer {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // First use on this server: load the script, then the same
                // pipeline. Nothing was written by the refused EVALSHA.
                let mut pipe = ::redis::pipe();
                pipe.load_script(&self.script)
                    .ignore()
                    .invoke_script(&invocation)
                    .add_command(wait);
                pipe.query_async::<(Vec<String>, u64)>(&mut connection)
                    .await
                    .map_err(store_error)?
            }
            other => other.map_err(store_error)?,
        };
        Ok((reply, Some(u32::try_from(acknowledged).unwrap_or(u32::MAX))))
    }

    /// The error for a write `acknowledged` replicas took, or `None` when
    /// it was enough (or nobody waited).
    fn short(&self, action_id: &ActionId, acknowledged: Option<u32>) -> Option<StoreError> {
        let acknowledged = acknowledged?;
        (acknowledged < self.wait_replicas).then(|| StoreError::NotReplicated {
            action_id: action_id.clone(),
            acknowledged,
            wanted: self.wait_replicas,
        })
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
        let (reply, acknowledged) = self
            .call(
                &request.action_id,
                op,
                request.attempt_id.as_deref(),
                &args,
                true,
            )
            .await?;
        let claimed = claimed(request, &reply)?;
        // Only a write needs its replicas: a replay or an in-progress
        // answer changed nothing that a failover could lose.
        if claimed.transition.is_some()
            && let Some(error) = self.short(&request.action_id, acknowledged)
        {
            if let Claim::Acquired { run } = claimed.claim {
                self.give_back(request, run).await;
            }
            return Err(error);
        }
        Ok(claimed)
    }

    /// Gives back run `run`, acquired but not replicated: it turns
    /// failed-retryable, so the next claim takes the next run, and no
    /// effect ran. Best effort: if this fails too, the record stays
    /// running, turns unknown past its lease and is reconciled.
    async fn give_back(&self, request: &ClaimRequest, run: FenceToken) {
        let state = ActionState::Failed {
            error: StoredError::new("claim not acknowledged by enough replicas; not run"),
            retryable: true,
        };
        let attempt_id = request.attempt_id.as_deref();
        if let Err(error) = self
            .report(&request.action_id, run, attempt_id, state, false)
            .await
        {
            tracing::warn!(
                action_id = ?request.action_id,
                run = run.get(),
                %error,
                "an unreplicated claim could not be given back; it turns unknown past its lease"
            );
        }
    }

    /// Stores run `run`'s outcome; `replicate`: waits for the replicas
    /// as configured.
    async fn report(
        &self,
        action_id: &ActionId,
        run: FenceToken,
        attempt_id: Option<&str>,
        state: ActionState,
        replicate: bool,
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
        let (reply, acknowledged) = self
            .call(action_id, "report", attempt_id, &args, replicate)
            .await?;
        let fields = Fields::new(&reply)?;
        match fields.tag {
            "ok" => match self.short(action_id, acknowledged) {
                Some(error) => Err(error),
                None => Ok(Transition::new(
                    kind(fields.before)?,
                    kind(fields.after)?,
                    fields.run,
                )),
            },
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
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
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
    run: FenceToken,
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
            run: FenceToken::new(run.parse().map_err(|_| unexpected(run))?),
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
    Ok(match fields.transition()? {
        Some(transition) => Claimed::changed(claim, transition),
        None => Claimed::read(claim),
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
        run: FenceToken,
        attempt_id: Option<&'a str>,
        result: Value,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Succeeded { result },
            true,
        ))
    }

    fn fail<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        error: StoredError,
        retryable: bool,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Failed { error, retryable },
            true,
        ))
    }

    fn mark_unknown<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(self.report(action_id, run, attempt_id, ActionState::Unknown, true))
    }

    fn resolve<'a>(
        &'a self,
        request: &'a ClaimRequest,
        run: FenceToken,
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
            let (reply, _) = self.call(action_id, "get", None, &[], false).await?;
            match reply.split_first() {
                Some((tag, _)) if tag == "none" => Ok(None),
                Some((tag, rest)) if tag == "record" && rest.len() >= 4 => {
                    let state = from_json(&rest[1])?;
                    let run = FenceToken::new(rest[2].parse().map_err(|_| unexpected(&rest[2]))?);
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
