//! The scheduler's policy (E3, E4): pure, synchronous state the scheduler actor owns.

mod cost;
mod policy;
mod sequence;
#[cfg(test)]
mod tests;

pub use policy::{AdmissionError, Finished, Outcome, PlanItem, PrefixCopy, Scheduler, SchedulerConfig, StepPlan};
pub use sequence::{Sequence, StopConditions};
