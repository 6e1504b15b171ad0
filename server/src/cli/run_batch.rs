//! `llaisys run-batch`: a file of requests in OpenAI's batch format answered line by line, as
//! vLLM's `run-batch` does (`llaisys_server::batch`), through the server's own routes in
//! process: the models and settings are `serve`'s, no port is opened.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llaisys_server::{batch, http, serve};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::CliError;
use super::serve::ModelArgs;

#[derive(Debug, clap::Args)]
pub struct RunBatchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The requests, one JSON object a line: `{"custom_id", "method": "POST", "url", "body"}`
    /// (`-`: standard input).
    #[arg(short = 'i', long = "input-file")]
    input: PathBuf,
    /// The answers, a line each in the requests' order: `{"id", "custom_id", "response":
    /// {"status_code", "request_id", "body"}, "error"}` (`-`: standard output).
    #[arg(short = 'o', long = "output-file")]
    output: PathBuf,
}

pub fn run(args: RunBatchArgs) -> Result<(), CliError> {
    // In process there is no one to authenticate.
    let config = args.model.config(vec![("server.api_keys".into(), "[]".into())])?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let reading = |source| CliError::Read { path: args.input.clone(), source };
        let input: Box<dyn AsyncRead + Unpin + Send> = match args.input.to_str() {
            Some("-") => Box::new(tokio::io::stdin()),
            _ => Box::new(tokio::fs::File::open(&args.input).await.map_err(reading)?),
        };
        let mut output: Box<dyn AsyncWrite + Unpin + Send> = match args.output.to_str() {
            Some("-") => Box::new(tokio::io::stdout()),
            _ => Box::new(tokio::fs::File::create(&args.output).await?),
        };
        let (models, config) = serve::models(&config).await?;
        let state = Arc::new(serve::app_state(models, &config)?);
        let app = http::app(state.clone(), &serve::http_options(&config));
        // As many in flight as the engines admit at once (a cluster's front: its nodes'
        // queue decides), answered in the input's order.
        let width = config.admission.max_concurrent_requests.clamp(1, 1024);
        let lines = futures_util::stream::unfold(BufReader::new(input).lines(), |mut lines| async move {
            lines.next_line().await.transpose().map(|line| (line, lines))
        });
        let answers = lines
            .enumerate()
            .filter(|(_, line)| std::future::ready(!matches!(line, Ok(l) if l.trim().is_empty())))
            .map(|(i, line)| {
                let app = &app;
                async move {
                    match line {
                        Ok(text) => Ok(batch::answer(app, i + 1, &text).await),
                        Err(e) => Err(e),
                    }
                }
            })
            .buffered(width);
        let mut answers = std::pin::pin!(answers);
        let (start, mut last_report) = (Instant::now(), Instant::now());
        let (mut done, mut failed) = (0usize, 0usize);
        while let Some(answer) = answers.next().await {
            let answer = answer.map_err(reading)?;
            done += 1;
            if answer["response"]["status_code"] != 200 {
                failed += 1;
            }
            output.write_all(format!("{answer}\n").as_bytes()).await?;
            if last_report.elapsed() >= Duration::from_secs(5) {
                eprintln!(
                    "llaisys run-batch: {done} answered ({failed} failed), {:.0} s",
                    start.elapsed().as_secs_f64()
                );
                last_report = Instant::now();
            }
        }
        output.flush().await?;
        eprintln!(
            "llaisys run-batch: {done} requests answered, {} succeeded, {failed} failed, in {:.1} s",
            done - failed,
            start.elapsed().as_secs_f64()
        );
        state.engines.shutdown().await;
        Ok(())
    })
}
