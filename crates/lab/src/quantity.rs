//! Values a lab file may write in more than one way: durations and templated numbers.

use std::borrow::Cow;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration: a number of seconds (`2.5`) or a string with a unit (`500ms`, `10s`, `1m`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationSpec(pub Duration);

/// Why a lab's value is not a duration (what the parse diagnostic says).
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    #[error("`{text}` is not a duration ({source}); write e.g. `500ms`, `10s` or `2m`")]
    NotADuration {
        text: String,
        source: humantime::DurationError,
    },
    #[error("{0} is not a usable number of seconds")]
    Seconds(f64),
}

impl DurationSpec {
    pub fn parse(text: &str) -> Result<DurationSpec, DurationError> {
        let t = text.trim();
        if let Ok(secs) = t.parse::<f64>() {
            return from_secs(secs);
        }
        humantime::parse_duration(t)
            .map(DurationSpec)
            .map_err(|source| DurationError::NotADuration {
                text: t.to_string(),
                source,
            })
    }
}

fn from_secs(secs: f64) -> Result<DurationSpec, DurationError> {
    if (0.0..1e9).contains(&secs) {
        Ok(DurationSpec(Duration::from_secs_f64(secs)))
    } else {
        Err(DurationError::Seconds(secs))
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => {
                from_secs(n.as_f64().unwrap_or(-1.0)).map_err(serde::de::Error::custom)
            }
            serde_json::Value::String(t) => {
                DurationSpec::parse(&t).map_err(serde::de::Error::custom)
            }
            other => Err(serde::de::Error::custom(format!(
                "expected a duration such as 10s or 500ms, found {}",
                describe(&other)
            ))),
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

/// A short description of a YAML value, for messages.
fn describe(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "nothing".into(),
        serde_json::Value::Bool(b) => format!("the boolean {b}"),
        serde_json::Value::Number(n) => format!("the number {n}"),
        serde_json::Value::String(s) => format!("the string `{s}`"),
        serde_json::Value::Array(_) => "a list".into(),
        serde_json::Value::Object(_) => "a mapping".into(),
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Param<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        match raw {
            serde_json::Value::String(t) if t.contains("{{") => Ok(Param::Template(t)),
            serde_json::Value::Number(_) => serde_json::from_value::<T>(raw.clone())
                .map(Param::Value)
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "{} does not fit here (expected a whole, non-negative number?)",
                        describe(&raw)
                    ))
                }),
            other => Err(serde::de::Error::custom(format!(
                "expected a number or a template such as \"{{{{ params.x }}}}\", found {}",
                describe(&other)
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

/// Parse a tc rate (`100mbit`, `1gbit`, `500kbit`, `1000000bit`) into bits per second.
pub fn parse_rate(text: &str) -> Option<u64> {
    let t = text.trim().to_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit {
        "bit" | "bps" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return None,
    };
    let v = n * mult;
    (8000.0..=400e9).contains(&v).then_some(v as u64)
}

/// Parse a size (`16kb`, `4mb`, `1500b`) into bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim().to_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit {
        "" | "b" => 1.0,
        "kb" | "k" => 1024.0,
        "mb" | "m" => 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (1500.0..=1024.0 * 1024.0 * 1024.0)
        .contains(&v)
        .then_some(v as u64)
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

    #[test]
    fn rates_and_sizes() {
        assert_eq!(parse_rate("100mbit"), Some(100_000_000));
        assert_eq!(parse_rate("1.5gbit"), Some(1_500_000_000));
        assert_eq!(parse_rate("fast"), None);
        assert_eq!(parse_rate("100"), None);
        assert_eq!(parse_size("16kb"), Some(16384));
        assert_eq!(parse_size("4mb"), Some(4 << 20));
        assert_eq!(parse_size("10b"), None);
    }
}
