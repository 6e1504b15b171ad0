//! The scheduler (E3–E6): the actor that owns a replica's live requests, sessions and worker,
//! and the policy it applies each step (continuous batching, KV admission and preemption,
//! prefix reuse, session pins).

mod actor;
mod cost;
mod messages;
mod policy;
mod sequence;
#[cfg(test)]
mod tests;

pub(crate) use actor::{IdSpace, SchedulerActor, SchedulerArgs, load_off_thread};
pub use messages::{ReplicaLoad, Retry, Submission, ToScheduler};
pub use policy::enqueue_by_priority;
pub use policy::{Finished, Outcome, PlanItem, PrefixCopy, Scheduler, StepPlan};
pub use sequence::Sequence;
