//! The session actor's messages.

use ractor::RpcReplyPort;

use super::actor::SessionInfo;

/// To a session actor.
pub enum ToSession {
    /// A request of the session was queued.
    Begin,
    /// A request of the session finished.
    End,
    /// Sent by the scheduler for `Engine::sessions`, with what the session keeps cached.
    Info { cached_tokens: usize, reply: RpcReplyPort<SessionInfo> },
    /// The actor's own timer: check the idle time.
    Tick,
}

impl ractor::Message for ToSession {}
