//! Throughput over time, one graph per path side by side (① ② ③), drawn here as SVG (no
//! script, no chart library): each traffic step's series (what the receiving node took
//! in, every 50 ms, and its mean over 250 ms), the path's transfers one after another on
//! a broken time axis (the idle time between them left out), each fault's moment marked
//! where it came among them, a transfer that failed banded red. A path that could not carry traffic at all
//! (every transfer refused, failed or empty) is greyed as a whole, with its reason in one
//! line. The same drawing serves report.html and `iblab ui`'s page (live, from the steps
//! so far), so it reads only step records, never a whole evidence document.

use std::collections::BTreeMap;
use std::fmt::Write;

use iblab_core::evidence::{StepRecord, Verdict};
use iblab_lab::names;
use iblab_lab::{Lang, PathKind, StepKind};

/// The words of the drawing, in one language: report.html's in the evidence's, the page's
/// in the browser's ([`Words::of`], from locales/report.yml).
#[derive(Debug, Clone)]
pub struct Words {
    pub lang: Lang,
    pub seconds: String,
    pub mbps: String,
    /// A path that carried nothing: its graph is greyed as a whole.
    pub carried_nothing: String,
    /// A path the lab runs that has no throughput measurement (only latency or setup).
    pub no_throughput: String,
    /// A path left out of the run, or not part of the lab.
    pub not_run: String,
    /// A path the lab does not use.
    pub not_in_lab: String,
    /// A path with no transfer yet (a run in progress).
    pub waiting: String,
    /// A transfer that reported only its average (no samples).
    pub average_only: String,
    pub failed: String,
    /// The drawing's name for a screen reader, `%{path}` filled in.
    pub label: String,
    /// What a transfer's lines are, `%{n}` (its samples) filled in.
    pub samples: String,
}

impl Words {
    /// The drawing's words in `lang`.
    pub fn of(lang: Lang) -> Words {
        let w = |key: &str| rust_i18n::t!(key, locale = lang.tag()).into_owned();
        Words {
            lang,
            seconds: w("graphs.seconds"),
            mbps: "Mbit/s".into(),
            carried_nothing: w("graphs.carried_nothing"),
            no_throughput: w("graphs.no_throughput"),
            not_run: w("graphs.not_run"),
            not_in_lab: w("graphs.not_in_lab"),
            waiting: w("graphs.waiting"),
            average_only: w("graphs.average_only"),
            failed: w("graphs.failed"),
            label: w("graphs.label"),
            samples: w("graphs.samples"),
        }
    }
}

/// How a path's graph stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// At least one transfer carried bytes.
    Carried,
    /// It ran transfers and none carried anything: greyed as a whole, with the reason.
    Failed(String),
    /// It ran, but nothing of it measures throughput.
    NoThroughput,
    /// Left out of this run, with the reason.
    NotRun(String),
    /// The lab does not use this path.
    NotInLab,
    /// A run in progress has not reached its transfers yet.
    Waiting,
}

/// One path's graph: its status and its drawing.
#[derive(Debug, Clone)]
pub struct Graph {
    pub path: PathKind,
    pub status: Status,
    pub svg: String,
}

/// What a run says of its paths, for the graphs.
pub struct Run<'a> {
    /// The paths the run carries.
    pub paths: &'a [PathKind],
    /// Paths the run left out, with the reason.
    pub excluded: &'a BTreeMap<PathKind, String>,
    pub steps: &'a [StepRecord],
    /// Still going: a path without a transfer yet is waiting, not empty.
    pub running: bool,
}

/// A traffic step the graphs count: one that measured throughput, has a series, or failed
/// (a refused or broken transfer carried nothing). Latency and connection tests that
/// passed measure no throughput and are left out, as is a delivery the emulated subnet
/// decided without carrying bytes.
fn counted(s: &StepRecord) -> bool {
    s.kind == StepKind::Traffic
        && (s.metrics.contains_key(names::THROUGHPUT_MBPS)
            || s.series.is_some()
            || matches!(s.verdict, Verdict::Fail | Verdict::Error))
}

/// Did a step carry bytes: a throughput above zero, or a series with a point above zero.
pub fn carried(s: &StepRecord) -> bool {
    matches!(s.verdict, Verdict::Pass | Verdict::Fail)
        && (s
            .metrics
            .get(names::THROUGHPUT_MBPS)
            .is_some_and(|m| m.value > 0.0)
            || s.series
                .as_ref()
                .is_some_and(|x| x.points.iter().any(|p| p[1] > 0.0)))
}

/// A reason in one line: its first line, at most about 160 characters.
pub fn one_line(text: &str) -> String {
    let first = text.lines().next().unwrap_or("").trim();
    if first.chars().count() <= 160 {
        return first.to_string();
    }
    let cut: String = first.chars().take(157).collect();
    format!("{}…", cut.trim_end())
}

/// How path `p` stands in the run.
pub fn status(run: &Run<'_>, p: PathKind) -> Status {
    if !run.paths.contains(&p) {
        return match run.excluded.get(&p) {
            Some(why) => Status::NotRun(why.clone()),
            None => Status::NotInLab,
        };
    }
    let traffic: Vec<&StepRecord> = run
        .steps
        .iter()
        .filter(|s| s.path == Some(p) && s.kind == StepKind::Traffic)
        .collect();
    let steps: Vec<&&StepRecord> = traffic.iter().filter(|s| counted(s)).collect();
    if steps.iter().any(|s| carried(s)) {
        return Status::Carried;
    }
    if let Some(s) = steps.first() {
        // It ran transfers, and none carried anything.
        let why = steps
            .iter()
            .find_map(|s| s.reason.clone())
            .or_else(|| s.reason.clone())
            .unwrap_or_else(|| "no bytes arrived".into());
        return Status::Failed(why);
    }
    if run.running {
        return Status::Waiting;
    }
    // No transfer ran: every one was skipped (its reason), or the path only measures
    // latency or connection setup here.
    let measured_other = traffic.iter().any(|s| s.verdict != Verdict::Skipped);
    match traffic.iter().find(|s| s.verdict == Verdict::Skipped) {
        Some(s) if !measured_other => {
            Status::Failed(s.reason.clone().unwrap_or_else(|| "skipped".into()))
        }
        _ => Status::NoThroughput,
    }
}

const W: f64 = 360.0;
const H: f64 = 200.0;
const LEFT: f64 = 46.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 36.0;

/// Each path's colour, in every drawing of the report.
pub(crate) fn colour(p: PathKind) -> &'static str {
    match p {
        PathKind::Tcp => "#3b6ea8",
        PathKind::Roce => "#c2410c",
        PathKind::Ib => "#7c3aed",
    }
}

use super::topology::esc;

/// A step of 1, 2 or 5 × 10^k that cuts `span` into about `n` parts.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let k = 10f64.powf(raw.log10().floor());
    let m = raw / k;
    let f = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * k
}

fn num(v: f64) -> String {
    if v.abs() >= 10.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Every path's graph, ① ② ③.
pub fn graphs(run: &Run<'_>, words: &Words) -> Vec<Graph> {
    PathKind::ALL
        .into_iter()
        .map(|p| {
            let status = status(run, p);
            let svg = draw(run, p, &status, words);
            Graph {
                path: p,
                status,
                svg,
            }
        })
        .collect()
}

/// The three graphs side by side, as one HTML block with its own inline styles (it sits in
/// report.html and in the page alike), each with its status line under it; `None` when no
/// step of the run counts (a lab without transfers).
pub fn html(run: &Run<'_>, words: &Words) -> Option<String> {
    if !run.running && !run.steps.iter().any(counted) {
        return None;
    }
    let mut o = String::from(
        r#"<div class="throughput-graphs" style="display:flex;flex-wrap:wrap;gap:12px;margin:.6rem 0">"#,
    );
    for g in graphs(run, words) {
        let (cls, line) = match &g.status {
            Status::Carried => ("carried", String::new()),
            Status::Failed(why) => (
                "failed",
                format!("✘ {}: {}", words.carried_nothing, one_line(why)),
            ),
            Status::NoThroughput => ("none", words.no_throughput.clone()),
            Status::NotRun(why) => (
                "not-run",
                format!(
                    "{}: {}",
                    words.not_run,
                    one_line(&iblab_core::evidence::judge::reason(why, words.lang))
                ),
            ),
            Status::NotInLab => ("not-run", words.not_in_lab.clone()),
            Status::Waiting => ("waiting", words.waiting.clone()),
        };
        let full = match &g.status {
            Status::Failed(why) => why.clone(),
            Status::NotRun(why) => iblab_core::evidence::judge::reason(why, words.lang),
            _ => line.clone(),
        };
        let grey = matches!(g.status, Status::Failed(_));
        let _ = write!(
            o,
            r#"<figure class="graph path-{path} {cls}" data-path="{path}" data-status="{cls}" style="margin:0;flex:1 1 300px;max-width:420px;{bg}"><div class="graph-svg"{op}>{svg}</div><figcaption title="{full}" style="font-size:12px;line-height:1.3;min-height:1.3em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;color:{fg}">{line}</figcaption></figure>"#,
            path = g.path.as_str(),
            bg = if grey {
                "background:#eceef0;border-radius:6px"
            } else {
                ""
            },
            op = if grey || matches!(g.status, Status::NotRun(_) | Status::NotInLab) {
                r#" style="filter:grayscale(1);opacity:.45""#
            } else {
                ""
            },
            svg = g.svg,
            full = esc(&full),
            fg = if grey { "#b3261e" } else { "#56606b" },
            line = esc(&line),
        );
    }
    o.push_str("</div>");
    Some(o)
}

/// The mean rate over the `window` seconds up to each point (each point stands for the
/// interval since the one before it; the first for 50 ms), weighted by interval.
pub fn smoothed(points: &[[f64; 2]], window: f64) -> Vec<[f64; 2]> {
    let mut out = Vec::with_capacity(points.len());
    for (i, [t, _]) in points.iter().enumerate() {
        let (mut bits, mut span) = (0.0, 0.0);
        for j in (0..=i).rev() {
            let [tj, vj] = points[j];
            if t - tj >= window - 1e-9 && j < i {
                break;
            }
            let dt = if j == 0 {
                0.05
            } else {
                (tj - points[j - 1][0]).max(0.0)
            };
            bits += vj * dt;
            span += dt;
        }
        out.push([*t, if span > 0.0 { bits / span } else { 0.0 }]);
    }
    out
}

/// One transfer on a graph's broken time axis: its span on the run's clock, and where it
/// sits on the axis.
struct Segment<'a> {
    step: &'a StepRecord,
    from: f64,
    to: f64,
    x0: f64,
    x1: f64,
}

/// How long a transfer lasted on the graph: its record's length, or its series' if longer.
fn length(s: &StepRecord) -> f64 {
    s.duration_s
        .max(
            s.series
                .as_ref()
                .and_then(|x| x.points.last())
                .map_or(0.0, |p| p[0]),
        )
        .max(0.05)
}

/// A path's graph: its transfers one after another on a broken time axis (each with the
/// seconds since it began; the idle time between them left out, a break drawn instead),
/// the moment of each fault where it came among them, and the rate each transfer's
/// receiving node saw: every 50 ms faint, the mean over 250 ms bold.
fn draw(run: &Run<'_>, p: PathKind, status: &Status, w: &Words) -> String {
    let plot = Plot::of(run, p);
    let mut o = String::new();
    plot.frame(&mut o, p, w);
    for (k, seg) in plot.segments.iter().enumerate() {
        plot.transfer(&mut o, k, seg, w);
    }
    plot.faults(&mut o, run);
    if let Status::Failed(_) = status {
        let _ = write!(
            o,
            r##"<text class="carried-nothing" x="{xx:.1}" y="{yy:.1}" text-anchor="middle" font-size="14" font-weight="600" fill="#56606b">{words}</text>"##,
            xx = LEFT + plot.pw / 2.0,
            yy = TOP + plot.ph / 2.0,
            words = esc(&w.carried_nothing),
        );
    }
    o.push_str("</svg>");
    o
}

/// A path's graph laid out: its transfers on the broken time axis, their smoothed rates,
/// and the rate axis's scale.
struct Plot<'a> {
    steps: Vec<&'a StepRecord>,
    segments: Vec<Segment<'a>>,
    /// Each transfer's mean over 250 ms, where it has a series.
    bold: Vec<Option<Vec<[f64; 2]>>>,
    /// Plot width and height.
    pw: f64,
    ph: f64,
    /// Pixels per second, and the seconds a break stands for.
    scale: f64,
    gap: f64,
    ymax: f64,
    ystep: f64,
    colour: &'static str,
}

impl<'a> Plot<'a> {
    fn of(run: &Run<'a>, p: PathKind) -> Plot<'a> {
        let steps: Vec<&StepRecord> = run
            .steps
            .iter()
            .filter(|s| s.path == Some(p) && counted(s))
            .collect();
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        // The axis: each transfer as long as it lasted, a gap of 6% of the whole between two.
        let total: f64 = steps.iter().map(|s| length(s)).sum::<f64>().max(1.0);
        let gap = if steps.len() > 1 { total * 0.06 } else { 0.0 };
        let scale = pw / (total + gap * steps.len().saturating_sub(1) as f64);
        let mut segments = Vec::new();
        let mut x = LEFT;
        for s in &steps {
            let len = length(s);
            segments.push(Segment {
                step: s,
                from: s.started_s,
                to: s.started_s + len,
                x0: x,
                x1: x + len * scale,
            });
            x += (len + gap) * scale;
        }
        let bold: Vec<Option<Vec<[f64; 2]>>> = steps
            .iter()
            .map(|s| {
                s.series
                    .as_ref()
                    .filter(|x| !x.points.is_empty())
                    .map(|x| smoothed(&x.points, 0.25))
            })
            .collect();
        let ymax_seen = bold
            .iter()
            .flatten()
            .flat_map(|v| v.iter().map(|q| q[1]))
            .chain(
                steps
                    .iter()
                    .filter_map(|s| s.metrics.get(names::THROUGHPUT_MBPS).map(|m| m.value)),
            )
            .fold(0.0_f64, f64::max);
        let ystep = nice_step(ymax_seen.max(1.0) * 1.1, 4.0);
        let ymax = ((ymax_seen.max(1.0) * 1.1 / ystep).ceil() * ystep).max(ystep);
        Plot {
            steps,
            segments,
            bold,
            pw,
            ph,
            scale,
            gap,
            ymax,
            ystep,
            colour: colour(p),
        }
    }

    /// Where a rate sits on the plot.
    fn y(&self, v: f64) -> f64 {
        TOP + self.ph - (v.clamp(0.0, self.ymax) / self.ymax) * self.ph
    }

    /// The bottom of the plot.
    fn yb(&self) -> f64 {
        TOP + self.ph
    }

    /// The graph's opening: its title with the provenance of what it shows, the plot's
    /// background, the rate axis with its grid, and the time axis's unit.
    fn frame(&self, o: &mut String, p: PathKind, w: &Words) {
        let (pw, ph, c) = (self.pw, self.ph, self.colour);
        let prov = self
            .steps
            .iter()
            .find_map(|s| s.series.as_ref().map(|x| x.provenance.kind))
            .or_else(|| {
                self.steps
                    .iter()
                    .find_map(|s| s.provenance.as_ref().map(|p| p.kind))
            })
            .map(|k| format!(" · {}", format!("{k:?}").to_lowercase()))
            .unwrap_or_default();
        let _ = write!(
            o,
            r##"<svg role="img" aria-label="{label}" viewBox="0 0 {W} {H}" width="100%" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="10">"##,
            label = esc(&w.label.replace("%{path}", p.as_str())),
        );
        let _ = write!(
            o,
            r##"<text x="2" y="14" font-size="14" font-weight="600" fill="{c}">{mark} {path}</text><text x="64" y="14" font-size="10" fill="#56606b">{mbps}{prov}</text>"##,
            mark = p.mark(),
            path = p.as_str(),
            mbps = esc(&w.mbps),
            prov = esc(&prov),
        );
        let _ = write!(
            o,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fbfcfd" stroke="#dde3ea"/>"##
        );
        let mut v = 0.0;
        while v <= self.ymax + 1e-9 {
            let yy = self.y(v);
            let _ = write!(
                o,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{x2:.1}" y2="{yy:.1}" stroke="#eef1f4"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end" fill="#56606b">{label}</text>"##,
                x2 = LEFT + pw,
                tx = LEFT - 4.0,
                ty = yy + 3.5,
                label = num(v),
            );
            v += self.ystep;
        }
        let _ = write!(
            o,
            r##"<text x="{xx:.1}" y="{yy:.1}" text-anchor="end" fill="#8a939c">{label}</text>"##,
            xx = LEFT + pw,
            yy = H - 4.0,
            label = esc(&w.seconds),
        );
    }

    /// One transfer: its time ticks, the break before it, a red band if it failed, its
    /// name, and its rate (the series faint and smoothed, else its average dashed).
    fn transfer(&self, o: &mut String, k: usize, seg: &Segment<'_>, w: &Words) {
        let (scale, ph, yb) = (self.scale, self.ph, self.yb());
        let s = seg.step;
        // Ticks: seconds since this transfer began.
        let len = seg.to - seg.from;
        let tstep = nice_step(len, ((seg.x1 - seg.x0) / 45.0).max(1.0));
        let mut t = 0.0;
        while t <= len + 1e-9 {
            let xx = seg.x0 + t * scale;
            let _ = write!(
                o,
                r##"<line x1="{xx:.1}" y1="{yb:.1}" x2="{xx:.1}" y2="{y2:.1}" stroke="#8a939c"/><text x="{xx:.1}" y="{ty:.1}" text-anchor="middle" fill="#56606b">{label}</text>"##,
                y2 = yb + 4.0,
                ty = yb + 14.0,
                label = num(t),
            );
            t += tstep;
        }
        if k > 0 {
            // The break: idle time on the run's clock left out.
            let xb = seg.x0 - self.gap * scale / 2.0;
            let _ = write!(
                o,
                r##"<line x1="{xb:.1}" y1="{TOP}" x2="{xb:.1}" y2="{yb:.1}" stroke="#c3cad2" stroke-dasharray="1 3"/><text x="{xb:.1}" y="{ty:.1}" text-anchor="middle" fill="#8a939c">⋯</text>"##,
                ty = yb + 14.0,
            );
        }
        let failed = matches!(s.verdict, Verdict::Fail | Verdict::Error);
        if failed {
            let _ = write!(
                o,
                r##"<rect class="failed-step" x="{a:.1}" y="{TOP}" width="{wd:.1}" height="{ph}" fill="#b3261e" fill-opacity="0.08"><title>{why}</title></rect>"##,
                a = seg.x0,
                wd = (seg.x1 - seg.x0).max(2.0),
                why = esc(s.reason.as_deref().unwrap_or(&w.failed)),
            );
        }
        let _ = write!(
            o,
            r##"<text x="{tx:.1}" y="{ty:.1}" fill="{fill}" font-size="9">{mark}{id}</text>"##,
            tx = seg.x0 + 2.0,
            ty = yb - 4.0,
            fill = if failed { "#b3261e" } else { "#56606b" },
            mark = if failed { "✘ " } else { "" },
            id = esc(&s.id),
        );
        self.rate(o, k, seg, w);
    }

    /// A transfer's rate: its series every 50 ms faint and its mean over 250 ms bold, or
    /// without a series its average as a dashed line.
    fn rate(&self, o: &mut String, k: usize, seg: &Segment<'_>, w: &Words) {
        let (s, c) = (seg.step, self.colour);
        let at = |t: f64| seg.x0 + (t - seg.from).clamp(0.0, seg.to - seg.from) * self.scale;
        match (&s.series, &self.bold[k]) {
            (Some(series), Some(mean)) => {
                let line = |pts: &[[f64; 2]]| {
                    let mut l = format!("{:.1},{:.1}", seg.x0, self.y(0.0));
                    for [t, v] in pts {
                        let _ = write!(l, " {:.1},{:.1}", at(s.started_s + t), self.y(*v));
                    }
                    l
                };
                let _ = write!(
                    o,
                    r##"<polyline class="samples" points="{raw}" fill="none" stroke="{c}" stroke-opacity="0.3" stroke-width="1"/><polyline class="series" points="{mean}" fill="none" stroke="{c}" stroke-width="1.8" stroke-linejoin="round"><title>{id}: {samples}; {prov}</title></polyline>"##,
                    raw = line(&series.points),
                    mean = line(mean),
                    id = esc(&s.id),
                    samples = esc(&w.samples.replace("%{n}", &series.points.len().to_string())),
                    prov = esc(&series.provenance.source),
                );
            }
            _ => {
                if let Some(m) = s.metrics.get(names::THROUGHPUT_MBPS) {
                    let yy = self.y(m.value);
                    let _ = write!(
                        o,
                        r##"<line class="average" x1="{a:.1}" y1="{yy:.1}" x2="{b:.1}" y2="{yy:.1}" stroke="{c}" stroke-width="1.6" stroke-dasharray="5 3"><title>{id}: {avg} {mbps} ({words})</title></line>"##,
                        a = seg.x0,
                        b = seg.x1,
                        id = esc(&s.id),
                        avg = num(m.value),
                        mbps = esc(&w.mbps),
                        words = esc(&w.average_only),
                    );
                }
            }
        }
    }

    /// Each fault's moment (a fault on a link, a subnet manager stopped or killed), where
    /// it came among this path's transfers: inside one, or in the break before the next.
    fn faults(&self, o: &mut String, run: &Run<'_>) {
        let (segments, scale, pw, yb) = (&self.segments, self.scale, self.pw, self.yb());
        for f in run.steps.iter().filter(|s| {
            matches!(s.kind, StepKind::Fault | StepKind::Sm) && s.verdict != Verdict::Skipped
        }) {
            let t = f.started_s;
            let xx = match segments.iter().position(|g| t < g.to) {
                _ if segments.is_empty() => continue,
                Some(k) if t >= segments[k].from => segments[k].x0 + (t - segments[k].from) * scale,
                Some(0) => LEFT + 1.0,
                Some(k) => segments[k].x0 - self.gap * scale / 2.0,
                None => LEFT + pw - 1.0,
            };
            // Its name on the side with room (the right edge has none).
            let (tx, anchor) = if xx > LEFT + pw * 0.8 {
                (xx - 2.0, "end")
            } else {
                (xx + 2.0, "start")
            };
            let _ = write!(
                o,
                r##"<g class="fault"><line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{yb:.1}" stroke="#b3261e" stroke-dasharray="3 3"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="{anchor}" fill="#b3261e" font-size="9">⚡ {id}</text></g>"##,
                ty = TOP + 9.0,
                id = esc(&f.id),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::evidence::Evidence;
    use iblab_core::testdata::{self, evidence};

    fn run(e: &Evidence) -> Run<'_> {
        Run {
            paths: &e.paths,
            excluded: &e.excluded_paths,
            steps: &e.steps,
            running: false,
        }
    }

    fn figure<'a>(html: &'a str, p: &str) -> &'a str {
        let at = html
            .find(&format!("<figure class=\"graph path-{p} "))
            .unwrap();
        &html[at..at + html[at..].find("</figure>").unwrap()]
    }

    /// Lesson 4 without an SM, kept from a real run (local backend): ① carried, drawn
    /// from its 50 ms series; ③ was refused by the subnet: greyed as a whole, its reason
    /// in one line under it; ② is not in the lab.
    #[test]
    fn lesson4_sm_off_greys_path_3_from_its_evidence() {
        let e = evidence(testdata::LESSON4_SM_OFF);
        let r = run(&e);
        assert_eq!(status(&r, PathKind::Tcp), Status::Carried);
        let Status::Failed(why) = status(&r, PathKind::Ib) else {
            panic!("{:?}", status(&r, PathKind::Ib));
        };
        assert!(why.contains("no subnet manager"), "{why}");
        assert_eq!(status(&r, PathKind::Roce), Status::NotInLab);
        let html = html(&r, &Words::of(Lang::En)).unwrap();
        let tcp = figure(&html, "tcp");
        assert!(tcp.contains("data-status=\"carried\""));
        let points = tcp
            .split("<polyline class=\"series\" points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .split(' ')
            .count();
        let series = e.steps.iter().find_map(|s| s.series.as_ref()).unwrap();
        assert_eq!(
            points,
            series.points.len() + 1,
            "every point, from the axis"
        );
        let ib = figure(&html, "ib");
        assert!(ib.contains("data-status=\"failed\"") && ib.contains("carried-nothing"));
        assert!(
            ib.contains("✘ carried nothing: refused by the subnet"),
            "{ib}"
        );
        assert!(ib.contains("grayscale"), "greyed as a whole");
        assert!(!tcp.contains("grayscale"));
        // The same run, still going, before ③'s refusal: waiting, not failed.
        let before: Vec<StepRecord> = e
            .steps
            .iter()
            .take_while(|s| !(s.path == Some(PathKind::Ib) && s.kind == StepKind::Traffic))
            .cloned()
            .collect();
        let live = Run {
            steps: &before,
            running: true,
            ..run(&e)
        };
        assert_eq!(status(&live, PathKind::Ib), Status::Waiting);
        assert_eq!(status(&live, PathKind::Tcp), Status::Carried);
    }

    /// Lesson 5 under congestion (kept from a run before steps had series): each path is
    /// drawn from its averages, dashed, the bottleneck's moment marked, ②'s collapsed
    /// transfer banded red while ② as a whole carried (its clean transfer did).
    #[test]
    fn lesson5_without_series_draws_averages_and_the_fault() {
        let e = evidence(testdata::LESSON5_CONGESTION);
        let r = run(&e);
        for p in PathKind::ALL {
            assert_eq!(status(&r, p), Status::Carried, "{p}");
        }
        let html = html(&r, &Words::of(Lang::En)).unwrap();
        let roce = figure(&html, "roce");
        assert_eq!(roce.matches("class=\"average\"").count(), 2);
        assert_eq!(roce.matches("class=\"failed-step\"").count(), 1);
        assert!(roce.contains("✘ congested"));
        assert!(roce.contains("⚡ bottleneck") && roce.contains("⚡ open"));
        assert!(!roce.contains("polyline"), "no series, none drawn");
        // A lab without a transfer draws no graphs at all.
        let none = Run {
            steps: &[],
            ..run(&e)
        };
        assert!(html_of_none(&none).is_none());
    }

    fn html_of_none(r: &Run<'_>) -> Option<String> {
        html(r, &Words::of(Lang::En))
    }

    #[test]
    fn the_bold_line_is_the_mean_over_250_ms() {
        // 50 ms samples alternating 0 and 100 Mbit/s: their mean over 250 ms (five of them)
        // is 40 or 60.
        let pts: Vec<[f64; 2]> = (1..=20)
            .map(|k| [k as f64 * 0.05, if k % 2 == 0 { 100.0 } else { 0.0 }])
            .collect();
        let m = smoothed(&pts, 0.25);
        assert_eq!(m.len(), pts.len());
        assert!(m[10..].iter().all(|p| (p[1] - 50.0).abs() < 11.0), "{m:?}");
        assert_eq!(m[0], [0.05, 0.0]);
        // A steady rate stays what it is.
        let flat: Vec<[f64; 2]> = (1..=10).map(|k| [k as f64 * 0.1, 20.0]).collect();
        assert!(
            smoothed(&flat, 0.25)
                .iter()
                .all(|p| (p[1] - 20.0).abs() < 1e-9)
        );
    }

    #[test]
    fn steps_are_nice() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(0.9, 4.0), 0.5);
        assert_eq!(nice_step(130.0, 4.0), 50.0);
        assert_eq!(nice_step(0.0, 4.0), 1.0);
    }

    #[test]
    fn one_line_cuts_long_reasons() {
        assert_eq!(one_line("a\nb"), "a");
        let long = "x".repeat(400);
        let cut = one_line(&long);
        assert!(cut.chars().count() <= 158 && cut.ends_with('…'));
    }
}
