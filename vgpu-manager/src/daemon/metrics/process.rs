//! The process metrics every Prometheus client library exports for its process (the "Process
//! metrics" of prometheus.io/docs/instrumenting/writing_clientlibs), read from `/proc/self` (proc(5):
//! `stat`, `fd/`) and `getrlimit(2)` at scrape time: a few small reads, no sysfs.

use std::sync::OnceLock;

use super::text::{Exposition, Kind};

/// What does not change while the process runs.
#[derive(Debug, Clone, Copy)]
struct Constants {
    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `stat`'s times.
    ticks: f64,
    /// The page size, the unit of `stat`'s `rss`.
    page: f64,
    /// Boot time, seconds since the Unix epoch (`btime` of `/proc/stat`).
    boot: f64,
}

fn constants() -> Constants {
    static C: OnceLock<Constants> = OnceLock::new();
    *C.get_or_init(|| {
        use nix::unistd::{SysconfVar, sysconf};
        let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as f64;
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        Constants { ticks, page, boot }
    })
}

/// The values `stat` gives, already in seconds and bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatValues {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Start time, seconds since the Unix epoch.
    pub start_time: f64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: f64,
    /// Resident set size, bytes.
    pub resident_bytes: f64,
    /// Threads.
    pub threads: f64,
}

/// Parses `/proc/<pid>/stat` (proc(5)): the fields after the command, which is in parentheses and
/// may itself hold spaces and parentheses (so the last `)` ends it). `None` when it is malformed.
pub fn parse_stat(text: &str, ticks: f64, page: f64, boot: f64) -> Option<StatValues> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first after the command; `nth(k)` is field k + 3.
    let field = |k: usize| -> Option<f64> { rest.split_ascii_whitespace().nth(k)?.parse().ok() };
    Some(StatValues {
        cpu_seconds: (field(11)? + field(12)?) / ticks,
        threads: field(17)?,
        start_time: boot + field(19)? / ticks,
        virtual_bytes: field(20)?,
        resident_bytes: field(21)? * page,
    })
}

/// Writes the process families (those that cannot be read are left out, as client libraries do).
pub fn write(e: &mut Exposition) {
    let c = constants();
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t, c.ticks, c.page, c.boot));
    if let Some(s) = stat {
        e.family(
            "process_cpu_seconds",
            Kind::Counter,
            "Total user and system CPU time spent in seconds.",
        )
        .sample(&[], s.cpu_seconds);
        e.family(
            "process_start_time_seconds",
            Kind::Gauge,
            "Start time of the process since unix epoch in seconds.",
        )
        .sample(&[], s.start_time);
        e.family(
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory size in bytes.",
        )
        .sample(&[], s.virtual_bytes);
        e.family(
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
        )
        .sample(&[], s.resident_bytes);
        e.family(
            "process_threads",
            Kind::Gauge,
            "Number of OS threads in the process.",
        )
        .sample(&[], s.threads);
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // Less the descriptor of the listing itself.
        let n = dir.count().saturating_sub(1);
        e.family(
            "process_open_fds",
            Kind::Gauge,
            "Number of open file descriptors.",
        )
        .sample(&[], n as f64);
    }
    if let Ok((soft, _)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        e.family(
            "process_max_fds",
            Kind::Gauge,
            "Maximum number of open file descriptors.",
        )
        .sample(&[], soft as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_past_a_command_with_spaces_and_parentheses() {
        // proc(5) field order; utime 150, stime 50, threads 7, starttime 1000, vsize, rss 10 pages.
        let text = "42 (vg (d) x) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 7 0 1000 123456789 10 18446744073709551615";
        let s = parse_stat(text, 100.0, 4096.0, 1_700_000_000.0).unwrap();
        assert_eq!(s.cpu_seconds, 2.0);
        assert_eq!(s.threads, 7.0);
        assert_eq!(s.start_time, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 123_456_789.0);
        assert_eq!(s.resident_bytes, 40960.0);
        assert_eq!(parse_stat("42 (x) S 1", 100.0, 4096.0, 0.0), None);
        assert_eq!(parse_stat("no paren", 100.0, 4096.0, 0.0), None);
    }

    #[test]
    fn this_process_is_described() {
        let mut e = Exposition::with_capacity(super::super::text::Format::Prometheus, 0);
        write(&mut e);
        let t = e.finish();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(t.contains(name), "{name} missing in {t}");
        }
    }
}
