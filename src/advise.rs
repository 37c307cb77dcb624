//! Lesson 6 as a tool: from a situation (the lesson's questions) to a recommendation
//! whose every reason names the lesson it comes from, next to this host's RDMA inventory
//! and the ratios measured in earlier runs.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use iblab_core::evidence::Evidence;
use iblab_lab::{Lang, PathKind};
use rust_i18n::t;

/// The questions lesson 6 asks before anyone buys a switch.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Situation {
    /// Do your applications use RDMA (verbs, NCCL over IB/RoCE, …) today?
    #[arg(long)]
    #[serde(default)]
    pub rdma_in_use: bool,
    /// How many machines the fabric connects.
    #[arg(long, default_value_t = 16)]
    #[serde(default = "default_nodes")]
    pub nodes: u32,
    /// How often the fabric is congested.
    #[arg(long, value_enum, default_value_t = Congestion::Rare)]
    #[serde(default)]
    pub congestion: Congestion,
    /// How much the workload suffers from tail latency.
    #[arg(long, value_enum, default_value_t = TailLatency::Normal)]
    #[serde(default)]
    pub tail_latency: TailLatency,
    /// Must traffic be routed across IP subnets or between sites?
    #[arg(long)]
    #[serde(default)]
    pub across_subnets: bool,
    /// Is there a team that can run opensm, ibdiagnet and an IB fabric?
    #[arg(long)]
    #[serde(default)]
    pub ib_team: bool,
    /// Does the fabric also carry lots of ordinary TCP traffic?
    #[arg(long)]
    #[serde(default)]
    pub much_tcp: bool,
    /// Is there an InfiniBand fabric and its tooling already?
    #[arg(long)]
    #[serde(default)]
    pub existing_ib: bool,
}

fn default_nodes() -> u32 {
    16
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    #[default]
    Rare,
    Sometimes,
    Constant,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum TailLatency {
    #[default]
    Normal,
    Sensitive,
    Extreme,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// Not using RDMA yet: RoCE on the Ethernet you already have, first.
    StartWithRoce,
    Roce,
    Infiniband,
}

impl Choice {
    /// What to do, in `lang`.
    pub fn describe(self, lang: Lang) -> String {
        let key = match self {
            Choice::StartWithRoce => "advise.choice.start_with_roce",
            Choice::Roce => "advise.choice.roce",
            Choice::Infiniband => "advise.choice.infiniband",
        };
        t!(key, locale = lang.tag()).into_owned()
    }
}

/// One reason, with the side it argues for, its weight and the lesson it comes from.
#[derive(Debug, Clone, Serialize)]
pub struct Reason {
    pub favours: Choice,
    pub weight: u32,
    pub lesson: u8,
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    pub choice: Choice,
    pub summary: String,
    pub reasons: Vec<Reason>,
}

/// Apply lesson 6's reasoning to a situation; the advice in `lang`.
pub fn advise(s: &Situation, lang: Lang) -> Advice {
    use Choice::{Infiniband as Ib, Roce};
    let l = lang.tag();
    let reason = |favours: Choice, weight: u32, lesson: u8, key: &str| Reason {
        favours,
        weight,
        lesson,
        text: t!(key, locale = l).into_owned(),
    };
    let mut r = Vec::new();
    if s.nodes >= 256 {
        r.push(reason(Ib, 2, 6, "advise.reason.very_large"));
    } else if s.nodes <= 64 {
        r.push(reason(Roce, 2, 6, "advise.reason.few_dozen"));
    }
    match s.congestion {
        Congestion::Constant => r.push(reason(Ib, 3, 5, "advise.reason.congestion_constant")),
        Congestion::Sometimes => r.push(reason(Roce, 1, 5, "advise.reason.congestion_sometimes")),
        Congestion::Rare => r.push(reason(Roce, 2, 5, "advise.reason.congestion_rare")),
    }
    match s.tail_latency {
        TailLatency::Extreme => r.push(reason(Ib, 2, 2, "advise.reason.tail_extreme")),
        TailLatency::Sensitive => r.push(reason(Ib, 1, 2, "advise.reason.tail_sensitive")),
        TailLatency::Normal => {}
    }
    if s.across_subnets {
        r.push(reason(Roce, 3, 3, "advise.reason.across_subnets"));
    }
    if s.ib_team || s.existing_ib {
        r.push(reason(Ib, 2, 4, "advise.reason.ib_team"));
    } else {
        r.push(reason(Roce, 2, 4, "advise.reason.no_ib_team"));
    }
    if s.much_tcp {
        r.push(reason(Roce, 2, 1, "advise.reason.much_tcp"));
    }
    let score = |c: Choice| {
        r.iter()
            .filter(|x| x.favours == c)
            .map(|x| x.weight)
            .sum::<u32>()
    };
    let (ib, roce) = (score(Ib), score(Roce));
    let choice = if !s.rdma_in_use {
        Choice::StartWithRoce
    } else if ib > roce {
        Ib
    } else {
        Roce
    };
    let mut summary = t!(
        "advise.summary",
        locale = l,
        choice = choice.describe(lang),
        ib = ib,
        roce = roce
    )
    .into_owned();
    if !s.rdma_in_use {
        r.insert(
            0,
            reason(Choice::StartWithRoce, 5, 2, "advise.reason.no_rdma_yet"),
        );
        summary.push_str(&t!("advise.big_and_small", locale = l));
    }
    Advice {
        choice,
        summary,
        reasons: r,
    }
}

/// What this host has: RDMA devices and their ports' link layers (from sysfs).
#[derive(Debug, Clone, Serialize)]
pub struct RdmaDevice {
    pub name: String,
    pub port: String,
    pub link_layer: String,
    pub state: String,
}

pub fn inventory() -> Vec<RdmaDevice> {
    inventory_at(Path::new("/sys/class/infiniband"))
}

fn inventory_at(root: &Path) -> Vec<RdmaDevice> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(root) else {
        return out;
    };
    for d in devs.flatten() {
        let Ok(ports) = std::fs::read_dir(d.path().join("ports")) else {
            continue;
        };
        for p in ports.flatten() {
            let read = |f: &str| {
                std::fs::read_to_string(p.path().join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            out.push(RdmaDevice {
                name: d.file_name().to_string_lossy().into_owned(),
                port: p.file_name().to_string_lossy().into_owned(),
                link_layer: read("link_layer"),
                state: read("state"),
            });
        }
    }
    out.sort_by(|a, b| (&a.name, &a.port).cmp(&(&b.name, &b.port)));
    out
}

/// A measured ratio between two paths, from one run's comparison rows.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub run: PathBuf,
    pub scenario: String,
    pub row: String,
    pub unit: String,
    pub from: PathKind,
    pub to: PathKind,
    /// The second path's figure over the first's; `None` when the first is 0.
    pub ratio: Option<f64>,
    /// How many times better the second path is, on a row that says which way is
    /// better; `None` when a side is 0 (a cost eliminated, or a collapse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub better: Option<iblab_lab::Better>,
    /// The lab says this gain shows only on hardware.
    pub needs_hardware: bool,
    /// Below this a figure is noise (the row's absolute tolerance): a cost taken under it
    /// is "to the noise floor", not a ratio of noise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
    pub from_value: f64,
    pub to_value: f64,
    /// With repeated runs, the lowest and highest figure of each side: where they overlap
    /// the two differ by no more than their own spread, and no gain is claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<[[f64; 2]; 2]>,
    /// ② and ③ were measured on the same device (③'s bytes riding ②'s rxe): they agree by
    /// construction here, and no gain ②→③ is claimed from them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub same_device: Vec<String>,
    pub provenance: String,
}

impl Ratio {
    /// Both figures came from real hardware.
    pub fn on_hardware(&self) -> bool {
        self.provenance.split(" / ").all(|p| p == "hardware")
    }
}

/// Gains ①→② and ②→③ of the given runs: the rows a lab declares as gains (`better`:
/// host CPU, syscalls and copies per MiB, retention under congestion, throughput), each
/// with its provenance; for runs that declare none, every throughput measurement.
pub fn ratios(runs: &[(PathBuf, Evidence)]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for (dir, e) in runs {
        let declared: Vec<_> = e
            .comparison
            .rows
            .iter()
            .filter(|r| r.better.is_some())
            .collect();
        // Raw figures are in `measurements`; evidence written before it held them in
        // `comparison`.
        let raw = if e.measurements.rows.is_empty() {
            &e.comparison.rows
        } else {
            &e.measurements.rows
        };
        let rows: Vec<_> = if declared.is_empty() {
            raw.iter()
                .filter(|r| r.name.starts_with("throughput"))
                .collect()
        } else {
            declared
        };
        for row in rows {
            for (from, to) in [
                (PathKind::Tcp, PathKind::Roce),
                (PathKind::Roce, PathKind::Ib),
            ] {
                if let (Some(ca), Some(cb)) = (row.values.get(&from), row.values.get(&to))
                    && let (Some(a), Some(b)) = (ca.number(), cb.number())
                {
                    let noise = |x: f64| row.floor.is_some_and(|f| x <= f);
                    let spread = ca.range.zip(cb.range).map(|(x, y)| [x, y]);
                    let within_spread = spread.is_some_and(|[x, y]| x[0] <= y[1] && y[0] <= x[1]);
                    let same_device = if (from, to) == (PathKind::Roce, PathKind::Ib) {
                        row.same_device.clone()
                    } else {
                        Vec::new()
                    };
                    let gain = match row.better {
                        _ if within_spread || !same_device.is_empty() => None,
                        Some(iblab_lab::Better::Lower) => (b > 0.0 && !noise(b)).then(|| a / b),
                        Some(iblab_lab::Better::Higher) => (a > 0.0).then(|| b / a),
                        None => None,
                    };
                    out.push(Ratio {
                        run: dir.clone(),
                        scenario: e.scenario.clone(),
                        row: row.name.clone(),
                        unit: row.unit.clone(),
                        from,
                        to,
                        ratio: (a > 0.0).then(|| b / a),
                        gain,
                        better: row.better,
                        needs_hardware: row.needs_hardware,
                        floor: row.floor,
                        from_value: a,
                        to_value: b,
                        spread,
                        same_device,
                        provenance: format!("{:?} / {:?}", ca.provenance, cb.provenance)
                            .to_lowercase(),
                    });
                }
            }
        }
    }
    out
}

/// One ratio as `advise` prints it, in `lang`: the gain (or the ratio), both figures, and,
/// where the figures are not hardware's, what that means, on the line itself.
pub fn ratio_line(r: &Ratio, lang: Lang) -> String {
    use iblab_report::terminal::fmt_num;
    let l = lang.tag();
    let (a, b) = (fmt_num(r.from_value), fmt_num(r.to_value));
    let figures = format!("{a} → {b} {}", r.unit).trim_end().to_string();
    let to = r.to.as_str();
    let within = r.spread.filter(|[x, y]| x[0] <= y[1] && y[0] <= x[1]);
    let gain = match (r.better, r.gain, r.ratio) {
        _ if !r.same_device.is_empty() => t!(
            "advise.same_device",
            locale = l,
            devices = r.same_device.join(", "),
            figures = figures
        ),
        (Some(_), None, _) if within.is_some() => {
            let [x, y] = within.unwrap_or_default();
            t!(
                "advise.within_spread",
                locale = l,
                from_low = fmt_num(x[0]),
                from_high = fmt_num(x[1]),
                to_low = fmt_num(y[0]),
                to_high = fmt_num(y[1]),
                unit = r.unit
            )
        }
        (Some(_), Some(g), _) => t!(
            "advise.gain",
            locale = l,
            gain = format!("{g:.2}"),
            figures = figures
        ),
        (Some(iblab_lab::Better::Lower), None, _) => {
            let noise = |x: f64| r.floor.is_some_and(|f| x <= f) || x == 0.0;
            match (noise(r.from_value), r.floor) {
                (true, Some(f)) => t!(
                    "advise.both_noise",
                    locale = l,
                    floor = fmt_num(f),
                    unit = r.unit,
                    figures = figures
                ),
                (true, None) => t!("advise.both_zero", locale = l, figures = figures),
                (false, Some(f)) => t!(
                    "advise.to_noise",
                    locale = l,
                    to = to,
                    floor = fmt_num(f),
                    unit = r.unit,
                    figures = figures
                ),
                (false, None) => t!("advise.to_zero", locale = l, to = to, figures = figures),
            }
        }
        (Some(iblab_lab::Better::Higher), None, _) => t!(
            "advise.from_zero",
            locale = l,
            from = r.from.as_str(),
            figures = figures
        ),
        (None, _, Some(x)) => format!("×{x:.2}").into(),
        (None, _, None) => t!(
            "advise.from_zero_to",
            locale = l,
            from = r.from.as_str(),
            to = to,
            value = b
        ),
    };
    let caveat = match (r.on_hardware(), r.needs_hardware, r.better.is_some()) {
        (true, _, _) => String::new(),
        (false, true, _) => format!(
            "\n      {}",
            t!(
                "advise.caveat_needs_hardware",
                locale = l,
                provenance = r.provenance
            )
        ),
        (false, false, true) => format!(
            "\n      {}",
            t!(
                "advise.caveat_counts",
                locale = l,
                provenance = r.provenance
            )
        ),
        (false, false, false) => format!(
            "\n      {}",
            t!("advise.caveat_soft", locale = l, provenance = r.provenance)
        ),
    };
    format!(
        "{} {} → {} {}: {gain}  [{}; {}; {}]{caveat}",
        r.from.mark(),
        r.from,
        r.to.mark(),
        r.to,
        r.row,
        r.scenario,
        r.provenance
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Situation {
        Situation {
            rdma_in_use: true,
            nodes: 16,
            congestion: Congestion::Rare,
            tail_latency: TailLatency::Normal,
            across_subnets: false,
            ib_team: false,
            much_tcp: false,
            existing_ib: false,
        }
    }

    #[test]
    fn no_rdma_yet_means_roce_first_whatever_else() {
        let s = Situation {
            rdma_in_use: false,
            nodes: 2000,
            congestion: Congestion::Constant,
            ib_team: true,
            ..base()
        };
        let a = advise(&s, Lang::En);
        assert_eq!(a.choice, Choice::StartWithRoce);
        assert_eq!(a.reasons[0].lesson, 2);
    }

    #[test]
    fn small_uncongested_cluster_gets_roce() {
        assert_eq!(advise(&base(), Lang::En).choice, Choice::Roce);
    }

    #[test]
    fn huge_congested_cluster_with_a_team_gets_ib() {
        let s = Situation {
            nodes: 1024,
            congestion: Congestion::Constant,
            tail_latency: TailLatency::Extreme,
            ib_team: true,
            ..base()
        };
        let a = advise(&s, Lang::En);
        assert_eq!(a.choice, Choice::Infiniband);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.lesson == 5 && r.favours == Choice::Infiniband)
        );
    }

    #[test]
    fn crossing_sites_pulls_to_roce() {
        let s = Situation {
            nodes: 300,
            congestion: Congestion::Sometimes,
            across_subnets: true,
            ..base()
        };
        let a = advise(&s, Lang::En);
        assert_eq!(a.choice, Choice::Roce);
        assert!(a.reasons.iter().all(|r| (1..=6).contains(&r.lesson)));
    }

    #[test]
    fn inventory_reads_sysfs_layout() {
        let root = std::env::temp_dir().join(format!("iblab-inv-{}", std::process::id()));
        let port = root.join("rxe0/ports/1");
        std::fs::create_dir_all(&port).unwrap();
        std::fs::write(port.join("link_layer"), "Ethernet\n").unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        let inv = inventory_at(&root);
        assert_eq!(inv.len(), 1);
        assert_eq!(
            (
                inv[0].name.as_str(),
                inv[0].link_layer.as_str(),
                inv[0].state.as_str()
            ),
            ("rxe0", "Ethernet", "4: ACTIVE")
        );
        std::fs::remove_dir_all(&root).unwrap();
        assert!(inventory_at(&root).is_empty());
    }

    fn gain_run() -> Vec<(PathBuf, Evidence)> {
        let mut e: Evidence =
            serde_json::from_str(include_str!("../tests/fixtures/evidence/tcp-loss.json")).unwrap();
        let row = |name: &str, unit: &str, better, needs, floor, v: [f64; 3]| {
            let cell = |x: f64, p| iblab_core::evidence::Cell {
                value: serde_json::json!(x),
                provenance: p,
                range: None,
                detail: None,
            };
            iblab_core::evidence::ComparisonRow {
                id: name.into(),
                group: iblab_core::evidence::Group::Host,
                name: name.into(),
                unit: unit.into(),
                values: [
                    (
                        PathKind::Tcp,
                        cell(v[0], iblab_core::evidence::ProvenanceKind::Soft),
                    ),
                    (
                        PathKind::Roce,
                        cell(v[1], iblab_core::evidence::ProvenanceKind::Soft),
                    ),
                    (
                        PathKind::Ib,
                        cell(v[2], iblab_core::evidence::ProvenanceKind::Modelled),
                    ),
                ]
                .into(),
                roce_equals_ib: None,
                same_device: Vec::new(),
                rule: String::new(),
                better: Some(better),
                needs_hardware: needs,
                floor,
            }
        };
        use iblab_lab::Better::{Higher, Lower};
        e.comparison.rows = vec![
            row(
                "syscalls",
                "syscalls/MiB",
                Lower,
                false,
                Some(2.0),
                [12.0, 0.4, 0.0],
            ),
            row("cpu", "ms/MiB", Lower, false, None, [6.0, 2.0, 2.0]),
            row(
                "throughput",
                "Mbit/s",
                Higher,
                true,
                None,
                [500.0, 50.0, 60.0],
            ),
            row("retention", "%", Higher, false, None, [90.0, 2.0, 80.0]),
        ];
        vec![(PathBuf::from("run"), e)]
    }

    /// Declared gain rows are read in their direction, with the noise floor and the
    /// provenance said on every line.
    #[test]
    fn gains_follow_the_declared_rows() {
        let r = ratios(&gain_run());
        assert_eq!(r.len(), 8, "{r:?}");
        let line = |row: &str, to: PathKind| {
            ratio_line(
                r.iter().find(|x| x.row == row && x.to == to).unwrap(),
                Lang::En,
            )
        };
        let l = line("syscalls", PathKind::Roce);
        assert!(l.contains("roce takes it to the noise, ≤ 2"), "{l}");
        assert!(l.contains("not on hardware"), "{l}");
        let l = line("syscalls", PathKind::Ib);
        assert!(l.contains("no gain: both within the noise"), "{l}");
        assert!(line("cpu", PathKind::Roce).contains("gain ×3.00"));
        let l = line("throughput", PathKind::Roce);
        assert!(
            l.contains("gain ×0.10") && l.contains("needs: hardware"),
            "{l}"
        );
        assert!(line("retention", PathKind::Ib).contains("gain ×40.00"));
        // Hardware figures carry no caveat.
        let mut hw = gain_run();
        for c in hw[0].1.comparison.rows[1].values.values_mut() {
            c.provenance = iblab_core::evidence::ProvenanceKind::Hardware;
        }
        let r = ratios(&hw);
        let l = ratio_line(r.iter().find(|x| x.row == "cpu").unwrap(), Lang::En);
        assert!(!l.contains("not on hardware"), "{l}");
    }

    /// A difference inside the runs' own spread is no gain, and ② against ③ measured on
    /// one device claims none: the issue's ×1.77 from 130 against 230 Mbit/s of three runs
    /// each on the same rxe.
    #[test]
    fn no_gain_within_the_spread_or_on_one_device() {
        let mut runs = gain_run();
        let row = &mut runs[0].1.comparison.rows[2];
        row.values.get_mut(&PathKind::Roce).unwrap().value = serde_json::json!(130.0);
        row.values.get_mut(&PathKind::Roce).unwrap().range = Some([100.0, 240.0]);
        row.values.get_mut(&PathKind::Ib).unwrap().value = serde_json::json!(230.0);
        row.values.get_mut(&PathKind::Ib).unwrap().range = Some([120.0, 250.0]);
        let r = ratios(&runs);
        let t = r
            .iter()
            .find(|x| x.row == "throughput" && x.to == PathKind::Ib)
            .unwrap();
        assert_eq!(t.gain, None);
        let l = ratio_line(t, Lang::En);
        assert!(
            l.contains("no gain: within the spread of the runs (100–240 → 120–250"),
            "{l}"
        );
        // Apart: a gain.
        runs[0].1.comparison.rows[2]
            .values
            .get_mut(&PathKind::Ib)
            .unwrap()
            .range = Some([400.0, 500.0]);
        let r = ratios(&runs);
        let t = r
            .iter()
            .find(|x| x.row == "throughput" && x.to == PathKind::Ib)
            .unwrap();
        assert!(
            t.gain.is_some_and(|g| (g - 230.0 / 130.0).abs() < 1e-9),
            "{t:?}"
        );
        // One device under both: no gain claimed, whatever the figures.
        runs[0].1.comparison.rows[2].same_device = vec!["a/a-rxe0".into(), "b/b-rxe0".into()];
        let r = ratios(&runs);
        let t = r
            .iter()
            .find(|x| x.row == "throughput" && x.to == PathKind::Ib)
            .unwrap();
        assert_eq!(t.gain, None);
        assert!(ratio_line(t, Lang::En).contains("same device here (a/a-rxe0, b/b-rxe0)"));
        // ①→② is not about ③'s device.
        let t = r
            .iter()
            .find(|x| x.row == "throughput" && x.to == PathKind::Roce)
            .unwrap();
        assert!(t.same_device.is_empty());
    }
}
