//! A real `dbus-daemon` in the guest (Debian package `dbus-daemon`, run chrooted into the host's root
//! that the guest mounts), listening on a socket in a scratch directory: the bus vgpud is deployed on, for
//! measurements that must not depend on the embedded bus.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::qemu_attach::HOSTROOT;
use super::runner::TestError;

/// How long the bus may take to create its socket.
const LISTENING_WITHIN: Duration = Duration::from_secs(30);

/// A running `dbus-daemon`, killed when dropped.
#[derive(Debug)]
pub struct BusDaemon {
    child: Child,
    address: String,
    /// Its standard error.
    log: PathBuf,
}

impl BusDaemon {
    /// Starts a bus that lets anyone own any name and call anything (the daemon's own authorization
    /// is tested elsewhere), listening at `<dir>/dbus.sock`. `dir` must be below `/tmp`.
    pub fn start(dir: &Path) -> Result<BusDaemon, TestError> {
        let sock = dir.join("dbus.sock");
        let address = format!("unix:path={}", sock.display());
        let config = dir.join("bus.conf");
        std::fs::write(
            &config,
            format!(
                "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\" \
                 \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
                 <busconfig><type>session</type><listen>{address}</listen><auth>EXTERNAL</auth>\
                 <policy context=\"default\"><allow send_destination=\"*\" eavesdrop=\"true\"/>\
                 <allow eavesdrop=\"true\"/><allow own=\"*\"/></policy></busconfig>\n"
            ),
        )
        .map_err(|e| TestError::Check(format!("cannot write {}: {e}", config.display())))?;
        let log = dir.join("dbus-daemon.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", log.display())))?;
        // Dynamically linked against the host's libraries: chrooted into the host's root, where the
        // guest's /tmp (holding `dir`) is bind-mounted at the same path (scripts/vm/init).
        let mut child = Command::new("chroot")
            .arg(HOSTROOT)
            .arg("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| {
                TestError::Check(format!(
                    "cannot start dbus-daemon (Debian package dbus-daemon on the host): {e}"
                ))
            })?;
        let deadline = Instant::now() + LISTENING_WITHIN;
        while !sock.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(TestError::Check(format!(
                    "dbus-daemon exited during start-up ({status})"
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestError::Check(format!(
                    "dbus-daemon did not create {} within {LISTENING_WITHIN:?}",
                    sock.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let bus = BusDaemon {
            child,
            address,
            log,
        };
        bus.check_answers()?;
        Ok(bus)
    }

    /// Connects and asks the bus its id, so that a bus that listens but does not answer fails here,
    /// with its log, rather than as a daemon that never comes up.
    fn check_answers(&self) -> Result<(), TestError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestError::Check(format!("cannot start a tokio runtime: {e}")))?;
        let ask = async {
            let conn = zbus::connection::Builder::address(self.address.as_str())
                .build()
                .await?;
            zbus::fdo::DBusProxy::new(&conn).await?.get_id().await?;
            Ok::<zbus::Connection, zbus::Error>(conn)
        };
        // The timer is made inside the runtime.
        let answer = rt.block_on(async { tokio::time::timeout(LISTENING_WITHIN, ask).await });
        // zbus's connection ends its tasks on the runtime when dropped.
        let _in_rt = rt.enter();
        let failure = match answer {
            Ok(Ok(_conn)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {LISTENING_WITHIN:?}"),
        };
        Err(TestError::Check(format!(
            "dbus-daemon at {} does not answer GetId: {failure}; its log:\n{}",
            self.address,
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )))
    }

    /// Its address, for `vgpud --bus` and clients.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Its process id (busybox's `chroot` execs it in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BusDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
