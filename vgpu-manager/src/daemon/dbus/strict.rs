//! [`Strict`]: an interface served as the D-Bus specification has it where zbus is lenient.
//!
//! * `Properties.Set` of a read-only property answers `org.freedesktop.DBus.Error.PropertyReadOnly`
//!   (zbus answers `UnknownProperty`, as if the property did not exist).
//! * A method call whose body signature is not the method's in-arguments answers
//!   `org.freedesktop.DBus.Error.InvalidArgs` naming the expected signature. zbus reads a body whose
//!   only value is a structure of the arguments (`(s)` for `s`) as the arguments themselves; the
//!   specification ("Message Format", the `SIGNATURE` header field) makes the body's signature the
//!   list of the arguments, so `(s)` is one structure argument, which no method here takes.
//!
//! Both are answered from the interface's own introspection (what zbus generates from the
//! `#[interface]` block), read once per type.

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use zbus::message::{Header, Message};
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult, Interface, SignalEmitter};
use zbus::{BoxDBusError, Connection, ObjectServer, OwnedVariant, Variant, fdo};

/// What the checks need of one interface.
#[derive(Debug, Default)]
struct Table {
    /// The interface's name.
    interface: String,
    /// Each method's in-arguments signature (the concatenated types of its `in` args).
    methods: HashMap<String, String>,
    /// The properties without write access.
    read_only: HashSet<String>,
}

impl Table {
    /// Reads the table from an introspection fragment (`<interface name="…">…</interface>`).
    fn from_introspection(xml: &str) -> Table {
        let mut t = Table::default();
        // zbus writes each doc comment as an XML comment, whose text may hold `--`, which XML does
        // not allow there: the comments are dropped before parsing.
        let mut plain = String::with_capacity(xml.len());
        let mut rest = xml;
        while let Some(start) = rest.find("<!--") {
            plain.push_str(&rest[..start]);
            rest = rest[start..]
                .find("-->")
                .map_or("", |end| &rest[start + end + 3..]);
        }
        plain.push_str(rest);
        let Ok(doc) = roxmltree::Document::parse(&plain) else {
            // zbus's own output; an unparsable one only disables the checks.
            tracing::warn!(
                "cannot read an interface's introspection: Set and call signatures are not checked"
            );
            return t;
        };
        let root = doc.root_element();
        t.interface = root.attribute("name").unwrap_or_default().to_string();
        for node in root.children().filter(|n| n.is_element()) {
            let Some(name) = node.attribute("name") else {
                continue;
            };
            match node.tag_name().name() {
                "method" => {
                    let sig: String = node
                        .children()
                        .filter(|a| a.has_tag_name("arg"))
                        .filter(|a| a.attribute("direction").unwrap_or("in") == "in")
                        .filter_map(|a| a.attribute("type"))
                        .collect();
                    t.methods.insert(name.to_string(), sig);
                }
                "property" if node.attribute("access") == Some("read") => {
                    t.read_only.insert(name.to_string());
                }
                _ => {}
            }
        }
        t
    }

    /// The table of `I`, read once per type.
    fn of<I: Interface>(inner: &I) -> Arc<Table> {
        static TABLES: OnceLock<Mutex<HashMap<TypeId, Arc<Table>>>> = OnceLock::new();
        let tables = TABLES.get_or_init(Default::default);
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        let mut tables = tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(tables.entry(TypeId::of::<I>()).or_insert_with(|| {
            let mut xml = String::new();
            inner.introspect_to_writer(&mut xml, 0);
            Arc::new(Table::from_introspection(&xml))
        }))
    }

    /// The error of a call of `member` with body signature `got`, if it is not the method's.
    fn signature_error(&self, member: &str, got: &str) -> Option<fdo::Error> {
        let want = self.methods.get(member)?;
        (want != got).then(|| {
            let hint = if got == format!("({want})") {
                ": send the arguments themselves, not one structure holding them"
            } else {
                ""
            };
            fdo::Error::InvalidArgs(format!(
                "{}.{member} takes arguments of signature '{want}', not '{got}'{hint}",
                self.interface
            ))
        })
    }
}

/// The body signature of the message `bytes` as sent: the raw `SIGNATURE` header field (D-Bus
/// specification, "Message Format": the fixed 12 bytes, then the header fields as an array of
/// `(yv)` structures, each aligned to 8). zbus's parsed signature cannot tell `ss` from `(ss)`.
/// `Some("")` when the field is absent (an empty body); `None` when the header does not read as
/// expected (then nothing is checked).
fn raw_body_signature(bytes: &[u8]) -> Option<&[u8]> {
    let little = match bytes.first()? {
        b'l' => true,
        b'B' => false,
        _ => return None,
    };
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        let v = if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        };
        usize::try_from(v).ok()
    };
    let align = |at: usize, n: usize| at.div_ceil(n) * n;
    let end = 16usize.checked_add(u32_at(12)?)?;
    let mut at = 16;
    while at < end {
        at = align(at, 8);
        let code = *bytes.get(at)?;
        // The variant's signature: one byte of length, the type, a nul.
        let sig_len = usize::from(*bytes.get(at + 1)?);
        let ty = bytes.get(at + 2..at + 2 + sig_len)?;
        at += 2 + sig_len + 1;
        match ty {
            b"g" => {
                let len = usize::from(*bytes.get(at)?);
                let value = bytes.get(at + 1..at + 1 + len)?;
                if code == 8 {
                    return Some(value);
                }
                at += 1 + len + 1;
            }
            b"s" | b"o" => {
                at = align(at, 4);
                at += 4 + u32_at(at)? + 1;
            }
            b"u" | b"h" => at = align(at, 4) + 4,
            _ => return None,
        }
    }
    Some(b"")
}

/// `T` served strictly (see the module documentation). Derefs to `T`, so the served object's state
/// and its generated `*_changed` helpers are used through it.
pub(super) struct Strict<T> {
    inner: T,
    table: Arc<Table>,
}

impl<T: Interface> Strict<T> {
    /// Serves `inner` strictly.
    pub(super) fn wrap(inner: T) -> Strict<T> {
        let table = Table::of(&inner);
        Strict { inner, table }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Strict<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<T> std::ops::Deref for Strict<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::DerefMut for Strict<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// A dispatch that answers `err` to the call `msg`.
fn refuse<'a>(conn: &'a Connection, msg: &'a Message, err: fdo::Error) -> DispatchResult<'a> {
    DispatchResult::new_async(conn, msg, async move { Err::<(), _>(err) })
}

// `zbus::export::async_trait` is what zbus's `#[interface]` expands to for this trait.
#[zbus::export::async_trait::async_trait]
impl<T: Interface> Interface for Strict<T> {
    fn name() -> InterfaceName<'static> {
        T::name()
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        self.inner.spawn_tasks_for_methods()
    }

    async fn get(
        &self,
        property_name: &str,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<Result<OwnedVariant, BoxDBusError>> {
        self.inner
            .get(property_name, server, connection, header, emitter)
            .await
    }

    async fn get_all(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> fdo::Result<HashMap<String, OwnedVariant>> {
        self.inner
            .get_all(server, connection, header, emitter)
            .await
    }

    fn set<'call>(
        &'call self,
        property_name: &'call str,
        value: &'call Variant<'_>,
        server: &'call ObjectServer,
        connection: &'call Connection,
        header: Option<&'call Header<'_>>,
        emitter: &'call SignalEmitter<'_>,
    ) -> DispatchResult<'call> {
        match self
            .inner
            .set(property_name, value, server, connection, header, emitter)
        {
            DispatchResult::NotFound if self.table.read_only.contains(property_name) => {
                let err = fdo::Error::PropertyReadOnly(format!(
                    "property {property_name} of {} is read-only",
                    self.table.interface
                ));
                DispatchResult::Async(Box::pin(async move { Err(Box::new(err) as BoxDBusError) }))
            }
            other => other,
        }
    }

    async fn set_mut(
        &mut self,
        property_name: &str,
        value: &Variant<'_>,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<Result<(), BoxDBusError>> {
        self.inner
            .set_mut(property_name, value, server, connection, header, emitter)
            .await
    }

    fn call<'call>(
        &'call self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        if let Some(got) = raw_body_signature(msg.data().bytes())
            && let Some(err) = self
                .table
                .signature_error(name.as_str(), &String::from_utf8_lossy(got))
        {
            return refuse(connection, msg, err);
        }
        self.inner.call(server, connection, msg, name)
    }

    fn call_mut<'call>(
        &'call mut self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        // `call` has checked the signature already (zbus calls `call_mut` only after `call` asked for
        // it).
        self.inner.call_mut(server, connection, msg, name)
    }

    fn introspect_to_writer(&self, writer: &mut dyn std::fmt::Write, level: usize) {
        self.inner.introspect_to_writer(writer, level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<interface name="org.vgpumanager.Manager1">
  <!--
   A doc comment with -- in it, as zbus writes them.
   -->
  <method name="GetInstance">
    <arg name="uuid" type="s" direction="in"/>
    <arg name="instance" type="(ssss)" direction="out"/>
  </method>
  <method name="Create">
    <arg name="target_kind" type="s" direction="in"/>
    <arg name="options" type="a{sv}" direction="in"/>
  </method>
  <method name="Reconcile">
  </method>
  <property name="Version" type="s" access="read"/>
  <property name="Knob" type="s" access="readwrite"/>
</interface>"#;

    /// A method call of `member` built by zbus with `body`.
    fn call_bytes<B>(body: &B) -> Vec<u8>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let m = Message::method_call("/org/vgpumanager/Manager1", "GetInstance")
            .interface("org.vgpumanager.Manager1")
            .destination("org.vgpumanager.Manager1")
            .build(body)
            .unwrap();
        m.data().bytes().to_vec()
    }

    #[test]
    fn the_raw_signature_tells_wrapped_arguments_apart() {
        let sig = |b: Vec<u8>| String::from_utf8(raw_body_signature(&b).unwrap().to_vec()).unwrap();
        assert_eq!(sig(call_bytes(&("a",))), "s");
        assert_eq!(sig(call_bytes(&(("a",),))), "(s)");
        assert_eq!(sig(call_bytes(&("a", "b"))), "ss");
        assert_eq!(sig(call_bytes(&(("a", "b"),))), "(ss)");
        assert_eq!(sig(call_bytes(&())), "");
        assert_eq!(raw_body_signature(b"x"), None);
        assert_eq!(raw_body_signature(b"l\x01"), None);
    }

    #[test]
    fn the_table_reads_in_arguments_and_read_only_properties() {
        let t = Table::from_introspection(XML);
        assert_eq!(t.interface, "org.vgpumanager.Manager1");
        assert_eq!(t.methods["GetInstance"], "s");
        assert_eq!(t.methods["Create"], "sa{sv}");
        assert_eq!(t.methods["Reconcile"], "");
        assert!(t.read_only.contains("Version") && !t.read_only.contains("Knob"));
    }

    #[test]
    fn wrapped_and_wrong_arguments_are_named() {
        let t = Table::from_introspection(XML);
        assert!(t.signature_error("GetInstance", "s").is_none());
        assert!(t.signature_error("Unknown", "(s)").is_none());
        let e = t.signature_error("GetInstance", "(s)").unwrap();
        assert_eq!(
            e,
            fdo::Error::InvalidArgs(
                "org.vgpumanager.Manager1.GetInstance takes arguments of signature 's', not '(s)': send the arguments themselves, not one structure holding them".into()
            )
        );
        let e = t.signature_error("Reconcile", "u").unwrap();
        assert!(matches!(e, fdo::Error::InvalidArgs(m) if m.ends_with("'', not 'u'")));
    }
}
