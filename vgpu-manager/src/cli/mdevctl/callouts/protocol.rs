//! The words of mdevctl's call-out protocol: events, actions, states, the `get capabilities` exchange,
//! the device a script is told about, and the argument vector of one call (mdevctl.rst, "CALLOUT
//! SCRIPTS" and "EVENT SCRIPTS"; mdevctl src/callouts.rs at bd7f10a for the exact words).

use std::fmt;
use std::path::PathBuf;

use qemu_glue::mdevctl::{MdevctlDevice, StartMode};
use serde::Deserialize;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use vgpu_client::{InstanceInfo, NewInstance};

/// When a script is called (`-e`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// Before the command acts; a non-zero status (other than 2) refuses it.
    Pre,
    /// After the command acted (state `success` or `failure`); the status is only logged.
    Post,
    /// `modify --live`: the script itself changes the running device.
    Live,
    /// A notifier call after the command (scripts.d/notifiers).
    Notify,
    /// A question: `capabilities` (the version exchange) or `attributes` (a running device's).
    Get,
    /// A word a script's `get capabilities` answer lists that mdevctl does not know (kept so newer
    /// scripts still parse, as mdevctl does; never sent).
    #[serde(other)]
    Unknown,
}

impl Event {
    /// The word on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Pre => "pre",
            Event::Post => "post",
            Event::Live => "live",
            Event::Notify => "notify",
            Event::Get => "get",
            Event::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the command does (`-a`): an mdevctl command, or the subject of a `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// `start` (also each device of `start-parent-mdevs`).
    Start,
    /// `stop`.
    Stop,
    /// `define`.
    Define,
    /// `undefine`.
    Undefine,
    /// `modify` (also its `live` event).
    Modify,
    /// `get attributes`: the running device's attributes, as JSON on standard output.
    Attributes,
    /// `get capabilities`: the version exchange.
    Capabilities,
    /// A word mdevctl does not know, in a script's answer (never sent).
    #[serde(other)]
    Unknown,
}

impl Action {
    /// The word on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Start => "start",
            Action::Stop => "stop",
            Action::Define => "define",
            Action::Undefine => "undefine",
            Action::Modify => "modify",
            Action::Attributes => "attributes",
            Action::Capabilities => "capabilities",
            Action::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far the command got (`-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not run yet (every `pre`, `live` and `get` call).
    None,
    /// It succeeded.
    Success,
    /// It failed.
    Failure,
}

impl State {
    /// The word on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            State::None => "none",
            State::Success => "success",
            State::Failure => "failure",
        }
    }
}

/// What a script supports, from its `get capabilities` answer (`{"supports": {"version": N,
/// "actions": […], "events": […]}}`), or version 1's fixed set for a script that answers none.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Capabilities {
    /// The protocol version the script speaks.
    pub version: u32,
    /// The actions it handles.
    pub actions: Vec<Action>,
    /// The events it handles.
    pub events: Vec<Event>,
}

#[derive(Deserialize)]
struct SupportsAnswer {
    supports: Option<Capabilities>,
}

impl Capabilities {
    /// What mdevctl assumes of a script without version support (its `CalloutVersion::V_1`).
    pub fn version_1() -> Capabilities {
        Capabilities {
            version: 1,
            actions: vec![
                Action::Start,
                Action::Stop,
                Action::Define,
                Action::Undefine,
                Action::Modify,
                Action::Attributes,
            ],
            events: vec![Event::Pre, Event::Post, Event::Notify, Event::Get],
        }
    }

    /// A script's answer to `get capabilities`: its standard output, trailing NUL bytes ignored, as
    /// `{"supports": {…}}`. `None` when it is not such an answer (the script has no version support).
    pub fn from_answer(stdout: &[u8]) -> Option<Capabilities> {
        let text = std::str::from_utf8(stdout).ok()?.trim_end_matches('\0');
        serde_json::from_str::<SupportsAnswer>(text).ok()?.supports
    }

    /// Whether the script handles `event` for `action`.
    pub fn handles(&self, event: Event, action: Action) -> bool {
        self.actions.contains(&action) && self.events.contains(&event)
    }
}

/// Why a script's `get attributes` answer is not one.
#[derive(Debug, thiserror::Error)]
pub enum AttributesAnswerError {
    /// The answer is not JSON.
    #[error("not JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The answer is JSON, but not a list of one-member objects with string values.
    #[error("not a list of one-member objects of strings: {0}")]
    Shape(String),
}

/// A script's answer to `get attributes` (mdevctl src/callouts.rs `get_attributes`): its standard
/// output, read as UTF-8 with invalid bytes replaced and trailing NUL bytes ignored, as a JSON list of
/// one-member objects `[{"NAME": "VALUE"}, …]` in the device's order. `None` for an empty answer;
/// `[{}]` (which mdevctl reads as no attributes), `[]` and `null` are an empty list. All or none: one
/// bad item refuses the whole answer.
pub fn attributes_from_answer(
    stdout: &[u8],
) -> Result<Option<Vec<(String, String)>>, AttributesAnswerError> {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim_end_matches('\0');
    if text.is_empty() {
        return Ok(None);
    }
    if text == "[{}]" {
        return Ok(Some(Vec::new()));
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(AttributesAnswerError::Json)?;
    attribute_list(&value)
        .map(Some)
        .map_err(AttributesAnswerError::Shape)
}

fn attribute_list(v: &serde_json::Value) -> Result<Vec<(String, String)>, String> {
    let list = match v {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(list) => list,
        other => return Err(format!("{other} (not a list)")),
    };
    let mut attrs = Vec::new();
    for item in list {
        let one = item
            .as_object()
            .filter(|o| o.len() == 1)
            .ok_or_else(|| format!("{item} (not an object of one member)"))?;
        for (k, val) in one {
            let val = val
                .as_str()
                .ok_or_else(|| format!("{item} (the value is not a string)"))?;
            attrs.push((k.clone(), val.to_string()));
        }
    }
    Ok(attrs)
}

/// What this front end offers a script on the standard input of `get capabilities`: mdevctl's version
/// 2 (`{"provides": …}`, mdevctl src/callouts.rs `CalloutVersion::V_2`, serialized in its field order).
pub const PROVIDES: &str = r#"{"provides":{"version":2,"actions":["start","stop","define","undefine","modify","attributes","capabilities"],"events":["pre","post","notify","get","live"]}}"#;

/// The device a call is about: `-t`, `-u`, `-p`, and the configuration written to a script's standard
/// input (`{"mdev_type": …, "start": …, "attrs": […]}`, as mdevctl's definition files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The mdev UUID.
    pub uuid: String,
    /// The parent device's sysfs name.
    pub parent: String,
    /// The mdev type id.
    pub mdev_type: String,
    /// Its start mode.
    pub start: StartMode,
    /// Its attributes, in write order.
    pub attrs: Vec<(String, String)>,
}

struct Attrs<'a>(&'a [(String, String)]);

impl Serialize for Attrs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, v) in self.0 {
            seq.serialize_element(&std::collections::BTreeMap::from([(k, v)]))?;
        }
        seq.end()
    }
}

impl Serialize for Device {
    /// The configuration only (no UUID or parent), keys in mdevctl's order.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("mdev_type", &self.mdev_type)?;
        m.serialize_entry("start", self.start.as_str())?;
        m.serialize_entry("attrs", &Attrs(&self.attrs))?;
        m.end()
    }
}

impl From<&MdevctlDevice> for Device {
    fn from(d: &MdevctlDevice) -> Device {
        Device {
            uuid: d.uuid.to_string(),
            parent: d.parent.clone(),
            mdev_type: d.config.mdev_type.to_string(),
            start: d.config.start,
            attrs: d.config.attrs.clone(),
        }
    }
}

impl Device {
    /// The device request `req` makes on `parent`.
    pub fn of_request(req: &NewInstance, parent: &str, autostart: bool) -> Device {
        Device {
            uuid: req.uuid.clone().unwrap_or_default(),
            parent: parent.to_string(),
            mdev_type: req.target.clone(),
            start: StartMode::from_autostart(autostart),
            attrs: req.attrs.clone(),
        }
    }

    /// Instance `i` of vgpud, with attributes `attrs`.
    pub fn of_instance(i: &InstanceInfo, attrs: Vec<(String, String)>) -> Device {
        Device {
            uuid: i.uuid.clone(),
            parent: if i.parent.is_empty() {
                i.gpu.clone()
            } else {
                i.parent.clone()
            },
            mdev_type: i.type_id.clone(),
            start: StartMode::from_autostart(i.autostart),
            attrs,
        }
    }

    /// The configuration as one line of JSON, as mdevctl writes it to a script (`to_json(false)`).
    pub fn config_json(&self) -> String {
        // Strings and lists of strings always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One call of one script: the script and its arguments
/// (`-t TYPE -e EVENT -a ACTION -s STATE -u UUID -p PARENT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The script to run.
    pub script: PathBuf,
    /// `-e`.
    pub event: Event,
    /// `-a`.
    pub action: Action,
    /// `-s`.
    pub state: State,
    /// `-t`.
    pub mdev_type: String,
    /// `-u`.
    pub uuid: String,
    /// `-p`.
    pub parent: String,
}

impl Call {
    /// The argument vector, in mdevctl's order.
    pub fn args(&self) -> Vec<String> {
        [
            ("-t", self.mdev_type.as_str()),
            ("-e", self.event.as_str()),
            ("-a", self.action.as_str()),
            ("-s", self.state.as_str()),
            ("-u", self.uuid.as_str()),
            ("-p", self.parent.as_str()),
        ]
        .into_iter()
        .flat_map(|(flag, v)| [flag.to_string(), v.to_string()])
        .collect()
    }
}
