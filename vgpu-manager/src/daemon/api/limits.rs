//! Bounds on what a client may send, and on how much of it the daemon repeats in logs and error
//! messages.
//!
//! A request's texts are checked where it is parsed ([`check_label`], [`check_text`]), so that an
//! oversized one is refused with a [`RequestError`] naming the limit before anything runs or is
//! stored. Text a client sent is never logged or echoed whole: [`clip`] and [`clip_debug`] show its
//! start and say how long it was (`… (16777216 bytes, first 64 shown)`).

use std::fmt::{self, Write};

use super::RequestError;

/// The longest label of an instance or a scheduling request, in bytes (UTF-8).
pub const MAX_LABEL_BYTES: usize = 256;

/// The longest pool TOML text (`Plan`, `Apply`) or scheduling requests JSON text (`PlanScheduling`,
/// `ApplyScheduling`), in bytes: 512 KiB, far above any real pool (a few KiB), and below the embedded
/// bus's 1 MiB message limit, so that a text past it is answered with this limit rather than a closed
/// connection.
pub const MAX_TEXT_BYTES: usize = 512 << 10;

/// The longest name of a profile, a GPU or a scheduling slot a client sends, in bytes: 255, a file
/// name's limit on Linux (`NAME_MAX`), as GPU ids (mdev parent names, PCI addresses) and slot names
/// (VF and mdev device names) are sysfs entry names, and the catalog's profile names are far shorter.
pub const MAX_NAME_BYTES: usize = 255;

/// The most scheduling requests one `PlanScheduling`/`ApplyScheduling` may hold: one per vGPU or
/// VF that will run on one GPU, which are a few dozen at most (an SR-IOV GPU's VFs, the vGPUs one
/// mdev parent hosts).
pub const MAX_SCHED_REQUESTS: usize = 256;

/// How much of a client's text an error message or a log line shows, in bytes.
pub const ECHO_BYTES: usize = 64;

/// How much of a logged request (its debug form) a log line shows, in bytes.
pub const LOG_REQUEST_BYTES: usize = 1024;

/// The longest error message sent back to a client, in bytes (messages that would echo long input).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// A text a client sends, as messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientText {
    /// An instance's label (`Create`/`Define` option `label`).
    Label,
    /// A scheduling request's label.
    SchedulingLabel,
    /// A pool file's text (`Plan`, `Apply`).
    PoolToml,
    /// The scheduling requests (`PlanScheduling`, `ApplyScheduling`).
    SchedulingRequests,
    /// A profile's name (`Create`/`Define` with target kind `profile`).
    Profile,
    /// A GPU's id (`Create`, `Define`, `PlanScheduling`, `ApplyScheduling`).
    Gpu,
    /// An mdev type id (`Create`/`Define` with target kind `type`).
    TypeId,
    /// A scheduling request's slot.
    SchedulingSlot,
    /// A live migration's fingerprint (`PrepareIncoming`).
    Fingerprint,
}

impl ClientText {
    /// The text's one name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientText::Label => "the label",
            ClientText::SchedulingLabel => "a scheduling request's label",
            ClientText::PoolToml => "the pool text",
            ClientText::SchedulingRequests => "the scheduling requests text",
            ClientText::Profile => "the profile name",
            ClientText::Gpu => "the GPU id",
            ClientText::TypeId => "the mdev type id",
            ClientText::SchedulingSlot => "a scheduling request's slot",
            ClientText::Fingerprint => "the migration fingerprint",
        }
    }

    /// Its limit in bytes.
    pub fn limit(self) -> usize {
        match self {
            ClientText::Label | ClientText::SchedulingLabel => MAX_LABEL_BYTES,
            ClientText::PoolToml | ClientText::SchedulingRequests | ClientText::Fingerprint => {
                MAX_TEXT_BYTES
            }
            ClientText::Profile | ClientText::Gpu | ClientText::SchedulingSlot => MAX_NAME_BYTES,
            ClientText::TypeId => mdev_types::ids::MdevTypeId::MAX_BYTES,
        }
    }
}

impl fmt::Display for ClientText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A list a client sends, as messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientList {
    /// The requests of one `PlanScheduling`/`ApplyScheduling`.
    SchedulingRequests,
}

impl ClientList {
    /// The list's one name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientList::SchedulingRequests => "the scheduling requests",
        }
    }

    /// Its limit in items.
    pub fn limit(self) -> usize {
        match self {
            ClientList::SchedulingRequests => MAX_SCHED_REQUESTS,
        }
    }
}

impl fmt::Display for ClientList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Refuses a list of `count` items when that is more than `what`'s limit.
pub fn check_count(what: ClientList, count: usize) -> Result<(), RequestError> {
    if count > what.limit() {
        return Err(RequestError::TooMany {
            what,
            count,
            limit: what.limit(),
        });
    }
    Ok(())
}

/// Refuses `text` when it is longer than `what`'s limit.
pub fn check_text(what: ClientText, text: &str) -> Result<(), RequestError> {
    if text.len() > what.limit() {
        return Err(RequestError::TooLong {
            what,
            bytes: text.len(),
            limit: what.limit(),
        });
    }
    Ok(())
}

/// Refuses a label longer than [`MAX_LABEL_BYTES`] or holding a control character (a newline, a tab,
/// an escape: labels are shown in tables and logs, one line each).
pub fn check_label(what: ClientText, label: &str) -> Result<(), RequestError> {
    check_text(what, label)?;
    if let Some((at, _)) = label.char_indices().find(|(_, c)| c.is_control()) {
        return Err(RequestError::UnprintableLabel {
            what,
            label: clip(label).to_string(),
            at,
        });
    }
    Ok(())
}

/// `text` shown at most [`ECHO_BYTES`] long (see [`Clipped`]).
pub fn clip(text: &str) -> Clipped<'_> {
    Clipped {
        text,
        limit: ECHO_BYTES,
    }
}

/// `text` shown at most `limit` bytes long (see [`Clipped`]).
pub fn clip_to(text: &str, limit: usize) -> Clipped<'_> {
    Clipped { text, limit }
}

/// A client's text as logs and messages show it: whole when it is at most `limit` bytes, otherwise
/// its first bytes (cut at a character boundary) and a marker with its length,
/// `… (16777216 bytes, first 64 shown)`. `{:?}` quotes and escapes the shown part as `str`'s does.
#[derive(Clone, Copy)]
pub struct Clipped<'a> {
    text: &'a str,
    limit: usize,
}

impl Clipped<'_> {
    /// The part shown: the whole text, or its start up to the limit.
    fn shown(&self) -> &str {
        if self.text.len() <= self.limit {
            return self.text;
        }
        let mut end = self.limit;
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        &self.text[..end]
    }

    fn marker(&self, f: &mut fmt::Formatter<'_>, shown: usize) -> fmt::Result {
        if shown < self.text.len() {
            write!(f, "… ({} bytes, first {shown} shown)", self.text.len())?;
        }
        Ok(())
    }
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.shown();
        f.write_str(shown)?;
        self.marker(f, shown.len())
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.shown();
        write!(f, "{shown:?}")?;
        self.marker(f, shown.len())
    }
}

/// `value`'s debug form (`{:?}`) shown at most `limit` bytes long, with the same marker as
/// [`Clipped`]. The value is formatted once, into no buffer: output past the limit is only counted.
pub fn clip_debug<T: fmt::Debug + ?Sized>(value: &T, limit: usize) -> ClippedDebug<'_, T> {
    ClippedDebug { value, limit }
}

/// See [`clip_debug`].
pub struct ClippedDebug<'a, T: ?Sized> {
    value: &'a T,
    limit: usize,
}

impl<T: fmt::Debug + ?Sized> fmt::Display for ClippedDebug<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// Passes the first `left` bytes on, counts the rest.
        struct Bounded<'f, 'g> {
            out: &'f mut fmt::Formatter<'g>,
            left: usize,
            shown: usize,
            total: usize,
        }
        impl Write for Bounded<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.total += s.len();
                if self.left == 0 {
                    return Ok(());
                }
                let mut end = s.len().min(self.left);
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                // A character that does not fit ends the shown part.
                self.left = if end < s.len() { 0 } else { self.left - end };
                self.shown += end;
                self.out.write_str(&s[..end])
            }
        }
        let mut b = Bounded {
            out: f,
            left: self.limit,
            shown: 0,
            total: 0,
        };
        write!(b, "{:?}", self.value)?;
        let (shown, total) = (b.shown, b.total);
        if shown < total {
            write!(f, "… ({total} bytes, first {shown} shown)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_show_whole_long_ones_with_their_length() {
        assert_eq!(clip("vm-1").to_string(), "vm-1");
        assert_eq!(format!("{:?}", clip("a\"b")), r#""a\"b""#);
        let long = "x".repeat(16 << 20);
        assert_eq!(
            clip(&long).to_string(),
            format!("{}… (16777216 bytes, first 64 shown)", "x".repeat(64))
        );
        // Cut at a character boundary: 'é' is two bytes.
        let e = "é".repeat(40);
        assert_eq!(
            clip(&e).to_string(),
            format!("{}… (80 bytes, first 64 shown)", "é".repeat(32))
        );
        assert_eq!(clip_to("aé", 2).to_string(), "a… (3 bytes, first 1 shown)");
    }

    #[test]
    fn debug_forms_are_bounded_without_a_copy() {
        let v = vec![7u8; 100_000];
        let s = clip_debug(&v, 16).to_string();
        assert!(s.starts_with("[7, 7, 7, 7, 7, …"), "{s}");
        assert!(s.ends_with("bytes, first 16 shown)"), "{s}");
        assert!(s.len() < 64, "{s}");
        assert_eq!(clip_debug(&3, 16).to_string(), "3");
    }

    #[test]
    fn limits_name_themselves() {
        assert!(check_label(ClientText::Label, &"l".repeat(MAX_LABEL_BYTES)).is_ok());
        let e = check_label(ClientText::Label, &"l".repeat(MAX_LABEL_BYTES + 1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the label is 257 bytes long, more than the limit of 256 bytes: send a shorter one"
        );
        let e = check_label(ClientText::Label, "vm\n1").unwrap_err();
        assert!(e.to_string().contains("control character at byte 2"), "{e}");
        let e = check_text(ClientText::PoolToml, &" ".repeat(MAX_TEXT_BYTES + 1)).unwrap_err();
        assert!(e.to_string().contains("limit of 524288 bytes"), "{e}");
        assert!(check_text(ClientText::PoolToml, "name = \"p\"").is_ok());
        let e = check_text(ClientText::Gpu, &"g".repeat(MAX_NAME_BYTES + 1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the GPU id is 256 bytes long, more than the limit of 255 bytes: send a shorter one"
        );
        assert!(check_text(ClientText::Profile, &"p".repeat(MAX_NAME_BYTES)).is_ok());
        let e = check_text(ClientText::TypeId, &"t".repeat(65)).unwrap_err();
        assert!(e.to_string().contains("limit of 64 bytes"), "{e}");
        assert!(check_count(ClientList::SchedulingRequests, MAX_SCHED_REQUESTS).is_ok());
        let e = check_count(ClientList::SchedulingRequests, MAX_SCHED_REQUESTS + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the scheduling requests: 257 of them, more than the limit of 256: send at most 256"
        );
    }
}
