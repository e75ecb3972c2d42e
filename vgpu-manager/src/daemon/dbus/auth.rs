//! Who is calling, and whether they may change anything.
//!
//! Calls that need authorization
//! ([`Access::needs_authorization`](crate::daemon::api::Access::needs_authorization)) are allowed for
//! uid 0 and for members of group `vgpu-admin`; the identity comes from the bus
//! (`org.freedesktop.DBus.GetConnectionCredentials` of the caller's unique name), never from anything
//! the caller sends. Where polkit runs (`org.freedesktop.PolicyKit1` has an owner), a non-root caller
//! must also be granted action `org.vgpumanager.manage`, asked for the subject kind `system-bus-name`
//! with the CALLER's unique name: polkit then resolves the caller's process itself, and the daemon's own
//! pid is never the subject. Root is not asked about, as polkit itself always authorizes uid 0
//! (polkitbackendinteractiveauthority.c: "uid 0, root, is _always_ authorized for anything").

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use nix::unistd::{Gid, Group, Uid, User, getgrouplist};
use zbus::message::{Flags, Header};
use zbus::names::{BusName, WellKnownName};
use zbus::{Connection, Variant, proxy};

use super::callers::CallerCache;
use super::errors::ApiError;
use vgpu_client::{ADMIN_GROUP, POLKIT_ACTION};

/// The bus name polkit's authority owns.
const POLKIT_NAME: &str = "org.freedesktop.PolicyKit1";
/// polkit's `CheckAuthorizationFlags.AllowUserInteraction` (polkit's D-Bus API documentation,
/// org.freedesktop.PolicyKit1.Authority).
const POLKIT_ALLOW_USER_INTERACTION: u32 = 1;

#[proxy(
    interface = "org.freedesktop.PolicyKit1.Authority",
    default_service = "org.freedesktop.PolicyKit1",
    default_path = "/org/freedesktop/PolicyKit1/Authority"
)]
trait Authority {
    /// `CheckAuthorization(in (sa{sv}) subject, in s action_id, in a{ss} details, in u flags,
    /// in s cancellation_id, out (bba{ss}) result)`.
    fn check_authorization(
        &self,
        subject: &(&str, HashMap<&str, Variant<'_>>),
        action_id: &str,
        details: HashMap<&str, &str>,
        flags: u32,
        cancellation_id: &str,
    ) -> zbus::Result<(bool, bool, HashMap<String, String>)>;
}

/// The identity of a caller, as the bus reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The caller's unique bus name (`:1.42`), or `private#N` for the N-th connection of vgpud's
    /// private socket.
    pub bus_name: String,
    /// Its uid.
    pub uid: u32,
    /// Its pid, when the bus knows it.
    pub pid: Option<u32>,
    /// Its groups (from the bus's `UnixGroupIDs`, or the uid's groups from the user database).
    pub groups: Vec<u32>,
    /// The user name, when the user database has one.
    pub user: Option<String>,
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {}", self.uid)?;
        if let Some(u) = &self.user {
            write!(f, " ({u})")?;
        }
        if self.bus_name.starts_with(':') {
            write!(f, " on bus name {}", self.bus_name)?;
        } else {
            // A connection of vgpud's private socket (`private#N`).
            write!(f, " on {}", self.bus_name)?;
        }
        if let Some(p) = self.pid {
            write!(f, ", pid {p}")?;
        }
        Ok(())
    }
}

/// Whether `uid` is one of vgpud's privileged users: root, or the user vgpud runs as. They may own
/// vgpud's name on the embedded bus, and get their own share of vgpud's workers (see admission).
pub fn is_privileged_uid(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Decides whether callers may make changes.
#[derive(Debug, Clone)]
pub struct Authorizer {
    admin_group: String,
    polkit_action: String,
    /// Callers identified before (shared by clones).
    callers: Arc<CallerCache>,
}

impl Default for Authorizer {
    fn default() -> Self {
        Authorizer {
            admin_group: ADMIN_GROUP.to_string(),
            polkit_action: POLKIT_ACTION.to_string(),
            callers: Arc::default(),
        }
    }
}

/// Why the group check refused a caller (pure, so it can be tested without a bus).
#[derive(Debug, Clone, PartialEq, Eq)]
enum GroupCheck {
    Allowed,
    NotMember,
    NoSuchGroup,
}

fn check_groups(caller: &Caller, admin_gid: Option<u32>) -> GroupCheck {
    if caller.uid == 0 {
        return GroupCheck::Allowed;
    }
    match admin_gid {
        None => GroupCheck::NoSuchGroup,
        Some(g) if caller.groups.contains(&g) => GroupCheck::Allowed,
        Some(_) => GroupCheck::NotMember,
    }
}

impl Authorizer {
    /// An authorizer whose admin group is `group` instead of `vgpu-admin` (for sites with their own
    /// group; the bus policy in `data/` names `vgpu-admin` and must then be changed to match).
    pub fn with_admin_group(group: &str) -> Authorizer {
        Authorizer {
            admin_group: group.to_string(),
            ..Authorizer::default()
        }
    }

    /// Forgets what is known of the caller on `bus_name` (its connection closed).
    pub(super) fn forget(&self, bus_name: &str) {
        self.callers.forget(bus_name);
    }

    /// Starts identifying the client that just connected as `name` (the bus announced it), so that
    /// its first call finds the answer known or under way: a one-shot client (`vgpuctl`, `mdevctl`
    /// as libvirt runs it, the libvirt hook) makes exactly one call, and would otherwise wait for
    /// this lookup's round trip to the bus after sending it. A lookup that fails is not remembered:
    /// the call then asks again.
    pub(super) fn prefetch(&self, conn: &Connection, name: zbus::names::UniqueName<'static>) {
        let (callers, conn) = (Arc::clone(&self.callers), conn.clone());
        tokio::spawn(async move {
            let key = name.to_string();
            if let Err(e) = callers
                .identify_once(&key, || identify_name(&conn, name))
                .await
            {
                tracing::debug!(client = %key, error = %e.message(), "a new client not identified ahead of its call");
            }
        });
    }

    /// Whose share of vgpud a call of the sender of `hdr` counts against: its user, looked up once
    /// per connection (the same lookup a change's authorization uses); a caller the bus cannot
    /// identify (no bus, a lookup that failed) is counted per connection.
    pub(super) async fn principal(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
    ) -> super::admission::Principal {
        use super::admission::Principal;
        let Some(sender) = hdr.sender() else {
            return Principal::Unknown;
        };
        match self
            .callers
            .identify_once(sender.as_str(), || identify(conn, hdr))
            .await
        {
            Ok(caller) => Principal::of_uid(caller.uid),
            Err(e) => {
                tracing::debug!(%sender, error = %e.message(), "caller not identified: counted per connection");
                Principal::Unknown
            }
        }
    }

    /// The group whose members may make changes.
    pub fn admin_group(&self) -> &str {
        &self.admin_group
    }

    /// Identifies the sender of the call `hdr` and checks it may call the mutating method in `hdr`.
    /// Returns the caller for logging; refusals say who was refused and how to get access.
    pub async fn authorize_change(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
    ) -> Result<Caller, ApiError> {
        let method = hdr.member().map(|m| m.to_string()).unwrap_or_default();
        let Some(sender) = hdr.sender() else {
            return Err(denied(
                "the call carries no sender, so its caller cannot be identified".into(),
            ));
        };
        let caller = self
            .callers
            .identify_once(sender.as_str(), || identify(conn, hdr))
            .await?;
        let admin_gid = if caller.uid == 0 {
            None
        } else {
            lookup_gid(&self.admin_group).await?
        };
        let group = &self.admin_group;
        let user = caller
            .user
            .clone()
            .unwrap_or_else(|| format!("#{}", caller.uid));
        match check_groups(&caller, admin_gid) {
            GroupCheck::Allowed => {}
            GroupCheck::NotMember => {
                return Err(denied(format!(
                    "{caller} may not call {method}: changes need root or membership in group {group} (an administrator can run `usermod -aG {group} {user}`; reconnect afterwards)"
                )));
            }
            GroupCheck::NoSuchGroup => {
                return Err(denied(format!(
                    "{caller} may not call {method}: changes need root or membership in group {group}, which does not exist on this host (an administrator can run `groupadd --system {group} && usermod -aG {group} {user}`)"
                )));
            }
        }
        if caller.uid != 0 {
            let interactive = hdr
                .primary()
                .flags()
                .contains(Flags::ALLOW_INTERACTIVE_AUTH);
            self.check_polkit(conn, &caller, &method, interactive)
                .await?;
        }
        Ok(caller)
    }

    /// Asks polkit, if it runs, whether `caller` may perform the manage action.
    async fn check_polkit(
        &self,
        conn: &Connection,
        caller: &Caller,
        method: &str,
        interactive: bool,
    ) -> Result<(), ApiError> {
        let action = &self.polkit_action;
        let dbus = zbus::fdo::DBusProxy::new(conn)
            .await
            .map_err(ApiError::internal)?;
        let running = dbus
            .name_has_owner(BusName::from(WellKnownName::from_static_str_unchecked(
                POLKIT_NAME,
            )))
            .await
            .map_err(ApiError::internal)?;
        if !running {
            return Ok(());
        }
        let polkit = AuthorityProxy::new(conn)
            .await
            .map_err(ApiError::internal)?;
        // The subject is the caller's unique bus name, so polkit looks up the caller's own process and
        // session; the daemon's pid must never stand in for it.
        let mut subject_details = HashMap::new();
        subject_details.insert("name", Variant::from(caller.bus_name.as_str()));
        let subject = ("system-bus-name", subject_details);
        let flags = if interactive {
            POLKIT_ALLOW_USER_INTERACTION
        } else {
            0
        };
        let (authorized, challenge, _) = polkit
            .check_authorization(&subject, action, HashMap::new(), flags, "")
            .await
            .map_err(|e| {
                denied(format!(
                    "{caller} may not call {method}: polkit could not be asked about action {action} ({e}); retry, or check `systemctl status polkit`"
                ))
            })?;
        if authorized {
            Ok(())
        } else if challenge {
            Err(denied(format!(
                "{caller} may not call {method}: polkit requires authentication for action {action}; run the command from a session with an authentication agent (or under `pkexec`), or ask an administrator to grant it to group {}",
                self.admin_group
            )))
        } else {
            Err(denied(format!(
                "{caller} may not call {method}: polkit refused action {action}; an administrator can grant it with a rule in /etc/polkit-1/rules.d/ (vgpu-manager ships one for group {})",
                self.admin_group
            )))
        }
    }
}

/// The refusal of a caller who may not do what it asked (`Error.AccessDenied`).
pub(super) fn denied(message: String) -> ApiError {
    ApiError::new("AccessDenied", message)
}

/// Asks the bus who sent `hdr`.
async fn identify(conn: &Connection, hdr: &Header<'_>) -> Result<Caller, ApiError> {
    let sender = hdr
        .sender()
        .ok_or_else(|| {
            denied("the call carries no sender, so its caller cannot be identified".into())
        })?
        .to_owned();
    identify_name(conn, sender).await
}

/// Asks the bus who is connected as `sender`.
async fn identify_name(
    conn: &Connection,
    sender: zbus::names::UniqueName<'static>,
) -> Result<Caller, ApiError> {
    let dbus = zbus::fdo::DBusProxy::new(conn).await.map_err(|e| {
        denied(format!(
            "vgpud cannot ask the bus who caller {sender} is ({e}), so it may not make changes; retry"
        ))
    })?;
    let creds = dbus
        .get_connection_credentials(BusName::from(sender.clone()))
        .await
        .map_err(|e| {
            denied(format!(
                "the bus could not identify caller {sender} ({e}), so it may not make changes"
            ))
        })?;
    let uid = creds.unix_user_id().ok_or_else(|| {
        denied(format!(
            "the bus reports no uid for caller {sender}, so it may not make changes"
        ))
    })?;
    let bus_groups = creds.unix_group_ids().cloned();
    let pid = creds.process_id();
    // The answer may carry the caller's pidfd (`ProcessFD`): closed now, not held while the user
    // database is read.
    drop(creds);
    tracing::debug!(%sender, uid, bus_groups = ?bus_groups, "caller credentials");
    let (user, groups) = match (bus_groups, cached_name(uid)) {
        // The bus gave the groups and the name is known: nothing to read.
        (Some(groups), Some(user)) => (user, groups),
        (bus_groups, _) => {
            let (user, groups) =
                tokio::task::spawn_blocking(move || user_and_groups(uid, bus_groups))
                    .await
                    .map_err(ApiError::internal)?;
            remember_name(uid, user.clone());
            (user, groups)
        }
    };
    Ok(Caller {
        bus_name: sender.to_string(),
        uid,
        pid,
        groups,
        user,
    })
}

/// How long a user name read from the user database is reused. The name only labels the caller
/// (instance owners, logs; authorization goes by uid and groups), and each lookup reads the user
/// database (`/etc/passwd` through NSS) once more per client connection.
const NAME_TTL: std::time::Duration = std::time::Duration::from_secs(60);

type NameCache = std::collections::HashMap<u32, (Option<String>, std::time::Instant)>;

fn names() -> &'static std::sync::Mutex<NameCache> {
    static NAMES: std::sync::OnceLock<std::sync::Mutex<NameCache>> = std::sync::OnceLock::new();
    NAMES.get_or_init(Default::default)
}

/// The name of `uid` read less than [`NAME_TTL`] ago (`Some(None)`: it has none).
fn cached_name(uid: u32) -> Option<Option<String>> {
    let cache = names()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cache
        .get(&uid)
        .filter(|(_, at)| at.elapsed() < NAME_TTL)
        .map(|(name, _)| name.clone())
}

fn remember_name(uid: u32, name: Option<String>) {
    let mut cache = names()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Callers are few (root, the admins, a handful of services); a flood of uids does not grow it
    // without bound.
    if cache.len() >= 1024 {
        cache.retain(|_, (_, at)| at.elapsed() < NAME_TTL);
        if cache.len() >= 1024 {
            cache.clear();
        }
    }
    cache.insert(uid, (name, std::time::Instant::now()));
}

/// The user name of `uid`, and its groups: those the bus reported, else the user database's
/// (`getgrouplist` of the user's name and primary group). Blocking (NSS).
fn user_and_groups(uid: u32, bus_groups: Option<Vec<u32>>) -> (Option<String>, Vec<u32>) {
    let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
    let name = user.as_ref().map(|u| u.name.clone());
    if let Some(g) = bus_groups {
        return (name, g);
    }
    let groups = user
        .and_then(|u| {
            let cname = std::ffi::CString::new(u.name).ok()?;
            getgrouplist(&cname, u.gid).ok()
        })
        .map(|gs| gs.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_default();
    (name, groups)
}

/// The gid of group `name`, or `None` if the group does not exist.
async fn lookup_gid(name: &str) -> Result<Option<u32>, ApiError> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        Group::from_name(&name)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw())
    })
    .await
    .map_err(ApiError::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, groups: &[u32]) -> Caller {
        Caller {
            bus_name: ":1.9".into(),
            uid,
            pid: Some(77),
            groups: groups.to_vec(),
            user: Some("alice".into()),
        }
    }

    #[test]
    fn root_always_passes_the_group_check() {
        assert_eq!(check_groups(&caller(0, &[]), None), GroupCheck::Allowed);
        assert_eq!(
            check_groups(&caller(0, &[]), Some(990)),
            GroupCheck::Allowed
        );
    }

    #[test]
    fn others_need_the_admin_group() {
        assert_eq!(
            check_groups(&caller(1000, &[990, 1000]), Some(990)),
            GroupCheck::Allowed
        );
        assert_eq!(
            check_groups(&caller(1000, &[1000]), Some(990)),
            GroupCheck::NotMember
        );
        assert_eq!(
            check_groups(&caller(1000, &[1000]), None),
            GroupCheck::NoSuchGroup
        );
    }

    #[test]
    fn caller_display_names_uid_user_bus_name_and_pid() {
        assert_eq!(
            caller(1000, &[]).to_string(),
            "uid 1000 (alice) on bus name :1.9, pid 77"
        );
    }

    #[test]
    fn root_groups_come_from_the_user_database_when_the_bus_gives_none() {
        remember_name(4_000_001, Some("cached".into()));
        assert_eq!(cached_name(4_000_001), Some(Some("cached".into())));
        assert_eq!(cached_name(4_000_002), None);
        let (name, groups) = user_and_groups(0, None);
        assert_eq!(name.as_deref(), Some("root"));
        assert!(groups.contains(&0), "{groups:?}");
        let (_, given) = user_and_groups(0, Some(vec![5, 6]));
        assert_eq!(given, vec![5, 6]);
    }
}
