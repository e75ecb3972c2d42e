//! A private `dbus-daemon` configured like a system bus, and what tests need around it to call as an
//! unprivileged user (shared by the authorization tests).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};

/// The unprivileged caller: nobody/nogroup on Debian.
pub const NOBODY: u32 = 65534;

/// The environment variable that lets the authorization tests be skipped when not run as root.
pub const ALLOW_SKIP_VAR: &str = "VGPU_TESTS_ALLOW_SKIP";

/// True when running as root, which the authorization tests need (setpriv switches to an unprivileged
/// uid). Otherwise the test fails, so that it never passes without having run — unless
/// `VGPU_TESTS_ALLOW_SKIP=1` is set: then this returns false after printing `SKIPPED: <reason>` to stderr,
/// and the caller returns.
pub fn require_root(test: &str) -> bool {
    if geteuid().is_root() {
        return true;
    }
    let reason = format!(
        "{test}: switches to an unprivileged uid with setpriv, which needs root (uid {})",
        geteuid()
    );
    if std::env::var(ALLOW_SKIP_VAR).as_deref() == Ok("1") {
        // Straight to the process's stderr: the test harness captures `eprintln!` of passing tests, and a
        // skip must show in the run's output.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {reason}; {ALLOW_SKIP_VAR}=1 allowed the skip"
        );
        return false;
    }
    panic!(
        "{reason}. Run the tests as root, as CI does (scripts/test under .ci/run), or set \
         {ALLOW_SKIP_VAR}=1 to skip them with a SKIPPED line on stderr"
    );
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A temporary directory every user can traverse (the unprivileged caller needs to reach the sockets).
pub fn open_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// A private `dbus-daemon`; killed by pid when dropped.
pub struct DbusDaemon {
    child: Child,
    /// The address clients connect to.
    pub address: String,
}

impl DbusDaemon {
    /// The bus daemon's process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }
}

impl Drop for DbusDaemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The default policy of a system bus, as in dbus's shipped `system.conf` (`<policy context="default">`):
/// anyone connects, nobody owns names or sends method calls unless a service's file allows it.
pub const SYSTEM_DEFAULTS: &str = r#"
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
"#;

/// No restriction at all: what a bus without vgpu-manager's policy file lets through.
pub const PERMISSIVE: &str = r#"
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
"#;

/// Starts `dbus-daemon` as a system-type bus on a socket in `dir`, with `default_policy` and, if given,
/// an included policy file; returns once it listens.
pub fn start_dbus_daemon(dir: &Path, default_policy: &str, include: Option<&Path>) -> DbusDaemon {
    start_dbus_daemon_with(dir, default_policy, include, "")
}

/// The resource limits of Debian's system bus: dbus-daemon's built-in defaults, which Debian's
/// `/usr/share/dbus-1/system.conf` (package dbus-system-bus-common) lists in comments and does not
/// change ("The defaults for these limits are hard-coded in dbus-daemon"; dbus-daemon(1), the
/// `<limit>` element, names each). Written out so that the hostile suite runs with them whatever a
/// dbus-daemon build defaults to; `the_test_bus_has_the_limits_of_debians_system_bus` checks them
/// against the installed file.
pub const SYSTEM_LIMITS: [(&str, u64); 16] = [
    ("max_incoming_bytes", 133_169_152),
    ("max_incoming_unix_fds", 64),
    ("max_outgoing_bytes", 133_169_152),
    ("max_outgoing_unix_fds", 64),
    ("max_message_size", 33_554_432),
    ("max_message_unix_fds", 16),
    ("service_start_timeout", 25_000),
    ("auth_timeout", 5_000),
    ("pending_fd_timeout", 150_000),
    ("max_completed_connections", 2_048),
    ("max_incomplete_connections", 64),
    ("max_connections_per_user", 256),
    ("max_pending_service_starts", 512),
    ("max_names_per_connection", 512),
    ("max_match_rules_per_connection", 512),
    ("max_replies_per_connection", 128),
];

/// A bus configured as Debian's system bus runs: dbus's default system policy, the shipped `data/`
/// policy file, [`SYSTEM_LIMITS`], and (as `<user>` in system.conf) dbus-daemon running as user
/// `messagebus` once it listens.
pub fn real_system_bus(dir: &Path) -> DbusDaemon {
    let mut extra: String = SYSTEM_LIMITS
        .iter()
        .map(|(name, value)| format!("  <limit name=\"{name}\">{value}</limit>\n"))
        .collect();
    extra.push_str("  <user>messagebus</user>\n");
    start_dbus_daemon_with(
        dir,
        SYSTEM_DEFAULTS,
        Some(&repo().join("data/org.vgpumanager.Manager1.conf")),
        &extra,
    )
}

/// [`start_dbus_daemon`] with `extra` elements in the configuration (`<limit>`, `<user>`, …).
pub fn start_dbus_daemon_with(
    dir: &Path,
    default_policy: &str,
    include: Option<&Path>,
    extra: &str,
) -> DbusDaemon {
    let socket = dir.join("system_bus_socket");
    let include = include
        .map(|p| format!("  <include>{}</include>\n", p.display()))
        .unwrap_or_default();
    let conf = format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">{default_policy}  </policy>
{include}{extra}</busconfig>
"#,
        socket.display()
    );
    let conf_path = dir.join("bus.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf_path.display()))
        .args(["--nofork", "--print-address=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("dbus-daemon.log")).unwrap())
        .spawn()
        .expect(
            "dbus-daemon (Debian package `dbus`) must be installed for the authorization tests",
        );
    // dbus-daemon prints its address once it listens.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("unix:"),
        "dbus-daemon did not start: {line:?}"
    );
    DbusDaemon {
        child,
        address: line.trim().to_string(),
    }
}

/// A system-type bus with dbus's default system policy and the shipped `data/` policy file.
pub fn shipped_system_bus(dir: &Path) -> DbusDaemon {
    start_dbus_daemon(
        dir,
        SYSTEM_DEFAULTS,
        Some(&repo().join("data/org.vgpumanager.Manager1.conf")),
    )
}
