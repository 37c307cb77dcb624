//! The labs shipped inside the binary (labs/*.yaml), usable from any folder.

/// A built-in lab: its name and its YAML text.
pub struct Builtin {
    pub name: &'static str,
    pub text: &'static str,
}

const LABS: &[Builtin] = &[
    Builtin {
        name: "lesson4",
        text: include_str!("../../labs/lesson4.yaml"),
    },
    Builtin {
        name: "lesson4-reroute",
        text: include_str!("../../labs/lesson4-reroute.yaml"),
    },
    Builtin {
        name: "tcp-loss",
        text: include_str!("../../labs/tcp-loss.yaml"),
    },
    Builtin {
        name: "roce-basics",
        text: include_str!("../../labs/roce-basics.yaml"),
    },
];

pub fn all() -> &'static [Builtin] {
    LABS
}

pub fn find(name: &str) -> Option<&'static Builtin> {
    LABS.iter().find(|b| b.name == name)
}
