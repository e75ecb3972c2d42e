//! Where the time of one daemon call goes, from vgpud's own log: the wall-clock instants a client
//! took before and after each call, set against the timestamps of the daemon's `request` line (written
//! once the call is admitted and its caller checked) and of the line the engine writes when the device
//! change is done (`instance created`, `instance removed`). That splits a call into three phases: the
//! way in (bus routing, admission, caller check), the engine's work (placement, the ledger entry, the
//! kernel's sysfs operation), and the way out (the instance's view read back, the object tree and its
//! signals, the reply).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mdev_types::ids::MdevUuid;

use super::bench::{ms, percentile};

/// One call as its client saw it.
pub(super) struct CallSpan {
    /// The instance the call was about.
    pub(super) uuid: MdevUuid,
    /// Taken just before the call was sent.
    pub(super) start: SystemTime,
    /// Taken just after its reply arrived.
    pub(super) end: SystemTime,
}

/// The log lines that mark one kind of call in vgpud's log.
pub(super) struct Marks {
    /// The command's name in the `request` line (`command=CreateInstance(…)`).
    pub(super) command: &'static str,
    /// The engine's message once the device change is done (followed by ` uuid=UUID`).
    pub(super) done: &'static str,
}

impl Marks {
    /// `Manager1.Create`: the command `CreateInstance`, done at `instance created` (the engine's
    /// reconcile.rs, once the kernel made the device).
    pub(super) const CREATE: Marks = Marks {
        command: "CreateInstance",
        done: "instance created",
    };
    /// `Manager1.Destroy`: the command `DestroyInstance`, done at `instance removed`.
    pub(super) const DESTROY: Marks = Marks {
        command: "DestroyInstance",
        done: "instance removed",
    };
}

/// Per-call durations of the three phases (calls whose lines were not both found are left out).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Phases {
    /// From the client's send to the daemon's `request` line.
    pub(super) way_in: Vec<Duration>,
    /// From the `request` line to the engine's done line.
    pub(super) work: Vec<Duration>,
    /// From the done line to the reply at the client.
    pub(super) way_out: Vec<Duration>,
}

impl Phases {
    /// One `bench:` line with each phase's p50, for `what` (a method name).
    pub(super) fn summary(&self, what: &str) -> String {
        format!(
            "bench:   {what:<7} phases p50 over {} calls: way in (routing, admission, caller check) {}, engine (placement, ledger, sysfs) {}, way out (view, objects, signals, reply) {}",
            self.work.len(),
            ms(percentile(&self.way_in, 50)),
            ms(percentile(&self.work, 50)),
            ms(percentile(&self.way_out, 50)),
        )
    }
}

/// The phases of `calls`, from the daemon log `log` and the lines `marks` names.
pub(super) fn phases(log: &str, calls: &[CallSpan], marks: &Marks) -> Phases {
    let mut requested: HashMap<String, SystemTime> = HashMap::new();
    let mut done: HashMap<String, SystemTime> = HashMap::new();
    let request_mark = format!("command={}", marks.command);
    let done_mark = format!("{} uuid=", marks.done);
    for line in log.lines() {
        let Some(at) = line.split_whitespace().next().and_then(parse_utc) else {
            continue;
        };
        if let Some((_, rest)) = line.split_once(&request_mark) {
            if let Some(uuid) = first_uuid(rest) {
                requested.entry(uuid).or_insert(at);
            }
        } else if let Some((_, rest)) = line.split_once(&done_mark)
            && let Some(uuid) = first_uuid(rest)
        {
            done.entry(uuid).or_insert(at);
        }
    }
    let mut p = Phases::default();
    for c in calls {
        let u = c.uuid.to_string();
        let (Some(r), Some(d)) = (requested.get(&u), done.get(&u)) else {
            continue;
        };
        let between = |a: SystemTime, b: SystemTime| b.duration_since(a).unwrap_or_default();
        p.way_in.push(between(c.start, *r));
        p.work.push(between(*r, *d));
        p.way_out.push(between(*d, c.end));
    }
    p
}

/// The first UUID (8-4-4-4-12 hex digits) in `text`.
fn first_uuid(text: &str) -> Option<String> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(35)).find_map(|i| {
        let s = text.get(i..i + 36)?;
        s.parse::<MdevUuid>().is_ok().then(|| s.to_string())
    })
}

/// A UTC timestamp as tracing-subscriber writes it (`2026-12-07T01:32:58.039109Z`).
fn parse_utc(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|n| n.parse::<i64>().ok());
    let (y, mo, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|n| n.parse::<u64>().ok());
    let (h, mi, sec) = (t.next()??, t.next()??, t.next()??);
    let digits = frac.get(..frac.len().min(9))?;
    let nanos = digits.parse::<u64>().ok()? * 10u64.pow(9 - digits.len() as u32);
    let days = u64::try_from(days_from_civil(y, mo, day)).ok()?;
    let secs = days * 86_400 + h * 3_600 + mi * 60 + sec;
    Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_to_the_epoch() {
        let t = parse_utc("1970-01-02T00:00:01.5Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_millis(86_401_500)
        );
        // 2026-12-07 is day 20_794 (date -d 2026-12-07 +%s = 1_796_601_600).
        let t = parse_utc("2026-12-07T01:32:58.039109Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_micros(1_796_607_178_039_109)
        );
        assert_eq!(parse_utc("2026-12-07 01:32:58Z"), None);
        assert_eq!(parse_utc("not a time"), None);
    }

    #[test]
    fn phases_come_from_the_request_and_done_lines() {
        let u: MdevUuid = "11111111-0000-0000-0000-000000000008".parse().unwrap();
        let other: MdevUuid = "11111111-0000-0000-0000-000000000009".parse().unwrap();
        let log = "\
2026-12-07T01:32:58.039000Z  INFO vgpu_manager::daemon::dbus: request caller=uid 0 (root) command=CreateInstance(InstanceSpec { uuid: Some(MdevUuid(11111111-0000-0000-0000-000000000008)) })
2026-12-07T01:32:58.041000Z  INFO vgpu_manager::daemon::engine::reconcile: instance created uuid=11111111-0000-0000-0000-000000000008 parent=p
2026-12-07T01:32:58.050000Z  INFO vgpu_manager::daemon::dbus: request caller=uid 0 (root) command=DestroyInstance { uuid: MdevUuid(11111111-0000-0000-0000-000000000008) }
2026-12-07T01:32:58.060000Z  INFO vgpu_manager::daemon::dbus: request caller=uid 0 (root) command=CreateInstance(InstanceSpec { uuid: Some(MdevUuid(11111111-0000-0000-0000-000000000009)) })
";
        let at = |s| parse_utc(s).unwrap();
        let calls = [
            CallSpan {
                uuid: u,
                start: at("2026-12-07T01:32:58.038000Z"),
                end: at("2026-12-07T01:32:58.045000Z"),
            },
            // Its done line is missing: left out.
            CallSpan {
                uuid: other,
                start: at("2026-12-07T01:32:58.059000Z"),
                end: at("2026-12-07T01:32:58.070000Z"),
            },
        ];
        let p = phases(log, &calls, &Marks::CREATE);
        assert_eq!(
            p,
            Phases {
                way_in: vec![Duration::from_millis(1)],
                work: vec![Duration::from_millis(2)],
                way_out: vec![Duration::from_millis(4)],
            }
        );
        assert!(p.summary("Create").contains("over 1 calls"));
        assert_eq!(phases(log, &calls, &Marks::DESTROY), Phases::default());
    }
}
