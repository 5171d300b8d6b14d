//! Tower middleware for LLM gateways that put several OpenAI-compatible
//! providers behind one endpoint.
//!
//! The one rule everything here serves: **a request may move to another
//! provider only while nothing of the model's answer has reached the client.**
//! Once the first piece of model output is flushed the stream is committed to
//! one voice; a later failure ends it cleanly instead of splicing a second
//! model's answer onto the first.
//!
//! Modules:
//! - [`sse`]: incremental, zero-copy Server-Sent Events scanner.
//! - [`dialect`]: wire dialects (OpenAI chat chunks): commit detection,
//!   finish_reason, usage, in-band errors, terminal chunks.
//! - [`classify`]: failure classes from the providers' own contracts.
//! - [`stream`]: `StreamStateLayer`: commit tracking and clean termination.
//! - [`budget`]: `BudgetLayer`: one deadline, attempt cap and spend ceiling per turn.
//! - [`action`]: idempotent tool actions keyed by the application.
//! - [`client`]: `UpstreamClient`, the real upstream HTTP client (hyper,
//!   rustls; feature `client`, on by default).
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod action;
pub mod budget;
pub mod classify;
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client;
pub mod dialect;
pub mod sse;
pub mod stream;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
