//! The labs the page offers, as the course orders them (lesson 1 to 6, each lesson's own
//! lab first), each with its goal, its scenarios, its switches and its parameters. Only
//! built-in labs: a request from the page names one of them, never a file.
//!
//! A switch is a pair of scenarios `BASE` and `BASE-FLAG` (lesson 5's `congestion` and
//! `congestion-lossless`: the switch `lossless`, 以太网无损). "As written" (`default`)
//! stands for a scenario that overrides nothing, so the switch works from it too.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::words::Lang;
use iblab_lab::{Lab, PathKind};

/// One lab as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Lesson {
    pub name: String,
    pub lesson: Option<u8>,
    pub title: String,
    pub goal: String,
    pub paths: Vec<PathKind>,
    /// The scenarios to pick from (`default` first), without the switched-on variants.
    pub scenarios: Vec<ScenarioView>,
    /// The switches of the lab (`lossless`), by flag.
    pub switches: Vec<String>,
    /// The lab's parameters with their values as written.
    pub params: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioView {
    pub name: String,
    pub description: String,
    /// What each switch turned on runs instead: flag → scenario.
    pub on: BTreeMap<String, String>,
    /// The parameters it runs with, by switch state: `off`, and `on:FLAG`.
    pub params: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
}

/// What the page shows of a lab, in `lang` (the lab's own words in that language, or in
/// the one it has). The lab's own words are read here and only here.
pub fn text(lab: &Lab, what: Text<'_>, lang: Lang) -> String {
    let lang = lang.lab();
    match what {
        Text::Title => lab.metadata.title.get(lang).to_string(),
        Text::Goal => lab
            .metadata
            .goal
            .as_ref()
            .map(|g| g.get(lang).to_string())
            .unwrap_or_default(),
        Text::Scenario(name) => lab
            .spec
            .scenarios
            .get(name)
            .and_then(|s| s.description.as_ref())
            .map(|d| d.get(lang).to_string())
            .unwrap_or_default(),
    }
}

/// Which of a lab's words [`text`] gives.
#[derive(Debug, Clone, Copy)]
pub enum Text<'a> {
    Title,
    Goal,
    Scenario(&'a str),
}

/// The built-in labs in the course's order: by lesson, the lesson's own lab (`lessonN`)
/// first, labs of no lesson last.
pub fn all(lang: Lang) -> Vec<Lesson> {
    let mut v: Vec<Lesson> = iblab_lab::builtin::all()
        .iter()
        .filter_map(|b| iblab_lab::load::resolve(b.name).ok())
        .map(|l| lesson(&l.lab, lang))
        .collect();
    v.sort_by_key(|l| {
        (
            l.lesson.unwrap_or(u8::MAX),
            l.name != format!("lesson{}", l.lesson.unwrap_or(0)),
            l.name.clone(),
        )
    });
    v
}

/// One built-in lab by name.
pub fn find(name: &str) -> Option<Lab> {
    iblab_lab::builtin::find(name)?;
    iblab_lab::load::resolve(name).ok().map(|l| l.lab)
}

/// The scenario a switch turned on runs instead of `scenario`, if the lab has one.
fn switched(lab: &Lab, scenario: &str, flag: &str) -> Option<String> {
    let direct = format!("{scenario}-{flag}");
    if lab.spec.scenarios.contains_key(&direct) {
        return Some(direct);
    }
    if scenario != "default" {
        return None;
    }
    // "As written" is any scenario that overrides nothing.
    lab.spec
        .scenarios
        .iter()
        .filter(|(_, s)| s.params.is_empty())
        .map(|(name, _)| format!("{name}-{flag}"))
        .find(|on| lab.spec.scenarios.contains_key(on))
}

/// The flags of a lab's switches: a scenario `BASE-FLAG` beside a scenario `BASE`.
fn flags(lab: &Lab) -> Vec<String> {
    let mut out: Vec<String> = lab
        .spec
        .scenarios
        .keys()
        .filter_map(|name| {
            let (base, flag) = name.rsplit_once('-')?;
            lab.spec
                .scenarios
                .contains_key(base)
                .then(|| flag.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn params_of(lab: &Lab, scenario: &str) -> BTreeMap<String, serde_json::Value> {
    let mut p = lab.spec.params.clone();
    if let Some(s) = lab.spec.scenarios.get(scenario) {
        p.extend(s.params.clone());
    }
    p
}

pub fn lesson(lab: &Lab, lang: Lang) -> Lesson {
    let flags = flags(lab);
    let switched_on: Vec<String> = lab
        .spec
        .scenarios
        .keys()
        .filter(|n| flags.iter().any(|f| n.ends_with(&format!("-{f}"))))
        .cloned()
        .collect();
    let mut scenarios = vec!["default".to_string()];
    scenarios.extend(
        lab.spec
            .scenarios
            .keys()
            .filter(|n| !switched_on.contains(n))
            .cloned(),
    );
    let scenarios = scenarios
        .into_iter()
        .map(|name| {
            let on: BTreeMap<String, String> = flags
                .iter()
                .filter_map(|f| Some((f.clone(), switched(lab, &name, f)?)))
                .collect();
            let mut params = BTreeMap::new();
            params.insert("off".to_string(), params_of(lab, &name));
            for (f, sc) in &on {
                params.insert(format!("on:{f}"), params_of(lab, sc));
            }
            ScenarioView {
                description: text(lab, Text::Scenario(&name), lang),
                name,
                on,
                params,
            }
        })
        .collect();
    Lesson {
        name: lab.metadata.name.clone(),
        lesson: lab.metadata.lesson,
        title: text(lab, Text::Title, lang),
        goal: text(lab, Text::Goal, lang),
        paths: lab.spec.paths.clone(),
        scenarios,
        switches: flags,
        params: lab.spec.params.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lab's own words in the page's language: its title, goal and scenarios.
    #[test]
    fn a_lesson_reads_in_the_pages_language() {
        let chinese = |s: &str| s.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c));
        for l in all(Lang::Zh) {
            assert!(
                chinese(&l.title) && chinese(&l.goal),
                "{}: {}",
                l.name,
                l.title
            );
            for s in l.scenarios.iter().filter(|s| !s.description.is_empty()) {
                assert!(chinese(&s.description), "{} {}", l.name, s.name);
            }
        }
        for l in all(Lang::En) {
            assert!(
                !chinese(&l.title) && !chinese(&l.goal),
                "{}: {}",
                l.name,
                l.title
            );
        }
    }

    #[test]
    fn the_course_order_and_lesson_5s_lossless_switch() {
        let all = all(Lang::En);
        let names: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(at("lesson1") < at("lesson2") && at("lesson2") < at("lesson3"));
        assert!(at("lesson4") < at("lesson4-reroute") && at("lesson4-reroute") < at("lesson5"));
        assert!(at("lesson5") < at("tcp-loss") && at("tcp-loss") < at("lesson6"));

        let l5 = all.iter().find(|l| l.name == "lesson5").unwrap();
        assert_eq!(l5.switches, ["lossless"]);
        let picked: Vec<&str> = l5.scenarios.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            picked,
            ["default", "congestion"],
            "the switched-on variant is the switch"
        );
        for s in &l5.scenarios {
            assert_eq!(s.on["lossless"], "congestion-lossless", "{}", s.name);
            assert_eq!(s.params["off"]["queue"], "16kb");
            assert_eq!(s.params["on:lossless"]["queue"], "4mb");
            assert_eq!(s.params["off"]["rate_mbit"], 20);
        }
        // lesson 4's sm-off is a scenario, not a switch.
        let l4 = all.iter().find(|l| l.name == "lesson4").unwrap();
        assert!(l4.switches.is_empty());
        assert!(l4.scenarios.iter().any(|s| s.name == "sm-off"));
        assert!(find("lesson5").is_some());
        assert!(find("../labs/lesson5.yaml").is_none(), "built-in labs only");
    }
}
