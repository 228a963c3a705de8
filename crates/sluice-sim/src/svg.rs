//! Plots as hand-written SVG: line and step charts with axes, ticks, labels, a legend and
//! event markers. No plotting dependency; the output is deterministic text.

use crate::report::{Report, trim};
use crate::scenario::{Event, Scenario};
use sluice_core::time::{MILLI, SECOND};
use std::fmt::Write as _;

const PALETTE: [&str; 8] = [
    "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
];
const LIMIT_COLOR: &str = "#d62728";

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Points joined by straight lines, with markers.
    Line,
    /// Horizontal steps: each point holds until the next x (`x_end` gives the last).
    Steps,
}

/// One series.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points (x, y), x ascending.
    pub points: Vec<(f64, f64)>,
    /// Stroke colour.
    pub color: String,
    /// Stroke width.
    pub width: f64,
    /// Dash pattern, if dashed.
    pub dash: Option<&'static str>,
    /// Drawing style.
    pub style: Style,
}

/// One chart panel.
#[derive(Clone, Debug, Default)]
pub struct Panel {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Series.
    pub series: Vec<Series>,
    /// Logarithmic x axis (ticks at the data's x values).
    pub log_x: bool,
    /// Vertical markers (x, label).
    pub marks: Vec<(f64, String)>,
    /// Where the last step ends (for step series).
    pub x_end: Option<f64>,
    /// Lowest y shown (the axis starts at min(this, data)).
    pub y_floor: f64,
}

const W: f64 = 960.0;
const PANEL_H: f64 = 380.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 220.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step for a range: 1, 2, 2.5 or 5 × 10^k, about `n` ticks.
fn nice_step(range: f64, n: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize + 1
    };
    trim(v, decimals.min(6))
}

fn render_panel(out: &mut String, p: &Panel, y0: f64) {
    let pw = W - LEFT - RIGHT;
    let ph = PANEL_H - TOP - BOTTOM;
    let (ox, oy) = (LEFT, y0 + TOP);
    let xs = p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.0));
    let ys = p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.1));
    let mut xmin = xs.clone().fold(f64::INFINITY, f64::min);
    let mut xmax = xs.fold(f64::NEG_INFINITY, f64::max);
    if let Some(e) = p.x_end {
        xmax = xmax.max(e);
    }
    for (x, _) in &p.marks {
        xmin = xmin.min(*x);
        xmax = xmax.max(*x);
    }
    if !xmin.is_finite() {
        xmin = 0.0;
        xmax = 1.0;
    }
    if xmax <= xmin {
        xmax = xmin + 1.0;
    }
    let ymin = ys.clone().fold(p.y_floor, f64::min);
    let mut ymax = ys.fold(f64::NEG_INFINITY, f64::max);
    if !ymax.is_finite() || ymax <= ymin {
        ymax = ymin + 1.0;
    }
    let ystep = nice_step(ymax - ymin, 6.0);
    let ylo = (ymin / ystep).floor() * ystep;
    let yhi = (ymax / ystep).ceil() * ystep
        + if (ymax / ystep).fract() == 0.0 {
            ystep
        } else {
            0.0
        };
    let log = p.log_x && xmin > 0.0;
    let fx = |x: f64| -> f64 {
        if log {
            ox + (x.ln() - xmin.ln()) / (xmax.ln() - xmin.ln()).max(1e-12) * pw
        } else {
            ox + (x - xmin) / (xmax - xmin) * pw
        }
    };
    let fy = |y: f64| -> f64 { oy + ph - (y - ylo) / (yhi - ylo) * ph };

    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="16" font-weight="bold">{}</text>"#,
        ox,
        y0 + 28.0,
        esc(&p.title)
    );
    // Grid and y ticks.
    let mut y = ylo;
    while y <= yhi + ystep * 1e-9 {
        let py = fy(y);
        let _ = writeln!(
            out,
            r##"<line x1="{ox:.1}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/>"##,
            ox + pw
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            ox - 8.0,
            py + 4.0,
            fmt_tick(y, ystep)
        );
        y += ystep;
    }
    // X ticks.
    let xticks: Vec<f64> = if log {
        let mut v: Vec<f64> = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|pt| pt.0))
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    } else {
        let step = nice_step(xmax - xmin, 8.0);
        let mut v = Vec::new();
        let mut x = (xmin / step).ceil() * step;
        while x <= xmax + step * 1e-9 {
            v.push(x);
            x += step;
        }
        v
    };
    let xstep = if xticks.len() > 1 {
        xticks[1] - xticks[0]
    } else {
        1.0
    };
    for x in &xticks {
        let px = fx(*x);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{oy:.1}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##,
            oy + ph
        );
        let _ = writeln!(
            out,
            r#"<text x="{px:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            oy + ph + 18.0,
            if log {
                trim(*x, 3)
            } else {
                fmt_tick(*x, xstep)
            }
        );
    }
    // Axes.
    let _ = writeln!(
        out,
        r##"<rect x="{ox:.1}" y="{oy:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">{}</text>"#,
        ox + pw / 2.0,
        oy + ph + 42.0,
        esc(&p.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">{}</text>"#,
        ox - 55.0,
        oy + ph / 2.0,
        ox - 55.0,
        oy + ph / 2.0,
        esc(&p.y_label)
    );
    // Event markers.
    for (i, (x, label)) in p.marks.iter().enumerate() {
        let px = fx(*x);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{oy:.1}" x2="{px:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="2,3"/>"##,
            oy + ph
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
            px + 3.0,
            oy + 12.0 + 13.0 * (i % 3) as f64,
            esc(label)
        );
    }
    // Series.
    for s in &p.series {
        if s.points.is_empty() {
            continue;
        }
        let mut d = String::new();
        match s.style {
            Style::Line => {
                for (i, (x, y)) in s.points.iter().enumerate() {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1} ",
                        if i == 0 { "M" } else { "L" },
                        fx(*x),
                        fy(*y)
                    );
                }
            }
            Style::Steps => {
                for (i, (x, y)) in s.points.iter().enumerate() {
                    let next = s.points.get(i + 1).map(|p| p.0).or(p.x_end).unwrap_or(*x);
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1} H{:.1} ",
                        if i == 0 { "M" } else { "L" },
                        fx(*x),
                        fy(*y),
                        fx(next)
                    );
                }
            }
        }
        let dash = s
            .dash
            .map_or(String::new(), |d| format!(r#" stroke-dasharray="{d}""#));
        let _ = writeln!(
            out,
            r#"<path d="{}" fill="none" stroke="{}" stroke-width="{}"{dash}/>"#,
            d.trim_end(),
            s.color,
            s.width
        );
        if s.style == Style::Line {
            for (x, y) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/>"#,
                    fx(*x),
                    fy(*y),
                    s.color
                );
            }
        }
    }
    // Legend.
    let lx = ox + pw + 18.0;
    for (i, s) in p.series.iter().enumerate() {
        let ly = oy + 10.0 + 20.0 * i as f64;
        let dash = s
            .dash
            .map_or(String::new(), |d| format!(r#" stroke-dasharray="{d}""#));
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="{}"{dash}/>"#,
            lx + 24.0,
            s.color,
            s.width.max(2.0)
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            lx + 30.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
}

/// Panels stacked vertically in one SVG document.
pub fn render(title: &str, panels: &[Panel]) -> String {
    let h = 40.0 + PANEL_H * panels.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="26" font-size="18" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for (i, p) in panels.iter().enumerate() {
        render_panel(&mut out, p, 40.0 + PANEL_H * i as f64);
    }
    out.push_str("</svg>\n");
    out
}

/// Labels of a scenario's events, at their times in seconds.
pub fn event_marks(sc: &Scenario) -> Vec<(f64, String)> {
    sc.events
        .iter()
        .map(|(t, e)| {
            let label = match e {
                Event::RegionDown(r) => format!("{} down", sc.regions[*r]),
                Event::RegionUp(r, _) => format!("{} up", sc.regions[*r]),
                Event::Partition(_) => "partition".into(),
                Event::Heal => "heal".into(),
                Event::StoreFailover(r, 0, _) => format!("{} store failover", sc.regions[*r]),
                Event::StoreFailover(r, slot, _) => {
                    format!("{} {} store failover", sc.regions[*r], sc.store_name(*slot))
                }
                Event::DaemonDown(r, d, _) => format!("{} daemon {d} down", sc.regions[*r]),
                Event::SetShip(iv, th) => {
                    let mut s = String::from("ship");
                    if let Some(iv) = iv {
                        let _ = write!(s, " {} ms", trim(*iv as f64 / MILLI as f64, 1));
                    }
                    if let Some(th) = th {
                        let _ = write!(s, " {th}%");
                    }
                    s
                }
            };
            (*t as f64 / SECOND as f64, label)
        })
        .collect()
}

/// Admitted per window over time for the busiest counters of a run.
pub fn admitted_plot(r: &Report, sc: &Scenario) -> String {
    let marks = event_marks(sc);
    let panels: Vec<Panel> = r
        .series
        .iter()
        .take(8)
        .map(|s| {
            let win = s
                .windows
                .get(1)
                .zip(s.windows.first())
                .map_or(1.0, |(b, a)| b.0 - a.0);
            let minutes = r.duration_s >= 600.0;
            let scale = if minutes { 60.0 } else { 1.0 };
            let x_end = s.windows.last().map(|w| (w.0 + win) / scale);
            let mut series = vec![Series {
                name: "admitted, all regions".into(),
                points: s
                    .windows
                    .iter()
                    .map(|w| (w.0 / scale, w.1 as f64))
                    .collect(),
                color: "#111".into(),
                width: 2.5,
                dash: None,
                style: Style::Steps,
            }];
            if s.region.is_none() {
                for (i, reg) in r.regions.iter().enumerate() {
                    series.push(Series {
                        name: format!("admitted in {reg}"),
                        points: s
                            .windows
                            .iter()
                            .map(|w| (w.0 / scale, w.3.get(i).copied().unwrap_or(0) as f64))
                            .collect(),
                        color: PALETTE[i % PALETTE.len()].into(),
                        width: 1.2,
                        dash: None,
                        style: Style::Steps,
                    });
                }
            }
            series.push(Series {
                name: format!("limit ({})", s.allowed),
                points: s
                    .windows
                    .iter()
                    .map(|w| (w.0 / scale, s.allowed as f64))
                    .collect(),
                color: LIMIT_COLOR.into(),
                width: 1.5,
                dash: Some("6,4"),
                style: Style::Steps,
            });
            let rule_scope = match &s.region {
                Some(reg) => format!(" in {reg}"),
                None => String::new(),
            };
            Panel {
                title: format!("{}{} · {}", s.rule, rule_scope, s.key),
                x_label: if minutes {
                    "simulated time (min)".into()
                } else {
                    "simulated time (s)".into()
                },
                y_label: format!("admitted per {} window", crate::report::trim(win, 3) + " s"),
                series,
                log_x: false,
                marks: marks.iter().map(|(t, l)| (t / scale, l.clone())).collect(),
                x_end,
                y_floor: 0.0,
            }
        })
        .collect();
    render(
        &format!(
            "{} — admitted per window (seed {}, ship interval {} ms)",
            r.scenario,
            r.seed,
            trim(r.ship_interval_ms, 1)
        ),
        &panels,
    )
}

/// Store calls per request, second by second, one panel per rule (each on its own scale:
/// a leased key's 0.01 beside an ordinary key's 1), with the run's mean dashed.
pub fn calls_plot(r: &Report, sc: &Scenario) -> String {
    let marks = event_marks(sc);
    let minutes = r.duration_s >= 600.0;
    let scale = if minutes { 60.0 } else { 1.0 };
    let panels: Vec<Panel> = r
        .calls
        .iter()
        .take(8)
        .map(|c| {
            let points: Vec<(f64, f64)> = c
                .seconds
                .iter()
                .map(|(t, n, calls)| (*t as f64 / scale, *calls as f64 / (*n).max(1) as f64))
                .collect();
            let x_end = c.seconds.last().map(|(t, _, _)| (*t as f64 + 1.0) / scale);
            let mean = points.iter().map(|p| (p.0, c.mean)).collect();
            Panel {
                title: format!(
                    "{} · {} calls per request over the run",
                    c.rule,
                    trim(c.mean, 4)
                ),
                x_label: if minutes {
                    "simulated time (min)".into()
                } else {
                    "simulated time (s)".into()
                },
                y_label: "store calls per request".into(),
                series: vec![
                    Series {
                        name: "per second".into(),
                        points,
                        color: "#111".into(),
                        width: 2.0,
                        dash: None,
                        style: Style::Steps,
                    },
                    Series {
                        name: "whole run".into(),
                        points: mean,
                        color: PALETTE[0].into(),
                        width: 1.5,
                        dash: Some("6,4"),
                        style: Style::Steps,
                    },
                ],
                log_x: false,
                marks: marks.iter().map(|(t, l)| (t / scale, l.clone())).collect(),
                x_end,
                y_floor: 0.0,
            }
        })
        .collect();
    render(
        &format!("{} — store calls per request (seed {})", r.scenario, r.seed),
        &panels,
    )
}

/// Overshoot against a swept parameter: max and p99 per global rule, with the limit line.
pub fn sweep_plot(param: &str, rows: &[(f64, Report)]) -> String {
    let Some((_, first)) = rows.first() else {
        return render("empty sweep", &[]);
    };
    let mut series = Vec::new();
    for (i, rule) in first.rules.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()].to_string();
        let pick = |f: fn(&crate::report::RuleReport) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|(x, r)| r.rules.get(i).map(|rr| (*x, f(rr))))
                .collect()
        };
        series.push(Series {
            name: format!("{} max", rule.id),
            points: pick(|r| r.overshoot_max),
            color: color.clone(),
            width: 2.5,
            dash: None,
            style: Style::Line,
        });
        series.push(Series {
            name: format!("{} p99", rule.id),
            points: pick(|r| r.overshoot_p99),
            color: color.clone(),
            width: 1.5,
            dash: Some("5,3"),
            style: Style::Line,
        });
        series.push(Series {
            name: format!("{} mean", rule.id),
            points: pick(|r| r.overshoot_mean),
            color,
            width: 1.0,
            dash: Some("1,3"),
            style: Style::Line,
        });
    }
    let xs: Vec<f64> = rows.iter().map(|(x, _)| *x).collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    series.push(Series {
        name: "limit (1.0)".into(),
        points: vec![(lo, 1.0), (hi, 1.0)],
        color: LIMIT_COLOR.into(),
        width: 1.5,
        dash: Some("6,4"),
        style: Style::Line,
    });
    let panel = Panel {
        title: format!(
            "{}: admitted / limit per window against {param}",
            first.scenario
        ),
        x_label: param.to_string(),
        y_label: "overshoot (admitted / limit)".into(),
        series,
        log_x: lo > 0.0 && hi / lo >= 10.0,
        marks: Vec::new(),
        x_end: None,
        y_floor: 1.0,
    };
    render(
        &format!("{} — overshoot sweep (seed {})", first.scenario, first.seed),
        &[panel],
    )
}
