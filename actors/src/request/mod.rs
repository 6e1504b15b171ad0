//! A request's own logic: its lifecycle and what of its text may be shown.

mod state;
mod stop;
mod text;
mod tools;

pub use state::{FinishReason, IllegalTransition, RequestId, RequestState};
pub use stop::{StopMatcher, StopOutcome};
pub use text::{Piece, TextStream};
pub use tools::{Route, ToolCallDelta, ToolCallOut, ToolCallParser, ToolCallTags, ToolParsing};
