//! Floods whose answers are many and quick (vgpud's objects, answered from memory), run so that the
//! machine's load cannot fail them in vgpud's place.
//!
//! busd, the embedded bus, disconnects a client that takes longer than 100 ms to read what it is
//! sent (busd's `SEND_TIMEOUT`, logged as "Disconnecting `:busd.N`, as it didn't take K messages
//! within 100ms"). An attacker that gets thousands of quick answers can be that client on a loaded
//! machine, and then its calls go unanswered through no fault of vgpud's. [`flood_observed`] repeats
//! such a flood, and only such a one.

use std::collections::BTreeMap;

use zbus::Connection;

use super::Daemon;
use super::flood::{self, Attack, Observed, finished, observe};

/// The line busd logs when it drops a client that did not read in time.
const SLOW_READER: &str = "as it didn't take";

/// How many times a flood is run at most.
pub const TRIES: usize = 3;

/// Runs `attack` against `daemon` while [`observe`] watches it through `conn`; the observation and
/// the attacker's tally. Repeated, up to [`TRIES`] times, while the attacker went unanswered
/// because the bus dropped it as a slow reader (its log says so); any other outcome is returned.
pub async fn flood_observed(
    daemon: &mut Daemon,
    conn: &Connection,
    attack: &Attack,
) -> (Observed, BTreeMap<String, usize>) {
    for attempt in 1..=TRIES {
        let dropped_before = daemon.log().matches(SLOW_READER).count();
        let mut a = flood::spawn(&daemon.bus, attack);
        let o = observe(daemon, conn, || finished(&mut a)).await;
        let tally = flood::tally(a);
        let dropped = daemon.log().matches(SLOW_READER).count() > dropped_before;
        if dropped && tally.contains_key("unanswered") && attempt < TRIES {
            println!(
                "attempt {attempt}: the bus dropped the attacker as a slow reader ({tally:?}); again"
            );
            continue;
        }
        return (o, tally);
    }
    unreachable!("the last attempt returns")
}
