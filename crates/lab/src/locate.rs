//! Where each value of a YAML document sits, by path (`spec.steps[2].traffic.to`),
//! so that checks made after parsing can still point at file:line:col.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser, Span};

/// A position in the source: 1-based line and column, and the byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
    pub offset: usize,
    pub len: usize,
}

/// Positions of every key and value of a document, by path.
#[derive(Debug, Default)]
pub struct Locator {
    values: HashMap<String, Pos>,
    keys: HashMap<String, Pos>,
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, index: usize },
}

impl Locator {
    /// Index a document. A document that does not parse yields an empty index (the
    /// deserializer reports that error with its own position).
    pub fn new(source: &str) -> Locator {
        let mut loc = Locator::default();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(source) {
            let Ok((event, span)) = item else { break };
            match event {
                Event::Scalar(text, ..) => {
                    if let Some(Frame::Map { path, key }) = stack.last_mut()
                        && key.is_none()
                    {
                        let p = join_key(path, &text);
                        loc.keys.insert(p, pos(source, &span));
                        *key = Some(text.into_owned());
                        continue;
                    }
                    let p = loc.value_path(&mut stack);
                    loc.values.insert(p, pos(source, &span));
                }
                Event::Alias(_) => {
                    let p = loc.value_path(&mut stack);
                    loc.values.insert(p, pos(source, &span));
                }
                Event::MappingStart(..) => {
                    let p = loc.value_path(&mut stack);
                    loc.values.insert(p.clone(), pos(source, &span));
                    stack.push(Frame::Map { path: p, key: None });
                }
                Event::SequenceStart(..) => {
                    let p = loc.value_path(&mut stack);
                    loc.values.insert(p.clone(), pos(source, &span));
                    stack.push(Frame::Seq { path: p, index: 0 });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        loc
    }

    /// The path of the value that starts now, advancing the parent frame.
    fn value_path(&self, stack: &mut [Frame]) -> String {
        match stack.last_mut() {
            None => String::new(),
            Some(Frame::Map { path, key }) => {
                let k = key.take().unwrap_or_default();
                join_key(path, &k)
            }
            Some(Frame::Seq { path, index }) => {
                let p = format!("{path}[{index}]");
                *index += 1;
                p
            }
        }
    }

    /// Where the value at `path` is, or the nearest enclosing value that exists.
    pub fn value(&self, path: &str) -> Pos {
        let mut p = path.to_string();
        loop {
            if let Some(pos) = self.values.get(&p) {
                return *pos;
            }
            match parent(&p) {
                Some(up) => p = up,
                None => {
                    return Pos {
                        line: 1,
                        col: 1,
                        offset: 0,
                        len: 0,
                    };
                }
            }
        }
    }

    /// Where the key naming `path` is (falls back to the value).
    pub fn key(&self, path: &str) -> Pos {
        self.keys
            .get(path)
            .copied()
            .unwrap_or_else(|| self.value(path))
    }
}

fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn parent(path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(path[..cut].to_string())
}

fn pos(source: &str, span: &Span) -> Pos {
    let line = span.start.line().max(1);
    let col = span.start.col() + 1;
    let offset = span
        .start
        .byte_offset()
        .unwrap_or_else(|| offset_of(source, line, col));
    let end = span
        .end
        .byte_offset()
        .unwrap_or_else(|| offset_of(source, span.end.line().max(1), span.end.col() + 1));
    Pos {
        line,
        col,
        offset,
        len: end.saturating_sub(offset),
    }
}

/// Byte offset of a 1-based line and column (columns count characters).
pub fn offset_of(source: &str, line: usize, col: usize) -> usize {
    let mut offset = 0;
    for (i, l) in source.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            let chars: usize = l
                .chars()
                .take(col.saturating_sub(1))
                .map(char::len_utf8)
                .sum();
            return (offset + chars).min(source.len());
        }
        offset += l.len();
    }
    source.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str =
        "a: 1\nspec:\n  steps:\n    - id: x\n      exec: {node: n1, command: [ls]}\n    - id: y\n";

    #[test]
    fn finds_nested_values_and_keys() {
        let l = Locator::new(DOC);
        assert_eq!((l.value("a").line, l.value("a").col), (1, 4));
        let p = l.value("spec.steps[0].exec.node");
        assert_eq!((p.line, p.col), (5, 20));
        assert_eq!(&DOC[p.offset..p.offset + 2], "n1");
        assert_eq!(l.value("spec.steps[1].id").line, 6);
        assert_eq!(l.key("spec.steps[1].id").col, 7);
    }

    #[test]
    fn falls_back_to_the_nearest_parent() {
        let l = Locator::new(DOC);
        assert_eq!(l.value("spec.steps[1].nothing").line, 6);
    }
}
