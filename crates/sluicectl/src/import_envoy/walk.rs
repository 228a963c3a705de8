//! Where Envoy's tree walk and Sluice's rules part ways: Envoy follows the most specific
//! entry at each level and never comes back, Sluice applies every matching rule. Each such
//! case becomes a note.

use super::Note;
use super::parse::{Node, Val};
use super::translate::Cand;
use std::collections::BTreeSet;

/// Relative keys paths of the limits in the subtree at `pos` (`""` for the node itself).
fn subtree_paths(cands: &[Cand<'_>], pos: &[usize]) -> BTreeSet<String> {
    cands
        .iter()
        .filter(|c| c.pos.starts_with(pos))
        .map(|c| rel_path(c, pos.len()))
        .collect()
}

/// A rule path to exempt, with its position (that of the limit it shadows).
type Exempt<'a> = (Vec<&'a Node>, Vec<usize>);

/// Where Envoy's walk takes a more specific sibling and never comes back: a limit below a
/// catch-all entry that the sibling's subtree has no counterpart of applies in Sluice only.
/// Where the sibling is an exact value, the limit's path through it is returned, to be written
/// as an `off` rule that wins the group; otherwise the case is only noted.
pub(super) fn walk_notes<'a>(
    nodes: &'a [Node],
    parent: &[usize],
    cands: &[Cand<'a>],
    notes: &mut Vec<Note>,
) -> Vec<Exempt<'a>> {
    let mut out = Vec::new();
    let at = |i: usize| parent.iter().copied().chain([i]).collect::<Vec<usize>>();
    for (i, c) in nodes.iter().enumerate() {
        let cpos = at(i);
        if matches!(&c.value, Val::Any) || c.value.is_star() {
            let mine = subtree_paths(cands, &cpos);
            for (j, s) in nodes.iter().enumerate() {
                if j == i || s.key != c.key || s.value.rank() <= c.value.rank() {
                    continue;
                }
                let theirs = subtree_paths(cands, &at(j));
                for rel in mine.difference(&theirs) {
                    for cand in cands.iter().filter(|k| {
                        !k.skip && k.pos.starts_with(&cpos) && rel_path(k, cpos.len()) == *rel
                    }) {
                        let exact = matches!(s.value, Val::Exact(_));
                        notes.push(Note::new(
                            &cand.node().file,
                            &cand.node().at,
                            "value",
                            format!(
                                "for {} Envoy follows the more specific entry ({}) and applies no limit at this depth; {}",
                                s.value.shown(&s.key),
                                s.at,
                                if exact {
                                    format!("carried as a mode: off rule there, so rule {} does not apply to those requests either", cand.id)
                                } else {
                                    format!("Sluice applies rule {} to those requests too", cand.id)
                                }
                            ),
                        ));
                        if exact {
                            let mut path = cand.path.clone();
                            path[cpos.len() - 1] = s;
                            out.push((path, cand.pos.clone()));
                        }
                    }
                }
            }
        }
        out.extend(walk_notes(&c.children, &cpos, cands, notes));
    }
    out
}

fn rel_path(c: &Cand<'_>, from: usize) -> String {
    c.path[from..]
        .iter()
        .map(|n| n.key.as_str())
        .collect::<Vec<_>>()
        .join("/")
}
#[cfg(test)]
mod tests {
    use crate::import_envoy::convert_one as convert;

    #[test]
    fn envoy_walk_differences_are_noted() {
        // Envoy takes a=x and never returns to the bare `a`, so a > b has no limit for a=x.
        let text = r#"
domain: d
descriptors:
  - key: a
    value: x
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: a
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 2 }
  - key: c
    descriptors:
      - key: e
        value: "1"
        descriptors:
          - key: f
            value: "2"
            rate_limit: { unit: second, requests_per_unit: 3 }
  - key: c
    value: "9"
    descriptors:
      - key: e
        descriptors:
          - key: f
            rate_limit: { unit: second, requests_per_unit: 4 }
"#;
        let import = convert(text).expect("converts");
        let notes: Vec<String> = import.notes.iter().map(ToString::to_string).collect();
        let notes = notes.join("\n");
        assert!(
            notes.contains("for a=x Envoy follows the more specific entry"),
            "{notes}"
        );
        // c > e=1 > f=2 has more exact values than c=9 > e > f, but for c=9, e=1, f=2 Envoy
        // takes c=9 at the first level.
        assert!(notes.contains("Envoy applies c_9.e.f"), "{notes}");
        assert_eq!(import.notes.len(), 2, "{notes}");
    }
}
