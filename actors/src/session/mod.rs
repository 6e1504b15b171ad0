//! Sessions (E6): one actor per conversation, tracking its requests and its idle time; the
//! cells a session pins belong to the scheduler's policy (`Scheduler::release_session`).

mod actor;
mod messages;

pub use actor::{SessionActor, SessionArgs, SessionInfo};
pub use messages::ToSession;
