//! The exposition formats: Prometheus text format 0.0.4 ("Exposition formats", prometheus.io/docs/
//! instrumenting/exposition_formats) and OpenMetrics 1.0 (the OpenMetrics specification,
//! github.com/OpenObservability/OpenMetrics, `specification/OpenMetrics.md`), written straight into one
//! buffer so a scrape allocates little.
//!
//! The two differ only where it shows here: a counter family is named without `_total` in
//! OpenMetrics' `# TYPE`/`# HELP` lines (its sample keeps `_total`) and with it in 0.0.4's; an info
//! family is type `info` in OpenMetrics and a gauge named `<name>_info` in 0.0.4; OpenMetrics escapes
//! `"` in HELP text too, writes a histogram's `le` as a canonical float (`1.0`), and ends with `# EOF`.

use std::fmt::Write as _;
use std::str::FromStr;

/// Which format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4 (`text/plain; version=0.0.4`).
    #[default]
    Prometheus,
    /// OpenMetrics 1.0 (`application/openmetrics-text; version=1.0.0`).
    OpenMetrics,
}

/// A word that names no [`Format`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a metrics format: expected prometheus or openmetrics")]
pub struct UnknownFormat(pub String);

impl Format {
    /// The format's one name: `prometheus` or `openmetrics` (D-Bus, `vgpuctl metrics --format`).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Prometheus => "prometheus",
            Format::OpenMetrics => "openmetrics",
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format an HTTP `Accept` header asks for: OpenMetrics when it lists
    /// `application/openmetrics-text` (with no version, or version 1.0.0) with a quality above 0,
    /// else the text format (which every Prometheus understands; it is also the answer without the
    /// header).
    pub fn from_accept(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            if !media.eq_ignore_ascii_case("application/openmetrics-text") {
                continue;
            }
            let mut version_ok = true;
            let mut quality_ok = true;
            for p in parts {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "version" => version_ok = v == "1.0.0",
                    "q" => quality_ok = v.parse::<f64>().is_ok_and(|q| q > 0.0),
                    _ => {}
                }
            }
            if version_ok && quality_ok {
                return Format::OpenMetrics;
            }
        }
        Format::Prometheus
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Format::Prometheus, Format::OpenMetrics]
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only goes up; its sample is `<name>_total`.
    Counter,
    /// Observations counted in cumulative buckets, with `_bucket`, `_sum` and `_count` samples.
    Histogram,
    /// Constant labels of something that exists; its sample is `<name>_info`, value 1.
    Info,
}

/// A histogram's state: cumulative counts per upper bound, the sum and the count of observations.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramValue<'a> {
    /// The buckets' upper bounds, ascending (without `+Inf`).
    pub bounds: &'a [f64],
    /// Observations at or below each bound (cumulative), one per bound.
    pub cumulative: &'a [u64],
    /// Every observation (the `+Inf` bucket and `_count`).
    pub count: u64,
    /// The sum of the observations.
    pub sum: f64,
}

/// An exposition being written: families one after the other into one text.
#[derive(Debug)]
pub struct Exposition {
    out: String,
    format: Format,
}

impl Exposition {
    /// An empty exposition in `format`, with room for `capacity` bytes.
    pub fn with_capacity(format: Format, capacity: usize) -> Exposition {
        Exposition {
            out: String::with_capacity(capacity),
            format,
        }
    }

    /// The format being written.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Starts family `name` (without `_total` or `_info`, which [`Kind`] adds) with its HELP and TYPE
    /// lines; its samples follow through the returned writer.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &str) -> FamilyWriter<'_> {
        let om = self.format == Format::OpenMetrics;
        let (type_name, type_word) = match (kind, om) {
            (Kind::Gauge, _) => (Suffixed(name, ""), "gauge"),
            (Kind::Counter, true) => (Suffixed(name, ""), "counter"),
            (Kind::Counter, false) => (Suffixed(name, "_total"), "counter"),
            (Kind::Histogram, _) => (Suffixed(name, ""), "histogram"),
            (Kind::Info, true) => (Suffixed(name, ""), "info"),
            (Kind::Info, false) => (Suffixed(name, "_info"), "gauge"),
        };
        let _ = write!(self.out, "# HELP {type_name} ");
        escape_help(&mut self.out, help, om);
        let _ = writeln!(self.out, "\n# TYPE {type_name} {type_word}");
        FamilyWriter {
            exp: self,
            name,
            kind,
        }
    }

    /// The finished text (OpenMetrics' `# EOF` line added).
    pub fn finish(mut self) -> String {
        if self.format == Format::OpenMetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

/// A name with a suffix, written without building a `String`.
struct Suffixed(&'static str, &'static str);

impl std::fmt::Display for Suffixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)?;
        f.write_str(self.1)
    }
}

/// Writes the samples of one family (see [`Exposition::family`]).
#[derive(Debug)]
pub struct FamilyWriter<'a> {
    exp: &'a mut Exposition,
    name: &'static str,
    kind: Kind,
}

impl FamilyWriter<'_> {
    /// One sample of a gauge, counter or info family with these labels (an info family's value is
    /// always 1, whatever `value` says).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let suffix = match self.kind {
            Kind::Gauge | Kind::Histogram => "",
            Kind::Counter => "_total",
            Kind::Info => "_info",
        };
        let value = if self.kind == Kind::Info { 1.0 } else { value };
        let out = &mut self.exp.out;
        out.push_str(self.name);
        out.push_str(suffix);
        write_labels(out, labels, None);
        out.push(' ');
        write_value(out, value);
        out.push('\n');
        self
    }

    /// The samples of one histogram with these labels: a `_bucket` per bound and `+Inf`, `_sum`
    /// and `_count`.
    pub fn histogram(&mut self, labels: &[(&str, &str)], h: &HistogramValue<'_>) -> &mut Self {
        let om = self.exp.format == Format::OpenMetrics;
        let out = &mut self.exp.out;
        let mut le = String::with_capacity(24);
        for (bound, n) in h.bounds.iter().zip(h.cumulative) {
            le.clear();
            write_le(&mut le, *bound, om);
            bucket(out, self.name, labels, &le, *n);
        }
        bucket(out, self.name, labels, "+Inf", h.count);
        out.push_str(self.name);
        out.push_str("_sum");
        write_labels(out, labels, None);
        out.push(' ');
        write_value(out, h.sum);
        out.push('\n');
        out.push_str(self.name);
        out.push_str("_count");
        write_labels(out, labels, None);
        let _ = writeln!(out, " {}", h.count);
        self
    }
}

fn bucket(out: &mut String, name: &str, labels: &[(&str, &str)], le: &str, n: u64) {
    out.push_str(name);
    out.push_str("_bucket");
    write_labels(out, labels, Some(le));
    let _ = writeln!(out, " {n}");
}

/// `{a="x",b="y"}` (nothing without labels), with `le` last when given.
fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        escape_label_value(out, v);
        out.push('"');
    }
    out.push('}');
}

/// A label value as both formats require: `\` as `\\`, `"` as `\"`, a line feed as `\n`.
pub fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text: `\` as `\\` and a line feed as `\n`; OpenMetrics also escapes `"`.
fn escape_help(out: &mut String, v: &str, om: bool) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if om => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// A sample value: integers without a fraction, others as Rust's shortest round-trip form (which
/// Go's `strconv.ParseFloat`, Prometheus' parser, reads back exactly), `NaN`, `+Inf`, `-Inf`.
fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        // Exact: |v| < 2^53.
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

/// A bucket bound; OpenMetrics' canonical form has a fraction (`1.0`).
fn write_le(out: &mut String, v: f64, om: bool) {
    if om && v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}.0", v as i64);
    } else {
        write_value(out, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(format: Format, kind: Kind, labels: &[(&str, &str)], v: f64) -> String {
        let mut e = Exposition::with_capacity(format, 0);
        e.family("x_things", kind, "Things.").sample(labels, v);
        e.finish()
    }

    #[test]
    fn label_values_and_help_are_escaped_as_each_format_requires() {
        let mut e = Exposition::with_capacity(Format::Prometheus, 0);
        e.family("a", Kind::Gauge, "back\\slash \"q\"\nline")
            .sample(&[("l", "a\\b\"c\nd")], 1.0);
        assert_eq!(
            e.finish(),
            "# HELP a back\\\\slash \"q\"\\nline\n# TYPE a gauge\na{l=\"a\\\\b\\\"c\\nd\"} 1\n"
        );
        let mut e = Exposition::with_capacity(Format::OpenMetrics, 0);
        e.family("a", Kind::Gauge, "say \"hi\"")
            .sample(&[("l", "é\"")], 2.5);
        assert_eq!(
            e.finish(),
            "# HELP a say \\\"hi\\\"\n# TYPE a gauge\na{l=\"é\\\"\"} 2.5\n# EOF\n"
        );
    }

    #[test]
    fn counters_are_named_with_total_as_each_format_requires() {
        assert_eq!(
            one(Format::Prometheus, Kind::Counter, &[], 3.0),
            "# HELP x_things_total Things.\n# TYPE x_things_total counter\nx_things_total 3\n"
        );
        assert_eq!(
            one(Format::OpenMetrics, Kind::Counter, &[], 3.0),
            "# HELP x_things Things.\n# TYPE x_things counter\nx_things_total 3\n# EOF\n"
        );
    }

    #[test]
    fn info_families_are_gauges_named_info_in_the_text_format() {
        assert_eq!(
            one(Format::Prometheus, Kind::Info, &[("v", "1")], 7.0),
            "# HELP x_things_info Things.\n# TYPE x_things_info gauge\nx_things_info{v=\"1\"} 1\n"
        );
        assert_eq!(
            one(Format::OpenMetrics, Kind::Info, &[("v", "1")], 7.0),
            "# HELP x_things Things.\n# TYPE x_things info\nx_things_info{v=\"1\"} 1\n# EOF\n"
        );
    }

    #[test]
    fn histograms_have_cumulative_buckets_inf_sum_and_count() {
        let h = HistogramValue {
            bounds: &[0.5, 1.0],
            cumulative: &[1, 3],
            count: 4,
            sum: 6.25,
        };
        let mut e = Exposition::with_capacity(Format::Prometheus, 0);
        e.family("d_seconds", Kind::Histogram, "D.")
            .histogram(&[("op", "create")], &h);
        assert_eq!(
            e.finish(),
            "# HELP d_seconds D.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{op=\"create\",le=\"0.5\"} 1\n\
             d_seconds_bucket{op=\"create\",le=\"1\"} 3\n\
             d_seconds_bucket{op=\"create\",le=\"+Inf\"} 4\n\
             d_seconds_sum{op=\"create\"} 6.25\n\
             d_seconds_count{op=\"create\"} 4\n"
        );
        let mut e = Exposition::with_capacity(Format::OpenMetrics, 0);
        e.family("d_seconds", Kind::Histogram, "D.")
            .histogram(&[], &h);
        let text = e.finish();
        assert!(text.contains("d_seconds_bucket{le=\"1.0\"} 3\n"), "{text}");
        assert!(text.ends_with("d_seconds_count 4\n# EOF\n"), "{text}");
    }

    #[test]
    fn values_are_written_as_prometheus_reads_them() {
        let mut s = String::new();
        for v in [
            0.0,
            -2.0,
            0.005,
            1e20,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            write_value(&mut s, v);
            s.push(' ');
        }
        assert_eq!(s, "0 -2 0.005 100000000000000000000 NaN +Inf -Inf ");
    }

    #[test]
    fn accept_chooses_openmetrics_only_when_asked_for_a_version_we_write() {
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Prometheus);
        // What Prometheus 2.x sends.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text; version=0.0.1")),
            Format::Prometheus
        );
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text;q=0")),
            Format::Prometheus
        );
        assert_eq!(
            Format::from_accept(Some("text/plain, Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
        assert_eq!("openmetrics".parse(), Ok(Format::OpenMetrics));
        assert!("json".parse::<Format>().is_err());
    }
}
