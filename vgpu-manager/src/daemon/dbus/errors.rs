//! The D-Bus face of [`CoreError`]: error name `org.vgpumanager.Error.<Kind>` (the stable
//! [`CoreError::kind`]) with the error's one-line message as the description.

use zbus::DBusError;
use zbus::message::{Header, Message};
use zbus::names::{ErrorName, OwnedErrorName};

use crate::daemon::api::CoreError;
use crate::daemon::api::limits::{MAX_MESSAGE_BYTES, clip_to};
use vgpu_client::ERROR_PREFIX;

/// An error reply of the vgpud API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    name: OwnedErrorName,
    message: String,
}

/// `message`, or its start and a length marker when it is past [`MAX_MESSAGE_BYTES`].
fn bounded(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    clip_to(&message, MAX_MESSAGE_BYTES).to_string()
}

/// The name of [`ApiError::internal`] errors.
const INTERNAL: &str = "org.vgpumanager.Error.Internal";

impl ApiError {
    /// An error of kind `kind` (a `CamelCase` word) with `message`, cut to [`MAX_MESSAGE_BYTES`]
    /// with a length marker (a message that echoes a client's input never grows with it).
    pub fn new(kind: &str, message: impl Into<String>) -> ApiError {
        let full = format!("{ERROR_PREFIX}.{kind}");
        let name = OwnedErrorName::try_from(full).unwrap_or_else(|_| {
            // `kind` comes from `CoreError::kind` or the constants here, all valid name elements;
            // this only guards against a future typo producing an invalid name.
            OwnedErrorName::from(ErrorName::from_static_str_unchecked(INTERNAL))
        });
        ApiError {
            name,
            message: bounded(message.into()),
        }
    }

    /// A malformed request, refused at the edge before any command runs (`Error.Invalid`).
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new("Invalid", message)
    }

    /// A failure inside the daemon (a lost worker thread); says to look at the log.
    pub fn internal(what: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            "Internal",
            format!("vgpud internal error: {what} (see `journalctl -u vgpud`)"),
        )
    }

    /// The answer to a call at a path where vgpud serves no object: the D-Bus specification's
    /// `org.freedesktop.DBus.Error.UnknownObject`, as zbus answers it.
    pub fn unknown_object(path: &str) -> ApiError {
        ApiError {
            name: OwnedErrorName::from(ErrorName::from_static_str_unchecked(
                "org.freedesktop.DBus.Error.UnknownObject",
            )),
            message: bounded(format!("Unknown object '{path}'")),
        }
    }

    /// The full error name, e.g. `org.vgpumanager.Error.NotFound`.
    pub fn error_name(&self) -> &str {
        self.name.as_str()
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> ApiError {
        ApiError::new(e.kind(), e.to_string())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.message)
    }
}

impl std::error::Error for ApiError {}

impl DBusError for ApiError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name.as_ref()).build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        self.name.as_ref()
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdev_types::ids::MdevUuid;

    #[test]
    fn core_errors_map_to_named_dbus_errors() {
        let uuid: MdevUuid = "4b20d080-1b54-4048-85b3-a6a62d165c01".parse().unwrap();
        let e = ApiError::from(CoreError::NotFound { uuid });
        assert_eq!(e.error_name(), "org.vgpumanager.Error.NotFound");
        assert!(e.message().contains("4b20d080-1b54-4048-85b3-a6a62d165c01"));
        let e = super::super::auth::denied("no".into());
        assert_eq!(e.error_name(), "org.vgpumanager.Error.AccessDenied");
        assert_eq!(
            ApiError::invalid("bad").error_name(),
            "org.vgpumanager.Error.Invalid"
        );
        // A failed host read is the host's fault, not the request's.
        let host = vgpu_host::discover::DiscoverError::Host(vgpu_host::HostError::new(
            vgpu_host::HostOp::Read,
            "/sys/bus/pci/devices",
            nix::errno::Errno::EIO,
        ));
        let e = ApiError::from(CoreError::from(host));
        assert_eq!(e.error_name(), "org.vgpumanager.Error.Host");
        assert!(
            e.message().starts_with("cannot read the host"),
            "{}",
            e.message()
        );
        assert_eq!(
            ApiError::internal("x").error_name(),
            "org.vgpumanager.Error.Internal"
        );
    }

    #[test]
    fn messages_are_bounded() {
        let e = ApiError::invalid("m".repeat(100_000));
        assert!(
            e.message().len() < MAX_MESSAGE_BYTES + 64,
            "{}",
            e.message().len()
        );
        assert!(
            e.message().ends_with("… (100000 bytes, first 4096 shown)"),
            "{}",
            &e.message()[4000..]
        );
        assert_eq!(ApiError::invalid("short").message(), "short");
    }
}
