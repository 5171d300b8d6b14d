//! An OpenAI- and Anthropic-compatible LLM gateway on axum, built on
//! `tower-llm-failover`: zero-token failover between providers, per-turn
//! budgets, client keys and their limits, shared state on Redis, and logs,
//! Prometheus metrics and OTLP export.
//!
//! The binary `tower-llm-gateway` (`cargo run --release -p
//! tower-llm-gateway -- --config gw.toml`) reads a TOML [`app::Config`],
//! builds the [`app::Gateway`] and serves it thread per core with
//! [`app::serve_sharded`] ([`app::serve`] serves on the caller's runtime,
//! as the package's tests do). The
//! modules are public for the binary, the package's tests and its benches;
//! the configuration reference is the package's README.
//!
//! ```no_run
//! # async fn run() -> Result<(), String> {
//! use tower_llm_gateway::app::{self, Config, Gateway};
//!
//! let config = Config::from_toml(
//!     r#"
//! [[providers]]
//! name = "openai"
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"
//! "#,
//! )?;
//! let gateway = Gateway::from_config(&config)?;
//! let listener = tokio::net::TcpListener::bind(&config.listen)
//!     .await
//!     .map_err(|e| e.to_string())?;
//! let running = app::serve(gateway, listener);
//! app::shutdown_signal().await;
//! running.shutdown(std::time::Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```

pub mod app;
mod drain;
mod front;
pub mod head_timeout;
pub mod keys;
pub mod log_line;
pub mod log_writer;
pub mod messages;
pub mod repoll;
pub mod serve;
pub mod state;
pub mod telemetry;
