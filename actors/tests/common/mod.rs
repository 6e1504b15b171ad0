//! Helpers the engine's integration tests share.

use std::time::Duration;

use llaisys_actors::{Engine, EngineStats};

/// Waits up to `within` until the engine is idle: nothing queued or running, and every used
/// cell belongs to a cached prefix. Panics with the last stats otherwise.
pub async fn wait_idle(engine: &Engine, within: Duration) -> EngineStats {
    let step = Duration::from_millis(10);
    for _ in 0..within.as_millis() / step.as_millis() {
        let stats = engine.stats().await.unwrap();
        if stats.running == 0 && stats.waiting == 0 && stats.kv_cells_used <= stats.kv_cells_cached {
            return stats;
        }
        tokio::time::sleep(step).await;
    }
    panic!("engine never became idle: {:?}", engine.stats().await.unwrap());
}
