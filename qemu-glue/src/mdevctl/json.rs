//! mdevctl's JSON documents (see the module docs of [`crate::mdevctl`] for the shapes and sources).
//! Output is serialized from structs and ordered maps, never from `serde_json::Value` objects, so keys
//! come out in mdevctl's order (`mdev_type`, `start`, `attrs`) whatever serde_json's map features are.

use std::collections::BTreeMap;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{MdevctlError, check_parent};

/// When mdevctl starts a defined device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartMode {
    /// When its parent appears (`"auto"`).
    Auto,
    /// Only when asked (`"manual"`).
    Manual,
}

impl StartMode {
    /// `auto` for `true`.
    pub fn from_autostart(autostart: bool) -> Self {
        if autostart {
            StartMode::Auto
        } else {
            StartMode::Manual
        }
    }

    /// True for [`StartMode::Auto`].
    pub fn is_auto(self) -> bool {
        self == StartMode::Auto
    }

    /// `auto` or `manual`.
    pub fn as_str(self) -> &'static str {
        match self {
            StartMode::Auto => "auto",
            StartMode::Manual => "manual",
        }
    }
}

/// One device's configuration: the content of `/etc/mdevctl.d/<parent>/<uuid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevctlConfig {
    /// The mdev type to create (`mdev_type` in the JSON).
    pub mdev_type: MdevTypeId,
    /// When it starts.
    pub start: StartMode,
    /// Attributes written to the device's sysfs directory after creation, in order.
    pub attrs: Vec<(String, String)>,
}

struct Attrs<'a>(&'a [(String, String)]);

impl Serialize for Attrs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, v) in self.0 {
            let mut one = BTreeMap::new();
            one.insert(k.as_str(), v.as_str());
            seq.serialize_element(&one)?;
        }
        seq.end()
    }
}

impl Serialize for MdevctlConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("mdev_type", self.mdev_type.as_str())?;
        m.serialize_entry("start", &self.start)?;
        m.serialize_entry("attrs", &Attrs(&self.attrs))?;
        m.end()
    }
}

fn shape(origin: &str, field: &str, problem: impl Into<String>) -> MdevctlError {
    MdevctlError::Shape {
        origin: origin.to_string(),
        field: field.to_string(),
        problem: problem.into(),
    }
}

fn parse_value(text: &str, origin: &str) -> Result<Value, MdevctlError> {
    serde_json::from_str(text).map_err(|e| MdevctlError::Json {
        origin: origin.to_string(),
        detail: e.to_string(),
    })
}

impl MdevctlConfig {
    /// Reads one configuration from JSON text; `origin` (a file name, `stdin`) goes into errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, MdevctlError> {
        Self::from_value(&parse_value(text, origin)?, origin, "")
    }

    /// Reads one configuration from a parsed value; `at` is its JSON path for errors.
    fn from_value(v: &Value, origin: &str, at: &str) -> Result<Self, MdevctlError> {
        let f = |name: &str| {
            if at.is_empty() {
                name.to_string()
            } else {
                format!("{at}.{name}")
            }
        };
        let obj = v.as_object().ok_or_else(|| {
            shape(
                origin,
                if at.is_empty() { "(top)" } else { at },
                r#"expected an object {"mdev_type": …, "start": "auto"|"manual", "attrs": […]}"#,
            )
        })?;
        // mdevctl requires both mdev_type and start (src/mdev.rs load_from_json).
        let mdev_type = obj
            .get("mdev_type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                shape(
                    origin,
                    &f("mdev_type"),
                    "missing or not a string: give the mdev type, e.g. \"nvidia-231\"",
                )
            })?;
        let mdev_type: MdevTypeId = mdev_type.parse().map_err(|_| {
            shape(
                origin,
                &f("mdev_type"),
                format!("'{mdev_type}' is not an mdev type id"),
            )
        })?;
        let start = match obj.get("start").and_then(Value::as_str) {
            Some("auto") => StartMode::Auto,
            Some("manual") => StartMode::Manual,
            other => {
                return Err(shape(
                    origin,
                    &f("start"),
                    format!("{other:?}: must be \"auto\" or \"manual\""),
                ));
            }
        };
        let mut attrs = Vec::new();
        match obj.get("attrs") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for (i, a) in list.iter().enumerate() {
                    let here = f(&format!("attrs[{i}]"));
                    let one = a
                        .as_object()
                        .filter(|o| o.len() == 1)
                        .ok_or_else(|| shape(origin, &here, "must be an object with exactly one key, e.g. {\"assign_adapter\": \"5\"}"))?;
                    for (k, v) in one {
                        let v = v.as_str().ok_or_else(|| {
                            shape(origin, &here, format!("value of '{k}' must be a string"))
                        })?;
                        attrs.push((k.clone(), v.to_string()));
                    }
                }
            }
            Some(_) => {
                return Err(shape(
                    origin,
                    &f("attrs"),
                    "must be a list of single-key objects",
                ));
            }
        }
        Ok(MdevctlConfig {
            mdev_type,
            start,
            attrs,
        })
    }

    /// Pretty JSON, as mdevctl writes its files and prints `list --dumpjson --uuid`.
    pub fn to_json_pretty(&self) -> String {
        // Serializing strings and lists into a String cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A device as mdevctl lists it: parent, UUID and configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevctlDevice {
    /// The parent device name (its sysfs name, e.g. `0000:3b:00.0`).
    pub parent: String,
    /// The instance's UUID, also its file name under `/etc/mdevctl.d/<parent>/`.
    pub uuid: MdevUuid,
    /// Its type, start mode and attributes, as stored in that file.
    pub config: MdevctlConfig,
}

struct Children<'a>(Vec<&'a MdevctlDevice>);

impl Serialize for Children<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for d in &self.0 {
            let mut one = BTreeMap::new();
            one.insert(d.uuid.to_string(), &d.config);
            seq.serialize_element(&one)?;
        }
        seq.end()
    }
}

/// `list --dumpjson` output for `devices`: parents in name order, devices by UUID within a parent (as
/// mdevctl sorts them), `[]` for none.
pub fn list_json(devices: &[MdevctlDevice]) -> String {
    let mut by_parent: BTreeMap<&str, Vec<&MdevctlDevice>> = BTreeMap::new();
    for d in devices {
        by_parent.entry(d.parent.as_str()).or_default().push(d);
    }
    if by_parent.is_empty() {
        return "[]".into();
    }
    let grouped: BTreeMap<&str, Children<'_>> = by_parent
        .into_iter()
        .map(|(p, mut v)| {
            v.sort_by_key(|d| d.uuid);
            (p, Children(v))
        })
        .collect();
    serde_json::to_string_pretty(&[grouped]).unwrap_or_default()
}

/// Reads `list --dumpjson` output (the grouped form; `[]` and empty text mean no devices).
pub fn parse_list_json(text: &str, origin: &str) -> Result<Vec<MdevctlDevice>, MdevctlError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let v = parse_value(text, origin)?;
    let list = v
        .as_array()
        .ok_or_else(|| shape(origin, "(top)", "expected a list [{PARENT: [...]}]"))?;
    let mut out = Vec::new();
    for (i, group) in list.iter().enumerate() {
        let parents = group
            .as_object()
            .ok_or_else(|| shape(origin, &format!("[{i}]"), "expected an object of parents"))?;
        for (parent, children) in parents {
            check_parent(parent)?;
            let here = format!("[{i}].{parent}");
            let children = children
                .as_array()
                .ok_or_else(|| shape(origin, &here, "expected a list of {UUID: CONFIG} objects"))?;
            for (j, c) in children.iter().enumerate() {
                let here = format!("{here}[{j}]");
                let (uuid, config) = c
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.iter().next())
                    .ok_or_else(|| {
                        shape(
                            origin,
                            &here,
                            "expected an object with exactly one key, the UUID",
                        )
                    })?;
                let uuid = uuid
                    .parse()
                    .map_err(|_| shape(origin, &here, format!("key '{uuid}' is not a UUID")))?;
                out.push(MdevctlDevice {
                    parent: parent.clone(),
                    uuid,
                    config: MdevctlConfig::from_value(config, origin, &format!("{here}.{uuid}"))?,
                });
            }
        }
    }
    Ok(out)
}

/// One mdev type of a parent, as `types --dumpjson` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MdevctlType {
    /// Type id (the key).
    #[serde(skip)]
    pub type_id: String,
    /// How many more instances fit.
    pub available_instances: u32,
    /// `device_api` (`vfio-pci` for GPUs).
    pub device_api: String,
    /// Human name; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<String>,
    /// Description; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub description: Option<String>,
}

struct TypeList<'a>(&'a [MdevctlType]);

impl Serialize for TypeList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for t in self.0 {
            let mut one = BTreeMap::new();
            one.insert(t.type_id.as_str(), t);
            seq.serialize_element(&one)?;
        }
        seq.end()
    }
}

/// `types --dumpjson` output: parents in name order, types in the order given; `[]` for none.
pub fn types_json(parents: &[(String, Vec<MdevctlType>)]) -> String {
    if parents.is_empty() {
        return "[]".into();
    }
    let m: BTreeMap<&str, TypeList<'_>> = parents
        .iter()
        .map(|(p, t)| (p.as_str(), TypeList(t)))
        .collect();
    serde_json::to_string_pretty(&[m]).unwrap_or_default()
}

/// Reads `types --dumpjson` output into (parent, types) pairs.
pub fn parse_types_json(
    text: &str,
    origin: &str,
) -> Result<Vec<(String, Vec<MdevctlType>)>, MdevctlError> {
    let v = parse_value(text, origin)?;
    let list = v
        .as_array()
        .ok_or_else(|| shape(origin, "(top)", "expected a list [{PARENT: [...]}]"))?;
    let mut out = Vec::new();
    for (i, group) in list.iter().enumerate() {
        let parents = group
            .as_object()
            .ok_or_else(|| shape(origin, &format!("[{i}]"), "expected an object of parents"))?;
        for (parent, types) in parents {
            let here = format!("[{i}].{parent}");
            let mut ts = Vec::new();
            for (j, t) in types.as_array().into_iter().flatten().enumerate() {
                let (id, body) = t
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.iter().next())
                    .ok_or_else(|| {
                        shape(origin, &format!("{here}[{j}]"), "expected {TYPE: {...}}")
                    })?;
                let mut ty: MdevctlType = serde_json::from_value(body.clone())
                    .map_err(|e| shape(origin, &format!("{here}[{j}].{id}"), e.to_string()))?;
                ty.type_id = id.clone();
                ts.push(ty);
            }
            out.push((parent.clone(), ts));
        }
    }
    Ok(out)
}
