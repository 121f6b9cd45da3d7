//! Logging: tracing to stderr at the configured level (`RUST_LOG` overrides), and the
//! level changed by a reload.

type FilterHandle = tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set when the configured level decides (no RUST_LOG): a reload may change it.
static LOG_FILTER: std::sync::OnceLock<FilterHandle> = std::sync::OnceLock::new();

/// Tracing to stderr at the configured level (RUST_LOG overrides). Started by systemd
/// with stderr going to the journal (`JOURNAL_STREAM` names stderr's device and inode):
/// no colours and no timestamp (the journal has its own), each line prefixed with its
/// syslog priority (`<3>` error ... `<7>` debug), which the journal reads as the level.
/// Elsewhere: colours only on a terminal.
pub fn init_logging(level: &str) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _, EnvFilter, Layer as _};
    let from_env = std::env::var("RUST_LOG").ok().and_then(|v| EnvFilter::try_new(v).ok());
    let env_decides = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(configured(level)));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let output = if to_journal() {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(JournalFormat(tracing_subscriber::fmt::format().without_time().with_ansi(false)))
            .boxed()
    } else {
        use std::io::IsTerminal;
        tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).boxed()
    };
    let installed = tracing_subscriber::registry().with(filter).with(output).try_init().is_ok();
    if installed && !env_decides {
        let _ = LOG_FILTER.set(handle);
    }
}

/// Applies a reloaded `dispatcher.log_level`; false when RUST_LOG decides the level.
pub fn set_log_level(level: &str) -> bool {
    let Some(handle) = LOG_FILTER.get() else { return false };
    handle.reload(tracing_subscriber::EnvFilter::new(configured(level))).is_ok()
}

/// The configured level as a filter. The codecs' own warnings (the `h2` crate logs one
/// line per unexpected frame a client sends: a client could fill the journal) are errors
/// only, unless the level names them.
fn configured(level: &str) -> String {
    if level.split(',').any(|d| d.trim_start().starts_with("h2")) {
        level.to_string()
    } else {
        format!("{level},h2=error")
    }
}

/// Whether stderr is the journal's stream (systemd sets `JOURNAL_STREAM=<dev>:<inode>` of
/// the stream it connected; a child whose stderr was redirected elsewhere must not
/// believe it).
pub fn to_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.split_once(':') else { return false };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return false };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The syslog priority of a level, as the journal reads a `<N>` line prefix.
pub fn priority(level: &tracing::Level) -> u8 {
    match *level {
        tracing::Level::ERROR => 3,
        tracing::Level::WARN => 4,
        tracing::Level::INFO => 6,
        _ => 7,
    }
}

/// The usual line, after its `<N>` priority prefix.
struct JournalFormat<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for JournalFormat<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// An error and its causes on one line, as `{:#}` writes them, less the causes whose
/// text is already said: an error type that writes its source into its own message
/// (`"{what}: {source}"`) would otherwise have it printed twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod error_text_tests {
    /// What writes its source into its message (a config file that cannot be read) has
    /// it said once.
    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = anyhow::Error::new(crate::config::ConfigError::Read { file: "/x.toml".into(), source: io });
        assert_eq!(format!("{e:#}"), "/x.toml: cannot read: No such file or directory: No such file or directory");
        assert_eq!(super::error_text(&e), "/x.toml: cannot read: No such file or directory");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::error_text(&e), "outer: inner");
    }
}
