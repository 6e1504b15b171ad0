//! Admission to the engines: at most `limits.max_concurrent_requests` requests at once; the
//! others wait, at most `limits.max_queue` of them (past that: 429), and are let in by their
//! priority (lower first: a generation's `priority`, 0 for the rest), then in arrival order.
//! Under first come, first served every priority is 0, so the queue is a plain one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use llaisys_actors::enqueue_by_priority;
use tokio::sync::oneshot;

use super::error::ApiError;
use crate::config::AdmissionLimits;

/// The places in the engines and the queue for them.
pub struct Admission {
    limits: AdmissionLimits,
    state: Mutex<State>,
}

struct State {
    /// Places not held.
    free: usize,
    waiting: VecDeque<Waiter>,
    next_id: u64,
}

struct Waiter {
    id: u64,
    priority: i32,
    /// Told when a place is handed to it.
    admitted: oneshot::Sender<()>,
}

/// A place in the engines, given back when dropped (to the first waiter, if any).
pub struct Permit(Arc<Admission>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Admission {
    pub fn new(limits: AdmissionLimits) -> Arc<Self> {
        let state = State { free: limits.max_concurrent_requests, waiting: VecDeque::new(), next_id: 0 };
        Arc::new(Self { limits, state: Mutex::new(state) })
    }

    /// A place now, or once the requests before it in the queue have theirs; 429 when the
    /// queue is full.
    pub async fn admit(self: &Arc<Self>, priority: i32) -> Result<Permit, ApiError> {
        let (id, admitted) = {
            let mut state = self.state.lock().expect("admission lock");
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                return Ok(Permit(self.clone()));
            }
            if state.waiting.len() >= self.limits.max_queue {
                return Err(ApiError::overloaded(format!(
                    "the server is at its limit of {} concurrent requests and {} queued; retry later",
                    self.limits.max_concurrent_requests, self.limits.max_queue
                )));
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            enqueue_by_priority(&mut state.waiting, Waiter { id, priority, admitted: tx }, |w| w.priority, false);
            (id, rx)
        };
        // A waiter whose request goes away leaves the queue, or passes on the place it was
        // just handed.
        struct Leave<'a>(&'a Arc<Admission>, u64, bool);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if self.2 {
                    let mut state = self.0.state.lock().expect("admission lock");
                    match state.waiting.iter().position(|w| w.id == self.1) {
                        Some(i) => drop(state.waiting.remove(i)),
                        None => {
                            drop(state);
                            self.0.release();
                        }
                    }
                }
            }
        }
        let mut leave = Leave(self, id, true);
        let handed = admitted.await;
        leave.2 = false;
        handed.map(|()| Permit(self.clone())).map_err(|_| ApiError::shutting_down())
    }

    /// Hands a place back: to the first waiter still there, else to the free ones.
    fn release(&self) {
        let mut state = self.state.lock().expect("admission lock");
        while let Some(w) = state.waiting.pop_front() {
            if w.admitted.send(()).is_ok() {
                return;
            }
        }
        state.free += 1;
    }

    /// Places held now.
    pub fn in_use(&self) -> usize {
        let state = self.state.lock().expect("admission lock");
        self.limits.max_concurrent_requests - state.free
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn admission(places: usize, queue: usize) -> Arc<Admission> {
        Admission::new(AdmissionLimits { max_concurrent_requests: places, max_queue: queue })
    }

    /// Spawns a waiter that records its name once admitted and holds its place until told.
    fn waiter(
        a: &Arc<Admission>,
        priority: i32,
        name: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
    ) -> (tokio::task::JoinHandle<()>, oneshot::Sender<()>) {
        let (a, order) = (a.clone(), order.clone());
        let (done, hold) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _permit = a.admit(priority).await.unwrap();
            order.lock().unwrap().push(name);
            let _ = hold.await;
        });
        (task, done)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn waiters_are_let_in_by_priority_then_arrival() {
        let a = admission(1, 8);
        let first = a.admit(0).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut held = Vec::new();
        for (priority, name) in [(0, "b"), (5, "late"), (0, "c"), (-3, "urgent")] {
            held.push(waiter(&a, priority, name, &order));
            settle().await;
        }
        assert!(order.lock().unwrap().is_empty(), "one place, held");
        // Each lets the next in as soon as it is in.
        let (tasks, dones): (Vec<_>, Vec<_>) = held.into_iter().unzip();
        for done in dones {
            let _ = done.send(());
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["urgent", "b", "c", "late"]);
        assert_eq!(a.in_use(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_waiter_that_leaves_loses_no_place() {
        let a = admission(1, 1);
        let held = a.admit(0).await.unwrap();
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.admit(0).await.map(|_| ()) }
        });
        settle().await;
        let refused = a.admit(-10).await.err().expect("the queue is full");
        assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        waiting.abort();
        settle().await;
        assert_eq!(a.state.lock().unwrap().waiting.len(), 0, "the waiter that left is gone");
        drop(held);
        assert_eq!(a.in_use(), 0);
        let again = a.admit(0).await.unwrap();
        assert_eq!(a.in_use(), 1);
        // A waiter handed the place as it goes away passes it on.
        let mut leaving = Box::pin(a.admit(0));
        assert!(futures_util::FutureExt::now_or_never(&mut leaving).is_none(), "it waits");
        drop(again);
        assert_eq!((a.in_use(), a.state.lock().unwrap().waiting.len()), (1, 0), "handed to the waiter");
        drop(leaving);
        assert_eq!(a.in_use(), 0);
    }
}
