//! vgpud's log filter: `VGPU_LOG` in tracing's `EnvFilter` syntax, `info` when unset or unreadable.
//!
//! zbus wraps every method call it dispatches in an INFO-level span whose fields are the whole call
//! message and its header formatted with `Debug` (zbus 6, `ObjectServer::dispatch_call`); at vgpud's
//! level that formatting ran for every call and never reached a line of vgpud's log. zbus's own
//! targets are therefore held at `warn` unless the filter names zbus itself (`VGPU_LOG=info,zbus=debug`).

use tracing_subscriber::EnvFilter;

/// The filter used when `VGPU_LOG` is unset or cannot be parsed.
const DEFAULT: &str = "info";

/// The filter for `spec` (the value of `VGPU_LOG`, if any).
pub fn log_filter(spec: Option<&str>) -> EnvFilter {
    let spec = spec
        .filter(|s| EnvFilter::try_new(s).is_ok())
        .unwrap_or(DEFAULT);
    let filter = EnvFilter::new(spec);
    if spec.contains("zbus") {
        return filter;
    }
    match "zbus=warn".parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Whether an event of `target` at `level` passes `filter`.
    fn passes(filter: EnvFilter, target: &str, level: Level) -> bool {
        let subscriber = tracing_subscriber::registry().with(filter);
        tracing::subscriber::with_default(subscriber, || {
            let meta = tracing::Metadata::new(
                "probe",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&PROBE)),
                tracing::metadata::Kind::SPAN,
            );
            tracing::dispatcher::get_default(|d| d.enabled(&meta))
        })
    }

    struct Probe;
    impl tracing::callsite::Callsite for Probe {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unimplemented!("not registered")
        }
    }
    static PROBE: Probe = Probe;

    #[test]
    fn zbus_call_spans_are_off_at_the_default_level_and_ours_are_on() {
        for spec in [None, Some("info"), Some("debug"), Some("not a [filter")] {
            let zbus = "zbus::object_server";
            assert!(!passes(log_filter(spec), zbus, Level::INFO), "{spec:?}");
            assert!(passes(log_filter(spec), zbus, Level::WARN), "{spec:?}");
            let ours = "vgpu_manager::daemon::dbus";
            assert!(passes(log_filter(spec), ours, Level::INFO), "{spec:?}");
        }
        assert!(!passes(
            log_filter(Some("info")),
            "vgpu_manager",
            Level::DEBUG
        ));
        assert!(passes(
            log_filter(Some("debug")),
            "vgpu_manager",
            Level::DEBUG
        ));
    }

    #[test]
    fn a_filter_that_names_zbus_keeps_its_level() {
        let f = || log_filter(Some("info,zbus=debug"));
        assert!(passes(f(), "zbus::object_server", Level::INFO));
        assert!(passes(f(), "zbus::object_server", Level::DEBUG));
    }
}
