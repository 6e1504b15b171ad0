//! The placer actor (D2), started when an engine has several replicas: it owns the placement
//! policy's state (prefix trees, session pins) and forwards each submitted request to the
//! replica the policy picks. Replicas publish their load on a watch channel after every message
//! they handle; requests routed to a replica that it has not yet received count as its load too,
//! so a burst of submissions spreads instead of landing where the last published load was low.

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;

use super::messages::ToPlacer;
use super::policy::{Load, Placement, PlacementConfig};
use crate::engine::EngineError;
use crate::scheduler::{ReplicaLoad, ToScheduler};

pub struct PlacerActor;

/// A replica as the placer sees it.
pub struct Target {
    pub scheduler: ActorRef<ToScheduler>,
    pub load: watch::Receiver<ReplicaLoad>,
}

pub struct PlacerArgs {
    pub targets: Vec<Target>,
    pub config: PlacementConfig,
}

pub struct PlacerState {
    targets: Vec<Target>,
    /// Requests forwarded to each replica so far.
    routed: Vec<u64>,
    placement: Placement<usize>,
}

impl Actor for PlacerActor {
    type Msg = ToPlacer;
    type State = PlacerState;
    type Arguments = PlacerArgs;

    async fn pre_start(&self, _: ActorRef<ToPlacer>, args: PlacerArgs) -> Result<PlacerState, ActorProcessingErr> {
        let routed = vec![0; args.targets.len()];
        Ok(PlacerState { targets: args.targets, routed, placement: Placement::new(args.config) })
    }

    async fn handle(
        &self,
        _: ActorRef<ToPlacer>,
        msg: ToPlacer,
        state: &mut PlacerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToPlacer::Submit(submission) => {
                let loads: Vec<(usize, Load)> = (0..state.targets.len()).map(|i| (i, state.load(i))).collect();
                let choice = &submission.choice;
                match state.placement.place(choice.prompt(), choice.session(), &loads) {
                    Some((i, reason)) => {
                        tracing::debug!(replica = i, reason = reason.as_str(), "request placed");
                        state.routed[i] += 1;
                        if let Err(e) = state.targets[i].scheduler.send_message(ToScheduler::Submit(submission)) {
                            // The replica's actor is gone: the message, reply port included, is
                            // dropped with the error, which the caller sees as a failed call.
                            tracing::error!(replica = i, error = %e, "replica unreachable");
                        }
                    }
                    None => {
                        let _ = submission.reply.send(Err(EngineError::NoReplica));
                    }
                }
            }
            ToPlacer::ForgetSession(id) => state.placement.forget_session(&id),
        }
        Ok(())
    }
}

impl PlacerState {
    fn load(&self, i: usize) -> Load {
        let seen = *self.targets[i].load.borrow();
        let unseen = self.routed[i].saturating_sub(seen.received) as usize;
        Load { requests: seen.held + unseen, available: seen.available }
    }
}
