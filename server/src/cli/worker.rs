//! `llaisys worker --join HOST:PORT`: a worker node (N1). It loads the model like `serve`, joins
//! the front at HOST:PORT with the shared cookie (and TLS when `cluster.tls_ca` is set), runs
//! the requests the front routes to it, and reconnects with backoff when the front goes away.

use llaisys_actors::cluster;

use super::CliError;
use super::serve::{ModelArgs, quoted, wait_for_signal};

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The front's cluster address, HOST:PORT (its `--cluster-listen`).
    #[arg(long)]
    join: String,
}

pub fn run(args: WorkerArgs) -> Result<(), CliError> {
    let config = args.model.config(vec![("cluster.listen".into(), quoted(""))])?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let config = llaisys_server::serve::with_local_model(&config).await?;
        let (cookie, tls) = (config.cluster_cookie()?, config.cluster_client_tls()?);
        let engine = llaisys_server::builder(&config)?.build().await?;
        let cluster = config.cluster_config();
        let mut worker = cluster::join(engine, args.join.clone(), cookie, tls, &cluster).await?;
        eprintln!("llaisys: worker node '{}' joining the front at {}", cluster.name, args.join);
        let left_by_itself = tokio::select! {
            _ = wait_for_signal() => false,
            _ = worker.left() => true,
        };
        eprintln!("llaisys: worker node '{}' leaving", cluster.name);
        worker.shutdown().await;
        match left_by_itself {
            true => Err(CliError::LeftCluster),
            false => Ok(()),
        }
    })
}
