//! S5: Prometheus metrics through the `metrics` facade, named after vLLM's with a `llaisys_`
//! prefix and labelled by model. Each server owns its recorder (no global one), so several
//! servers, or tests, can live in one process. Engine gauges are read at scrape time.

use std::time::Duration;

use llaisys_actors::ReplicaStats;
use llaisys_actors::request::FinishReason;
use metrics::{Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

const METADATA: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, None);

/// Latency buckets in seconds, from 1 ms to 2 minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 120.0,
];

/// Grammar mask buckets in seconds, from 10 µs to 100 ms.
const MASK_BUCKETS: &[f64] = &[1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1];

/// Figures read from the engines at each scrape (a node that left has none).
const ENGINE_HELP: &[(&str, &str)] = &[
    ("llaisys_num_requests_running", "Requests in the engine's running batch."),
    ("llaisys_num_requests_waiting", "Requests waiting to be scheduled."),
    ("llaisys_kv_cache_usage_perc", "Fraction of KV-cache cells in use (1 = full)."),
    ("llaisys_kv_cache_cells_used", "KV-cache cells in use, cached prefixes included."),
    (
        "llaisys_kv_cache_bytes",
        "Bytes the KV cache holds (keys and values, labelled with their dtype, and linear-attention states).",
    ),
    ("llaisys_kv_cache_cells_cached", "KV-cache cells kept for prefix reuse and sessions."),
    ("llaisys_num_sessions", "Live sessions."),
    ("llaisys_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."),
    ("llaisys_prefix_cache_hits_total", "Prompt tokens found in the prefix cache."),
    ("llaisys_num_preemptions_total", "Sequences preempted for lack of KV cells."),
    ("llaisys_worker_restarts_total", "Failed workers replaced."),
    (
        "llaisys_text_call_retries_total",
        "Answers generated again: they were a tool call written as text that no offered tool fits.",
    ),
    ("llaisys_spec_decode_num_draft_tokens_total", "Tokens proposed for speculative decoding, by proposer."),
    ("llaisys_spec_decode_num_accepted_tokens_total", "Proposed tokens accepted, by proposer."),
    ("llaisys_spec_decode_num_rejected_tokens_total", "Proposed tokens rejected, by proposer."),
    ("llaisys_spec_decode_acceptance_rate", "Accepted over proposed tokens so far, by proposer."),
    ("llaisys_cluster_wire_bytes_total", "Cluster frame bytes this process sent and received, by direction."),
    ("llaisys_kernel_calls_total", "Linear-layer products this process ran, by kernel (a debug figure)."),
];

/// Figures the server counts as requests finish.
const REQUEST_HELP: &[(&str, &str)] = &[
    ("llaisys_prompt_tokens_total", "Prompt tokens of finished requests."),
    ("llaisys_generation_tokens_total", "Generated tokens."),
    ("llaisys_request_success_total", "Finished requests by finish reason."),
    ("llaisys_time_to_first_token_seconds", "Time from arrival to the first generated token."),
    ("llaisys_inter_token_latency_seconds", "Time between consecutive generated tokens of a request."),
    ("llaisys_e2e_request_latency_seconds", "Time from arrival to the last token."),
    ("llaisys_request_queue_time_seconds", "Time from arrival to the first scheduling."),
    ("llaisys_http_requests_total", "HTTP responses by route and status."),
    ("llaisys_request_errors_total", "Error responses by route and error type."),
    ("llaisys_constrained_requests_total", "Requests with a constraint (T1), by kind."),
    ("llaisys_grammar_mask_seconds", "Time to compute one token's grammar mask."),
    ("llaisys_embedding_inputs_total", "Inputs read as prefill-only work (embeddings, rerank's documents)."),
    ("llaisys_embedding_tokens_total", "Tokens embedded."),
    ("llaisys_embedding_latency_seconds", "Time to embed one request's inputs, once admitted."),
];

pub struct Metrics {
    recorder: PrometheusRecorder,
}

fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .expect("the bucket list is not empty")
        .set_buckets_for_metric(Matcher::Full("llaisys_grammar_mask_seconds".into()), MASK_BUCKETS)
        .expect("the bucket list is not empty")
        .build_recorder()
}

fn describe(recorder: &PrometheusRecorder, help: &[(&'static str, &'static str)]) {
    for (name, help) in help {
        recorder.describe_counter((*name).into(), None, (*help).into());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self { recorder: recorder() };
        describe(&m.recorder, REQUEST_HELP);
        m
    }

    fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
        Key::from_parts(name, labels.iter().map(|(k, v)| Label::new(*k, v.clone())).collect::<Vec<_>>())
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, String)], by: u64) {
        self.recorder.register_counter(&Self::key(name, labels), &METADATA).increment(by);
    }

    fn histogram(&self, name: &'static str, model: &str, value: Duration) {
        self.recorder
            .register_histogram(&Self::key(name, &[("model", model.into())]), &METADATA)
            .record(value.as_secs_f64());
    }

    /// One finished request (one choice).
    pub fn request_finished(&self, model: &str, reason: FinishReason, prompt: usize, generated: usize, e2e: Duration) {
        let m = || ("model", model.to_string());
        self.counter("llaisys_request_success_total", &[m(), ("finished_reason", reason.as_str().into())], 1);
        self.counter("llaisys_prompt_tokens_total", &[m()], prompt as u64);
        self.counter("llaisys_generation_tokens_total", &[m()], generated as u64);
        self.histogram("llaisys_e2e_request_latency_seconds", model, e2e);
    }

    /// An embedding request answered.
    pub fn embedded(&self, model: &str, inputs: usize, tokens: usize, latency: Duration) {
        self.counter("llaisys_embedding_inputs_total", &[("model", model.into())], inputs as u64);
        self.counter("llaisys_embedding_tokens_total", &[("model", model.into())], tokens as u64);
        self.histogram("llaisys_embedding_latency_seconds", model, latency);
    }

    pub fn first_token(&self, model: &str, ttft: Duration) {
        self.histogram("llaisys_time_to_first_token_seconds", model, ttft);
    }

    pub fn inter_token(&self, model: &str, gap: Duration) {
        self.histogram("llaisys_inter_token_latency_seconds", model, gap);
    }

    pub fn queue_time(&self, model: &str, queued: Duration) {
        self.histogram("llaisys_request_queue_time_seconds", model, queued);
    }

    /// A request accepted with a constraint of `kind` (json_schema, regex, tools, ...).
    pub fn constrained_request(&self, model: &str, kind: &str) {
        self.counter("llaisys_constrained_requests_total", &[("model", model.into()), ("kind", kind.into())], 1);
    }

    pub fn grammar_mask(&self, model: &str, time: Duration) {
        self.histogram("llaisys_grammar_mask_seconds", model, time);
    }

    /// An error response of `error_type` (`invalid_request`, `overloaded`, `worker_lost`, ...).
    pub fn request_error(&self, route: &str, error_type: &str) {
        self.counter("llaisys_request_errors_total", &[("route", route.into()), ("error_type", error_type.into())], 1);
    }

    pub fn http_response(&self, route: &str, status: u16) {
        self.counter("llaisys_http_requests_total", &[("route", route.into()), ("status", status.to_string())], 1);
    }

    /// The Prometheus text exposition: the server's counters, then `engines`' figures (each
    /// model's replicas, every node's in a cluster) read now, so that a node that left is gone.
    pub fn render(&self, engines: &[(&str, Vec<ReplicaStats>)]) -> String {
        let snapshot = Snapshot(recorder());
        describe(&snapshot.0, ENGINE_HELP);
        for (model, replicas) in engines {
            for (i, r) in replicas.iter().enumerate() {
                // The replica's index on its node.
                let index = replicas[..i].iter().filter(|o| o.node == r.node).count();
                snapshot.engine_stats(model, index, r);
            }
        }
        for (kernel, calls) in llaisys_model::kernels::calls() {
            let key = Self::key("llaisys_kernel_calls_total", &[("kernel", kernel.to_string())]);
            snapshot.0.register_counter(&key, &METADATA).absolute(calls);
        }
        let (sent, received) = llaisys_actors::cluster::wire::bytes();
        for (direction, bytes) in [("sent", sent), ("received", received)] {
            let key = Self::key("llaisys_cluster_wire_bytes_total", &[("direction", direction.to_string())]);
            snapshot.0.register_counter(&key, &METADATA).absolute(bytes);
        }
        format!("{}{}", self.recorder.handle().render(), snapshot.0.handle().render())
    }
}

/// A scrape's engine figures.
struct Snapshot(PrometheusRecorder);

impl Snapshot {
    /// One replica's own figures, labelled by model, node (`local` outside a cluster), device
    /// and replica index (two replicas can share a device).
    fn engine_stats(&self, model: &str, replica: usize, r: &ReplicaStats) {
        let s = &r.stats;
        let labels = [
            ("model", model.to_string()),
            ("node", r.node.clone()),
            ("device", r.device.clone()),
            ("replica", replica.to_string()),
        ];
        let gauge = |name, value: f64| self.0.register_gauge(&Metrics::key(name, &labels), &METADATA).set(value);
        gauge("llaisys_num_requests_running", s.running as f64);
        gauge("llaisys_num_requests_waiting", s.waiting as f64);
        gauge("llaisys_kv_cache_usage_perc", s.kv_cells_used as f64 / s.kv_capacity.max(1) as f64);
        gauge("llaisys_kv_cache_cells_used", s.kv_cells_used as f64);
        let dtype = s.kv_dtype.map_or("unknown", |d| d.name());
        let kv_labels = [&labels[..], &[("kv_dtype", dtype.to_string())]].concat();
        self.0.register_gauge(&Metrics::key("llaisys_kv_cache_bytes", &kv_labels), &METADATA).set(s.kv_bytes as f64);
        gauge("llaisys_kv_cache_cells_cached", s.kv_cells_cached as f64);
        gauge("llaisys_num_sessions", s.sessions as f64);
        let spec = &s.speculative;
        for (name, value) in [
            ("llaisys_prefix_cache_queries_total", s.prefix_queries),
            ("llaisys_prefix_cache_hits_total", s.prefix_hits),
            ("llaisys_num_preemptions_total", s.preemptions),
            ("llaisys_worker_restarts_total", s.worker_restarts),
            ("llaisys_text_call_retries_total", s.text_call_retries),
        ] {
            self.0.register_counter(&Metrics::key(name, &labels), &METADATA).absolute(value);
        }
        let mut labels = labels.to_vec();
        labels.push(("proposer", spec.proposer.to_string()));
        for (name, value) in [
            ("llaisys_spec_decode_num_draft_tokens_total", spec.proposed),
            ("llaisys_spec_decode_num_accepted_tokens_total", spec.accepted),
            ("llaisys_spec_decode_num_rejected_tokens_total", spec.rejected()),
        ] {
            self.0.register_counter(&Metrics::key(name, &labels), &METADATA).absolute(value);
        }
        let rate = spec.accepted as f64 / spec.proposed.max(1) as f64;
        self.0.register_gauge(&Metrics::key("llaisys_spec_decode_acceptance_rate", &labels), &METADATA).set(rate);
    }
}
