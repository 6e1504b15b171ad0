//! The token-level API under `chat`/`complete`: requests as token ids, each with its own event
//! stream; run several concurrently, cancel one by id, read the stats, shut down (draining).
//!
//! cargo run -p llaisys-actors --example embed -- [MODEL]   (a GGUF file or a model directory;
//! without one it uses the weightless `mock` model)

use llaisys_actors::{Engine, Event, GenerateParams, GenerateRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let builder = match std::env::args().nth(1) {
        Some(path) => Engine::builder().model(path),
        None => Engine::builder().model_type("mock"),
    };
    let engine = builder.build().await?;
    let encode = |text: &str| -> Result<Vec<u32>, Box<dyn std::error::Error>> {
        Ok(match engine.tokenizer() {
            Some(t) => t.encode(text)?,
            None => text.bytes().map(u32::from).collect(),
        })
    };
    let prompts = [encode("The capital of France is")?, encode("def fibonacci(n):")?, encode("Once upon a time")?];

    // Three concurrent requests; the handle is cloned into each task.
    let mut tasks = Vec::new();
    for (i, prompt) in prompts.into_iter().enumerate() {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let params = GenerateParams { max_tokens: 24, ..GenerateParams::default() };
            let mut stream = engine.generate(GenerateRequest::new(prompt, params)).await?;
            if i == 2 {
                engine.cancel(stream.id).await; // the third request is cancelled at once
            }
            let (mut text, mut tokens) = (String::new(), 0);
            while let Some(event) = stream.next().await {
                match event {
                    Event::Token { text: t, .. } => {
                        text.push_str(&t);
                        tokens += 1;
                    }
                    Event::Finished { reason, text: t, .. } => {
                        text.push_str(&t);
                        println!("request {i}: {tokens} tokens, finish {}: {text:?}", reason.as_str());
                    }
                }
            }
            Ok::<(), llaisys_actors::EngineError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!("{:?}", engine.stats().await?);
    engine.shutdown().await;
    Ok(())
}
