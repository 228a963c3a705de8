//! The workspace's one writer of the Prometheus text exposition format. Each binary keeps its
//! own atomics and decides its own series; this crate only writes them, so the escaping and
//! the histogram's cumulative shape are written once. No dependency: it appends to a `String`.
//!
//! # Layout
//!
//! - [`header`]: a metric family's `# HELP` and `# TYPE` lines.
//! - [`sample`]: one sample line, with its labels escaped ([`escape_label_value`]).
//! - [`counter`] and [`gauge`]: a family of one unlabelled sample, header included.
//! - [`Histogram`]: a histogram's `_bucket`, `_sum` and `_count` lines from its bounds, counts
//!   and sum, whether the counts were recorded per bucket or already cumulative ([`Counts`]).

use std::borrow::Cow;
use std::fmt::{Display, Write as _};

/// A metric family's type, as its `# TYPE` line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts at zero with the process).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes a family's `# HELP` and `# TYPE` lines. The help text has its backslashes and line
/// breaks escaped, as the format requires.
pub fn header(out: &mut String, name: &str, help: &str, kind: Kind) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape_into(out, help, false);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind.as_str());
    out.push('\n');
}

/// A label value as the format wants it between quotes: `\`, `"` and line feeds escaped.
/// Borrowed when nothing needs escaping (the usual case).
pub fn escape_label_value(v: &str) -> Cow<'_, str> {
    if needs_escape(v, true) {
        let mut s = String::with_capacity(v.len() + 2);
        escape_into(&mut s, v, true);
        Cow::Owned(s)
    } else {
        Cow::Borrowed(v)
    }
}

fn needs_escape(v: &str, quote: bool) -> bool {
    v.bytes()
        .any(|b| b == b'\\' || b == b'\n' || (quote && b == b'"'))
}

/// Appends `v` escaped: `\` and line feeds always, `"` too when `quote` (a label value).
fn escape_into(out: &mut String, v: &str, quote: bool) {
    if !needs_escape(v, quote) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// Appends `{a="x",b="y"}` (nothing when `labels` is empty), then `extra` as a last label.
fn write_labels(out: &mut String, labels: &[(&str, &str)], extra: Option<(&str, &str)>) {
    if labels.is_empty() && extra.is_none() {
        return;
    }
    out.push('{');
    for (i, (k, v)) in labels.iter().copied().chain(extra).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        escape_into(out, v, true);
        out.push('"');
    }
    out.push('}');
}

/// Writes one sample line: `name{labels} value`. Label values are escaped; the value is
/// written as `Display` writes it (an integer, or a float such as a histogram's sum).
pub fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl Display) {
    sample_with(out, name, labels, None, value);
}

fn sample_with(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    extra: Option<(&str, &str)>,
    value: impl Display,
) {
    out.push_str(name);
    write_labels(out, labels, extra);
    let _ = writeln!(out, " {value}");
}

/// A counter family of one unlabelled sample: header and value.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, Kind::Counter);
    sample(out, name, &[], value);
}

/// A gauge family of one unlabelled sample: header and value.
pub fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, Kind::Gauge);
    sample(out, name, &[], value);
}

/// How a histogram's bucket counts were recorded.
#[derive(Clone, Copy, Debug)]
pub enum Counts<'a> {
    /// Each observation counted in its own bucket only (one atomic add): summed when written.
    PerBucket(&'a [u64]),
    /// Each observation counted in every bucket at or above it: written as they are.
    Cumulative(&'a [u64]),
}

/// One histogram's figures, read from its atomics at render time.
#[derive(Clone, Copy, Debug)]
pub struct Histogram<'a> {
    /// Upper bounds of the buckets, ascending, without `+Inf`.
    pub bounds: &'a [f64],
    /// One count per bound.
    pub counts: Counts<'a>,
    /// Observations in all (the `+Inf` bucket and `_count`).
    pub count: u64,
    /// Sum of the observations, in the family's unit.
    pub sum: f64,
}

impl Histogram<'_> {
    /// Writes the `_bucket` lines (one per bound, then `+Inf`), `_sum` and `_count`, each
    /// with `labels` (the bucket's `le` last). Not the header: see [`header`].
    ///
    /// Counts are read from separate atomics, so an observation under way may be in its bucket
    /// and not yet in `count`: `+Inf` and `_count` never fall below the last bucket.
    pub fn write(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        let bucket = format!("{name}_bucket");
        let (counts, per_bucket) = match self.counts {
            Counts::PerBucket(c) => (c, true),
            Counts::Cumulative(c) => (c, false),
        };
        let mut cumulative = 0;
        let mut le = String::new();
        for (b, c) in self.bounds.iter().zip(counts) {
            cumulative = if per_bucket { cumulative + c } else { *c };
            le.clear();
            let _ = write!(le, "{b}");
            sample_with(out, &bucket, labels, Some(("le", &le)), cumulative);
        }
        let n = self.count.max(cumulative);
        sample_with(out, &bucket, labels, Some(("le", "+Inf")), n);
        sample(out, &format!("{name}_sum"), labels, self.sum);
        sample(out, &format!("{name}_count"), labels, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert!(matches!(
            escape_label_value("plain"),
            Cow::Borrowed("plain")
        ));
        assert_eq!(escape_label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label_value("two\nlines"), "two\\nlines");
        let mut out = String::new();
        sample(&mut out, "m", &[("k", "say \"hi\""), ("z", "ok")], 3);
        assert_eq!(out, "m{k=\"say \\\"hi\\\"\",z=\"ok\"} 3\n");
    }

    #[test]
    fn help_escapes_backslash_and_newline_but_not_quotes() {
        let mut out = String::new();
        header(&mut out, "m", "a \"b\" \\ c\nd", Kind::Gauge);
        assert_eq!(out, "# HELP m a \"b\" \\\\ c\\nd\n# TYPE m gauge\n");
    }

    #[test]
    fn counter_and_gauge_write_header_and_value() {
        let mut out = String::new();
        counter(&mut out, "c_total", "Things.", 4);
        gauge(&mut out, "g", "Level.", 2);
        assert_eq!(
            out,
            "# HELP c_total Things.\n# TYPE c_total counter\nc_total 4\n\
             # HELP g Level.\n# TYPE g gauge\ng 2\n"
        );
    }

    #[test]
    fn per_bucket_counts_are_summed_into_cumulative_lines() {
        let mut out = String::new();
        Histogram {
            bounds: &[0.001, 0.01, 1.0],
            counts: Counts::PerBucket(&[2, 0, 1]),
            count: 4,
            sum: 2.5,
        }
        .write(&mut out, "h", &[]);
        assert_eq!(
            out,
            "h_bucket{le=\"0.001\"} 2\nh_bucket{le=\"0.01\"} 2\nh_bucket{le=\"1\"} 3\n\
             h_bucket{le=\"+Inf\"} 4\nh_sum 2.5\nh_count 4\n"
        );
    }

    #[test]
    fn cumulative_counts_are_written_as_recorded_with_labels() {
        let mut out = String::new();
        Histogram {
            bounds: &[0.005, 0.05],
            counts: Counts::Cumulative(&[1, 3]),
            count: 3,
            sum: 0.0,
        }
        .write(&mut out, "h", &[("region", "eu")]);
        assert_eq!(
            out,
            "h_bucket{region=\"eu\",le=\"0.005\"} 1\nh_bucket{region=\"eu\",le=\"0.05\"} 3\n\
             h_bucket{region=\"eu\",le=\"+Inf\"} 3\nh_sum{region=\"eu\"} 0\nh_count{region=\"eu\"} 3\n"
        );
    }

    #[test]
    fn inf_never_falls_below_the_last_bucket() {
        let mut out = String::new();
        Histogram {
            bounds: &[1.0],
            counts: Counts::PerBucket(&[2]),
            count: 1,
            sum: 1.0,
        }
        .write(&mut out, "h", &[]);
        assert!(out.contains("h_bucket{le=\"+Inf\"} 2\n"));
        assert!(out.ends_with("h_count 2\n"));
    }
}
