//! The labs shipped inside the binary (labs/*.yaml), usable from any folder.

/// A built-in lab: its name and its YAML text.
pub struct Builtin {
    pub name: &'static str,
    pub text: &'static str,
}

/// A built-in lab from labs/NAME.yaml.
macro_rules! lab {
    ($name:literal) => {
        Builtin {
            name: $name,
            text: include_str!(concat!("../../../labs/", $name, ".yaml")),
        }
    };
}

const LABS: &[Builtin] = &[
    lab!("lesson1"),
    lab!("lesson2"),
    lab!("lesson3"),
    lab!("lesson4"),
    lab!("lesson4-reroute"),
    lab!("lesson5"),
    lab!("lesson6"),
    lab!("roce-basics"),
    lab!("tcp-loss"),
];

pub fn all() -> &'static [Builtin] {
    LABS
}

/// The course's lessons, in order: the numbers of the built-in labs named `lessonN`. The one
/// place the course's length is known; a lesson is added as a lab (docs/architecture.md,
/// "Adding a lesson"), and no count is written anywhere else.
pub fn lessons() -> Vec<u8> {
    let mut n: Vec<u8> = LABS
        .iter()
        .filter_map(|b| b.name.strip_prefix("lesson")?.parse().ok())
        .collect();
    n.sort_unstable();
    n
}

pub fn find(name: &str) -> Option<&'static Builtin> {
    LABS.iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use crate::{PathKind, RawStep, expr, step_id};

    /// The lessons are 1 to N with none missing, and lesson N's lab says it is lesson N.
    #[test]
    fn the_lessons_are_numbered_from_one_and_say_so() {
        let n = super::lessons();
        assert!(n.len() >= 6, "{n:?}");
        assert_eq!(n, (1..=n.len() as u8).collect::<Vec<_>>());
        for i in n {
            let lab = crate::load::resolve(&format!("lesson{i}")).unwrap();
            assert_eq!(
                lab.lab.metadata.lesson,
                Some(i),
                "lesson{i}'s metadata.lesson"
            );
        }
    }

    /// The path a step's record stands for, as far as the lab file says: a traffic step
    /// has one record per path (read as `steps.ID.PATH`), a probe the path it reads, the
    /// rest none.
    fn probe_path(step: &RawStep) -> Option<PathKind> {
        step.probe
            .as_ref()
            .or(step.wait.as_ref().and_then(|w| w.probe.as_ref()))
            .map(|p| p.path_or_default())
    }

    /// Rows of `lab` whose ③ cell reads a step instance its ② cell reads, or a step of
    /// path ② (`steps.ID.roce.…`, or a probe of path roce).
    fn ib_cells_reading_roce(lab: &crate::Lab) -> Vec<String> {
        let steps: Vec<(String, &RawStep)> = lab
            .spec
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (step_id(s, i), s))
            .collect();
        // `steps.ID` or `steps.ID.PATH` of every step a cell reads, in any language.
        let read = |t: &crate::Text| -> Vec<(String, Option<PathKind>)> {
            t.versions()
                .into_iter()
                .flat_map(|(_, e)| expr::check_expression(e).unwrap())
                .collect::<Vec<_>>()
                .iter()
                .filter_map(|v| {
                    let mut parts = v.strip_prefix("steps.")?.split('.');
                    let id = parts.next()?.to_string();
                    let on = parts.next().and_then(PathKind::parse).or_else(|| {
                        steps
                            .iter()
                            .find(|(s, _)| *s == id)
                            .and_then(|(_, st)| probe_path(st))
                    });
                    Some((id, on))
                })
                .collect()
        };
        let mut bad = Vec::new();
        let details = |row: &crate::CompareSpec| {
            let d = row.detail.clone().unwrap_or_default();
            (d.roce, d.ib)
        };
        for row in &lab.spec.compare {
            let (Some(roce), Some(ib)) = (&row.roce, &row.ib) else {
                continue;
            };
            let (mut r, mut i) = (read(roce), read(ib));
            // A cell's detail is its own: the same rule.
            let (droce, dib) = details(row);
            r.extend(droce.iter().flat_map(&read));
            i.extend(dib.iter().flat_map(&read));
            let name = row.row.get(crate::Lang::En);
            for (id, on) in &i {
                if *on == Some(PathKind::Roce) {
                    bad.push(format!("row `{name}`: ③'s cell reads step {id} of path ②"));
                } else if on.is_none() && r.iter().any(|(rid, _)| rid == id) {
                    bad.push(format!("row `{name}`: ② and ③ read the same step {id}"));
                }
            }
        }
        bad
    }

    /// ③ is never ②'s figure under another name: no built-in lab's comparison row gives
    /// ③ what ② measured. Lesson 3 once kept ②'s very expressions in its ③ column (the
    /// second lab below): this catches it.
    #[test]
    fn no_ib_cell_reads_what_roce_measured() {
        for b in super::all() {
            let lab = crate::load::load_str(b.name, b.text).unwrap().lab;
            let bad = ib_cells_reading_roce(&lab);
            assert!(bad.is_empty(), "{}: {bad:?}", b.name);
        }
        let mut old = crate::load::load_str("lesson3", super::find("lesson3").unwrap().text)
            .unwrap()
            .lab;
        for row in old.spec.compare.iter_mut().filter(|r| r.ib.is_some()) {
            row.ib = row.roce.clone();
        }
        let bad = ib_cells_reading_roce(&old);
        assert!(bad.iter().any(|b| b.contains("of path ②")), "{bad:?}");
    }
}
