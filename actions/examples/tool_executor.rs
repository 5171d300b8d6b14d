//! A fake payment effect behind the idempotent executor layer, run through
//! the ambiguity case: the charge is applied, its response is lost, the call
//! times out. Prints the action's state at each step.
//!
//! ```sh
//! cargo run --example tool_executor
//! RUST_LOG=tower_llm_failover=debug cargo run --example tool_executor   # every transition
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_actions::{
    ActionExecutorLayer, ActionId, ActionStore, BoxFuture, MemoryStore, Reconciler, Reconciliation,
    ToolCall, ToolSchemas,
};

/// The payment provider: charges keyed by idempotency key (our action id).
#[derive(Debug, Default)]
struct PaymentProvider {
    charges: Mutex<HashMap<ActionId, Value>>,
    applied: AtomicUsize,
    /// While set, the provider charges but its answer never arrives.
    lose_responses: AtomicBool,
}

impl PaymentProvider {
    async fn charge(&self, call: ToolCall) -> Result<Value, BoxError> {
        let receipt = json!({
            "charge_id": format!("ch_{}", call.action_id),
            "amount": call.arguments["amount"],
            "currency": call.arguments["currency"],
        });
        self.applied.fetch_add(1, Ordering::SeqCst);
        self.charges
            .lock()
            .map_err(|_| "provider state poisoned")?
            .insert(call.action_id.clone(), receipt.clone());
        if self.lose_responses.load(Ordering::SeqCst) {
            // The charge went through; the response is lost on the way back.
            std::future::pending::<()>().await;
        }
        Ok(receipt)
    }

    fn applied(&self) -> usize {
        self.applied.load(Ordering::SeqCst)
    }
}

/// Reconciles by looking the charge up by its idempotency key.
#[derive(Debug)]
struct LookupCharge(Arc<PaymentProvider>);

impl Reconciler for LookupCharge {
    fn reconcile<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> BoxFuture<'a, Result<Reconciliation, BoxError>> {
        Box::pin(async move {
            let charges = self
                .0
                .charges
                .lock()
                .map_err(|_| "provider state poisoned")?;
            Ok(match charges.get(&call.action_id) {
                Some(receipt) => Reconciliation::Succeeded(receipt.clone()),
                None => Reconciliation::NotApplied,
            })
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let provider = Arc::new(PaymentProvider::default());
    let store = Arc::new(MemoryStore::new());
    let schemas = ToolSchemas::new().with_tool(
        "charge_card",
        &json!({
            "type": "object",
            "properties": {
                "amount": { "type": "integer", "minimum": 1 },
                "currency": { "type": "string" }
            },
            "required": ["amount", "currency"]
        }),
    )?;
    let payment_service = {
        let provider = Arc::clone(&provider);
        service_fn(move |call: ToolCall| {
            let provider = Arc::clone(&provider);
            async move { provider.charge(call).await }
        })
    };
    let base = ActionExecutorLayer::new(store.clone())
        .schemas(schemas)
        .effect_timeout(Duration::from_millis(100));
    // Two executors on the same store: one without a reconciler, one with.
    let mut plain = ServiceBuilder::new()
        .layer(base.clone())
        .service(payment_service.clone());
    let mut reconciling = ServiceBuilder::new()
        .layer(base.reconciler(LookupCharge(Arc::clone(&provider))))
        .service(payment_service);

    let action_id = ActionId::from("order-847/charge");
    let call = |attempt: &str| {
        ToolCall::new(
            action_id.clone(),
            "charge_card",
            json!({ "amount": 4200, "currency": "eur" }),
        )
        .with_attempt_id(attempt)
    };
    let show = |step: &str, outcome: &dyn std::fmt::Display| {
        println!("{step}\n    -> {outcome}");
    };

    println!(
        "action {action_id}: {}  (charges applied: {})\n",
        store.state(&action_id).await?,
        provider.applied()
    );

    provider.lose_responses.store(true, Ordering::SeqCst);
    let first = plain.ready().await?.call(call("turn-1/primary")).await;
    show(
        "1. primary model proposes the charge; it is applied, the response is lost",
        &display(&first),
    );
    report(&store, &action_id, &provider).await?;

    provider.lose_responses.store(false, Ordering::SeqCst);
    let second = plain.ready().await?.call(call("turn-1/backup")).await;
    show(
        "2. backup model proposes the same charge (no reconciler)",
        &display(&second),
    );
    report(&store, &action_id, &provider).await?;

    let third = reconciling.ready().await?.call(call("turn-1/backup")).await;
    show(
        "3. same charge again, with a reconciler that asks the provider",
        &display(&third),
    );
    report(&store, &action_id, &provider).await?;

    let fourth = reconciling
        .ready()
        .await?
        .call(call("turn-2/primary"))
        .await;
    show(
        "4. a later turn proposes it once more: replayed from the store",
        &display(&fourth),
    );
    report(&store, &action_id, &provider).await?;

    if provider.applied() != 1 || fourth.is_err() {
        return Err("expected exactly one charge and a replayed receipt".into());
    }
    println!("\none charge applied across four proposals; no blind repeat.");
    Ok(())
}

fn display<E: std::fmt::Display>(outcome: &Result<Value, E>) -> String {
    match outcome {
        Ok(value) => format!("ok: {value}"),
        Err(error) => format!("error: {error}"),
    }
}

async fn report(
    store: &MemoryStore,
    action_id: &ActionId,
    provider: &PaymentProvider,
) -> Result<(), BoxError> {
    let record = store.get(action_id).await?;
    let (state, run, attempts) = match record {
        Some(record) => (record.state.to_string(), record.run.get(), record.attempts),
        None => ("not_started".to_owned(), 0, Vec::new()),
    };
    println!(
        "    state: {state}, run {run}, attempts {attempts:?}, charges applied: {}\n",
        provider.applied()
    );
    Ok(())
}
