//! A terminal chat: each line you type is a user turn; the answer streams back as it is
//! generated. The conversation is a session, so each turn computes only its new tokens.
//!
//! cargo run --release -p llaisys-actors --example chat -- MODEL   (a GGUF file or a model directory)

use std::io::{BufRead, Write};

use llaisys_actors::{ChatMessage, ChatRequest, Engine, Event, Output, StreamExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: chat MODEL (a GGUF file or a model directory)")?;
    let engine = Engine::builder().model(path).build().await?;
    let mut history = vec![ChatMessage::new("system", "You are a helpful assistant.")];
    let stdin = std::io::stdin();
    print!("> ");
    std::io::stdout().flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            print!("> ");
            std::io::stdout().flush()?;
            continue;
        }
        history.push(ChatMessage::new("user", line));
        // No max_tokens: what is left of the context, within the engine's limit.
        let request = ChatRequest::new(history.clone()).session("terminal");
        let mut stream = match engine.chat(request).await {
            Ok(stream) => stream,
            Err(e) => {
                // Refused (the conversation outgrew the context, say): forget this turn.
                println!("[refused: {e}]\n> ");
                history.pop();
                continue;
            }
        };
        let mut answer = String::new();
        while let Some(Output { event, .. }) = stream.next().await {
            let (text, done) = match event {
                Event::Token { text, .. } => (text, None),
                Event::Finished { reason, text, usage, .. } => (text, Some((reason, usage))),
            };
            print!("{text}");
            std::io::stdout().flush()?;
            answer.push_str(&text);
            if let Some((reason, usage)) = done {
                println!(
                    "\n[{}: {} tokens, {} of the prompt's {} from the cache]",
                    reason.as_str(),
                    usage.completion_tokens,
                    usage.cached_tokens,
                    usage.prompt_tokens
                );
            }
        }
        history.push(ChatMessage::new("assistant", answer));
        print!("> ");
        std::io::stdout().flush()?;
    }
    println!();
    engine.shutdown().await;
    Ok(())
}
