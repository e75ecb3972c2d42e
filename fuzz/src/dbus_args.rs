//! The D-Bus argument decoding of every method with arguments
//! (`vgpu_manager::daemon::dbus::decode::decode`: the `Command` a call builds, or its `Error.Invalid`
//! reply).
//!
//! Input: NUL-separated fields (a D-Bus string never holds NUL): the method name, its string
//! arguments in signature order, then for methods with an `a{sv}` options argument one field per
//! option, `KEY \x01 SIG \x01 VALUE [\x01 VALUE …]`, with SIG one of `s b y u i x t d o g as a(ss)
//! (ss) ay v` (what a hostile client can put in a variant). Beyond "no panic": a decoded command
//! holds exactly what the arguments said within the documented limits (`daemon::api::limits`), and
//! a refusal is an `org.vgpumanager.Error.*` whose message is bounded and never repeats a long
//! client text whole.

use std::collections::HashMap;

use mdev_types::ids::MdevUuid;
use vgpu_manager::daemon::api::limits::{
    MAX_LABEL_BYTES, MAX_MESSAGE_BYTES, MAX_NAME_BYTES, MAX_SCHED_REQUESTS, MAX_TEXT_BYTES,
};
use vgpu_manager::daemon::api::{InstanceTarget, MAX_ATTRS, MdevAttr};
use vgpu_manager::daemon::dbus::decode::{DecodedCall, WireCall, decode};
use zbus::{ObjectPath, OwnedVariant, Signature, Variant};

/// The methods, with the number of string arguments before the options.
pub const METHODS: &[&str] = &[
    "GetInstance",
    "Create",
    "Define",
    "Destroy",
    "Start",
    "Stop",
    "Undefine",
    "SetAutostart",
    "Plan",
    "Apply",
    "PlanScheduling",
    "ApplyScheduling",
    "OpenDevice",
];

/// The instance an `Instance1` object stands for.
const OBJECT_UUID: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";

/// One option's value, as a client could send it; `None` when the input cannot make that type.
fn variant(sig: &str, values: &[&str]) -> Option<Variant<'static>> {
    let first = values.first().copied().unwrap_or_default();
    let num = || first.trim().parse::<i128>().unwrap_or(first.len() as i128);
    let owned: Vec<String> = values.iter().map(|s| s.to_string()).collect();
    Some(match sig {
        "s" => Variant::from(first.to_string()),
        "b" => Variant::from(first == "true"),
        "y" => Variant::from(num() as u8),
        "u" => Variant::from(num() as u32),
        "i" => Variant::from(num() as i32),
        "x" => Variant::from(num() as i64),
        "t" => Variant::from(num() as u64),
        "d" => Variant::from(first.parse::<f64>().unwrap_or(0.0)),
        "o" => Variant::from(ObjectPath::try_from(first.to_string()).ok()?),
        "g" => Variant::from(Signature::try_from(first).ok()?),
        "as" => Variant::from(owned),
        "a(ss)" => Variant::from(
            owned
                .chunks(2)
                .map(|p| (p[0].clone(), p.get(1).cloned().unwrap_or_default()))
                .collect::<Vec<(String, String)>>(),
        ),
        "(ss)" => Variant::from((
            first.to_string(),
            values.get(1).copied().unwrap_or_default().to_string(),
        )),
        "ay" => Variant::from(first.as_bytes().to_vec()),
        "v" => Variant::from(Variant::from(first.to_string())),
        _ => return None,
    })
}

fn options(fields: &[&str]) -> HashMap<String, OwnedVariant> {
    let mut out = HashMap::new();
    for f in fields {
        let parts: Vec<&str> = f.split('\u{1}').collect();
        let [key, sig, values @ ..] = parts.as_slice() else {
            continue;
        };
        let Some(v) = variant(sig, values).and_then(|v| OwnedVariant::try_from(v).ok()) else {
            continue;
        };
        out.insert(key.to_string(), v);
    }
    out
}

/// The call the input describes.
pub fn wire_call(data: &[u8]) -> Option<WireCall> {
    let text = std::str::from_utf8(data).ok()?;
    let fields: Vec<&str> = text.split('\0').collect();
    let (method, args) = fields.split_first()?;
    let arg = |i: usize| args.get(i).copied().unwrap_or_default().to_string();
    let uuid = arg(0);
    Some(match *method {
        "GetInstance" => WireCall::GetInstance { uuid },
        "Create" | "Define" => WireCall::CreateOrDefine {
            define: *method == "Define",
            target_kind: arg(0),
            target: arg(1),
            gpu: arg(2),
            uuid: arg(3),
            options: options(args.get(4..).unwrap_or_default()),
        },
        "Destroy" => WireCall::Destroy { uuid },
        "Start" => WireCall::Start { uuid },
        "Stop" => WireCall::Stop { uuid },
        "Undefine" => WireCall::Undefine { uuid },
        "SetAutostart" => WireCall::SetAutostart {
            uuid,
            autostart: arg(1) == "true",
        },
        "Plan" => WireCall::Plan { pool_toml: arg(0) },
        "Apply" => WireCall::Apply { pool_toml: arg(0) },
        "PlanScheduling" | "ApplyScheduling" => WireCall::Scheduling {
            apply: *method == "ApplyScheduling",
            gpu: arg(0),
            requests: arg(1),
        },
        "OpenDevice" => WireCall::OpenDevice {
            uuid: OBJECT_UUID.parse().ok()?,
            options: options(args),
        },
        _ => return None,
    })
}

/// Every client text of `call`.
fn texts(call: &WireCall) -> Vec<&str> {
    match call {
        WireCall::GetInstance { uuid }
        | WireCall::Destroy { uuid }
        | WireCall::Start { uuid }
        | WireCall::Stop { uuid }
        | WireCall::Undefine { uuid }
        | WireCall::SetAutostart { uuid, .. } => vec![uuid],
        WireCall::CreateOrDefine {
            target_kind,
            target,
            gpu,
            uuid,
            options,
            ..
        } => {
            let mut t = vec![target_kind.as_str(), target, gpu, uuid];
            t.extend(options.keys().map(String::as_str));
            t
        }
        WireCall::Plan { pool_toml } | WireCall::Apply { pool_toml } => vec![pool_toml],
        WireCall::Scheduling { gpu, requests, .. } => vec![gpu, requests],
        WireCall::OpenDevice { options, .. } => options.keys().map(String::as_str).collect(),
    }
}

fn same_uuid(text: &str, uuid: &MdevUuid) {
    assert_eq!(
        text.parse::<MdevUuid>().ok().as_ref(),
        Some(uuid),
        "{text:?}"
    );
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Some(call) = wire_call(data) else {
        return;
    };
    let decoded = match decode(&call) {
        Ok(d) => d,
        Err(e) => {
            assert!(
                e.error_name().starts_with("org.vgpumanager.Error."),
                "{e:?}"
            );
            let m = e.message();
            assert!(m.len() <= MAX_MESSAGE_BYTES + 64, "{} bytes", m.len());
            for t in texts(&call) {
                assert!(
                    t.len() <= 300 || !m.contains(t),
                    "{m:?} repeats a {}-byte client text",
                    t.len()
                );
            }
            return;
        }
    };
    match (&call, &decoded) {
        (WireCall::GetInstance { uuid }, DecodedCall::GetInstance(c)) => same_uuid(uuid, &c.uuid),
        (WireCall::Destroy { uuid }, DecodedCall::Destroy(c)) => same_uuid(uuid, &c.uuid),
        (WireCall::Start { uuid }, DecodedCall::Start(c)) => same_uuid(uuid, &c.uuid),
        (WireCall::Stop { uuid }, DecodedCall::Stop(c)) => same_uuid(uuid, &c.uuid),
        (WireCall::Undefine { uuid }, DecodedCall::Undefine(c)) => same_uuid(uuid, &c.uuid),
        (WireCall::SetAutostart { uuid, autostart }, DecodedCall::SetAutostart(c)) => {
            same_uuid(uuid, &c.uuid);
            assert_eq!(c.autostart, *autostart);
        }
        (
            WireCall::CreateOrDefine {
                define,
                target,
                gpu,
                uuid,
                ..
            },
            DecodedCall::Create(_) | DecodedCall::Define(_),
        ) => {
            let spec = match &decoded {
                DecodedCall::Create(c) => {
                    assert!(!define && !c.0.autostart, "{c:?}");
                    &c.0
                }
                DecodedCall::Define(c) => {
                    assert!(define, "{c:?}");
                    &c.0
                }
                _ => unreachable!(),
            };
            match &spec.target {
                InstanceTarget::Profile(p) => {
                    assert!(!p.is_empty() && p == target.trim() && p.len() <= MAX_NAME_BYTES)
                }
                InstanceTarget::Type(t) => assert_eq!(Some(t), target.parse().ok().as_ref()),
            }
            match &spec.gpu {
                None => assert!(gpu.trim().is_empty()),
                Some(g) => assert!(g == gpu.trim() && !g.is_empty() && gpu.len() <= MAX_NAME_BYTES),
            }
            match &spec.uuid {
                None => assert!(uuid.trim().is_empty()),
                Some(u) => same_uuid(uuid, u),
            }
            if let Some(l) = &spec.label {
                assert!(!l.is_empty() && l.len() <= MAX_LABEL_BYTES, "{l:?}");
            }
            assert!(spec.attrs.len() <= MAX_ATTRS);
            for a in &spec.attrs {
                assert_eq!(MdevAttr::new(a.name(), a.value()).as_ref(), Ok(a));
            }
        }
        (WireCall::Plan { pool_toml }, DecodedCall::Plan(c)) => pool(pool_toml, &c.toml),
        (WireCall::Apply { pool_toml }, DecodedCall::Apply(c)) => pool(pool_toml, &c.toml),
        (
            WireCall::Scheduling {
                apply: false, gpu, ..
            },
            DecodedCall::PlanScheduling(c),
        ) => {
            assert!(c.gpu == *gpu && c.requests.len() <= MAX_SCHED_REQUESTS)
        }
        (
            WireCall::Scheduling {
                apply: true, gpu, ..
            },
            DecodedCall::ApplyScheduling(c),
        ) => {
            assert!(c.gpu == *gpu && c.requests.len() <= MAX_SCHED_REQUESTS)
        }
        (WireCall::OpenDevice { uuid, .. }, DecodedCall::OpenDevice(c)) => {
            assert_eq!(c.uuid, *uuid)
        }
        (call, decoded) => panic!("{call:?} decoded to another method's command {decoded:?}"),
    }
}

fn pool(sent: &str, kept: &str) {
    assert_eq!(sent, kept);
    assert!(!kept.trim().is_empty() && kept.len() <= MAX_TEXT_BYTES);
}
