//! Prefill-only work (embeddings, a reranker's verdicts) waiting for the worker, batched across
//! requests: each pass takes the oldest job and every other queued job that reads out the same
//! way, while the pass stays within [`MAX_TOKENS`] and [`MAX_SEQ`] inputs. Jobs that arrive
//! while a pass runs wait for the next one, so under load many small requests share one
//! forward pass (one read of the weights) instead of taking one pass each.

use std::collections::VecDeque;

use llaisys_model::kv::MAX_SEQ;
use llaisys_model::{Context, DecodeError, Readout};
use ractor::RpcReplyPort;

/// The most tokens one pass reads out: long requests are split into passes of this size by the
/// engine, so the decoding sequences on the same worker never wait long between steps.
pub(crate) const MAX_TOKENS: usize = 2048;

/// Whether a pass holding `inputs` inputs of `tokens` tokens in all can take one more input of
/// `len` tokens (an empty pass takes anything).
pub(crate) fn has_room(inputs: usize, tokens: usize, len: usize) -> bool {
    inputs == 0 || (tokens + len <= MAX_TOKENS && inputs < MAX_SEQ)
}

pub(crate) type Reply = RpcReplyPort<Result<Vec<Vec<f32>>, DecodeError>>;

/// One caller's inputs (already within the limits of one pass), answered once they ran.
pub(crate) struct Job {
    pub inputs: Vec<Vec<u32>>,
    pub readout: Readout,
    pub reply: Reply,
}

impl Job {
    fn tokens(&self) -> usize {
        self.inputs.iter().map(Vec::len).sum()
    }
}

/// The jobs waiting for a pass, oldest first.
#[derive(Default)]
pub(crate) struct Queue {
    jobs: VecDeque<Job>,
}

impl Queue {
    pub fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The next pass: the oldest job, and the later ones with the same read-out that fit.
    /// Jobs whose caller went away are dropped.
    pub fn next_pass(&mut self) -> Option<Pass> {
        self.jobs.retain(|job| !job.reply.is_closed());
        let first = self.jobs.pop_front()?;
        let (mut inputs, mut tokens) = (first.inputs.len(), first.tokens());
        let mut jobs = vec![first];
        let mut k = 0;
        while k < self.jobs.len() {
            let job = &self.jobs[k];
            let fits = job.readout == jobs[0].readout
                && job
                    .inputs
                    .iter()
                    .try_fold((inputs, tokens), |(n, t), i| has_room(n, t, i.len()).then(|| (n + 1, t + i.len())))
                    .is_some();
            if fits {
                let job = self.jobs.remove(k).expect("in range");
                (inputs, tokens) = (inputs + job.inputs.len(), tokens + job.tokens());
                jobs.push(job);
            } else {
                k += 1;
            }
        }
        Some(Pass { jobs })
    }
}

/// Jobs that run as one forward pass.
pub(crate) struct Pass {
    jobs: Vec<Job>,
}

impl Pass {
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Runs the pass on `ctx` and answers each job with its own inputs' rows. If the merged pass
    /// fails, each job runs alone, so one caller's bad input fails only that caller.
    pub fn run(self, ctx: &Context) {
        let mut jobs = self.jobs;
        if jobs.len() == 1 {
            let job = jobs.pop().expect("one job");
            let _ = job.reply.send(ctx.readouts(&job.inputs, &job.readout));
            return;
        }
        let inputs: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        match ctx.readouts(&inputs, &jobs[0].readout) {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                for job in jobs {
                    let _ = job.reply.send(Ok(rows.by_ref().take(job.inputs.len()).collect()));
                }
            }
            Err(_) => {
                for job in jobs {
                    let _ = job.reply.send(ctx.readouts(&job.inputs, &job.readout));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use llaisys_model::mock::Mock;
    use llaisys_model::{Device, Pooling};
    use tokio::sync::oneshot;

    use super::*;

    type Answer = oneshot::Receiver<Result<Vec<Vec<f32>>, DecodeError>>;

    fn job(inputs: &[&[u32]], readout: &Readout) -> (Job, Answer) {
        let (tx, rx) = oneshot::channel();
        let inputs = inputs.iter().map(|i| i.to_vec()).collect();
        (Job { inputs, readout: readout.clone(), reply: tx.into() }, rx)
    }

    fn sizes(pass: &Pass) -> Vec<usize> {
        pass.jobs.iter().map(|j| j.inputs.len()).collect()
    }

    #[test]
    fn a_pass_takes_the_oldest_job_and_the_later_ones_that_read_out_alike() {
        let (last, mean) = (Readout::Pooled(Pooling::Last), Readout::Pooled(Pooling::Mean));
        let mut queue = Queue::default();
        let mut answers = Vec::new();
        for (inputs, readout) in [(&[&[1u32, 2][..]][..], &last), (&[&[3], &[4, 5]], &mean), (&[&[6, 7, 8]], &last)] {
            let (j, rx) = job(inputs, readout);
            queue.push(j);
            answers.push(rx);
        }
        let pass = queue.next_pass().expect("queued");
        assert_eq!((sizes(&pass), &pass.jobs[0].readout), (vec![1, 1], &last), "the mean job waits");
        let pass = queue.next_pass().expect("the mean job is left");
        assert_eq!((sizes(&pass), &pass.jobs[0].readout), (vec![2], &mean));
        assert!(queue.next_pass().is_none());
    }

    #[test]
    fn a_pass_stays_within_its_token_and_input_limits() {
        let readout = Readout::Pooled(Pooling::Last);
        let mut queue = Queue::default();
        let long = vec![1u32; MAX_TOKENS - 10];
        let mut answers = Vec::new();
        for inputs in [vec![&long[..]], vec![&[2u32; 11][..]], vec![&[3u32; 10][..]]] {
            let (j, rx) = job(&inputs, &readout);
            queue.push(j);
            answers.push(rx);
        }
        let tokens = |p: &Pass| p.jobs.iter().map(Job::tokens).sum::<usize>();
        let pass = queue.next_pass().expect("queued");
        assert_eq!(tokens(&pass), MAX_TOKENS, "11 tokens do not fit, the 10 after them do");
        assert_eq!(tokens(&queue.next_pass().expect("left")), 11);

        let one = [5u32];
        let many: Vec<&[u32]> = vec![&one[..]; MAX_SEQ - 1];
        for inputs in [many, vec![&one[..], &one[..]], vec![&one[..]]] {
            let (j, rx) = job(&inputs, &readout);
            queue.push(j);
            answers.push(rx);
        }
        let pass = queue.next_pass().expect("queued");
        assert_eq!(sizes(&pass), vec![MAX_SEQ - 1, 1], "two inputs do not fit beside the first job, one does");
    }

    #[test]
    fn jobs_whose_caller_left_are_dropped() {
        let readout = Readout::Pooled(Pooling::Last);
        let mut queue = Queue::default();
        let (gone, rx) = job(&[&[1]], &readout);
        drop(rx);
        queue.push(gone);
        let (kept, _rx) = job(&[&[2, 3]], &readout);
        queue.push(kept);
        let pass = queue.next_pass().expect("one caller waits");
        assert_eq!(pass.jobs.iter().map(Job::tokens).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn a_shared_pass_answers_each_caller_as_a_pass_of_its_own_would() {
        let readout = Readout::Logits(vec![0, 3, 7]);
        let inputs: [&[&[u32]]; 3] = [&[&[1, 2, 3]], &[&[9], &[4, 4, 4, 4]], &[&[6, 5]]];
        let model = Mock::new(16, 256, vec![], Some(13), &Device::flex());
        let ctx = Context::new(Box::new(model), 64);
        let alone: Vec<_> =
            inputs.iter().map(|i| ctx.readouts(&job(i, &readout).0.inputs, &readout).unwrap()).collect();

        let mut queue = Queue::default();
        let answers: Vec<Answer> = inputs
            .iter()
            .map(|i| {
                let (j, rx) = job(i, &readout);
                queue.push(j);
                rx
            })
            .collect();
        let pass = queue.next_pass().expect("queued");
        assert_eq!(pass.jobs(), 3);
        pass.run(&ctx);
        for (rx, alone) in answers.into_iter().zip(alone) {
            assert_eq!(rx.blocking_recv().unwrap().unwrap(), alone);
        }

        // A job the model fails on fails alone; the others still get their rows.
        let bad: &[&[u32]] = &[&[2, 13]];
        let mut answers = Vec::new();
        for i in [inputs[0], bad, inputs[2]] {
            let (j, rx) = job(i, &readout);
            queue.push(j);
            answers.push(rx);
        }
        queue.next_pass().expect("queued").run(&ctx);
        let results: Vec<_> = answers.into_iter().map(|rx| rx.blocking_recv().unwrap()).collect();
        assert!(matches!(&results[1], Err(DecodeError::Internal(e)) if e.contains("13")), "{:?}", results[1]);
        assert_eq!(results[0].as_ref().unwrap(), &ctx.readouts(&[vec![1, 2, 3]], &readout).unwrap());
        assert_eq!(results[2].as_ref().unwrap(), &ctx.readouts(&[vec![6, 5]], &readout).unwrap());
    }
}
