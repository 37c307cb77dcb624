//! The summary printed at the end of a run (colour only on a terminal).

use iblab_core::evidence::{ComparisonRow, Evidence, Group, RunVerdict, Verdict};
use iblab_lab::{Lang, PathKind};
use rust_i18n::t;

struct Paint(bool);

impl Paint {
    fn code(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn verdict(&self, v: Verdict, s: &str) -> String {
        match v {
            Verdict::Pass => self.code("32", s),
            Verdict::Fail | Verdict::Error => self.code("31", s),
            Verdict::Skipped => self.code("90", s),
        }
    }
}

/// The summary of a run: what it is about (the lab's declared comparison, each
/// expectation with the values it judged), then the verdict, in the evidence's language.
/// `verbose` adds every raw measurement, and the comparison's values whole (wrapped in
/// their columns) with their details; without it each row is one line.
pub fn render(e: &Evidence, colour: bool, verbose: bool) -> String {
    render_width(e, colour, verbose, width())
}

/// [`render`], its tables laid out for `width` columns.
pub fn render_width(e: &Evidence, colour: bool, verbose: bool, width: usize) -> String {
    let p = Paint(colour);
    let lang = e.lang;
    let l = lang.tag();
    let mut out = header(e, &p);
    let title = t!("terminal.comparison", locale = l);
    out.push_str(&table(&p, &title, &e.comparison.rows, width, verbose, lang));
    if verbose {
        out.push_str(&details(&e.comparison.rows, lang));
        let title = t!("terminal.all_measurements", locale = l);
        out.push_str(&table(&p, &title, &e.measurements.rows, width, true, lang));
    } else if !e.measurements.rows.is_empty() {
        out.push_str(&format!(
            "\n  {}\n",
            t!(
                "terminal.raw_hint",
                locale = l,
                n = e.measurements.rows.len()
            )
        ));
    }
    out.push_str(&expectations(e, &p));
    out.push_str(&tolerated(e));
    for n in &e.notes {
        out.push_str(&format!(
            "\n  {}",
            t!("terminal.note", locale = l, note = n)
        ));
    }
    out.push_str(&summary(e, &p));
    out
}

/// The lab, its title, scenario, backend and paths, and each path left out with why.
fn header(e: &Evidence, p: &Paint) -> String {
    let lang = e.lang;
    let l = lang.tag();
    let mut out = format!(
        "\n{}  {}\n  {}\n",
        p.code("1", &e.lab),
        e.title,
        t!(
            "terminal.header",
            locale = l,
            scenario = e.scenario,
            backend = e.backend,
            paths = e
                .paths
                .iter()
                .map(|x| format!("{} {x}", x.mark()))
                .collect::<Vec<_>>()
                .join(" ")
        )
    );
    for (path, why) in &e.excluded_paths {
        out.push_str(&format!(
            "  {}\n",
            t!(
                "terminal.not_run",
                locale = l,
                mark = path.mark(),
                path = path,
                why = iblab_core::evidence::judge::reason(why, lang)
            )
        ));
    }
    out
}

/// Each expectation with its verdict and explanation; a failed one with its expression,
/// a judged one with the values it read.
fn expectations(e: &Evidence, p: &Paint) -> String {
    let l = e.lang.tag();
    if e.expectations.is_empty() {
        return String::new();
    }
    let mut out = format!("\n  {}\n", t!("terminal.expectations", locale = l));
    for x in &e.expectations {
        out.push_str(&format!(
            "  {} {}\n",
            p.verdict(x.verdict, x.verdict.symbol()),
            p.code("1", &x.id)
        ));
        out.push_str(&format!("      {}\n", x.explanation));
        let failed = matches!(x.verdict, Verdict::Fail | Verdict::Error);
        if failed {
            out.push_str(&format!(
                "      {} {}\n",
                p.code("90", &t!("terminal.that", locale = l)),
                x.expression
            ));
        }
        if x.verdict != Verdict::Skipped && !x.observed.is_empty() {
            let seen: Vec<String> = x
                .observed
                .iter()
                .map(|(k, v)| format!("{k} = {}", fmt_observed(v)))
                .collect();
            out.push_str(&format!(
                "      {} {}\n",
                p.code("90", &t!("terminal.saw", locale = l)),
                seen.join(" · ")
            ));
        }
    }
    out
}

/// The steps the lab lets fail that failed, if any.
fn tolerated(e: &Evidence) -> String {
    let tolerated: Vec<String> = e
        .steps
        .iter()
        .filter(|s| s.allowed_to_fail && matches!(s.verdict, Verdict::Fail | Verdict::Error))
        .map(|s| match s.path {
            Some(path) => format!("{} [{} {path}]", s.id, path.mark()),
            None => s.id.clone(),
        })
        .collect();
    if tolerated.is_empty() {
        return String::new();
    }
    format!(
        "\n  {}\n",
        t!(
            "terminal.tolerated",
            locale = e.lang.tag(),
            steps = tolerated.join(", ")
        )
    )
}

/// The run's verdict, its expectations counted, its length and its folder.
fn summary(e: &Evidence, p: &Paint) -> String {
    let l = e.lang.tag();
    let count =
        |f: &dyn Fn(Verdict) -> bool| e.expectations.iter().filter(|x| f(x.verdict)).count();
    let passed = count(&|v| v == Verdict::Pass);
    let failed = count(&|v| matches!(v, Verdict::Fail | Verdict::Error));
    let skipped = count(&|v| v == Verdict::Skipped);
    let verdict = match e.verdict {
        RunVerdict::Pass => p.code("32;1", &t!("terminal.pass", locale = l)),
        RunVerdict::Fail => p.code("31;1", &t!("terminal.fail", locale = l)),
        RunVerdict::Error => p.code("31;1", &t!("terminal.error", locale = l)),
        RunVerdict::Interrupted => p.code("33;1", &t!("terminal.interrupted", locale = l)),
    };
    let skipped_word = if e.verdict == RunVerdict::Interrupted {
        t!("terminal.not_judged", locale = l)
    } else {
        t!("terminal.skipped", locale = l)
    };
    format!(
        "\n\n  {}\n",
        t!(
            "terminal.summary",
            locale = l,
            verdict = verdict,
            passed = passed,
            failed = failed,
            skipped = skipped,
            skipped_word = skipped_word,
            secs = format!("{:.1}", e.duration_s),
            dir = shown(&e.run_dir).display()
        )
    )
}

/// The details behind the comparison's values (what `-v` adds under the table): a line
/// for each cell that has one.
fn details(rows: &[ComparisonRow], lang: Lang) -> String {
    let mut out = String::new();
    for r in rows {
        for (path, c) in &r.values {
            if let Some(d) = &c.detail {
                out.push_str(&format!("    {} · {} {path}: {d}\n", r.name, path.mark()));
            }
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\n  {}\n{out}", t!("terminal.details", locale = lang.tag()))
}

/// The width the summary is laid out for when there is no terminal to ask (piped output,
/// tests) and COLUMNS is not set: the comparison of every built-in lab fits it, a row a
/// line.
pub const DEFAULT_WIDTH: usize = 120;

/// Narrower than this the table's columns cannot hold their headers; it is laid out for
/// this width and the terminal wraps its lines.
const MIN_WIDTH: usize = 48;

/// The width to lay the summary out for: COLUMNS when it is set to a number, else the
/// width of the terminal standard output is on, else [`DEFAULT_WIDTH`].
pub fn width() -> usize {
    width_from(std::env::var("COLUMNS").ok().as_deref(), tty_width())
}

fn width_from(columns: Option<&str>, tty: Option<usize>) -> usize {
    columns
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&w| w > 0)
        .or(tty.filter(|&w| w > 0))
        .unwrap_or(DEFAULT_WIDTH)
}

/// The columns of the terminal standard output is on; `None` when it is not a terminal.
fn tty_width() -> Option<usize> {
    use std::io::IsTerminal;
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    terminal_size::terminal_size_of(&out).map(|(w, _)| usize::from(w.0))
}

/// Rows under ① ② ③ in aligned columns, grouped host-internal / network layer (a group
/// with no rows is not drawn); a row where ② = ③ by its rule is grey and marked `=`, one
/// where they differ green `≠`. The table fits in `width` columns (display columns: a
/// Chinese character takes two). `whole`: a label or value too long for its column wraps
/// within it, continuation lines under the column, and is never cut; a value's
/// provenance stays on the line of its last word. Else every row is one line: a value
/// too long for its column is cut with `…` before its provenance (whole with `-v`, in
/// evidence.json and report.html, as a line under the table says).
fn table(
    p: &Paint,
    title: &str,
    rows: &[ComparisonRow],
    width: usize,
    whole: bool,
    lang: Lang,
) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let l = lang.tag();
    // A cell as the words it wraps at; the value's last word and its provenance are one.
    // On one line the provenance is a mark (`[s]`), said once under the table.
    let mut marks = std::collections::BTreeSet::new();
    let labels: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            row_label(r, lang)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .collect();
    let cells: Vec<[Vec<String>; 3]> = rows
        .iter()
        .map(|r| PathKind::ALL.map(|path| cell_words(r, path, whole, lang, &mut marks)))
        .collect();
    let heads = PathKind::ALL.map(|path| format!("{} {path}", path.mark()));
    let layout = Columns::fit(title, &heads, rows, &labels, &cells, width);
    let mut out = format!("\n  {}", pad(title, layout.widths[0]));
    for (i, head) in heads.iter().enumerate() {
        out.push_str(&format!("  {}", layout.align(i + 1, head)));
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    let mut cut_any = false;
    for group in [Group::Host, Group::Network] {
        let in_group: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].group == group)
            .collect();
        if in_group.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "  {}\n",
            if group == Group::Host {
                t!("group.host", locale = l)
            } else {
                t!("group.network", locale = l)
            }
        ));
        for i in in_group {
            let columns = layout.lines(&labels[i], &cells[i], whole, &mut cut_any);
            out.push_str(&row_lines(p, &rows[i], &columns, &layout));
        }
    }
    out.push_str(&table_legend(rows, &marks, cut_any, lang));
    out
}

/// A row's label: its name, its unit, and whether it needs hardware to show.
fn row_label(r: &ComparisonRow, lang: Lang) -> String {
    let hw = if r.needs_hardware {
        t!("terminal.needs_hardware", locale = lang.tag()).into_owned()
    } else {
        String::new()
    };
    if r.unit.is_empty() {
        format!("{}{hw}", r.name)
    } else {
        format!("{} [{}]{hw}", r.name, r.unit)
    }
}

/// A cell as the words it wraps at, its provenance joined to the last: in words when
/// `whole`, else as a mark (noted in `marks`, to be said under the table).
fn cell_words(
    r: &ComparisonRow,
    path: PathKind,
    whole: bool,
    lang: Lang,
    marks: &mut std::collections::BTreeSet<&'static str>,
) -> Vec<String> {
    match r.values.get(&path) {
        Some(c) => {
            let mut words: Vec<String> = fmt_text(&c.value)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            let prov = if whole {
                format!("({})", short(c.provenance, lang))
            } else {
                marks.insert(c.provenance.as_str());
                format!("[{}]", mark(c.provenance, lang))
            };
            match words.last_mut() {
                Some(last) => *last = format!("{last} {prov}"),
                None => words.push(prov),
            }
            words
        }
        None => vec!["—".into()],
    }
}

/// A table's columns: their widths within the room there is, and which are numbers
/// (right-aligned: a column of numbers, or of nothing; one with a text is left-aligned).
struct Columns {
    widths: Vec<usize>,
    numeric: [bool; 3],
}

impl Columns {
    fn fit(
        title: &str,
        heads: &[String; 3],
        rows: &[ComparisonRow],
        labels: &[Vec<String>],
        cells: &[[Vec<String>; 3]],
        width: usize,
    ) -> Columns {
        let one_line = |words: &[String]| cols(&words.join(" "));
        let numeric = PathKind::ALL.map(|path| {
            rows.iter()
                .filter_map(|r| r.values.get(&path))
                .all(|c| c.value.is_number())
        });
        let title_w = cols(title);
        let mut natural = vec![
            labels
                .iter()
                .map(|l| one_line(l))
                .chain([title_w])
                .max()
                .unwrap_or(0),
        ];
        let mut least = vec![title_w.max(natural[0].min(12))];
        for (i, head) in heads.iter().enumerate() {
            let head_w = cols(head);
            let n = cells
                .iter()
                .map(|c| one_line(&c[i]))
                .chain([head_w])
                .max()
                .unwrap_or(0);
            natural.push(n);
            least.push(head_w.max(n.min(8)));
        }
        let marked = rows
            .iter()
            .any(|r| r.roce_equals_ib.is_some() || !r.same_device.is_empty());
        let marker_w = if marked { 3 } else { 0 };
        let room = width
            .max(MIN_WIDTH)
            .saturating_sub(2 + 2 * PathKind::ALL.len() + marker_w);
        Columns {
            widths: fit(&natural, &least, room),
            numeric,
        }
    }

    /// `s` padded to column `i`'s width, on its side.
    fn align(&self, i: usize, s: &str) -> String {
        if i > 0 && self.numeric[i - 1] {
            lpad(s, self.widths[i])
        } else {
            pad(s, self.widths[i])
        }
    }

    /// A row's columns as the lines each takes: wrapped when `whole`, else one line each,
    /// cut with `…` (noted in `cut_any`).
    fn lines(
        &self,
        label: &[String],
        cells: &[Vec<String>; 3],
        whole: bool,
        cut_any: &mut bool,
    ) -> Vec<Vec<String>> {
        if whole {
            let mut c = vec![wrap(label, self.widths[0])];
            for (k, words) in cells.iter().enumerate() {
                c.push(wrap(words, self.widths[k + 1]));
            }
            return c;
        }
        let mut c = vec![vec![cut(&label.join(" "), self.widths[0])]];
        for (k, words) in cells.iter().enumerate() {
            let line = one_line_cell(words, self.widths[k + 1]);
            *cut_any |= line.contains('…');
            c.push(vec![line]);
        }
        *cut_any |= c[0][0].contains('…');
        c
    }
}

/// A row's lines, its ② = ③ mark on the first, grey where they agree and green where
/// they differ.
fn row_lines(p: &Paint, r: &ComparisonRow, columns: &[Vec<String>], layout: &Columns) -> String {
    let mut out = String::new();
    let height = columns.iter().map(Vec::len).max().unwrap_or(1);
    for n in 0..height {
        let mut line = String::new();
        for (k, lines) in columns.iter().enumerate() {
            line.push_str("  ");
            line.push_str(&layout.align(k, lines.get(n).map_or("", String::as_str)));
        }
        let line = match (n, r.roce_equals_ib) {
            // ② and ③ measured on one device: equal by construction, not judged.
            (0, _) if !r.same_device.is_empty() => format!("{line}  ≡"),
            (0, Some(true)) => format!("{line}  ="),
            (0, Some(false)) => format!("{line}  ≠"),
            _ => line.trim_end().to_string(),
        };
        let line = match r.roce_equals_ib {
            Some(true) => p.code("90", &line),
            Some(false) => p.code("32", &line),
            None => line,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// What is said under a table: the provenance marks used, that a value was cut, and the
/// devices rows were measured on alone.
fn table_legend(
    rows: &[ComparisonRow],
    marks: &std::collections::BTreeSet<&'static str>,
    cut_any: bool,
    lang: Lang,
) -> String {
    let l = lang.tag();
    let mut out = String::new();
    if !marks.is_empty() {
        let legend: Vec<String> = iblab_core::evidence::ProvenanceKind::ALL
            .iter()
            .filter(|k| marks.contains(k.as_str()))
            .map(|k| format!("[{}] {}", mark(*k, lang), k.word(lang)))
            .collect();
        out.push_str(&format!("  {}\n", legend.join(" · ")));
    }
    if cut_any {
        out.push_str(&format!("  {}\n", t!("terminal.cut_hint", locale = l)));
    }
    if let Some(r) = rows.iter().find(|r| !r.same_device.is_empty()) {
        out.push_str(&format!(
            "  {}\n",
            t!(
                "terminal.same_device",
                locale = l,
                devices = r.same_device.join(", ")
            )
        ));
    }
    out
}

/// A provenance as a cell's mark on one line (`s`, `e`, `m`, `hw`).
fn mark(k: iblab_core::evidence::ProvenanceKind, lang: Lang) -> String {
    t!(
        format!("provenance.mark.{}", k.as_str()),
        locale = lang.tag()
    )
    .into_owned()
}

/// A cell's words on one line of at most `w` columns: whole when they fit, else the value
/// cut with `…` and its provenance mark kept (the last word's tail).
fn one_line_cell(words: &[String], w: usize) -> String {
    let whole = words.join(" ");
    if cols(&whole) <= w {
        return whole;
    }
    match whole.rfind(" [") {
        Some(i) if whole.ends_with(']') => {
            let (value, prov) = whole.split_at(i);
            let room = w.saturating_sub(cols(prov));
            if room >= 2 {
                return format!("{}{prov}", cut(value, room));
            }
            cut(&whole, w)
        }
        _ => cut(&whole, w),
    }
}

/// Widths for columns that want `natural` characters each, at least `least`, in `room`:
/// all natural when they fit; else the widest are narrowed to one common cap (the
/// narrow ones keep theirs), never below `least`.
fn fit(natural: &[usize], least: &[usize], room: usize) -> Vec<usize> {
    let natural: Vec<usize> = natural.iter().zip(least).map(|(n, l)| *n.max(l)).collect();
    if natural.iter().sum::<usize>() <= room {
        return natural;
    }
    if least.iter().sum::<usize>() >= room {
        return least.to_vec();
    }
    let capped = |cap: usize| -> Vec<usize> {
        natural
            .iter()
            .zip(least)
            .map(|(n, l)| *n.min(&cap.max(*l)))
            .collect()
    };
    let mut cap = 0;
    while capped(cap + 1).iter().sum::<usize>() <= room {
        cap += 1;
    }
    let mut widths = capped(cap);
    let mut left = room - widths.iter().sum::<usize>();
    for (w, n) in widths.iter_mut().zip(&natural) {
        if left > 0 && *w < *n {
            *w += 1;
            left -= 1;
        }
    }
    widths
}

/// Words in lines of at most `w` characters, broken at spaces; a word longer than a line
/// is broken within (a value is never cut), and so is a word joined to its provenance
/// when the two do not fit on one line.
fn wrap(words: &[String], w: usize) -> Vec<String> {
    let w = w.max(2);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut pieces: Vec<String> = Vec::new();
    for word in words {
        if cols(word) <= w {
            pieces.push(word.clone());
        } else {
            for part in word.split(' ') {
                pieces.extend(chunks(part, w));
            }
        }
    }
    for piece in pieces {
        let (have, add) = (cols(&line), cols(&piece));
        if line.is_empty() {
            line = piece;
        } else if have + 1 + add <= w {
            line.push(' ');
            line.push_str(&piece);
        } else {
            lines.push(std::mem::replace(&mut line, piece));
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// The columns `s` takes on a terminal: a Chinese character two, ① and → one.
pub fn cols(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

fn char_cols(c: char) -> usize {
    unicode_width::UnicodeWidthChar::width(c).unwrap_or(0)
}

/// `s` in pieces of at most `w` columns each (a character wider than `w` on its own).
fn chunks(s: &str, w: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut piece = String::new();
    for c in s.chars() {
        if !piece.is_empty() && cols(&piece) + char_cols(c) > w {
            out.push(std::mem::take(&mut piece));
        }
        piece.push(c);
    }
    if !piece.is_empty() {
        out.push(piece);
    }
    out
}

/// Pad on the right to `w` columns.
fn pad(s: &str, w: usize) -> String {
    let n = cols(s);
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

/// Pad on the left to `w` columns.
fn lpad(s: &str, w: usize) -> String {
    let n = cols(s);
    format!("{}{s}", " ".repeat(w.saturating_sub(n)))
}

/// At most `w` columns, an ellipsis marking a cut.
fn cut(s: &str, w: usize) -> String {
    if cols(s) <= w {
        return s.to_string();
    }
    let mut kept = String::new();
    for c in s.chars() {
        if cols(&kept) + char_cols(c) + 1 > w {
            break;
        }
        kept.push(c);
    }
    format!("{}…", kept.trim_end())
}

/// An observed value, short: numbers formatted, long texts cut.
fn fmt_observed(v: &serde_json::Value) -> String {
    cut(&fmt_text(v), 60)
}

/// A run folder as the user would type it: relative to the current folder when inside it.
fn shown(dir: &std::path::Path) -> std::path::PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(|p| p.to_path_buf()))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| dir.to_path_buf())
}

/// A provenance in a table's cell: short.
fn short(k: iblab_core::evidence::ProvenanceKind, lang: Lang) -> String {
    t!(
        format!("provenance.short.{}", k.as_str()),
        locale = lang.tag()
    )
    .into_owned()
}

/// A text cell in full (strings without their JSON quotes).
fn fmt_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => fmt_num(n.as_f64().unwrap_or(0.0)),
        other => other.to_string(),
    }
}

pub fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::evidence::ComparisonRow;

    /// Lesson 4's comparison (network rows only, ② not run), with its values as long as
    /// the lab writes them, and a row on ② and ③ that says they agree.
    fn lesson4_rows() -> Vec<ComparisonRow> {
        let row = |name: &str,
                   tcp: Option<&str>,
                   roce: Option<&str>,
                   ib: &str,
                   same: Option<bool>| {
            let mut values = serde_json::Map::new();
            if let Some(v) = tcp {
                values.insert(
                    "tcp".into(),
                    serde_json::json!({"value": v, "provenance": "soft"}),
                );
            }
            if let Some(v) = roce {
                values.insert(
                    "roce".into(),
                    serde_json::json!({"value": v, "provenance": "soft"}),
                );
            }
            values.insert(
                "ib".into(),
                serde_json::json!({"value": ib, "provenance": "emulated"}),
            );
            let mut r =
                serde_json::json!({"group": "network", "name": name, "unit": "", "values": values});
            if let Some(same) = same {
                r["roce_equals_ib"] = serde_json::json!(same);
            }
            serde_json::from_value::<ComparisonRow>(r).unwrap()
        };
        vec![
            row(
                "address",
                Some("MAC 02:42:ac:11:00:02, burnt in; found by ARP"),
                None,
                "LID 1, given by the subnet manager",
                None,
            ),
            row(
                "forwarding table",
                Some("learned by the bridge (flood and learn), no central role"),
                None,
                "written by the SM: 3 LFT entries",
                None,
            ),
            row(
                "forwarding table written by",
                Some("learned by the bridge from the frames it forwarded: 4 entries, none written"),
                Some("learned by the bridge from the frames it forwarded: 4 entries, none written"),
                "the subnet manager, through the subnet management agent of each switch",
                Some(false),
            ),
        ]
    }

    /// The text of a column: from where its header starts to where the next one does,
    /// over every line under the heading, joined with spaces.
    fn column(out: &str, head: &str, next: Option<&str>) -> String {
        let lines: Vec<Vec<char>> = out.lines().map(|l| l.chars().collect()).collect();
        let find = |line: &[char], s: &str| {
            let s: Vec<char> = s.chars().collect();
            line.windows(s.len()).position(|w| w == s.as_slice())
        };
        let header = lines
            .iter()
            .find(|l| find(l, head).is_some())
            .expect("a header line");
        let from = find(header, head).unwrap();
        let to = next.map(|n| find(header, n).unwrap());
        let mut parts = Vec::new();
        for l in lines.iter().skip_while(|l| *l != header).skip(1) {
            let end = to.unwrap_or(l.len()).min(l.len());
            if from >= end {
                continue;
            }
            let part: String = l[from..end].iter().collect();
            let part = part.trim_end();
            let part = part
                .strip_suffix('≠')
                .or_else(|| part.strip_suffix('='))
                .unwrap_or(part)
                .trim();
            if !part.is_empty() {
                parts.push(part.to_string());
            }
        }
        parts.join(" ")
    }

    fn check_whole(rows: &[ComparisonRow], width: usize) -> String {
        let out = table(&Paint(false), "comparison", rows, width, true, Lang::En);
        assert!(!out.contains('…'), "a value was cut at {width}:\n{out}");
        for l in out.lines() {
            assert!(
                l.chars().count() <= width,
                "a line wider than {width}: {l:?}\n{out}"
            );
        }
        let tcp = column(&out, "① tcp", Some("② roce"));
        let roce = column(&out, "② roce", Some("③ ib"));
        let ib = column(&out, "③ ib", None);
        for r in rows {
            for (path, text) in [
                (PathKind::Tcp, &tcp),
                (PathKind::Roce, &roce),
                (PathKind::Ib, &ib),
            ] {
                if let Some(c) = r.values.get(&path) {
                    let whole =
                        format!("{} ({})", fmt_text(&c.value), short(c.provenance, Lang::En));
                    // A word longer than its column (a MAC address at 60) is broken
                    // within: compare without the spaces the wrapping changed.
                    let bare = |s: &str| s.split_whitespace().collect::<String>();
                    assert!(
                        bare(text).contains(&bare(&whole)),
                        "{path} of {} not whole at {width}: {whole:?} not in {text:?}\n{out}",
                        r.name
                    );
                    assert!(
                        width < 100 || text.contains(&whole),
                        "{path} of {} not whole at {width}: {whole:?} not in {text:?}\n{out}",
                        r.name
                    );
                }
            }
        }
        // Where a column holds the value's last word with its provenance (every column
        // from 100 on), the provenance is never on a line of its own.
        if width >= 100 {
            for l in out.lines() {
                for prov in ["(soft)", "(emul)"] {
                    assert!(
                        !l.contains(&format!("  {prov}")),
                        "a provenance on a line of its own at {width}: {l:?}\n{out}"
                    );
                }
            }
        }
        out
    }

    #[test]
    fn long_values_are_whole_wrapped_within_their_column() {
        for width in [60, 100, 160] {
            check_whole(&lesson4_rows(), width);
        }
        let narrow = check_whole(&lesson4_rows(), 60);
        assert!(
            narrow.lines().count() > 2 + 4,
            "at 60 columns the long cells wrap:\n{narrow}"
        );
    }

    #[test]
    fn a_wide_terminal_holds_each_value_on_one_line() {
        let mut rows = lesson4_rows();
        rows.truncate(2);
        let out = check_whole(&rows, 160);
        assert!(out.contains("learned by the bridge (flood and learn), no central role (soft)"));
        assert!(out.contains("LID 1, given by the subnet manager (emul)"));
        assert_eq!(
            out.lines().count(),
            1 + 1 + 1 + 2,
            "title, heading, two rows:\n{out}"
        );
    }

    #[test]
    fn the_marker_and_colour_stay_on_every_line_of_a_row() {
        let rows = lesson4_rows();
        let out = table(&Paint(true), "comparison", &rows, 70, true, Lang::En);
        let green: Vec<&str> = out.lines().filter(|l| l.starts_with("\x1b[32m")).collect();
        assert!(
            green.len() > 1,
            "the ≠ row wraps and each of its lines is green:\n{out}"
        );
        assert!(green.iter().all(|l| l.ends_with("\x1b[0m")));
        assert_eq!(
            out.matches('≠').count(),
            1,
            "the marker once, on the row's first line"
        );
        assert!(green[0].contains('≠'));
    }

    #[test]
    fn a_group_without_rows_has_no_heading() {
        let mut e: Evidence = iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS);
        assert!(render_width(&e, false, false, 100).contains("  host-internal\n"));
        e.comparison.rows = lesson4_rows();
        let out = render_width(&e, false, false, 100);
        assert!(!out.contains("host-internal"), "{out}");
        assert!(out.contains("  network layer\n"), "{out}");
    }

    #[test]
    fn numbers_stay_right_aligned_and_fit() {
        let e: Evidence = iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS);
        for width in [60, 100] {
            let out = table(
                &Paint(false),
                "comparison",
                &e.comparison.rows,
                width,
                true,
                Lang::En,
            );
            assert!(!out.contains('…'));
            assert!(out.lines().all(|l| l.chars().count() <= width), "{out}");
            // Where `s` ends on line `l`, in characters.
            let ends =
                |l: &str, s: &str| l[..l.find(s).unwrap()].chars().count() + s.chars().count();
            let header = out.lines().find(|l| l.contains("① tcp")).unwrap();
            let end = ends(header, "① tcp");
            let row = out
                .lines()
                .find(|l| l.contains("throughput_mbps") && l.contains("(soft)"))
                .unwrap();
            let end_of_value = ends(row, "(soft)");
            assert_eq!(end, end_of_value, "① column right-aligned:\n{out}");
        }
    }

    #[test]
    fn columns_share_the_room_the_widest_narrowed_first() {
        assert_eq!(fit(&[10, 20, 30], &[5, 5, 5], 100), vec![10, 20, 30]);
        assert_eq!(fit(&[10, 20, 30], &[5, 5, 5], 40), vec![10, 15, 15]);
        assert_eq!(fit(&[10, 20, 31], &[5, 5, 5], 41), vec![10, 16, 15]);
        assert_eq!(fit(&[10, 20, 30], &[8, 8, 8], 10), vec![8, 8, 8]);
    }

    #[test]
    fn wrapping_breaks_at_spaces_and_never_loses_a_character() {
        let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            wrap(&words("LID 1, given by the SM"), 10),
            vec!["LID 1,", "given by", "the SM"]
        );
        assert_eq!(
            wrap(&words("abcdefghijkl x"), 5),
            vec!["abcde", "fghij", "kl x"]
        );
        assert_eq!(
            wrap(&["role (soft)".to_string()], 8),
            vec!["role", "(soft)"]
        );
        assert_eq!(wrap(&[], 8), vec![""]);
    }

    #[test]
    fn the_width_is_columns_else_the_terminal_else_the_default() {
        assert_eq!(width_from(Some("72"), Some(200)), 72);
        assert_eq!(width_from(Some(" 132 "), None), 132);
        assert_eq!(width_from(Some("wide"), Some(90)), 90);
        assert_eq!(width_from(Some("0"), None), DEFAULT_WIDTH);
        assert_eq!(width_from(None, Some(90)), 90);
        assert_eq!(width_from(None, None), DEFAULT_WIDTH);
    }
}
