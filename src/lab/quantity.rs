//! Values a lab file may write in more than one way: durations and templated numbers.

use std::borrow::Cow;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration: a number of seconds (`2.5`) or a string with a unit (`500ms`, `10s`, `1m`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    pub fn parse(text: &str) -> Result<DurationSpec, String> {
        let t = text.trim();
        if let Ok(secs) = t.parse::<f64>() {
            return from_secs(secs);
        }
        humantime::parse_duration(t).map(DurationSpec).map_err(|e| {
            format!("`{t}` is not a duration ({e}); write e.g. `500ms`, `10s` or `2m`")
        })
    }
}

fn from_secs(secs: f64) -> Result<DurationSpec, String> {
    if secs.is_finite() && (0.0..1e9).contains(&secs) {
        Ok(DurationSpec(Duration::from_secs_f64(secs)))
    } else {
        Err(format!("{secs} is not a usable number of seconds"))
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => from_secs(n).map_err(serde::de::Error::custom),
            Raw::Text(t) => DurationSpec::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl JsonSchema for DurationSpec {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Seconds as a number, or a string with a unit: 500ms, 10s, 2m.",
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": "^[0-9.]+ *(ns|us|ms|s|m|h|sec|min)?$"}
            ]
        })
    }
}

/// A number given literally (`3`) or as a template over parameters (`"{{ params.loss }}"`),
/// resolved when the run is planned.
#[derive(Debug, Clone, PartialEq)]
pub enum Param<T> {
    Value(T),
    Template(String),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Param<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw<T> {
            Value(T),
            Text(String),
        }
        match Raw::<T>::deserialize(d)? {
            Raw::Value(v) => Ok(Param::Value(v)),
            Raw::Text(t) if t.contains("{{") => Ok(Param::Template(t)),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "expected a number or a template such as \"{{{{ params.x }}}}\", found the string `{t}`"
            ))),
        }
    }
}

impl<T: Serialize> Serialize for Param<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Param::Value(v) => v.serialize(s),
            Param::Template(t) => s.serialize_str(t),
        }
    }
}

impl<T: JsonSchema> JsonSchema for Param<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("Param_{}", T::schema_name()).into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let inner = generator.subschema_for::<T>();
        json_schema!({
            "anyOf": [inner, {"type": "string", "pattern": "\\{\\{.*\\}\\}", "description": "A template over params, e.g. \"{{ params.loss }}\""}]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_both_spellings() {
        assert_eq!(
            DurationSpec::parse("2.5").unwrap().0,
            Duration::from_millis(2500)
        );
        assert_eq!(
            DurationSpec::parse("500ms").unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!(
            DurationSpec::parse("2m").unwrap().0,
            Duration::from_secs(120)
        );
        assert!(DurationSpec::parse("soon").is_err());
        assert!(DurationSpec::parse("-1").is_err());
    }
}
