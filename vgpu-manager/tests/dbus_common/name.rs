//! A hostile local client: one raw D-Bus call made by a separate process running as another uid (65534
//! in the hostile suites), for the attacks vgpuctl and dbus-send cannot make (a `RequestName` whose
//! reply must be read, a forged `NameLost`, arguments wrapped in a structure, `Properties.Set`).
//!
//! The attacker is the test binary itself, run again with `--exact attacker_process` and the attack in
//! an environment variable; each test file that uses [`attack_as`] has a test of that name calling
//! [`attacker_main`] (which does nothing in a normal test run). The child prints one line
//! `ATTACK-OUTCOME <json>`, read back as an [`Outcome`].

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use zbus::Variant;

/// The variable that carries the attack to the child.
const ATTACK_VAR: &str = "VGPU_TEST_ATTACK";
/// The marker of the child's answer line.
const MARKER: &str = "ATTACK-OUTCOME ";

/// One raw call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Attack {
    /// `org.freedesktop.DBus.RequestName(name, flags)`.
    RequestName {
        /// The name.
        name: String,
        /// The flags (1 AllowReplacement, 2 ReplaceExisting, 4 DoNotQueue).
        flags: u32,
    },
    /// A `org.freedesktop.DBus.NameLost(name)` signal sent unicast to `to`, as any client can.
    ForgeNameLost {
        /// The destination (a unique name).
        to: String,
        /// The name said to be lost.
        name: String,
    },
    /// `org.freedesktop.DBus.Properties.Set(interface, property, <s value>)` on `path`.
    SetProperty {
        /// The object.
        path: String,
        /// The property's interface.
        interface: String,
        /// The property.
        property: String,
        /// A string value.
        value: String,
    },
    /// A method call on `path` whose string arguments are sent wrapped in one structure (signature
    /// `(s…)`) in place of the argument list (`s…`).
    WrappedCall {
        /// The object.
        path: String,
        /// The interface.
        interface: String,
        /// The method.
        member: String,
        /// The arguments, all strings.
        args: Vec<String>,
    },
}

/// What the attacker got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A method return, its body's signature and value in text.
    Reply(String),
    /// A signal was sent (no reply exists).
    Sent,
    /// An error reply.
    Error {
        /// The error name.
        name: String,
        /// Its message.
        message: String,
    },
}

impl Outcome {
    /// The error name, if an error.
    pub fn error_name(&self) -> Option<&str> {
        match self {
            Outcome::Error { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// Runs `attack` against the bus at `bus` from a child process running as `uid` (and gid `uid`, no
/// supplementary groups).
pub async fn attack_as(uid: u32, bus: &str, attack: &Attack) -> Outcome {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "attacker_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ATTACK_VAR, serde_json::to_string(&(bus, attack)).unwrap())
    .stdin(Stdio::null())
    .uid(uid)
    .gid(uid);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run the attacker process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(MARKER).map(|(_, json)| json))
        .unwrap_or_else(|| {
            panic!(
                "the attacker ({attack:?}) printed no outcome ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap()
}

/// The attacker's side: when the attack variable is set (in the child [`attack_as`] starts), makes
/// the call and prints the outcome; otherwise (a normal test run) returns at once.
pub fn attacker_main() {
    let Ok(spec) = std::env::var(ATTACK_VAR) else {
        return;
    };
    let (bus, attack): (String, Attack) = serde_json::from_str(&spec).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(run(&bus, &attack));
    println!("{MARKER}{}", serde_json::to_string(&outcome).unwrap());
}

fn outcome(r: zbus::Result<zbus::Message>) -> Outcome {
    match r {
        Ok(m) => {
            let body = m.body();
            let sig = body.signature().to_string();
            let value = match sig.as_str() {
                "u" => body.deserialize::<u32>().map(|v| v.to_string()),
                _ => body.deserialize::<zbus::Structure>().map(|v| v.to_string()),
            }
            .unwrap_or_default();
            Outcome::Reply(format!("{sig} {value}").trim_end().to_string())
        }
        Err(zbus::Error::MethodError(name, message, _)) => Outcome::Error {
            name: name.to_string(),
            message: message.unwrap_or_default(),
        },
        Err(zbus::Error::FDO(e)) => Outcome::Error {
            name: zbus::DBusError::name(&*e).to_string(),
            message: zbus::DBusError::description(&*e)
                .unwrap_or_default()
                .to_string(),
        },
        Err(e) => Outcome::Error {
            name: "(zbus)".into(),
            message: e.to_string(),
        },
    }
}

async fn run(bus: &str, attack: &Attack) -> Outcome {
    let conn = vgpu_client::connect(&bus.parse().expect("bus address"))
        .await
        .expect("the attacker connects");
    let service = Some(vgpu_client::SERVICE);
    match attack {
        Attack::RequestName { name, flags } => outcome(
            conn.call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "RequestName",
                &(name.as_str(), *flags),
            )
            .await,
        ),
        Attack::ForgeNameLost { to, name } => {
            match conn
                .emit_signal(
                    Some(to.as_str()),
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "NameLost",
                    &(name.as_str(),),
                )
                .await
            {
                Ok(()) => Outcome::Sent,
                Err(e) => Outcome::Error {
                    name: "(zbus)".into(),
                    message: e.to_string(),
                },
            }
        }
        Attack::SetProperty {
            path,
            interface,
            property,
            value,
        } => outcome(
            conn.call_method(
                service,
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Set",
                &(
                    interface.as_str(),
                    property.as_str(),
                    Variant::from(value.as_str()),
                ),
            )
            .await,
        ),
        Attack::WrappedCall {
            path,
            interface,
            member,
            args,
        } => {
            let (path, iface, member) = (path.as_str(), Some(interface.as_str()), member.as_str());
            // The body is one structure: `((s))` is the type of a message whose body is `(s)`.
            outcome(match args.as_slice() {
                [a] => {
                    conn.call_method(service, path, iface, member, &((a.as_str(),),))
                        .await
                }
                [a, b] => {
                    conn.call_method(service, path, iface, member, &((a.as_str(), b.as_str()),))
                        .await
                }
                _ => panic!("WrappedCall takes one or two arguments"),
            })
        }
    }
}
