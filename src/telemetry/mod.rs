//! Telemetry. For now: structured logs through `tracing`, configured by LOG_LEVEL and
//! LOG_FORMAT. Nothing on the request path logs at the default level (WARN).

use crate::settings::{LogFormat, LogLevel};

/// Installs the global subscriber, writing to stderr. Safe to call once per process.
pub fn init_logs(level: LogLevel, format: LogFormat) {
    let level: tracing::Level = level.into();
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    // A second call (tests) keeps the first subscriber; that is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
