//! A rollout as one self-contained HTML page: a row per replaced node with
//! its phases on a shared time axis, the leader changes, and how many
//! replacements ran at once. It is drawn from the answers of Jaeger's query
//! API (`GET /api/traces`), so it works with any Jaeger that received
//! nodewarden's traces, including one built without the web UI.
//!
//! [`fetch_traces`] asks Jaeger; everything else is pure: [`parse_traces`]
//! reads its answers, [`build`] decides what the page shows, [`render`]
//! draws it. Data from Jaeger is never trusted: a trace or span lacking what the
//! timeline needs is left out. The `nodewarden-timeline` binary of the root
//! package runs it; this crate knows nothing of the operator but the names
//! of the spans it reads.
#![warn(missing_docs)]

mod fetch;
mod jaeger;
mod model;
mod page;

pub use fetch::{FetchError, fetch_traces};
pub use jaeger::{Process, Reference, Span, Tag, TimelineError, Trace, parse_traces, traces_query};
pub use model::{
    LeaderChange, Mark, MarkKind, Options, Phase, RolloutSpan, Row, Sent, Step, Timeline, build,
    choose_rollout, in_progress, leader_changes, replacement_rows, rollout_marks, rollout_spans,
};
pub use page::{escape, format_duration, render, tick_step};

/// The root span of a replacement, as nodewarden names it
/// (`nodewarden::telemetry::trace::REPLACE_NODE`; the binary's tests check
/// that the two agree).
pub const REPLACE_NODE: &str = "replace node";
/// The root span of a rollout, as nodewarden names it
/// (`nodewarden::telemetry::trace::ROLLOUT`).
pub const ROLLOUT: &str = "rollout";
/// A rollout's wave (`nodewarden::telemetry::trace::ROLLOUT_WAVE`).
pub const ROLLOUT_WAVE: &str = "rollout wave";
/// The soak after a wave (`nodewarden::telemetry::trace::WAVE_SOAK`).
pub const WAVE_SOAK: &str = "wave soak";
/// A failure domain's replacements (`nodewarden::telemetry::trace::ROLLOUT_DOMAIN`).
pub const ROLLOUT_DOMAIN: &str = "rollout domain";
/// The rollout halted (`nodewarden::telemetry::trace::ROLLOUT_HALTED`).
pub const ROLLOUT_HALTED: &str = "rollout halted";

#[cfg(test)]
mod tests;
