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

pub fn find(name: &str) -> Option<&'static Builtin> {
    LABS.iter().find(|b| b.name == name)
}
