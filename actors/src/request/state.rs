//! E2: the request state machine. Every transition is explicit, checked and logged with the
//! request id; an illegal one is an error and changes nothing.

use std::fmt;

/// A request's id, unique within one engine.
pub type RequestId = u64;

/// Why a request ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// An eos / stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Cancelled by id or by the client going away.
    Abort,
    /// The engine failed the request.
    Error,
    /// T3: it stopped after calling tools (OpenAI's `tool_calls`).
    ToolCalls,
}

impl FinishReason {
    /// The wire name: `stop`, `length`, `abort`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestState {
    /// Queued, no KV cells yet.
    Waiting,
    /// In the running batch (prefilling or decoding).
    Running,
    /// Its cells were taken back under memory pressure; it is recomputed when readmitted.
    Preempted,
    /// Reserved for disaggregated prefill: waiting for its KV from another instance.
    WaitingForRemoteKv,
    Finished(FinishReason),
}

impl fmt::Display for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Waiting => f.write_str("waiting"),
            Self::Running => f.write_str("running"),
            Self::Preempted => f.write_str("preempted"),
            Self::WaitingForRemoteKv => f.write_str("waiting_for_remote_kv"),
            Self::Finished(FinishReason::Stop | FinishReason::ToolCalls) => f.write_str("finished_stopped"),
            Self::Finished(r) => write!(
                f,
                "finished_{}",
                match r {
                    FinishReason::Length => "length",
                    FinishReason::Abort => "aborted",
                    _ => "error",
                }
            ),
        }
    }
}

/// A transition the state machine does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("request {id}: illegal transition {from} → {to}")]
pub struct IllegalTransition {
    pub id: RequestId,
    pub from: RequestState,
    pub to: RequestState,
}

impl RequestState {
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Finished(_))
    }

    /// Whether `self → to` is allowed. Only a running request finishes by stop or length;
    /// any unfinished request can be aborted or failed; nothing leaves a finished state.
    pub fn can_become(self, to: RequestState) -> bool {
        use RequestState::*;
        match (self, to) {
            (Finished(_), _) => false,
            (_, Finished(FinishReason::Abort | FinishReason::Error)) => true,
            (Running, Finished(_)) => true,
            (Waiting | Preempted, Running) => true,
            (Running, Preempted) => true,
            (Waiting, WaitingForRemoteKv) | (WaitingForRemoteKv, Waiting) => true,
            _ => false,
        }
    }

    /// Moves to `to` if allowed, logging the transition with the request id.
    pub fn transition(&mut self, id: RequestId, to: RequestState) -> Result<(), IllegalTransition> {
        if !self.can_become(to) {
            tracing::warn!(request_id = id, from = %self, to = %to, "illegal request transition rejected");
            return Err(IllegalTransition { id, from: *self, to });
        }
        tracing::info!(request_id = id, from = %self, to = %to, "request transition");
        *self = to;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FinishReason::*;
    use super::RequestState::*;
    use super::*;

    #[test]
    fn a_request_runs_is_preempted_resumes_and_finishes() {
        let mut s = Waiting;
        for to in [Running, Preempted, Running, Finished(Length)] {
            s.transition(7, to).unwrap();
        }
        assert_eq!(s, Finished(Length));
    }

    #[test]
    fn only_running_requests_finish_by_stop_or_length() {
        for from in [Waiting, Preempted, WaitingForRemoteKv] {
            for reason in [Stop, Length] {
                assert!(!from.can_become(Finished(reason)), "{from} → {reason:?}");
            }
            assert!(from.can_become(Finished(Abort)) && from.can_become(Finished(Error)), "{from}");
        }
    }

    #[test]
    fn finished_is_final_and_illegal_moves_change_nothing() {
        let mut s = Finished(Stop);
        let err = s.transition(3, Running).unwrap_err();
        assert_eq!(err.to_string(), "request 3: illegal transition finished_stopped → running");
        assert_eq!(s, Finished(Stop));
        let mut w = Waiting;
        assert!(w.transition(4, Preempted).is_err(), "a waiting request holds no cells to take back");
        assert_eq!(w, Waiting);
    }

    #[test]
    fn states_print_their_spec_names() {
        let names: Vec<String> = [
            Waiting,
            Running,
            Preempted,
            WaitingForRemoteKv,
            Finished(Stop),
            Finished(Length),
            Finished(Abort),
            Finished(Error),
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            names,
            [
                "waiting",
                "running",
                "preempted",
                "waiting_for_remote_kv",
                "finished_stopped",
                "finished_length",
                "finished_aborted",
                "finished_error"
            ]
        );
        assert_eq!([Stop, Length, Abort, Error].map(FinishReason::as_str), ["stop", "length", "abort", "error"]);
    }
}
