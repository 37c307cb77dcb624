//! Checks a parsed lab before anything is planned: names, references, expressions.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::LoadedLab;
use super::diag::{Diagnostic, LoadError};
use super::{
    API_VERSION, ExecSpec, FaultAction, FaultSpec, Lab, Param, PathKind, ProbeKind, ProbeSpec,
    SmControlSpec, Step, StepAction, TrafficSpec, WaitSpec, expectation_id, step_id,
};
use crate::address;
use crate::expr::{self, Phase};
use crate::limits;

struct Checker<'a> {
    loaded: &'a LoadedLab,
    found: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn err(&mut self, path: &str, message: impl Into<String>, hint: impl Into<String>) {
        let pos = self.loaded.locator.value(path);
        self.found
            .push(Diagnostic::at(&self.loaded.source, pos, message).hint(hint));
    }

    fn err_key(&mut self, path: &str, message: impl Into<String>, hint: impl Into<String>) {
        let pos = self.loaded.locator.key(path);
        self.found
            .push(Diagnostic::at(&self.loaded.source, pos, message).hint(hint));
    }
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some('a'..='z'))
        && c.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some('a'..='z'))
        && s.len() <= 32
        && c.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// What expressions in a lab may refer to.
struct Names {
    steps: BTreeSet<String>,
    /// Each step's kind (`traffic`, `fault`, …), to check the results an expression reads.
    step_kinds: BTreeMap<String, &'static str>,
    params: BTreeSet<String>,
    nodes: BTreeSet<String>,
}

/// Validate everything; all problems are reported at once. A valid lab's steps come back
/// resolved, each into its one kind (`spec.steps`, in order).
pub fn validate(loaded: &LoadedLab) -> Result<Vec<Step>, LoadError> {
    let lab = &loaded.lab;
    let mut c = Checker {
        loaded,
        found: Vec::new(),
    };

    if lab.api_version != API_VERSION {
        c.err(
            "apiVersion",
            format!("unsupported apiVersion `{}`", lab.api_version),
            format!("write `apiVersion: {API_VERSION}`"),
        );
    }
    if lab.kind != "Lab" {
        c.err(
            "kind",
            format!("unsupported kind `{}`", lab.kind),
            "write `kind: Lab`",
        );
    }
    if !is_name(&lab.metadata.name) {
        c.err(
            "metadata.name",
            format!(
                "lab name `{}` is not usable on the command line",
                lab.metadata.name
            ),
            "use 1-32 characters a-z, 0-9 and '-', starting with a letter",
        );
    }
    if let Some(n) = lab.metadata.lesson
        && !crate::builtin::lessons().contains(&n)
    {
        c.err(
            "metadata.lesson",
            format!("lesson {n} does not exist"),
            format!(
                "the course has lessons 1 to {}",
                crate::builtin::lessons().len()
            ),
        );
    }

    let names = check_topology(&mut c, lab);
    check_sizes(&mut c, lab);
    check_paths(&mut c, lab);
    check_params_and_scenarios(&mut c, lab);
    let names = Names {
        steps: check_step_ids(&mut c, lab),
        step_kinds: lab
            .spec
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((step_id(s, i), s.kind()?)))
            .collect(),
        params: lab.spec.params.keys().cloned().collect(),
        nodes: names,
    };
    check_subnet_managers(&mut c, lab, &names);
    let steps = check_steps(&mut c, lab, &names);
    check_expectations(&mut c, lab, &names);
    check_compare(&mut c, lab, &names);
    check_texts(&mut c, lab);
    if c.found.is_empty() {
        check_templated(&mut c, lab, &steps);
    }

    if c.found.is_empty() {
        Ok(steps)
    } else {
        Err(LoadError {
            diagnostics: c.found,
        })
    }
}

fn check_topology(c: &mut Checker, lab: &Lab) -> BTreeSet<String> {
    let t = &lab.spec.topology;
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    if t.nodes.is_empty() {
        c.err(
            "spec.topology.nodes",
            "a lab needs at least one node",
            "list the hosts, e.g. `nodes: [a, b]`",
        );
    }
    for (section, list) in [("nodes", &t.nodes), ("switches", &t.switches)] {
        for (i, n) in list.iter().enumerate() {
            let path = format!("spec.topology.{section}[{i}]");
            if !is_name(n) || n.len() > 12 {
                c.err(
                    &path,
                    format!("`{n}` is not a usable name"),
                    "use 1-12 characters a-z, 0-9 and '-', starting with a letter",
                );
            } else if let Some(prev) = seen.get(n) {
                c.err(
                    &path,
                    format!("`{n}` is declared twice (already in {prev})"),
                    "give every node and switch its own name",
                );
            } else {
                seen.insert(n.clone(), section.to_string());
            }
        }
    }
    let mut link_names = HashSet::new();
    for (i, l) in t.links.iter().enumerate() {
        let path = format!("spec.topology.links[{i}]");
        if l.ends.len() != 2 {
            c.err(
                &format!("{path}.ends"),
                format!("a link has exactly two ends, this one has {}", l.ends.len()),
                "write `ends: [a, sw1]`",
            );
            continue;
        }
        for (j, e) in l.ends.iter().enumerate() {
            if !seen.contains_key(e) {
                c.err(
                    &format!("{path}.ends[{j}]"),
                    format!("link end `{e}` is not a node or switch"),
                    format!(
                        "declare it under topology.nodes or topology.switches, or use one of: {}",
                        join(seen.keys())
                    ),
                );
            }
        }
        if l.ends[0] == l.ends[1] {
            c.err(
                &format!("{path}.ends"),
                format!("link connects `{}` to itself", l.ends[0]),
                "a link joins two different nodes or switches",
            );
        }
        if !link_names.insert(l.id()) {
            c.err(
                &path,
                format!("two links are both called `{}`", l.id()),
                "give parallel links distinct `name`s",
            );
        }
        if let Some(mtu) = l.mtu
            && !(576..=9000).contains(&mtu)
        {
            c.err(
                &format!("{path}.mtu"),
                format!("MTU {mtu} is out of range"),
                "use 576 to 9000",
            );
        }
    }
    if let Some(a) = &t.addressing
        && let Err(e) = address::Prefix::parse(&a.ipv4)
    {
        c.err(
            "spec.topology.addressing.ipv4",
            e.to_string(),
            "write an IPv4 prefix of /8 to /22, e.g. 198.18.0.0/15",
        );
    }
    if c.found.is_empty() {
        for u in address::unsupported_shapes(lab) {
            c.err(&u.at, u.message, u.hint);
        }
    }
    if c.found.is_empty() {
        // Links that meet at switches are one Ethernet segment: a port with a smaller MTU
        // drops the larger frames of the others, silently.
        for seg in address::segments(lab) {
            let mtu = |i: usize| t.links[i].mtu.unwrap_or(1500);
            let first = seg.links[0];
            if let Some(&odd) = seg.links.iter().find(|&&i| mtu(i) != mtu(first)) {
                let at = if t.links[odd].mtu.is_some() {
                    format!("spec.topology.links[{odd}].mtu")
                } else {
                    format!("spec.topology.links[{odd}]")
                };
                c.err(
                    &at,
                    format!(
                        "link `{}` has MTU {} but link `{}`, on the same Ethernet segment, has {}",
                        t.links[odd].id(),
                        mtu(odd),
                        t.links[first].id(),
                        mtu(first)
                    ),
                    "give every link that meets at the same switches one `mtu` (a port with a smaller MTU drops larger frames)",
                );
            }
        }
    }
    t.nodes.iter().cloned().collect()
}

fn check_paths(c: &mut Checker, lab: &Lab) {
    let mut seen = HashSet::new();
    if lab.spec.paths.is_empty() {
        c.err(
            "spec.paths",
            "no path to compare",
            "list at least one of tcp, roce, ib",
        );
    }
    for (i, p) in lab.spec.paths.iter().enumerate() {
        if !seen.insert(*p) {
            c.err(
                &format!("spec.paths[{i}]"),
                format!("path `{p}` is listed twice"),
                "list each path once",
            );
        }
    }
}

fn check_params_and_scenarios(c: &mut Checker, lab: &Lab) {
    for name in lab.spec.params.keys() {
        if !is_ident(name) {
            c.err_key(
                &format!("spec.params.{name}"),
                format!("parameter name `{name}` cannot be used in expressions"),
                "use a-z, 0-9 and '_', starting with a letter",
            );
        }
    }
    for (name, sc) in &lab.spec.scenarios {
        let path = format!("spec.scenarios.{name}");
        if !is_name(name) {
            c.err_key(
                &path,
                format!("scenario name `{name}` is not usable on the command line"),
                "use a-z, 0-9 and '-', starting with a letter",
            );
        }
        if name == "default" {
            c.err_key(
                &path,
                "`default` is the lab without overrides and cannot be redefined",
                "pick another name",
            );
        }
        for (p, v) in &sc.params {
            match lab.spec.params.get(p) {
                None => c.err_key(&format!("{path}.params.{p}"), format!("scenario `{name}` overrides parameter `{p}`, which the lab does not declare"), format!("declare it under spec.params (known: {})", join(lab.spec.params.keys()))),
                Some(d) if std::mem::discriminant(d) != std::mem::discriminant(v) && !(d.is_number() && v.is_number()) => {
                    c.err(&format!("{path}.params.{p}"), format!("`{p}` is {} in spec.params but {} here", kind_of(d), kind_of(v)), "keep the parameter's type")
                }
                Some(_) => {}
            }
        }
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

fn check_step_ids(c: &mut Checker, lab: &Lab) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for (i, s) in lab.spec.steps.iter().enumerate() {
        let id = step_id(s, i);
        let path = format!("spec.steps[{i}].id");
        if !is_ident(&id) {
            c.err(
                &path,
                format!("step id `{id}` cannot be used in expressions"),
                "use a-z, 0-9 and '_', starting with a letter (no '-')",
            );
        } else if !ids.insert(id.clone()) {
            c.err(
                &path,
                format!("step id `{id}` is used twice"),
                "give every step its own id",
            );
        }
    }
    ids
}

/// A lab's size and each duration it writes, within [`limits`].
fn check_sizes(c: &mut Checker, lab: &Lab) {
    let spec = &lab.spec;
    for (path, n, max, what) in [
        (
            "spec.topology.links",
            spec.topology.links.len(),
            limits::MAX_LINKS,
            "links",
        ),
        ("spec.steps", spec.steps.len(), limits::MAX_STEPS, "steps"),
        (
            "spec.expect",
            spec.expect.len(),
            limits::MAX_EXPECTATIONS,
            "expectations",
        ),
        (
            "spec.compare",
            spec.compare.len(),
            limits::MAX_EXPECTATIONS,
            "comparison rows",
        ),
    ] {
        if n > max {
            c.err_key(
                path,
                format!("the lab has {n} {what}; a lab has at most {max}"),
                format!("split it into smaller labs of at most {max} {what} each"),
            );
        }
    }
    let max = limits::MAX_DURATION;
    for (i, s) in spec.steps.iter().enumerate() {
        let durations = [
            ("timeout", s.timeout),
            ("sleep", s.sleep),
            ("wait.interval", s.wait.as_ref().and_then(|w| w.interval)),
        ];
        for (field, d) in durations {
            if let Some(d) = d
                && d.0 > max
            {
                c.err(
                    &format!("spec.steps[{i}].{field}"),
                    format!(
                        "{:.0} s is longer than a lab may wait in one step",
                        d.0.as_secs_f64()
                    ),
                    format!("use at most {} s (1h)", max.as_secs()),
                );
            }
        }
    }
}

/// Each raw step resolved into its one kind (where it has none or several, that is the
/// step's problem), then checked as that kind; the steps that resolved, in order.
fn check_steps(c: &mut Checker, lab: &Lab, names: &Names) -> Vec<Step> {
    let links: BTreeMap<String, Vec<String>> = lab
        .spec
        .topology
        .links
        .iter()
        .map(|l| (l.id(), l.ends.clone()))
        .collect();
    let mut resolved = Vec::new();
    for (i, raw) in lab.spec.steps.iter().enumerate() {
        let path = format!("spec.steps[{i}]");
        let s = match raw.resolve(i) {
            Ok(s) => s,
            Err(e) => {
                c.err(&path, e.to_string(), e.hint());
                continue;
            }
        };
        if let Some(w) = &s.when {
            check_expr(c, &format!("{path}.when"), w, names, Phase::Run);
        }
        let at = format!("{path}.{}", s.kind().word());
        match &s.action {
            StepAction::Exec(e) => check_exec(c, &at, e, names),
            StepAction::Traffic(t) => check_traffic(c, lab, &at, t, names),
            StepAction::Fault(f) => check_fault(c, lab, &at, f, &links, names),
            StepAction::Wait(w) => check_wait(c, lab, &at, w, names),
            StepAction::Probe(pr) => check_probe(c, lab, &at, pr, names),
            StepAction::Sm(sm) => check_sm(c, lab, &at, sm),
            StepAction::Sleep(_) => {}
        }
        check_step_paths(c, lab, &path, &s.action);
        resolved.push(s);
    }
    resolved
}

fn check_traffic(c: &mut Checker, lab: &Lab, p: &str, t: &TrafficSpec, names: &Names) {
    for (field, n) in [("from", &t.from), ("to", &t.to)] {
        if !names.nodes.contains(n) {
            c.err(
                &format!("{p}.{field}"),
                format!("`{n}` is not a node"),
                format!("use one of: {}", join(&names.nodes)),
            );
        }
    }
    if t.from == t.to {
        c.err(
            &format!("{p}.to"),
            "traffic from a node to itself crosses no network",
            "pick two different nodes",
        );
    }
    if let Some(ps) = &t.paths {
        for (j, pk) in ps.iter().enumerate() {
            if !lab.spec.paths.contains(pk) {
                c.err(
                    &format!("{p}.paths[{j}]"),
                    format!("path `{pk}` is not one of the lab's paths"),
                    format!(
                        "add it to spec.paths or use one of: {}",
                        join(lab.spec.paths.iter().map(|p| p.as_str()))
                    ),
                );
            }
        }
    }
    check_param(
        c,
        &format!("{p}.seconds"),
        t.seconds.as_ref(),
        names,
        |v| limits::seconds_ok(*v),
        limits::SECONDS,
    );
    let step_paths = t.paths.as_ref().unwrap_or(&lab.spec.paths);
    if t.capture && step_paths.iter().all(|pk| *pk == PathKind::Tcp) {
        c.err(
            &format!("{p}.capture"),
            "`capture` watches a verbs test's exchange and RoCEv2 packets: this step runs on path tcp only",
            "run it on path roce (or ib), or drop `capture`",
        );
    }
    if let Some(n) = t.repeat
        && !limits::repeat_ok(n)
    {
        c.err(
            &format!("{p}.repeat"),
            format!("value out of range: expected {}", limits::REPEAT),
            format!("use a value {}", limits::REPEAT),
        );
    }
    check_param(
        c,
        &format!("{p}.streams"),
        t.streams.as_ref(),
        names,
        |v| limits::streams_ok(*v),
        limits::STREAMS,
    );
    if names.nodes.contains(&t.from)
        && names.nodes.contains(&t.to)
        && address::shared_segment(lab, &t.from, &t.to).is_none()
    {
        c.err(
            p,
            format!("`{}` and `{}` share no Ethernet segment", t.from, t.to),
            "connect both to one switch (iblab does not route between segments)",
        );
    }
}

fn check_fault(
    c: &mut Checker,
    lab: &Lab,
    p: &str,
    f: &FaultSpec,
    links: &BTreeMap<String, Vec<String>>,
    names: &Names,
) {
    match links.get(&f.link) {
        None => c.err(
            &format!("{p}.link"),
            format!("no link is called `{}`", f.link),
            format!("use one of: {}", join(links.keys())),
        ),
        Some(ends) => {
            if let Some(t) = &f.toward
                && !ends.contains(t)
            {
                c.err(
                    &format!("{p}.toward"),
                    format!("`{t}` is not an end of link `{}`", f.link),
                    // A link refused for having one end (or three) has that many.
                    format!("use {}", join_or(ends)),
                );
            }
        }
    }
    match f.action {
        FaultAction::Loss => {
            if f.percent.is_none() {
                c.err(
                    p,
                    "a loss fault needs `percent`",
                    "add e.g. `percent: 1` (1% of frames dropped)",
                );
            }
            check_param(
                c,
                &format!("{p}.percent"),
                f.percent.as_ref(),
                names,
                |v| *v > 0.0 && *v <= 100.0,
                "a percentage above 0 and at most 100",
            );
        }
        FaultAction::MadErrors if f.percent.is_none() => {
            c.err(
                p,
                "a mad-errors fault needs `percent`",
                "add e.g. `percent: 50`",
            );
        }
        FaultAction::Rate => match &f.rate {
            None => c.err(p, "a rate fault needs `rate`", "add e.g. `rate: 100mbit`"),
            Some(r) => {
                if r.contains("{{") {
                    check_template_field(c, &format!("{p}.rate"), r, names);
                    check_rendered(c, lab, &format!("{p}.rate"), r, Quantity::Rate);
                } else if crate::quantity::parse_rate(r).is_none() {
                    c.err(
                        &format!("{p}.rate"),
                        format!("`{r}` is not a rate"),
                        "write a number with a unit: kbit, mbit, gbit",
                    );
                }
            }
        },
        _ => {}
    }
    if let Some(q) = &f.queue
        && q.contains("{{")
    {
        check_template_field(c, &format!("{p}.queue"), q, names);
        check_rendered(c, lab, &format!("{p}.queue"), q, Quantity::Size);
    } else if let Some(q) = &f.queue
        && crate::quantity::parse_size(q).is_none()
    {
        c.err(
            &format!("{p}.queue"),
            format!("`{q}` is not a size"),
            "write a number with a unit: b, kb, mb",
        );
    }
}

fn check_wait(c: &mut Checker, lab: &Lab, p: &str, w: &WaitSpec, names: &Names) {
    match (&w.exec, &w.probe) {
        (Some(e), None) => check_exec(c, &format!("{p}.exec"), e, names),
        (None, Some(pr)) => check_probe(c, lab, &format!("{p}.probe"), pr, names),
        _ => c.err(
            p,
            "a wait repeats exactly one thing",
            "give either `exec` or `probe`",
        ),
    }
    check_expr(c, &format!("{p}.until"), &w.until, names, Phase::Until);
}

fn check_sm(c: &mut Checker, lab: &Lab, p: &str, sm: &SmControlSpec) {
    if !lab.spec.subnet_managers.iter().any(|m| m.name == sm.name) {
        let known: Vec<&str> = lab
            .spec
            .subnet_managers
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        c.err(
            &format!("{p}.name"),
            format!("no subnet manager is called `{}`", sm.name),
            format!(
                "declare it under spec.subnetManagers (known: {})",
                join(known)
            ),
        );
    }
}

/// The paths a step works on (a probe's, the IB subnet's) must be in the lab.
fn check_step_paths(c: &mut Checker, lab: &Lab, path: &str, action: &StepAction) {
    let probe_path = match action {
        StepAction::Probe(p) => Some(p),
        StepAction::Wait(w) => w.probe.as_ref(),
        _ => None,
    }
    .map(|p| p.path_or_default());
    if let Some(pp) = probe_path
        && pp != PathKind::Ib
        && !lab.spec.paths.contains(&pp)
    {
        c.err(
            path,
            format!("this probe reads path {pp}, which is not in spec.paths"),
            format!("add {pp} to spec.paths"),
        );
    }
    let needs_ib = probe_path == Some(PathKind::Ib)
        || matches!(action, StepAction::Sm(_))
        || matches!(action, StepAction::Fault(f) if f.action == FaultAction::MadErrors);
    if needs_ib && !lab.spec.paths.contains(&PathKind::Ib) {
        c.err(
            path,
            "this step works on the InfiniBand subnet, but path ib is not in spec.paths",
            "add ib to spec.paths",
        );
    }
}

fn check_probe(c: &mut Checker, lab: &Lab, path: &str, p: &ProbeSpec, names: &Names) {
    for (field, v) in [("from", &p.from), ("to", &p.to), ("node", &p.node)] {
        if let Some(n) = v
            && !names.nodes.contains(n)
        {
            c.err(
                &format!("{path}.{field}"),
                format!("`{n}` is not a node (probes ask from a node's HCA)"),
                format!("use one of: {}", join(&names.nodes)),
            );
        }
    }
    if p.what == ProbeKind::Learned && p.path == Some(PathKind::Ib) {
        c.err(
            &format!("{path}.path"),
            "`learned` probes read Ethernet bridges and ARP tables: path tcp or roce",
            "drop `path` (tcp), or use `path: roce`",
        );
    }
    if p.what == ProbeKind::Verbs && p.path == Some(PathKind::Tcp) {
        c.err(
            &format!("{path}.path"),
            "`verbs` probes make mistakes on queue pairs: path tcp has none",
            "use `path: roce` or `path: ib`",
        );
    }
    if !matches!(
        p.what,
        ProbeKind::Device | ProbeKind::Learned | ProbeKind::Verbs
    ) && p.path.is_some_and(|x| x != PathKind::Ib)
    {
        c.err(
            &format!("{path}.path"),
            format!(
                "`{}` probes read the InfiniBand subnet: path ib only",
                p.what.as_str()
            ),
            "drop `path`, or use `what: device`",
        );
    }
    let trace = p.what == ProbeKind::Trace;
    if trace && (p.from.is_none() || p.to.is_none()) {
        c.err(
            path,
            "a trace needs `from` and `to`",
            "write e.g. `probe: { what: trace, from: a, to: b }`",
        );
    }
    if trace && p.from.is_some() && p.from == p.to {
        c.err(
            &format!("{path}.to"),
            "a trace from a node to itself crosses no switch",
            "pick two different nodes",
        );
    }
    // An SA probe may name the peer it asks a path to (`node` asks, `to` is the peer).
    let sa_path = p.what == ProbeKind::Sa && p.from.is_none() && p.to.is_some();
    if sa_path && p.to.is_some() && p.to == p.node {
        c.err(
            &format!("{path}.to"),
            "a path record from a node to itself says nothing of the subnet",
            "pick another node as `to`",
        );
    }
    if !trace && !sa_path && (p.from.is_some() || p.to.is_some()) {
        c.err(
            path,
            format!(
                "`from`/`to` belong to traces (and `to` to sa probes), not to `{}` probes",
                p.what.as_str()
            ),
            "use `node` to say which HCA asks",
        );
    }
    let _ = lab;
}

fn check_subnet_managers(c: &mut Checker, lab: &Lab, names: &Names) {
    let mut seen = HashSet::new();
    for (i, m) in lab.spec.subnet_managers.iter().enumerate() {
        let path = format!("spec.subnetManagers[{i}]");
        if !is_name(&m.name) {
            c.err(
                &format!("{path}.name"),
                format!("`{}` is not a usable name", m.name),
                "use a-z, 0-9 and '-', starting with a letter",
            );
        } else if !seen.insert(m.name.clone()) {
            c.err(
                &format!("{path}.name"),
                format!("subnet manager `{}` is declared twice", m.name),
                "give each SM its own name",
            );
        }
        if !names.nodes.contains(&m.on) {
            c.err(
                &format!("{path}.on"),
                format!("`{}` is not a node (an SM runs on a node's HCA)", m.on),
                format!("use one of: {}", join(&names.nodes)),
            );
        }
        if let Some(p) = m.priority
            && p > 15
        {
            c.err(
                &format!("{path}.priority"),
                format!("SM priority {p} is out of range"),
                "use 0 to 15 (the highest becomes master)",
            );
        }
        if let Some(w) = &m.when {
            // Decided when the lab is planned: which SMs start at bring-up.
            check_expr(c, &format!("{path}.when"), w, names, Phase::Plan);
        }
    }
    if !lab.spec.subnet_managers.is_empty() && !lab.spec.paths.contains(&PathKind::Ib) {
        c.err(
            "spec.subnetManagers",
            "subnet managers belong to the InfiniBand subnet, but path ib is not in spec.paths",
            "add ib to spec.paths",
        );
    }
}

fn check_exec(c: &mut Checker, path: &str, e: &ExecSpec, names: &Names) {
    if !names.nodes.contains(&e.node) {
        c.err(
            &format!("{path}.node"),
            format!("`{}` is not a node", e.node),
            format!("use one of: {}", join(&names.nodes)),
        );
    }
    if e.command.is_empty() {
        c.err(
            &format!("{path}.command"),
            "empty command",
            "write the program and its arguments, e.g. [ping, -c1, \"{{ nodes.b.ip }}\"]",
        );
    }
    for (j, arg) in e.command.iter().enumerate() {
        let p = format!("{path}.command[{j}]");
        match expr::check_template(arg) {
            Err(msg) => c.err(
                &p,
                format!("bad template: {msg}"),
                "templates look like {{ nodes.b.ip }} or {{ params.seconds }}",
            ),
            Ok(vars) => check_vars(c, &p, &vars, names, Phase::Plan),
        }
    }
}

/// A quantity a template must render to.
#[derive(Clone, Copy)]
enum Quantity {
    Rate,
    Size,
}

/// A templated quantity (`rate: "{{ params.rate }}"`) rendered with the parameters of
/// the default run and of every scenario: each must give a quantity `plan` accepts, so
/// `validate` refuses what `plan` would.
fn check_rendered(c: &mut Checker, lab: &Lab, path: &str, text: &str, q: Quantity) {
    let runs = std::iter::once(("default", None)).chain(
        lab.spec
            .scenarios
            .iter()
            .map(|(n, s)| (n.as_str(), Some(&s.params))),
    );
    for (scenario, overrides) in runs {
        let mut params = lab.spec.params.clone();
        if let Some(o) = overrides {
            params.extend(o.clone());
        }
        let ctx = serde_json::json!({ "params": params, "scenario": scenario });
        // Templates reading more than params are checked by name only.
        let Ok(value) = expr::render(text, &ctx) else {
            continue;
        };
        let (ok, what, fix) = match q {
            Quantity::Rate => (
                crate::quantity::parse_rate(&value).is_some(),
                "a rate",
                "write a number with a unit: kbit, mbit, gbit (e.g. 100mbit)",
            ),
            Quantity::Size => (
                crate::quantity::parse_size(&value).is_some(),
                "a size",
                "write a number with a unit: b, kb, mb (e.g. 16kb)",
            ),
        };
        if !ok {
            c.err(
                path,
                format!("in scenario `{scenario}` this is `{value}`, which is not {what}"),
                format!("{fix}, in spec.params or the scenario's params"),
            );
            return;
        }
    }
}

/// Every scenario's values as the plan will have them: each templated number of a step
/// (`seconds`, `streams`, a loss `percent`) rendered with the scenario's parameters and
/// held to the same limits as a number written out, and the steps' time limits added up
/// (at their least: a backend may give traffic more) within a run's. What `up` refuses
/// when it plans, `validate` refuses too, at the value's position. A template that reads
/// more than the parameters, the scenario and the paths (a node's address) is checked by
/// name only.
fn check_templated(c: &mut Checker, lab: &Lab, steps: &[Step]) {
    let runs = std::iter::once(("default", None)).chain(
        lab.spec
            .scenarios
            .iter()
            .map(|(n, s)| (n.as_str(), Some(&s.params))),
    );
    for (scenario, overrides) in runs {
        let mut params = lab.spec.params.clone();
        if let Some(o) = overrides {
            params.extend(o.clone());
        }
        let paths: Vec<&str> = lab.spec.paths.iter().map(|p| p.as_str()).collect();
        let mut run = ScenarioValues {
            scenario,
            ctx: serde_json::json!({ "params": params, "scenario": scenario, "paths": paths }),
            said: false,
        };
        let mut total = std::time::Duration::ZERO;
        for (i, s) in steps.iter().enumerate() {
            total += run.step(c, lab, &format!("spec.steps[{i}]"), s);
        }
        if total > limits::MAX_RUN && !run.said {
            c.err_key(
                "spec.steps",
                format!(
                    "in scenario `{scenario}` the steps' time limits add up to {:.0} s; one run of a lab takes at most {} s (6h)",
                    total.as_secs_f64(),
                    limits::MAX_RUN.as_secs()
                ),
                "shorten the steps (`seconds`, `timeout`, the parameters they read) or split the lab",
            );
        }
    }
}

/// One scenario's values, as [`check_templated`] checks them.
struct ScenarioValues<'a> {
    scenario: &'a str,
    /// What its templates read: parameters, the scenario, the paths.
    ctx: serde_json::Value,
    /// A problem was said for this scenario: one is enough (each value that reads the
    /// same parameter would say the same).
    said: bool,
}

impl ScenarioValues<'_> {
    /// A template's number in this scenario (its error in words), `None` when it reads
    /// more than the scenario's values.
    fn number(&self, t: &str) -> Option<Result<f64, String>> {
        let vars = expr::check_template(t).ok()?;
        if vars
            .iter()
            .any(|v| !["params", "scenario", "paths"].contains(&v.split('.').next().unwrap_or("")))
        {
            return None;
        }
        Some(
            expr::render(t, &self.ctx)
                .map_err(|e| format!("a template that cannot be rendered: {e}"))
                .and_then(|text| {
                    text.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("`{}`, which is not a number", text.trim()))
                }),
        )
    }

    /// The first value this scenario's parameters make wrong.
    fn bad(&mut self, c: &mut Checker, at: String, what: String, fix: String) {
        if !self.said {
            self.said = true;
            c.err(
                &at,
                format!("in scenario `{}` this is {what}", self.scenario),
                format!("{fix}, in spec.params or the scenario's params"),
            );
        }
    }

    /// A step's time limit at its least in this scenario, its templated numbers checked.
    fn step(&mut self, c: &mut Checker, lab: &Lab, at: &str, s: &Step) -> std::time::Duration {
        let own = s.timeout.map(|d| d.0);
        match &s.action {
            StepAction::Traffic(t) => self.traffic(c, lab, &format!("{at}.traffic"), t, own),
            StepAction::Fault(f) => {
                if let Some(Param::Template(src)) = &f.percent {
                    self.percent(c, &format!("{at}.fault.percent"), src);
                }
                own.unwrap_or(limits::STEP_TIMEOUT)
            }
            StepAction::Exec(_) => own.unwrap_or(limits::EXEC_TIMEOUT),
            StepAction::Sleep(d) => own.unwrap_or(d.0 + limits::SLEEP_MARGIN),
            StepAction::Wait(_) | StepAction::Probe(_) | StepAction::Sm(_) => {
                own.unwrap_or(limits::STEP_TIMEOUT)
            }
        }
    }

    /// A traffic step's seconds and streams; its time limit, every path and run of it.
    fn traffic(
        &mut self,
        c: &mut Checker,
        lab: &Lab,
        at: &str,
        t: &TrafficSpec,
        own: Option<std::time::Duration>,
    ) -> std::time::Duration {
        let mut seconds = 3.0;
        if let Some(Param::Template(src)) = &t.seconds {
            match self.number(src) {
                Some(Ok(v)) if limits::seconds_ok(v) => seconds = v,
                Some(Ok(v)) => self.bad(
                    c,
                    format!("{at}.seconds"),
                    format!("{} seconds, out of range", short_number(v)),
                    format!("make it {}", limits::SECONDS),
                ),
                Some(Err(e)) => self.bad(
                    c,
                    format!("{at}.seconds"),
                    e,
                    "make it a number of seconds".into(),
                ),
                None => {}
            }
        } else if let Some(Param::Value(v)) = &t.seconds {
            seconds = *v;
        }
        if let Some(Param::Template(src)) = &t.streams {
            match self.number(src) {
                Some(Ok(v)) if v.fract() == 0.0 && limits::streams_ok(v as u32) => {}
                Some(Ok(v)) => self.bad(
                    c,
                    format!("{at}.streams"),
                    format!("{} streams, out of range", short_number(v)),
                    format!("make it {}", limits::STREAMS),
                ),
                Some(Err(e)) => self.bad(
                    c,
                    format!("{at}.streams"),
                    e,
                    "make it a whole number of streams".into(),
                ),
                None => {}
            }
        }
        let runs = t.repeat.unwrap_or(1).max(1);
        let instances = t.paths.as_ref().map_or(lab.spec.paths.len(), Vec::len);
        let each = own.unwrap_or(
            std::time::Duration::from_secs_f64(seconds.clamp(0.0, 1e6)) + limits::TRAFFIC_MARGIN,
        );
        each * runs * instances as u32
    }

    /// A loss fault's templated percentage.
    fn percent(&mut self, c: &mut Checker, at: &str, src: &str) {
        match self.number(src) {
            Some(Ok(v)) if v > 0.0 && v <= 100.0 => {}
            Some(Ok(v)) => self.bad(
                c,
                at.to_string(),
                format!("{}%, out of range", short_number(v)),
                "make it a percentage above 0 and at most 100".into(),
            ),
            Some(Err(e)) => self.bad(c, at.to_string(), e, "make it a percentage".into()),
            None => {}
        }
    }
}

/// A number as a reader takes it in: `-3`, `0.5`, `1e300`.
fn short_number(v: f64) -> String {
    if v.abs() >= 1e9 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn check_template_field(c: &mut Checker, path: &str, text: &str, names: &Names) {
    match expr::check_template(text) {
        Err(msg) => c.err(
            path,
            format!("bad template: {msg}"),
            "write e.g. \"{{ params.queue }}\"",
        ),
        Ok(vars) => check_vars(c, path, &vars, names, Phase::Plan),
    }
}

fn check_param<T>(
    c: &mut Checker,
    path: &str,
    p: Option<&Param<T>>,
    names: &Names,
    ok: impl Fn(&T) -> bool,
    range: &str,
) {
    match p {
        Some(Param::Value(v)) if !ok(v) => c.err(
            path,
            format!("value out of range: expected {range}"),
            format!("use a value {range}"),
        ),
        Some(Param::Template(t)) => match expr::check_template(t) {
            Err(msg) => c.err(
                path,
                format!("bad template: {msg}"),
                "write e.g. \"{{ params.seconds }}\"",
            ),
            Ok(vars) => check_vars(c, path, &vars, names, Phase::Plan),
        },
        _ => {}
    }
}

fn check_expr(c: &mut Checker, path: &str, src: &str, names: &Names, phase: Phase) {
    match expr::check_expression(src) {
        Err(msg) => c.err(
            path,
            format!("bad expression: {msg}"),
            "expressions look like `steps.clean.tcp.ok and params.loss > 0`",
        ),
        Ok(vars) => check_vars(c, path, &vars, names, phase),
    }
}

/// Every name read must exist where it is read (`phase`): templates are rendered when the
/// lab is planned, expressions over results are judged during and after the run.
fn check_vars(c: &mut Checker, path: &str, vars: &BTreeSet<String>, names: &Names, phase: Phase) {
    let readable: Vec<&str> = expr::ROOTS
        .iter()
        .filter(|r| r.1 <= phase)
        .map(|r| r.0)
        .collect();
    for v in vars {
        let mut parts = v.split('.');
        let root = parts.next().unwrap_or_default();
        let second = parts.next();
        let Some(&(_, from, _)) = expr::ROOTS.iter().find(|r| r.0 == root) else {
            c.err(
                path,
                format!("unknown name `{root}` in `{v}`"),
                format!("expressions start from one of: {}", readable.join(", ")),
            );
            continue;
        };
        if from > phase {
            c.err(
                path,
                format!("`{v}` cannot be read here: {}", from.why_not_before()),
                format!("here read only: {}", readable.join(", ")),
            );
            continue;
        }
        let (set, what) = match root {
            "steps" => (&names.steps, "step"),
            "params" => (&names.params, "parameter"),
            "nodes" => (&names.nodes, "node"),
            _ => continue,
        };
        if let Some(s) = second
            && !set.contains(s)
        {
            c.err(
                path,
                format!("unknown {what} `{s}` in `{v}`"),
                format!("known {what}s: {}", join(set)),
            );
        } else if root == "steps"
            && let Some(id) = second
            && let Some(problem) = step_result_problem(names, id, parts.clone().collect())
        {
            c.err(
                path,
                format!("{problem} (in `{v}`)"),
                step_result_fix(names, id),
            );
        } else if root == "nodes"
            && let Some(field) = parts.next()
            && !expr::NODE_FIELDS.contains(&field)
        {
            c.err(
                path,
                format!("a node has no `{field}` (in `{v}`)"),
                format!("a node has: {}", expr::NODE_FIELDS.join(", ")),
            );
        }
    }
}

/// What every step record offers to expressions, whatever its kind.
const STEP_FIELDS: &[&str] = &[
    "ok",
    "verdict",
    "skipped",
    "duration_s",
    "provenance",
    "exit_code",
    "stdout",
    "stderr",
    "runs",
];

/// The results a step of this kind offers by name, where that set is closed (traffic and
/// fault steps; probes and commands report open-ended facts).
fn step_results(kind: &str) -> Option<Vec<String>> {
    matches!(kind, "traffic" | "fault").then(|| {
        STEP_FIELDS
            .iter()
            .map(|s| s.to_string())
            .chain(crate::names::for_step(kind))
            .collect()
    })
}

/// Is `steps.<id>.<rest>` something the step can produce? `Some` says what is wrong.
fn step_result_problem(names: &Names, id: &str, rest: Vec<&str>) -> Option<String> {
    let kind = *names.step_kinds.get(id)?;
    let known = step_results(kind)?;
    let mut rest = rest.into_iter();
    let first = rest.next()?;
    let metric = match (kind, crate::PathKind::parse(first)) {
        // A traffic step runs once per path: `steps.ID.ok`, or `steps.ID.PATH.metric`.
        ("traffic", Some(_)) => rest.next()?,
        ("traffic", None) if ["ok", "skipped"].contains(&first) => return None,
        ("traffic", None) => {
            return Some(format!(
                "step `{id}` runs once per path: read `steps.{id}.<path>.{first}` (tcp, roce or ib), or `steps.{id}.ok`"
            ));
        }
        _ => first,
    };
    // `runs.METRIC`: every repetition's value of a metric.
    let metric = match metric {
        "runs" => rest.next()?,
        m => m,
    };
    if known.iter().any(|k| k == metric) {
        return None;
    }
    Some(match closest(metric, &known) {
        Some(k) => format!("a {kind} step produces no `{metric}`; did you mean `{k}`?"),
        None => format!("a {kind} step produces no `{metric}`"),
    })
}

/// The known name a misspelling most likely meant: one that contains it or shares its
/// first word, the shortest first.
fn closest<'a>(typed: &str, known: &'a [String]) -> Option<&'a str> {
    let head = typed.split('_').next().unwrap_or(typed);
    known
        .iter()
        .filter(|k| k.contains(typed) || (head.len() >= 3 && k.starts_with(head)))
        .min_by_key(|k| k.len())
        .map(String::as_str)
}

/// The names a step offers, the closest first, for the fix line.
fn step_result_fix(names: &Names, id: &str) -> String {
    let kind = names.step_kinds.get(id).copied().unwrap_or("");
    let known = step_results(kind).unwrap_or_default();
    format!("a {kind} step offers: {}", known.join(", "))
}

fn check_expectations(c: &mut Checker, lab: &Lab, names: &Names) {
    let mut ids = HashSet::new();
    for (i, e) in lab.spec.expect.iter().enumerate() {
        let path = format!("spec.expect[{i}]");
        let id = expectation_id(e, i);
        if !is_ident(&id) {
            c.err(
                &format!("{path}.id"),
                format!("expectation id `{id}` is not usable"),
                "use a-z, 0-9 and '_', starting with a letter",
            );
        } else if !ids.insert(id.clone()) {
            c.err(
                &format!("{path}.id"),
                format!("expectation id `{id}` is used twice"),
                "give every expectation its own id",
            );
        }
        check_expr(c, &format!("{path}.that"), &e.that, names, Phase::Run);
        if let Some(w) = &e.when {
            check_expr(c, &format!("{path}.when"), w, names, Phase::Run);
        }
        if e.needs.is_some()
            && !crate::expr::check_expression(&e.that)
                .map(|vars| vars.iter().any(|v| v.starts_with("steps.")))
                .unwrap_or(true)
        {
            c.err(
                &format!("{path}.needs"),
                "`needs: hardware` on an expectation that reads no step",
                "it is judged by the provenance of the steps it reads: read one, or drop `needs`",
            );
        }
        if e.because
            .versions()
            .iter()
            .all(|(_, w)| w.trim().is_empty())
        {
            c.err(
                &format!("{path}.because"),
                "an expectation needs an explanation a learner can read",
                "say why the claim holds",
            );
        }
        for (j, p) in e.paths.iter().enumerate() {
            if !lab.spec.paths.contains(p) {
                c.err(
                    &format!("{path}.paths[{j}]"),
                    format!("path `{p}` is not one of the lab's paths"),
                    "add it to spec.paths or remove it here",
                );
            }
        }
    }
    let _ = PathKind::ALL;
}

fn check_compare(c: &mut Checker, lab: &Lab, names: &Names) {
    let mut ids = HashSet::new();
    for (i, row) in lab.spec.compare.iter().enumerate() {
        let path = format!("spec.compare[{i}]");
        let id = crate::compare_id(row, i);
        if !is_ident(&id) {
            c.err(
                &format!("{path}.id"),
                format!("row id `{id}` is not usable"),
                "use a-z, 0-9 and '_', starting with a letter",
            );
        } else if !ids.insert(id.clone()) {
            c.err(
                &format!("{path}.id"),
                format!("row id `{id}` is used twice"),
                "give every comparison row its own id",
            );
        }
        if row.cells().len() < 2 {
            c.err(
                &path,
                format!(
                    "comparison row `{}` has fewer than two paths",
                    row.row.get(lab.language())
                ),
                "give an expression for at least two of tcp, roce, ib",
            );
        }
        let detail = row.detail.iter().flat_map(|d| d.cells());
        let cells = row
            .cells()
            .into_iter()
            .map(|(p, e)| (format!("{path}.{p}"), p, e));
        for (at, p, e) in cells.chain(detail.map(|(p, e)| (format!("{path}.detail.{p}"), p, e))) {
            if !lab.spec.paths.contains(&p) {
                c.err(
                    &at,
                    format!("path `{p}` is not one of the lab's paths"),
                    "add it to spec.paths or drop the cell",
                );
            }
            for (lang, src) in e.versions() {
                let at = match lang {
                    Some(l) => format!("{at}.{l}"),
                    None => at.clone(),
                };
                check_expr(c, &at, src, names, Phase::Run);
            }
        }
    }
}

/// Every text a learner reads has words in each language it is written in.
fn check_texts(c: &mut Checker, lab: &Lab) {
    for (at, text, kind) in lab.texts() {
        // An empty `because` is said by the expectations' own check.
        if at.ends_with(".because") && text.versions().iter().all(|(_, w)| w.trim().is_empty()) {
            continue;
        }
        for (lang, words) in text.versions() {
            if kind == crate::TextKind::Words && words.trim().is_empty() {
                let at = match lang {
                    Some(l) => format!("{at}.{l}"),
                    None => at.clone(),
                };
                c.err(
                    &at,
                    "empty text",
                    "write what the learner reads, or leave the language out (it falls back to another the text has)",
                );
            }
        }
    }
}

fn join<I, S>(items: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let v: Vec<String> = items.into_iter().map(|s| s.as_ref().to_string()).collect();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// `a`, `a or b`, `a, b or c`.
fn join_or(items: &[String]) -> String {
    match items.split_last() {
        None => "no end: the link has none".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use crate::StepKind;
    use crate::load::load_str;

    /// A lab whose one step is `step` (YAML at the step's indentation).
    fn refusal(step: &str) -> crate::diag::Diagnostic {
        let text = format!(
            "apiVersion: iblab.dev/v1\nkind: Lab\nmetadata: {{ name: k, title: K }}\n\
             spec:\n  topology:\n    nodes: [a, b]\n    links:\n      - {{ ends: [a, b] }}\n  \
             steps:\n    - id: s\n{step}\n  expect:\n    - {{ id: e, that: 'true', because: B. }}\n"
        );
        let e = load_str("k.yaml", &text).expect_err("refused");
        e.diagnostics
            .into_iter()
            .find(|d| d.message.contains("does nothing") || d.message.contains("several"))
            .unwrap_or_else(|| panic!("no step-kind diagnostic for {step}"))
    }

    /// A step with two kinds and a step with none are told every kind there is, from the
    /// one list (`StepKind`), so the hint cannot leave one out.
    #[test]
    fn a_step_of_two_kinds_or_none_is_told_every_kind() {
        let two = refusal("      sleep: 1s\n      exec: { node: a, command: [\"true\"] }");
        assert!(two.message.contains("exec, sleep"), "{}", two.message);
        let none = refusal("      name: nothing");
        assert!(none.message.contains("does nothing"), "{}", none.message);
        for d in [two, none] {
            let hint = d.hint.unwrap();
            for k in StepKind::ALL {
                assert!(hint.contains(k.word()), "{hint} lacks {}", k.word());
            }
            assert_eq!(
                hint,
                "give each step exactly one of: exec, traffic, fault, wait, sleep, probe, sm"
            );
        }
    }
}
