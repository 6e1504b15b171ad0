//! A session actor (E6): one per conversation. It tracks the session's requests and its idle
//! time; when no request has touched it for the idle timeout it tells the scheduler, which
//! (knowing no request of the session is on its way) frees the session's pinned cells and stops
//! it. The pinned cells themselves belong to the scheduler's policy
//! (`Scheduler::release_session`).

use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::ToSession;
use crate::scheduler::ToScheduler;

/// What `Engine::sessions` reports about one session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionInfo {
    pub id: String,
    /// Requests made in the session so far.
    pub requests: u64,
    /// Requests of the session running or waiting now.
    pub active: usize,
    /// Time since the session's last request ended (zero while one is active).
    pub idle: Duration,
    /// Tokens whose keys and values the session keeps in the cache.
    pub cached_tokens: usize,
}

pub struct SessionActor;

pub struct SessionArgs {
    pub id: String,
    pub idle_timeout: Duration,
    pub scheduler: ActorRef<ToScheduler>,
}

pub struct SessionState {
    args: SessionArgs,
    requests: u64,
    active: usize,
    last_used: Instant,
}

impl Actor for SessionActor {
    type Msg = ToSession;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(&self, me: ActorRef<ToSession>, args: SessionArgs) -> Result<SessionState, ActorProcessingErr> {
        // Check a few times per timeout, so a session outlives it by at most a quarter of it.
        let period = (args.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(10));
        me.send_interval(period, || ToSession::Tick);
        tracing::info!(session = args.id, "session started");
        Ok(SessionState { args, requests: 0, active: 0, last_used: Instant::now() })
    }

    async fn handle(
        &self,
        me: ActorRef<ToSession>,
        msg: ToSession,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToSession::Begin => {
                state.requests += 1;
                state.active += 1;
            }
            ToSession::End => {
                state.active = state.active.saturating_sub(1);
                state.last_used = Instant::now();
            }
            ToSession::Info { cached_tokens, reply } => {
                let idle = if state.active > 0 { Duration::ZERO } else { state.last_used.elapsed() };
                let _ = reply.send(SessionInfo {
                    id: state.args.id.clone(),
                    requests: state.requests,
                    active: state.active,
                    idle,
                    cached_tokens,
                });
            }
            ToSession::Tick => {
                if state.active == 0 && state.last_used.elapsed() >= state.args.idle_timeout {
                    let id = state.args.id.clone();
                    let _ = state.args.scheduler.send_message(ToScheduler::SessionIdle { id, actor: me.get_id() });
                }
            }
        }
        Ok(())
    }
}
