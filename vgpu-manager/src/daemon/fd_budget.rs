//! vgpud's file-descriptor budget: it raises its soft `RLIMIT_NOFILE` to the hard limit at start.
//!
//! systemd starts services with a soft limit of 1024 and a much higher hard limit (systemd.exec(5),
//! `LimitNOFILE=`; the soft limit stays low for programs that still use select(2), which vgpud does
//! not). The shipped unit sets both to the value vgpud is sized for; raising the soft limit makes
//! the same budget apply wherever vgpud runs without that unit.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force.
///
/// A failure leaves the limit as it was (it is logged): vgpud still runs, within a smaller budget.
pub fn raise_nofile_limit() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE");
            return 1024;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = hard, "raised the soft RLIMIT_NOFILE");
            hard
        }
        Err(e) => {
            tracing::warn!(error = %e, soft, hard, "cannot raise the soft RLIMIT_NOFILE to the hard limit");
            soft
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let soft = raise_nofile_limit();
        let (now, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, now);
        assert_eq!(now, hard);
    }
}
