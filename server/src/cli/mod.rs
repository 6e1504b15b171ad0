//! Subcommands of `llaisys`.

mod bench;
mod generate;
mod perplexity;
mod run_batch;
mod serve;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "llaisys", version, about = "A serving runtime for Qwen2-family language models")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One request through the engine (greedy by default), streamed: prints the text, or ids.
    Generate(generate::GenerateArgs),
    /// The OpenAI-compatible HTTP server.
    Serve(serve::ServeArgs),
    /// Speed through the engine: prefill, batch-1 decode, throughput under concurrent requests.
    Bench(bench::BenchArgs),
    /// Perplexity on a text file, computed as llama.cpp's llama-perplexity does.
    Perplexity(perplexity::PerplexityArgs),
    /// A worker node of a cluster: runs the model for the front it joins (`serve --cluster-listen`).
    Worker(worker::WorkerArgs),
    /// A file of requests in OpenAI's batch format (JSONL) answered through the server's routes,
    /// as vLLM's `run-batch`: `-i requests.jsonl -o answers.jsonl`.
    RunBatch(run_batch::RunBatchArgs),
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Load(#[from] llaisys_model::LoadError),
    #[error(transparent)]
    Engine(#[from] llaisys_actors::EngineError),
    #[error(transparent)]
    Build(#[from] llaisys_actors::BuildError),
    #[error(transparent)]
    Tokenizer(#[from] llaisys_model::tokenizer::TokenizerError),
    #[error(transparent)]
    Config(#[from] llaisys_server::config::ConfigError),
    #[error(transparent)]
    Serve(#[from] llaisys_server::ServeError),
    #[error(transparent)]
    Hub(#[from] llaisys_server::hub::HubError),
    #[error(transparent)]
    Cluster(#[from] llaisys_actors::cluster::ClusterError),
    /// A flag or its value that cannot be used.
    #[error("{flag}: {reason}")]
    Usage { flag: &'static str, reason: String },
    #[error("reading {path}: {source}")]
    Read { path: std::path::PathBuf, source: std::io::Error },
    /// A forward pass of `perplexity` failed.
    #[error("chunk {chunk}: {source}")]
    Decode { chunk: usize, source: llaisys_model::DecodeError },
    /// A generated answer ended with an error (the log says why).
    #[error("generation failed (see the log)")]
    GenerationFailed,
    /// A benchmark request ended before its tokens (the measurement would not compare).
    #[error("a benchmark request ended after {tokens} of {max_tokens} tokens ({finish})")]
    ShortRun { tokens: usize, max_tokens: usize, finish: &'static str },
    /// A worker node left its cluster by itself (the log says why).
    #[error("the node left the cluster (see the log above)")]
    LeftCluster,
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// `--model` as a local path: a model given by name comes through the hub cache
/// (`HF_HUB_OFFLINE=1`: the cache only).
async fn local_model(model: &std::path::Path) -> Result<std::path::PathBuf, CliError> {
    use llaisys_server::hub::{HubConfig, resolve};
    Ok(resolve(&model.to_string_lossy(), &HubConfig::from_env(false)).await?.path)
}

impl CliError {
    fn usage(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::Usage { flag, reason: reason.into() }
    }
}

impl Cli {
    pub fn run(self) -> Result<(), CliError> {
        match self.command {
            Command::Generate(args) => generate::run(args),
            Command::Bench(args) => bench::run(args),
            Command::Serve(args) => serve::run(args),
            Command::Perplexity(args) => perplexity::run(args),
            Command::Worker(args) => worker::run(args),
            Command::RunBatch(args) => run_batch::run(args),
        }
    }
}
