//! Logging: tracing to stderr at the configured level (`RUST_LOG` overrides), and the
//! level changed by a reload.

type FilterHandle = tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set when the configured level decides (no RUST_LOG): a reload may change it.
static LOG_FILTER: std::sync::OnceLock<FilterHandle> = std::sync::OnceLock::new();

/// Tracing to stderr at the configured level (RUST_LOG overrides).
pub fn init_logging(level: &str) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _, EnvFilter};
    let from_env = std::env::var("RUST_LOG").ok().and_then(|v| EnvFilter::try_new(v).ok());
    let env_decides = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .try_init()
        .is_ok();
    if installed && !env_decides {
        let _ = LOG_FILTER.set(handle);
    }
}

/// Applies a reloaded `dispatcher.log_level`; false when RUST_LOG decides the level.
pub fn set_log_level(level: &str) -> bool {
    let Some(handle) = LOG_FILTER.get() else { return false };
    handle.reload(tracing_subscriber::EnvFilter::new(level)).is_ok()
}
