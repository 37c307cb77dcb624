//! JSON Schema as schemars writes it, made into the structural OpenAPI v3 schema a
//! CustomResourceDefinition requires: every `$ref` inlined, `anyOf`/`oneOf` folded into
//! one node the API server can prune by, unknown-typed values kept whole. What a fold
//! loses (one-of-these-keys, a number-or-template) is still checked by iblab's own
//! validator, with file:line:col, when the object is run.

use serde_json::{Map, Value, json};

/// The structural form of `root` (a schemars root schema with its `$defs`).
pub fn structural(root: &Value) -> Value {
    let defs = root
        .get("$defs")
        .or_else(|| root.get("definitions"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    fold(root, &defs, &mut Vec::new())
}

/// A value of any type, kept as written.
fn any(description: Option<&Value>) -> Value {
    let mut m = Map::new();
    if let Some(d) = description {
        m.insert("description".into(), d.clone());
    }
    m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    Value::Object(m)
}

fn fold(node: &Value, defs: &Map<String, Value>, stack: &mut Vec<String>) -> Value {
    let obj = match node {
        Value::Bool(_) => return any(None),
        Value::Object(o) => o,
        _ => return any(None),
    };
    // A reference: inline it (a recursive one cannot be: keep that value whole).
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or(r).to_string();
        let Some(target) = defs.get(&name) else {
            return any(obj.get("description"));
        };
        if stack.contains(&name) {
            return any(obj.get("description"));
        }
        stack.push(name);
        let mut inlined = fold(target, defs, stack);
        stack.pop();
        if let (Some(d), Some(m)) = (obj.get("description"), inlined.as_object_mut()) {
            m.insert("description".into(), d.clone());
        }
        return inlined;
    }
    let description = obj.get("description");
    let branches = obj
        .get("anyOf")
        .or_else(|| obj.get("oneOf"))
        .and_then(Value::as_array);
    let mut out = match branches {
        Some(bs) => {
            let folded: Vec<Value> = bs.iter().map(|b| fold(b, defs, stack)).collect();
            merge(&folded, description)
        }
        None => plain(obj, defs, stack),
    };
    if let (Some(d), Some(m)) = (description, out.as_object_mut()) {
        m.insert("description".into(), d.clone());
    }
    out
}

/// One schema node without junctors.
fn plain(obj: &Map<String, Value>, defs: &Map<String, Value>, stack: &mut Vec<String>) -> Value {
    let mut out = Map::new();
    // `type: [T, "null"]` (an Option) becomes T, nullable.
    let mut ty = obj.get("type").cloned();
    if let Some(Value::Array(ts)) = &ty {
        let real: Vec<&Value> = ts.iter().filter(|t| t.as_str() != Some("null")).collect();
        if real.len() < ts.len() {
            out.insert("nullable".into(), json!(true));
        }
        ty = match real.as_slice() {
            [one] => Some((*one).clone()),
            _ => return any(obj.get("description")),
        };
    }
    if let Some(c) = obj.get("const") {
        out.insert("enum".into(), json!([c]));
        if ty.is_none() {
            ty = type_of(c).map(Value::from);
        }
    }
    if let Some(e) = obj.get("enum").and_then(Value::as_array) {
        let vals: Vec<Value> = e.iter().filter(|v| !v.is_null()).cloned().collect();
        if vals.len() < e.len() {
            out.insert("nullable".into(), json!(true));
        }
        if ty.is_none() {
            ty = vals.first().and_then(type_of).map(Value::from);
        }
        out.insert("enum".into(), Value::Array(vals));
    }
    let Some(ty) = ty.and_then(|t| t.as_str().map(str::to_string)) else {
        return any(obj.get("description"));
    };
    if ty == "null" {
        // Only meaningful as a branch: it makes the merged node nullable.
        return json!({"nullable": true});
    }
    out.insert("type".into(), json!(ty));
    for key in [
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "multipleOf",
    ] {
        if let Some(v) = obj.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    match ty.as_str() {
        "object" => {
            let props = obj.get("properties").and_then(Value::as_object);
            if let Some(props) = props {
                let folded: Map<String, Value> = props
                    .iter()
                    .map(|(k, v)| (k.clone(), fold(v, defs, stack)))
                    .collect();
                out.insert("properties".into(), Value::Object(folded));
                if let Some(r) = obj.get("required") {
                    out.insert("required".into(), r.clone());
                }
            } else {
                // A map: its values' schema, or anything kept whole.
                match obj.get("additionalProperties") {
                    Some(Value::Object(v)) if !v.is_empty() => {
                        out.insert(
                            "additionalProperties".into(),
                            fold(&Value::Object(v.clone()), defs, stack),
                        );
                    }
                    _ => {
                        out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                    }
                }
            }
        }
        "array" => {
            let items = match obj.get("items") {
                Some(Value::Array(tuple)) => {
                    let folded: Vec<Value> = tuple.iter().map(|t| fold(t, defs, stack)).collect();
                    merge(&folded, None)
                }
                Some(i) => fold(i, defs, stack),
                None => match obj.get("prefixItems").and_then(Value::as_array) {
                    Some(tuple) => {
                        let folded: Vec<Value> =
                            tuple.iter().map(|t| fold(t, defs, stack)).collect();
                        merge(&folded, None)
                    }
                    None => any(None),
                },
            };
            out.insert("items".into(), items);
        }
        _ => {}
    }
    Value::Object(out)
}

fn type_of(v: &Value) -> Option<&'static str> {
    Some(match v {
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::Null => return None,
    })
}

/// Branches folded into one node: same type merged (objects: the union of their
/// properties; strings: the union of their enums), `null` making it nullable, integer and
/// string an int-or-string, anything else kept whole.
fn merge(branches: &[Value], description: Option<&Value>) -> Value {
    let mut nullable = false;
    let mut typed: Vec<&Map<String, Value>> = Vec::new();
    for b in branches {
        let Some(m) = b.as_object() else {
            return any(description);
        };
        if m.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
            && m.get("type").is_none()
        {
            return any(description);
        }
        if m.get("nullable") == Some(&json!(true)) {
            nullable = true;
            if m.len() == 1 {
                continue;
            }
        }
        typed.push(m);
    }
    let types: Vec<&str> = typed
        .iter()
        .filter_map(|m| m.get("type").and_then(Value::as_str))
        .collect();
    if types.len() != typed.len() {
        return any(description);
    }
    let Some(&first) = types.first() else {
        return any(description);
    };
    let mut out = Map::new();
    if types.iter().all(|t| *t == first) {
        out.insert("type".into(), json!(first));
        match first {
            "object" => {
                let mut props = Map::new();
                let mut open = false;
                for m in &typed {
                    if let Some(p) = m.get("properties").and_then(Value::as_object) {
                        for (k, v) in p {
                            props.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    } else {
                        open = true;
                    }
                }
                if open {
                    out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                }
                if !props.is_empty() {
                    out.insert("properties".into(), Value::Object(props));
                }
            }
            "array" => {
                let items: Vec<Value> = typed
                    .iter()
                    .filter_map(|m| m.get("items").cloned())
                    .collect();
                out.insert("items".into(), merge(&items, None));
            }
            _ => {
                // Every branch an enum: the union; any branch open: no enum.
                let mut values: Vec<Value> = Vec::new();
                let mut open = false;
                for m in &typed {
                    match m.get("enum").and_then(Value::as_array) {
                        Some(e) => values.extend(e.iter().cloned()),
                        None => open = true,
                    }
                }
                if !open {
                    values.dedup();
                    out.insert("enum".into(), Value::Array(values));
                }
                if typed.len() == 1 {
                    for (k, v) in typed[0] {
                        out.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
    } else if types.iter().all(|t| matches!(*t, "integer" | "string")) {
        out.insert("x-kubernetes-int-or-string".into(), json!(true));
    } else {
        return any(description);
    }
    if nullable {
        out.insert("nullable".into(), json!(true));
    }
    Value::Object(out)
}

#[cfg(test)]
/// The rules of a structural schema this module promises, as problems found in `s`
/// (empty when there are none): every node typed or kept whole, no junctor, no
/// reference, no `additionalProperties` beside `properties`.
pub fn problems(s: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(s, "", &mut out);
    out
}

#[cfg(test)]
fn walk(s: &Value, at: &str, out: &mut Vec<String>) {
    let Some(m) = s.as_object() else {
        out.push(format!("{at}: not a schema object"));
        return;
    };
    for k in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$defs",
        "definitions",
    ] {
        if m.contains_key(k) {
            out.push(format!("{at}: has `{k}`"));
        }
    }
    let kept = m.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
        || m.get("x-kubernetes-int-or-string") == Some(&json!(true));
    if m.get("type").is_none() && !kept {
        out.push(format!("{at}: no type"));
    }
    if m.contains_key("properties") && m.contains_key("additionalProperties") {
        out.push(format!("{at}: properties beside additionalProperties"));
    }
    if let Some(p) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in p {
            walk(v, &format!("{at}.{k}"), out);
        }
    }
    if let Some(i) = m.get("items") {
        walk(i, &format!("{at}[]"), out);
    }
    if let Some(a) = m.get("additionalProperties")
        && a.is_object()
    {
        walk(a, &format!("{at}{{}}"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refs_and_mixed_types_fold() {
        let root = json!({
            "$defs": {
                "Inner": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}},
                "Dur": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                "Kind": {"oneOf": [{"const": "a"}, {"const": "b"}]},
                "Tree": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Tree"}}}
            },
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "inner": {"$ref": "#/$defs/Inner", "description": "the inner"},
                "dur": {"$ref": "#/$defs/Dur"},
                "kind": {"$ref": "#/$defs/Kind"},
                "tree": {"$ref": "#/$defs/Tree"},
                "params": {"type": "object", "additionalProperties": true},
                "count": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "pair": {"type": "array", "items": [{"type": "string"}, {"type": "string"}]}
            }
        });
        let s = structural(&root);
        assert!(problems(&s).is_empty(), "{:?}", problems(&s));
        let p = &s["properties"];
        assert_eq!(p["inner"]["description"], "the inner");
        assert_eq!(p["inner"]["properties"]["x"]["nullable"], true);
        assert_eq!(p["inner"]["properties"]["x"]["type"], "integer");
        assert_eq!(p["dur"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(p["kind"]["enum"], json!(["a", "b"]));
        assert_eq!(p["kind"]["type"], "string");
        assert_eq!(
            p["tree"]["properties"]["child"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
        assert_eq!(p["params"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(p["count"]["x-kubernetes-int-or-string"], true);
        assert_eq!(p["pair"]["items"]["type"], "string");
        assert!(s.get("additionalProperties").is_none());
    }

    #[test]
    fn the_checker_finds_what_is_not_structural() {
        let bad = json!({"type": "object", "properties": {
            "a": {"anyOf": [{"type": "string"}]},
            "b": {"description": "untyped"},
        }, "additionalProperties": false});
        let found = problems(&bad);
        assert!(found.iter().any(|p| p.contains(".a: has `anyOf`")));
        assert!(found.iter().any(|p| p.contains(".b: no type")));
        assert!(
            found
                .iter()
                .any(|p| p.contains("beside additionalProperties"))
        );
    }
}
