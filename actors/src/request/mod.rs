//! A request (E2, E7): its actor, which turns sampled tokens into its client's events, and its
//! own logic: its lifecycle and what of its text may be shown.

mod actor;
mod harmony;
mod messages;
mod postprocess;
mod reasoning;
mod state;
mod stop;
mod text;
mod tools;

pub(crate) use actor::{RequestActor, RequestArgs};
pub use harmony::{HarmonyParsing, HarmonySplit, HarmonyTags};
pub use messages::ToRequest;
pub use postprocess::Postprocess;
pub use reasoning::{Part, ReasoningParsing, ReasoningSplit, ReasoningTags};
pub use state::{FinishReason, IllegalTransition, RequestId, RequestState};
pub use stop::{StopMatcher, StopOutcome};
pub use text::{Piece, TextStream};
pub use tools::{
    Emit, Route, TextCallSpec, TextCallTool, TextCalls, ToolCallDelta, ToolCallOut, ToolCallParser, ToolCallTags,
    ToolParsing, XmlTools,
};
