//! vgpud's log filter: `VGPU_LOG` in tracing's `EnvFilter` syntax, `info` when unset or unreadable.
//!
//! zbus wraps every method call it dispatches in an INFO-level span whose fields are the whole call
//! message and its header formatted with `Debug` (zbus 6, `ObjectServer::dispatch_call`); at vgpud's
//! level that formatting ran for every call and never reached a line of vgpud's log. zbus's own
//! targets are therefore held at `warn` unless the filter names zbus itself (`VGPU_LOG=info,zbus=debug`).

use tracing_subscriber::EnvFilter;

/// The filter used when `VGPU_LOG` is unset or cannot be parsed.
const DEFAULT: &str = "info";

/// The filter for `spec` (the value of `VGPU_LOG`, if any), and, when `spec` cannot be parsed, why and
/// what is used instead (vgpud logs it once its log is set up).
pub fn log_filter(spec: Option<&str>) -> (EnvFilter, Option<String>) {
    let (spec, problem) = match spec.map(|s| (s, EnvFilter::try_new(s))) {
        None => (DEFAULT, None),
        Some((s, Ok(_))) => (s, None),
        Some((s, Err(e))) => (
            DEFAULT,
            Some(format!(
                "VGPU_LOG={s:?} is not a log filter ({e}), so `{DEFAULT}` is used: give directives such as `info` or `info,vgpu_manager=debug`"
            )),
        ),
    };
    let spec = if spec.contains("zbus") {
        spec.to_string()
    } else {
        format!("{spec},zbus=warn")
    };
    (EnvFilter::new(spec), problem)
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
            assert!(!passes(log_filter(spec).0, zbus, Level::INFO), "{spec:?}");
            assert!(passes(log_filter(spec).0, zbus, Level::WARN), "{spec:?}");
            let ours = "vgpu_manager::daemon::dbus";
            assert!(passes(log_filter(spec).0, ours, Level::INFO), "{spec:?}");
        }
        assert!(!passes(
            log_filter(Some("info")).0,
            "vgpu_manager",
            Level::DEBUG
        ));
        assert!(passes(
            log_filter(Some("debug")).0,
            "vgpu_manager",
            Level::DEBUG
        ));
    }

    #[test]
    fn an_unparsable_filter_is_reported_with_what_is_used_instead() {
        let (_, problem) = log_filter(Some("not a [filter"));
        let problem = problem.expect("reported");
        assert!(
            problem.contains("VGPU_LOG=\"not a [filter\"") && problem.contains("`info` is used"),
            "{problem}"
        );
        for good in [None, Some("info"), Some("warn,vgpu_manager=debug")] {
            assert!(log_filter(good).1.is_none(), "{good:?}");
        }
    }

    #[test]
    fn a_filter_that_names_zbus_keeps_its_level() {
        let f = || log_filter(Some("info,zbus=debug")).0;
        assert!(passes(f(), "zbus::object_server", Level::INFO));
        assert!(passes(f(), "zbus::object_server", Level::DEBUG));
    }
}
