//! Embedding the engine in a host application: start it in the host's tokio runtime, run
//! several requests concurrently, cancel one, read the stats, shut down (draining).
//!
//! cargo run -p llaisys-actors --example embed -- [MODEL]   (a GGUF file or a model directory;
//! without one it uses the weightless `mock` model)

use std::path::PathBuf;

use llaisys_actors::{Engine, EngineConfig, Event, GenerateParams, GenerateRequest};
use llaisys_model::{Device, LoadOptions, ModelSource, load_model};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let source = std::env::args().nth(1).map(|p| ModelSource::resolve(&PathBuf::from(p))).transpose()?;
    let model = load_model(
        if source.is_some() { None } else { Some("mock") },
        source.as_ref(),
        &LoadOptions::default(),
        &Device::flex(),
    )?;
    let tokenizer = source.as_ref().map(ModelSource::tokenizer).transpose()?;
    let encode = |text: &str| -> Result<Vec<u32>, Box<dyn std::error::Error>> {
        Ok(match &tokenizer {
            Some(t) => t.encode(text)?,
            None => text.bytes().map(u32::from).collect(),
        })
    };
    let prompts = [encode("The capital of France is")?, encode("def fibonacci(n):")?, encode("Once upon a time")?];
    let engine = Engine::start(model, tokenizer.clone(), EngineConfig::default()).await?;

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
