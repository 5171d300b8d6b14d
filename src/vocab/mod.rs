//! The words every layer shares, at the bottom of the crate: what kind of
//! failure ([`FailureClass`]) and where it landed ([`Phase`]), what was
//! done about it ([`Decision`]), how a turn ended ([`TurnOutcome`],
//! [`StopReason`]), its id and deadline ([`TurnId`], [`TurnDeadline`]),
//! and what it spent ([`Usage`], [`Cost`]).
//!
//! Private: the items are published at the crate root, so no layer needs
//! another layer's module to speak of them.

mod decision;
mod failure;
mod turn;
mod usage;

pub use decision::Decision;
pub use failure::{FailureClass, Phase};
pub use turn::{DeadlineExceeded, StopReason, TurnDeadline, TurnId, TurnOutcome};
pub use usage::{Cost, Usage};
