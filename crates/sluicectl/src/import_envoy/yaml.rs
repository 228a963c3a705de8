//! The rules file import-envoy prints: one YAML document per domain, each rule on a few
//! lines in the rule format's field order, scalars quoted only when YAML needs it.

use super::Import;
use serde_json::{Value, json};

impl Import {
    /// The rules file: one YAML document per domain, fields in the rule format's order.
    pub fn to_yaml(&self, source: &str) -> anyhow::Result<String> {
        let mut out = format!(
            "# Imported from {source} by `sluicectl import-envoy`.\n\
             # Rules match on envoy.keys, which sluiced adds to every Envoy descriptor.\n"
        );
        for (i, d) in self.domains.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&format!("domain: {}\nrules:\n", q(&d["domain"])?));
            let rules = d["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
            if rules.is_empty() {
                out.push_str("  []\n");
            }
            for r in rules {
                let mut first = true;
                for field in [
                    "id",
                    "group",
                    "match",
                    "key",
                    "algorithm",
                    "limit",
                    "window",
                    "mode",
                ] {
                    let v = &r[field];
                    if v.is_null() {
                        continue;
                    }
                    out.push_str(if first { "  - " } else { "    " });
                    first = false;
                    let text = match v {
                        Value::Object(m) => {
                            let items: Vec<String> = m
                                .iter()
                                .map(|(k, v)| Ok(format!("{}: {}", q(&json!(k))?, q(v)?)))
                                .collect::<anyhow::Result<_>>()?;
                            format!("{{ {} }}", items.join(", "))
                        }
                        Value::Array(a) => {
                            let items: Vec<String> =
                                a.iter().map(q).collect::<anyhow::Result<_>>()?;
                            format!("[{}]", items.join(", "))
                        }
                        v => q(v)?,
                    };
                    out.push_str(&format!("{field}: {text}\n"));
                }
            }
        }
        Ok(out)
    }
}

/// A YAML scalar: JSON's double-quoted strings are YAML's too; plain when that is unambiguous.
fn q(v: &Value) -> anyhow::Result<String> {
    Ok(match v {
        Value::String(s)
            if !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b))
                && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
                && !["true", "false", "null", "yes", "no", "on", "off", "y", "n"]
                    .contains(&s.to_ascii_lowercase().as_str()) =>
        {
            s.clone()
        }
        v => serde_json::to_string(v)?,
    })
}
