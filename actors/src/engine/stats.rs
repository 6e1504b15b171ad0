//! The engine's figures: load, cache, counters by finish reason, speculation, per replica.

use llaisys_model::KvDtype;

use crate::request::FinishReason;

/// A snapshot of the engine's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_cells_used: usize,
    pub kv_capacity: usize,
    /// The KV cache's element type, and the bytes its keys and values hold.
    #[serde(default)]
    pub kv_dtype: Option<KvDtype>,
    #[serde(default)]
    pub kv_bytes: usize,
    /// Cells kept for prefix reuse (included in `kv_cells_used`).
    pub kv_cells_cached: usize,
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub finished: FinishCounts,
    /// Live sessions.
    pub sessions: usize,
    /// Times a failed worker was replaced.
    pub worker_restarts: u64,
    /// Answers started over because they were a call written as text that no tool fits
    /// (`GenerateParams::text_retry`).
    #[serde(default)]
    pub text_call_retries: u64,
    pub speculative: SpeculativeStats,
}

/// Speculative decoding's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SpeculativeStats {
    /// Who proposes: `ngram` (prompt lookup) or `draft` (a draft model).
    pub proposer: &'static str,
    /// Tokens proposed, and how many of them were accepted.
    pub proposed: u64,
    pub accepted: u64,
}

impl<'de> serde::Deserialize<'de> for SpeculativeStats {
    /// The proposer's name read back into one of the proposers' own.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::cluster::wire::SpeculativeCounts::deserialize(d).map(Self::from)
    }
}

impl SpeculativeStats {
    pub fn rejected(&self) -> u64 {
        self.proposed - self.accepted
    }
}

impl EngineStats {
    /// Adds another replica's figures (capacities and counters add up).
    pub(crate) fn add(&mut self, o: &EngineStats) {
        self.running += o.running;
        self.waiting += o.waiting;
        self.kv_cells_used += o.kv_cells_used;
        self.kv_capacity += o.kv_capacity;
        self.kv_dtype = self.kv_dtype.or(o.kv_dtype);
        self.kv_bytes += o.kv_bytes;
        self.kv_cells_cached += o.kv_cells_cached;
        self.preemptions += o.preemptions;
        self.prefix_queries += o.prefix_queries;
        self.prefix_hits += o.prefix_hits;
        self.finished.add(&o.finished);
        self.sessions += o.sessions;
        self.worker_restarts += o.worker_restarts;
        self.text_call_retries += o.text_call_retries;
        self.speculative.proposer = o.speculative.proposer;
        self.speculative.proposed += o.speculative.proposed;
        self.speculative.accepted += o.speculative.accepted;
    }
}

/// One replica's figures: the device it runs on and its own stats.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaStats {
    /// The node it runs on (`local` outside a cluster).
    pub node: String,
    /// The device as `--device` spells it (`cpu`, `vulkan:0`).
    pub device: String,
    pub stats: EngineStats,
}

/// Requests finished so far, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct FinishCounts {
    pub stop: u64,
    pub length: u64,
    pub abort: u64,
    pub error: u64,
}

impl FinishCounts {
    pub fn total(&self) -> u64 {
        self.stop + self.length + self.abort + self.error
    }

    fn add(&mut self, o: &FinishCounts) {
        self.stop += o.stop;
        self.length += o.length;
        self.abort += o.abort;
        self.error += o.error;
    }

    pub(crate) fn count(&mut self, reason: FinishReason) {
        *match reason {
            FinishReason::Stop | FinishReason::ToolCalls => &mut self.stop,
            FinishReason::Length => &mut self.length,
            FinishReason::Abort => &mut self.abort,
            FinishReason::Error => &mut self.error,
        } += 1;
    }
}

/// `ReplicaStats::node` of an engine outside a cluster.
pub const LOCAL_NODE: &str = "local";
