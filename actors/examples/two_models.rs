//! A host service running two models side by side in one process: each engine has its own
//! actors, KV cache and limits; jobs go to either by name (`Router`), concurrently.
//!
//! cargo run --release -p llaisys-actors --example two_models -- MODEL_A MODEL_B
//! (each a GGUF file or a model directory; e.g. the same checkpoint in two dtypes)

use std::time::Instant;

use llaisys_actors::{ChatRequest, Engine, EngineConfig, Router};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [a, b] = args.as_slice() else { return Err("usage: two_models MODEL_A MODEL_B".into()) };
    // Smaller caches than the default: two engines share the machine's memory.
    let config = EngineConfig { kv_capacity: 4096, ..EngineConfig::default() };
    let mut router = Router::new();
    for (name, path) in [("a", a), ("b", b)] {
        router.add(name.to_string(), Engine::builder().model(path).config(config).build().await?)?;
    }

    let jobs = [
        ("a", "Write a haiku about the sea."),
        ("b", "Write a haiku about the sea."),
        ("a", "What is 17 * 23?"),
        ("b", "Name three prime numbers."),
    ];
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (model, question) in jobs {
        let engine = router.engine(model)?.clone();
        tasks.push(tokio::spawn(async move {
            let request = ChatRequest::default().user(question).max_tokens(48).temperature(0.0);
            let answer = engine.chat(request).await?.answer().await;
            Ok::<_, llaisys_actors::EngineError>((model, question, answer))
        }));
    }
    for task in tasks {
        let (model, question, answer) = task.await??;
        println!("[{model}] {question}\n    {:?} ({} tokens)", answer.text(), answer.usage.completion_tokens);
    }
    println!("4 jobs on 2 engines in {:.2} s", start.elapsed().as_secs_f64());
    for name in ["a", "b"] {
        let stats = router.engine(name)?.stats().await?;
        println!(
            "[{name}] finished {}, KV cells used {}/{}",
            stats.finished.total(),
            stats.kv_cells_used,
            stats.kv_capacity
        );
        router.engine(name)?.shutdown().await;
    }
    Ok(())
}
