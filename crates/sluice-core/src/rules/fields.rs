//! Field access for one mapping of the rule format: every missing, mistyped or unknown
//! field becomes a [`Problem`] under the rule (or override) it belongs to.

use super::Problem;
use crate::algo::{Rate, parse_rate};
use crate::time::{Span, parse_span};
use serde_json::{Map, Value};
use std::collections::HashSet;

/// Field access that records a problem for every missing, mistyped or unknown field.
pub(crate) struct Fields<'a> {
    at: String,
    obj: &'a Map<String, Value>,
    used: HashSet<&'static str>,
    problems: &'a mut Vec<Problem>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(
        at: &str,
        obj: &'a Map<String, Value>,
        problems: &'a mut Vec<Problem>,
    ) -> Fields<'a> {
        Fields {
            at: at.to_string(),
            obj,
            used: HashSet::new(),
            problems,
        }
    }

    pub(crate) fn bad(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            at: self.at.clone(),
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn take(&mut self, field: &'static str) -> Option<&'a Value> {
        self.used.insert(field);
        self.obj.get(field).filter(|v| !v.is_null())
    }

    pub(super) fn string(&mut self, field: &'static str, required: bool) -> Option<String> {
        match self.take(field) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            Some(other) => {
                self.bad(field, format!("expected a string, got {other}"));
                None
            }
            None => {
                if required {
                    self.bad(field, "is required");
                }
                None
            }
        }
    }

    pub(super) fn count(&mut self, field: &'static str, max: u64) -> Option<u64> {
        match self.take(field) {
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) => {
                    self.bad(field, "must be greater than zero");
                    None
                }
                Some(v) if v > max => {
                    self.bad(field, format!("must be at most {max}, got {v}"));
                    None
                }
                Some(v) => Some(v),
                None => {
                    self.bad(field, format!("expected a positive whole number, got {n}"));
                    None
                }
            },
            Some(other) => {
                self.bad(
                    field,
                    format!("expected a positive whole number, got {other}"),
                );
                None
            }
            None => None,
        }
    }

    /// Records `is required for {algorithm}` for a field not given, unless a problem with it
    /// is already recorded (a zero, a mistyped value).
    pub(super) fn need(&mut self, field: &str, given: bool, algorithm: &str) {
        if !given
            && !self
                .problems
                .iter()
                .any(|p| p.at == self.at && p.field == field)
        {
            self.bad(field, format!("is required for {algorithm}"));
        }
    }

    /// Exactly one of `either` (`rate_per_s`, `rate`): both given is refused, and neither is
    /// `is required for {algorithm}` under the second (unless one was given but refused).
    pub(super) fn need_one(&mut self, either: &[&str], given: usize, algorithm: &str) {
        let [first, second, ..] = either else {
            return;
        };
        if given > 1 {
            self.bad(second, format!("give {second} or {first}, not both"));
        } else if given == 0
            && !self
                .problems
                .iter()
                .any(|p| p.at == self.at && either.contains(&p.field.as_str()))
        {
            self.bad(
                second,
                format!("is required for {algorithm} ({second}: N/<duration> such as 10/1m, or {first}: N)"),
            );
        }
    }

    pub(super) fn span(&mut self, field: &'static str) -> Option<Span> {
        let s = self.string(field, false)?;
        match parse_span(&s) {
            Ok(sp) => Some(sp),
            Err(e) => {
                self.bad(field, e.to_string());
                None
            }
        }
    }

    /// A bucket's `rate`: `<count>/<duration>` ([`crate::algo::parse_rate`]).
    pub(super) fn rate(&mut self, field: &'static str) -> Option<Rate> {
        let s = match self.take(field)? {
            Value::String(s) => s.clone(),
            other => {
                self.bad(
                    field,
                    format!("expected a rate like 10/1m (a count, /, a duration), got {other}"),
                );
                return None;
            }
        };
        match parse_rate(&s) {
            Ok(r) => Some(r),
            Err(e) => {
                self.bad(field, e.to_string());
                None
            }
        }
    }

    pub(super) fn choice<T: Copy>(
        &mut self,
        field: &'static str,
        default: T,
        options: &[(&str, T)],
    ) -> T {
        let Some(s) = self.string(field, false) else {
            return default;
        };
        match options.iter().find(|(n, _)| *n == s) {
            Some((_, v)) => *v,
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.bad(
                    field,
                    format!("expected one of {}, got {s:?}", names.join(" | ")),
                );
                default
            }
        }
    }

    pub(super) fn boolean(&mut self, field: &'static str) -> Option<bool> {
        match self.take(field) {
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.bad(field, format!("expected true or false, got {other}"));
                None
            }
            None => None,
        }
    }

    pub(super) fn finish(mut self) {
        let unknown: Vec<String> = self
            .obj
            .keys()
            .filter(|k| !self.used.contains(k.as_str()))
            .cloned()
            .collect();
        for k in unknown {
            // A YAML key that is no string (`? ` alone, `~:`) arrives empty: quoted, the
            // problem still says which field.
            let name = if k.is_empty() { "\"\"" } else { k.as_str() };
            self.bad(name, "unknown field");
        }
    }
}
