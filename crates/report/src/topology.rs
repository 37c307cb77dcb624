//! The lab drawn: hosts, switches and the cables between them with their names and
//! addresses, where the subnet manager runs, LIDs on path ③ and where faults were applied.
//! As SVG (drawn here: no external asset, no script) and as Graphviz dot. A pure function
//! of the topology (from a plan, so `show` needs no run) and, for a run, its evidence.

use std::collections::BTreeMap;
use std::fmt::Write;

use iblab_core::evidence::topology::{Marks, TopoNode, Topology};

const BOX_W: f64 = 150.0;
const GAP: f64 = 40.0;
const HOST_Y: f64 = 30.0;
const SWITCH_Y: f64 = 230.0;
const BOX_H: f64 = 78.0;
const MARGIN: f64 = 170.0;

/// Where each node sits: switches in one row, hosts above them in the order of the
/// switch each hangs on, so that cables seldom cross.
fn layout(t: &Topology) -> (BTreeMap<String, (f64, f64)>, f64, f64) {
    let switches: Vec<&TopoNode> = t.nodes.iter().filter(|n| n.switch).collect();
    let mut hosts: Vec<&TopoNode> = t.nodes.iter().filter(|n| !n.switch).collect();
    let switch_of = |host: &str| {
        t.links
            .iter()
            .find_map(|l| {
                let [(a, _), (b, _)] = &l.ends;
                let peer = if a == host {
                    b
                } else if b == host {
                    a
                } else {
                    return None;
                };
                switches.iter().position(|s| &s.name == peer)
            })
            .unwrap_or(usize::MAX)
    };
    hosts.sort_by_key(|h| switch_of(&h.name));
    let cols = hosts.len().max(switches.len()).max(1) as f64;
    // Room on both sides for the labels of cables that lean outwards.
    let width = cols * (BOX_W + GAP) + GAP + 2.0 * MARGIN;
    let row = |items: &[&TopoNode], y: f64, pos: &mut BTreeMap<String, (f64, f64)>| {
        let n = items.len() as f64;
        let span = n * BOX_W + (n - 1.0).max(0.0) * GAP;
        let x0 = (width - span) / 2.0;
        for (i, it) in items.iter().enumerate() {
            pos.insert(it.name.clone(), (x0 + i as f64 * (BOX_W + GAP), y));
        }
    };
    let mut pos = BTreeMap::new();
    row(&hosts, HOST_Y, &mut pos);
    let switch_y = if hosts.is_empty() { HOST_Y } else { SWITCH_Y };
    row(&switches, switch_y, &mut pos);
    // Room under the row for cables between switches (each further one lower).
    let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
    for l in &t.links {
        let [(a, _), (b, _)] = &l.ends;
        let both_switches = [a, b]
            .iter()
            .all(|n| switches.iter().any(|s| &&s.name == n));
        if both_switches {
            *pairs
                .entry((a.min(b).clone(), a.max(b).clone()))
                .or_default() += 1;
        }
    }
    let under = pairs.values().max().copied().unwrap_or(0) as f64 * 44.0;
    let height = switch_y + BOX_H + 40.0 + under;
    (pos, width, height)
}

/// Text made safe inside SVG or HTML (text and attribute values).
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The lab as an SVG image, its words in `lang`.
pub fn svg(t: &Topology, marks: &Marks, lang: iblab_lab::Lang) -> String {
    let word = |key: &str| rust_i18n::t!(key, locale = lang.tag()).into_owned();
    let (pos, width, height) = layout(t);
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<svg role="img" aria-label="lab topology" viewBox="0 0 {width:.0} {height:.0}" width="100%" style="max-width:{width:.0}px" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">"##
    );
    // Cables first, so boxes sit on top. Parallel cables between one pair bow apart.
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for l in &t.links {
        let [(a, ia), (b, ib)] = &l.ends;
        let (Some(&(ax, ay)), Some(&(bx, by))) = (pos.get(a.as_str()), pos.get(b.as_str())) else {
            continue;
        };
        let key = if a < b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        };
        let k = *seen.entry(key).and_modify(|k| *k += 1).or_insert(0);
        // Between rows: centre to centre, parallel cables bowing apart sideways. Within a
        // row (switch to switch): under the boxes, each further cable lower.
        let same_row = ay == by;
        let (y1, y2) = if same_row {
            (ay + BOX_H, by + BOX_H)
        } else {
            (ay + BOX_H / 2.0, by + BOX_H / 2.0)
        };
        let (x1, x2) = (ax + BOX_W / 2.0, bx + BOX_W / 2.0);
        let (cx, cy) = if same_row {
            ((x1 + x2) / 2.0, y1 + 50.0 + k as f64 * 44.0)
        } else {
            let bow = k as f64 * 36.0 * if k.is_multiple_of(2) { 1.0 } else { -1.0 };
            ((x1 + x2) / 2.0 + bow, (y1 + y2) / 2.0)
        };
        let fault = marks.faults.get(&l.name);
        let colour = if fault.is_some() {
            "#b91c1c"
        } else {
            "#56606b"
        };
        let _ = write!(
            o,
            r#"<path d="M{x1:.1} {y1:.1} Q{cx:.1} {cy:.1} {x2:.1} {y2:.1}" fill="none" stroke="{colour}" stroke-width="2"/>"#
        );
        // The label: under a cable within a row at its lowest point; on a cable between
        // rows a third of the way down, on the outer side of its lean, so
        // that labels of cables meeting at one switch do not overlap.
        let point = |t: f64| {
            let u = 1.0 - t;
            (
                u * u * x1 + 2.0 * u * t * cx + t * t * x2,
                u * u * y1 + 2.0 * u * t * cy + t * t * y2,
            )
        };
        let (lx, ly, anchor) = if same_row {
            let (x, y) = point(0.5);
            (x, y + 14.0, "middle")
        } else {
            let (x, y) = point(0.33);
            match (x2 - x1).partial_cmp(&0.0) {
                Some(std::cmp::Ordering::Greater) => (x - 8.0, y, "end"),
                Some(std::cmp::Ordering::Less) => (x + 8.0, y, "start"),
                _ => (x + 8.0, y, "start"),
            }
        };
        let mut label = format!("{} ({ia}–{ib})", l.name);
        if let Some(f) = fault {
            label.push_str(&format!(" ⚡ {}", f.join(", ")));
        }
        let _ = write!(
            o,
            r##"<text x="{lx:.1}" y="{ly:.1}" text-anchor="{anchor}" fill="{colour}" stroke="#fff" stroke-width="3" paint-order="stroke">{}</text>"##,
            esc(&label)
        );
    }
    for n in &t.nodes {
        let Some(&(x, y)) = pos.get(n.name.as_str()) else {
            continue;
        };
        let (fill, kind) = if n.switch {
            ("#eef2f7", word("topology.switch"))
        } else {
            ("#fff7ed", word("topology.host"))
        };
        let _ = write!(
            o,
            r##"<g><rect x="{x:.1}" y="{y:.1}" width="{BOX_W}" height="{BOX_H}" rx="8" fill="{fill}" stroke="#3b4450"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"##,
            x + BOX_W / 2.0,
            y + 17.0,
            esc(&n.name)
        );
        let mut lines = vec![kind];
        lines.extend(n.addresses.iter().cloned());
        if let Some(lid) = marks.lids.get(&n.name) {
            lines.push(format!("③ LID {lid}"));
        }
        if t.subnet_managers.contains(&n.name) {
            lines.push(word("topology.runs_sm"));
        }
        for (i, line) in lines.iter().take(4).enumerate() {
            let _ = write!(
                o,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#3b4450">{}</text>"##,
                x + BOX_W / 2.0,
                y + 32.0 + 12.0 * i as f64,
                esc(line)
            );
        }
        o.push_str("</g>");
    }
    o.push_str("</svg>");
    o
}

/// The lab as a Graphviz graph (`dot -Tsvg` draws it).
pub fn dot(t: &Topology, name: &str) -> String {
    let q = |s: &str| {
        let escaped = s
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        format!("\"{escaped}\"")
    };
    let mut o = format!("graph {} {{\n  node [fontname=\"sans-serif\"];\n", q(name));
    for n in &t.nodes {
        let mut label = n.name.clone();
        for a in &n.addresses {
            label.push_str(&format!("\n{a}"));
        }
        if t.subnet_managers.contains(&n.name) {
            label.push_str("\nsubnet manager");
        }
        let _ = writeln!(
            o,
            "  {} [shape={}, label={}];",
            q(&n.name),
            if n.switch { "box" } else { "ellipse" },
            q(&label)
        );
    }
    for l in &t.links {
        let [(a, ia), (b, ib)] = &l.ends;
        let _ = writeln!(
            o,
            "  {} -- {} [label={}, taillabel={}, headlabel={}];",
            q(a),
            q(b),
            q(&l.name),
            q(ia),
            q(ib)
        );
    }
    o.push_str("}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reroute() -> Topology {
        let lab = iblab_lab::load::resolve("lesson4-reroute").unwrap();
        let plan = iblab_core::plan::plan(
            &lab,
            &iblab_core::plan::Request {
                scenario: None,
                backend: "local".into(),
                paths: None,
                hca: None,
                run: None,
                lang: Default::default(),
            },
            &iblab_core::caps::HostCaps::for_tests(),
            &iblab_core::plan::backend::testing::backends(),
        )
        .unwrap();
        Topology::of(&plan)
    }

    #[test]
    fn every_node_and_cable_is_drawn_with_its_names() {
        let t = reroute();
        let mut marks = Marks::default();
        marks.lids.insert("a".into(), 1);
        marks.faults.insert("isl1".into(), vec!["down".into()]);
        let s = svg(&t, &marks, iblab_lab::Lang::En);
        for want in [
            "a",
            "b",
            "sw1",
            "sw2",
            "isl1",
            "isl2",
            "198.18.0.1/24",
            "③ LID 1",
            "⚡ down",
            "runs a subnet manager",
        ] {
            assert!(s.contains(want), "{want} missing");
        }
        assert_eq!(s.matches("<path ").count(), 4, "four cables");
        assert_eq!(s.matches("<rect ").count(), 4, "four boxes");
        // The two cables between sw1 and sw2 do not lie on top of each other.
        let paths: Vec<&str> = s.split("<path ").skip(1).collect();
        let isl: Vec<&&str> = paths.iter().filter(|p| p.contains("Q")).collect();
        assert_eq!(isl.len(), 4);
        assert_ne!(paths[1], paths[2]);
    }

    #[test]
    fn dot_names_every_edge() {
        let d = dot(&reroute(), "lesson4-reroute");
        assert!(d.starts_with("graph \"lesson4-reroute\" {"));
        assert_eq!(d.matches(" -- ").count(), 4);
        assert!(d.contains("label=\"isl2\""));
    }

    #[test]
    fn text_from_the_lab_is_escaped() {
        let mut t = reroute();
        t.nodes[0].addresses.push("<script>".into());
        assert!(!svg(&t, &Marks::default(), iblab_lab::Lang::En).contains("<script>"));
    }
}
