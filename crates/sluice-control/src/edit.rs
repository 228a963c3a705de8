//! The admin API's changes as pure functions from the current [`State`] to the next one.
//!
//! Keeping them free of I/O lets the same code run inside the committing transaction (with
//! the version row locked) and in unit tests; validation of the result as a whole, the
//! tightening check and the write are the store's job ([`crate::store`]).

use crate::model::{Entry, EntryKey, Kind, State, override_key};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Most rules one domain may hold: matching is indexed, but listing, diffing and history stay
/// human-sized, and a runaway script is stopped before it fills the table.
pub const MAX_RULES_PER_DOMAIN: usize = 10_000;
/// Most overrides one domain may hold.
pub const MAX_OVERRIDES_PER_DOMAIN: usize = 100_000;
/// Largest body of one rule or override, serialized.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A change an operator asks for. Serialized (tagged by `edit`) when it is held for a
/// second approver, so the approval applies the same edit.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "edit", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    /// Create or replace one rule (`PUT /v1/rules/{id}`).
    PutRule {
        /// `?domain=`, or `None` to infer it.
        domain: Option<String>,
        /// The rule id from the path.
        id: String,
        /// The rule in the rule format.
        body: Value,
    },
    /// Remove one rule (`DELETE /v1/rules/{id}`).
    DeleteRule {
        /// `?domain=`, or `None` to infer it.
        domain: Option<String>,
        /// The rule id.
        id: String,
    },
    /// Set one rule's mode (`:shadow`, `:enforce`, `:off`).
    SetMode {
        /// `?domain=`, or `None` to infer it.
        domain: Option<String>,
        /// The rule id.
        id: String,
        /// `enforce`, `shadow` or `off`.
        #[serde(deserialize_with = "mode_de")]
        mode: ModeName,
    },
    /// The kill switch: every enforcing rule (of one domain, or all) to shadow.
    ShadowAll {
        /// Only this domain, or every domain.
        domain: Option<String>,
    },
    /// Create or replace one override (`PUT /v1/overrides/{rule}/{identity}`).
    PutOverride {
        /// `?domain=`, or `None` to infer it.
        domain: Option<String>,
        /// The rule it changes, or `None` (`*`) for an exemption from every rule.
        rule: Option<String>,
        /// Descriptor values of the identity.
        identity: BTreeMap<String, String>,
        /// Numbers (`limit` / `rate_per_s` / `burst`) or `exempt: true`.
        body: Value,
    },
    /// Remove one override.
    DeleteOverride {
        /// `?domain=`, or `None` to infer it.
        domain: Option<String>,
        /// The rule, or `None` for `*`.
        rule: Option<String>,
        /// Descriptor values of the identity.
        identity: BTreeMap<String, String>,
    },
    /// Replace whole domains with the given documents (`sluicectl apply`): entries of those
    /// domains missing from the documents are deleted; other domains are untouched.
    Apply {
        /// Domain documents in the rule format.
        docs: Vec<Value>,
    },
    /// Make the state equal to what it was at an earlier version, as a new version.
    Rollback {
        /// The version to restore.
        to: u64,
    },
}

/// One of the three mode names. An alias, so serde does not take the field as borrowed
/// from the input (it is read by [`mode_de`]).
pub type ModeName = &'static str;

/// A mode read back from a held edit, as the one of the three names it is.
fn mode_de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let s = <String as serde::Deserialize>::deserialize(d)?;
    match s.as_str() {
        "enforce" => Ok("enforce"),
        "shadow" => Ok("shadow"),
        "off" => Ok("off"),
        other => Err(serde::de::Error::custom(format!("unknown mode {other:?}"))),
    }
}

impl Edit {
    /// The action name recorded in the change log.
    pub fn action(&self) -> &'static str {
        match self {
            Edit::PutRule { .. } => "put",
            Edit::DeleteRule { .. } => "delete",
            Edit::SetMode { mode, .. } => match *mode {
                "shadow" => "shadow",
                "off" => "off",
                _ => "enforce",
            },
            Edit::ShadowAll { .. } => "shadow-all",
            Edit::PutOverride { .. } => "put-override",
            Edit::DeleteOverride { .. } => "delete-override",
            Edit::Apply { .. } => "apply",
            Edit::Rollback { .. } => "rollback",
        }
    }
}

/// Why an edit cannot be made (before validation of the resulting set).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The rule or override does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request itself is wrong (ids disagree, domain ambiguous, limits exceeded).
    #[error("{0}")]
    BadRequest(String),
    /// Documents that are not a valid rule set (`apply`).
    #[error(transparent)]
    Invalid(#[from] sluice_core::rules::RulesError),
}

/// The domain an edit is about: the one given, else the only domain holding the rule, else
/// (when creating) the only domain there is.
pub fn resolve_domain(
    state: &State,
    given: Option<&str>,
    rule: Option<&str>,
    creating: bool,
) -> Result<String, EditError> {
    if let Some(d) = given {
        if d.is_empty() || d.len() > 128 {
            return Err(EditError::BadRequest(
                "domain must be 1 to 128 characters".into(),
            ));
        }
        return Ok(d.to_string());
    }
    if let Some(id) = rule {
        let ds = state.rule_domains(id);
        match ds.as_slice() {
            [one] => return Ok(one.to_string()),
            [] if !creating => {
                return Err(EditError::NotFound(format!("no rule {id:?}")));
            }
            [] => {}
            many => {
                return Err(EditError::BadRequest(format!(
                    "rule {id:?} exists in domains {}; say which with ?domain=NAME",
                    many.join(", ")
                )));
            }
        }
    }
    let domains = state.domains();
    match domains.len() {
        1 => Ok(domains.into_iter().next().unwrap_or_default().to_string()),
        0 => Err(EditError::BadRequest(
            "there are no domains yet: say which domain with ?domain=NAME".into(),
        )),
        _ => Err(EditError::BadRequest(format!(
            "there are several domains ({}); say which with ?domain=NAME",
            domains.into_iter().collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn identity_value(identity: &BTreeMap<String, String>) -> Value {
    Value::Object(
        identity
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<String, Value>>(),
    )
}

fn set_mode(body: &mut Value, mode: &str) -> bool {
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let current = obj.get("mode").and_then(Value::as_str).unwrap_or("enforce");
    if current == mode {
        return false;
    }
    obj.insert("mode".into(), Value::String(mode.to_string()));
    true
}

/// The state after `edit`. `past` is the state at the rollback's version (loaded by the
/// caller); unused by the other edits.
pub fn apply(state: &State, edit: &Edit, past: Option<&State>) -> Result<State, EditError> {
    let mut next = state.clone();
    match edit {
        Edit::PutRule { domain, id, body } => {
            let Some(obj) = body.as_object() else {
                return Err(EditError::BadRequest(
                    "the body must be a rule: a JSON object in the rule format".into(),
                ));
            };
            let mut obj = obj.clone();
            match obj.get("id") {
                None | Some(Value::Null) => {
                    obj.insert("id".into(), Value::String(id.clone()));
                }
                Some(Value::String(s)) if s == id => {}
                Some(other) => {
                    return Err(EditError::BadRequest(format!(
                        "the body's id {other} differs from the path's {id:?}"
                    )));
                }
            }
            let d = resolve_domain(state, domain.as_deref(), Some(id), true)?;
            let key = EntryKey::rule(&d, id);
            let position = state
                .entries
                .get(&key)
                .map_or_else(|| state.next_position(&d, Kind::Rule), |e| e.position);
            next.entries.insert(
                key,
                Entry {
                    position,
                    body: Value::Object(obj),
                },
            );
        }
        Edit::DeleteRule { domain, id } => {
            let d = resolve_domain(state, domain.as_deref(), Some(id), false)?;
            if next.entries.remove(&EntryKey::rule(&d, id)).is_none() {
                return Err(EditError::NotFound(format!(
                    "no rule {id:?} in domain {d:?}"
                )));
            }
        }
        Edit::SetMode { domain, id, mode } => {
            let d = resolve_domain(state, domain.as_deref(), Some(id), false)?;
            let Some(e) = next.entries.get_mut(&EntryKey::rule(&d, id)) else {
                return Err(EditError::NotFound(format!(
                    "no rule {id:?} in domain {d:?}"
                )));
            };
            set_mode(&mut e.body, mode);
        }
        Edit::ShadowAll { domain } => {
            for (k, e) in next.entries.iter_mut() {
                if k.kind == Kind::Rule && domain.as_deref().is_none_or(|d| d == k.domain) {
                    let enforcing = e
                        .body
                        .get("mode")
                        .and_then(Value::as_str)
                        .unwrap_or("enforce")
                        == "enforce";
                    if enforcing {
                        set_mode(&mut e.body, "shadow");
                    }
                }
            }
        }
        Edit::PutOverride {
            domain,
            rule,
            identity,
            body,
        } => {
            let Some(obj) = body.as_object() else {
                return Err(EditError::BadRequest(
                    "the body must be an override: a JSON object with limit / rate_per_s / rate / \
                     burst, or exempt: true"
                        .into(),
                ));
            };
            let mut obj = obj.clone();
            let want_identity = identity_value(identity);
            match obj.get("identity") {
                None | Some(Value::Null) => {
                    obj.insert("identity".into(), want_identity);
                }
                Some(given)
                    if override_key(&serde_json::json!({"identity": given}))
                        == override_key(&serde_json::json!({"identity": want_identity})) => {}
                Some(other) => {
                    return Err(EditError::BadRequest(format!(
                        "the body's identity {other} differs from the path's {want_identity}"
                    )));
                }
            }
            match (obj.get("rule"), rule) {
                (None | Some(Value::Null), Some(r)) => {
                    obj.insert("rule".into(), Value::String(r.clone()));
                }
                (None | Some(Value::Null), None) => {}
                (Some(Value::String(s)), Some(r)) if s == r => {}
                (Some(other), _) => {
                    return Err(EditError::BadRequest(format!(
                        "the body's rule {other} differs from the path's {}",
                        rule.as_deref().unwrap_or("*")
                    )));
                }
            }
            let d = resolve_domain(state, domain.as_deref(), rule.as_deref(), false)?;
            let body = Value::Object(obj);
            let Some(key) = override_key(&body) else {
                return Err(EditError::BadRequest(
                    "an override needs an identity: at least one name=value".into(),
                ));
            };
            let key = EntryKey::override_(&d, &key);
            let position = state
                .entries
                .get(&key)
                .map_or_else(|| state.next_position(&d, Kind::Override), |e| e.position);
            next.entries.insert(key, Entry { position, body });
        }
        Edit::DeleteOverride {
            domain,
            rule,
            identity,
        } => {
            let probe = serde_json::json!({"identity": identity_value(identity), "rule": rule});
            let Some(key) = override_key(&probe) else {
                return Err(EditError::BadRequest(
                    "an override is named by its rule and identity: at least one name=value".into(),
                ));
            };
            let d = match domain {
                Some(d) => d.clone(),
                None => {
                    let ds: Vec<&str> = state
                        .entries
                        .keys()
                        .filter(|k| k.kind == Kind::Override && k.key == key)
                        .map(|k| k.domain.as_str())
                        .collect();
                    match ds.as_slice() {
                        [one] => one.to_string(),
                        [] => return Err(EditError::NotFound(format!("no override {key:?}"))),
                        many => {
                            return Err(EditError::BadRequest(format!(
                                "override {key:?} exists in domains {}; say which with ?domain=NAME",
                                many.join(", ")
                            )));
                        }
                    }
                }
            };
            if next
                .entries
                .remove(&EntryKey::override_(&d, &key))
                .is_none()
            {
                return Err(EditError::NotFound(format!(
                    "no override {key:?} in domain {d:?}"
                )));
            }
        }
        Edit::Apply { docs } => {
            let incoming = State::from_docs(docs)?;
            let named: Vec<&str> = docs
                .iter()
                .filter_map(|d| d.get("domain").and_then(Value::as_str))
                .collect();
            next.entries
                .retain(|k, _| !named.contains(&k.domain.as_str()));
            next.entries.extend(incoming.entries);
        }
        Edit::Rollback { .. } => {
            let Some(past) = past else {
                return Err(EditError::BadRequest("no state to roll back to".into()));
            };
            next = past.clone();
        }
    }
    check_bounds(&next)?;
    Ok(next)
}

/// Per-domain counts and body sizes within the limits above.
fn check_bounds(state: &State) -> Result<(), EditError> {
    for d in state.domains() {
        let rules = state.list(d, Kind::Rule).len();
        if rules > MAX_RULES_PER_DOMAIN {
            return Err(EditError::BadRequest(format!(
                "domain {d:?} would hold {rules} rules; at most {MAX_RULES_PER_DOMAIN}"
            )));
        }
        let overrides = state.list(d, Kind::Override).len();
        if overrides > MAX_OVERRIDES_PER_DOMAIN {
            return Err(EditError::BadRequest(format!(
                "domain {d:?} would hold {overrides} overrides; at most {MAX_OVERRIDES_PER_DOMAIN}"
            )));
        }
    }
    for (k, e) in &state.entries {
        let size = e.body.to_string().len();
        if size > MAX_BODY_BYTES {
            return Err(EditError::BadRequest(format!(
                "{} {}/{} is {size} bytes; at most {MAX_BODY_BYTES}",
                k.kind.as_str(),
                k.domain,
                k.key
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> State {
        State::from_docs(&[json!({"domain": "api", "rules": [
            {"id": "login", "key": ["ip"], "algorithm": "sliding_window", "limit": 100, "window": "1m"},
            {"id": "pay", "key": ["api_key"], "algorithm": "token_bucket", "rate_per_s": 20, "burst": 40, "mode": "off"},
        ]})])
        .expect("valid")
    }

    #[test]
    fn every_edit_round_trips_through_json_as_a_held_change_stores_it() {
        let identity: BTreeMap<String, String> = [("ip".to_string(), "1.2.3.4".to_string())].into();
        let edits = [
            Edit::PutRule {
                domain: Some("api".into()),
                id: "login".into(),
                body: json!({"limit": 1}),
            },
            Edit::DeleteRule {
                domain: None,
                id: "login".into(),
            },
            Edit::SetMode {
                domain: None,
                id: "login".into(),
                mode: "off",
            },
            Edit::ShadowAll {
                domain: Some("api".into()),
            },
            Edit::PutOverride {
                domain: None,
                rule: Some("login".into()),
                identity: identity.clone(),
                body: json!({"limit": 5}),
            },
            Edit::DeleteOverride {
                domain: None,
                rule: None,
                identity,
            },
            Edit::Apply {
                docs: vec![json!({"domain": "api", "rules": []})],
            },
            Edit::Rollback { to: 3 },
        ];
        for e in edits {
            let v = serde_json::to_value(&e).expect("serializes");
            let back: Edit = serde_json::from_value(v.clone()).expect("reads back");
            assert_eq!(back, e, "{v}");
        }
        let bad = json!({"edit": "set_mode", "domain": null, "id": "x", "mode": "loud"});
        assert!(serde_json::from_value::<Edit>(bad).is_err());
    }

    #[test]
    fn put_infers_the_only_domain_and_keeps_the_position() {
        let s = base();
        let body =
            json!({"key": ["ip"], "algorithm": "sliding_window", "limit": 10, "window": "1m"});
        let edit = Edit::PutRule {
            domain: None,
            id: "login".into(),
            body,
        };
        let next = apply(&s, &edit, None).expect("ok");
        let e = &next.entries[&EntryKey::rule("api", "login")];
        assert_eq!(e.position, 0);
        assert_eq!(e.body["id"], "login");
        assert_eq!(e.body["limit"], 10);
        let new = Edit::PutRule {
            domain: None,
            id: "new".into(),
            body: json!({"key": [], "algorithm": "concurrency", "limit": 2}),
        };
        let next = apply(&s, &new, None).expect("ok");
        assert_eq!(next.entries[&EntryKey::rule("api", "new")].position, 2);
    }

    #[test]
    fn ids_that_disagree_and_ambiguous_domains_are_refused() {
        let s = base();
        let edit = Edit::PutRule {
            domain: None,
            id: "login".into(),
            body: json!({"id": "other"}),
        };
        assert!(matches!(
            apply(&s, &edit, None),
            Err(EditError::BadRequest(_))
        ));
        let mut two = s.clone();
        two.entries.insert(
            EntryKey::rule("web", "login"),
            s.entries[&EntryKey::rule("api", "login")].clone(),
        );
        let del = Edit::DeleteRule {
            domain: None,
            id: "login".into(),
        };
        let err = apply(&two, &del, None).expect_err("ambiguous");
        assert!(err.to_string().contains("?domain="), "{err}");
        let missing = Edit::DeleteRule {
            domain: None,
            id: "nope".into(),
        };
        assert!(matches!(
            apply(&s, &missing, None),
            Err(EditError::NotFound(_))
        ));
    }

    #[test]
    fn shadow_all_leaves_off_rules_off() {
        let next = apply(&base(), &Edit::ShadowAll { domain: None }, None).expect("ok");
        assert_eq!(
            next.entries[&EntryKey::rule("api", "login")].body["mode"],
            "shadow"
        );
        assert_eq!(
            next.entries[&EntryKey::rule("api", "pay")].body["mode"],
            "off"
        );
    }

    #[test]
    fn overrides_take_identity_and_rule_from_the_path() {
        let s = base();
        let identity: BTreeMap<String, String> =
            [("api_key".to_string(), "big".to_string())].into();
        let edit = Edit::PutOverride {
            domain: None,
            rule: Some("pay".into()),
            identity: identity.clone(),
            body: json!({"rate_per_s": 200, "burst": 400}),
        };
        let next = apply(&s, &edit, None).expect("ok");
        let key = EntryKey::override_("api", "pay/api_key=big");
        assert_eq!(next.entries[&key].body["identity"]["api_key"], "big");
        next.to_rule_set(1).expect("valid set");
        let del = Edit::DeleteOverride {
            domain: None,
            rule: Some("pay".into()),
            identity,
        };
        let back = apply(&next, &del, None).expect("ok");
        assert_eq!(back, s);
    }

    #[test]
    fn apply_replaces_named_domains_only() {
        let mut s = base();
        s.entries.insert(
            EntryKey::rule("web", "w"),
            Entry {
                position: 0,
                body: json!({"id": "w", "key": [], "algorithm": "concurrency", "limit": 1}),
            },
        );
        let docs = vec![json!({"domain": "api", "rules": [
            {"id": "login", "key": ["ip"], "algorithm": "sliding_window", "limit": 50, "window": "1m"}
        ]})];
        let next = apply(&s, &Edit::Apply { docs }, None).expect("ok");
        assert!(next.entries.contains_key(&EntryKey::rule("web", "w")));
        assert!(!next.entries.contains_key(&EntryKey::rule("api", "pay")));
        assert_eq!(
            next.entries[&EntryKey::rule("api", "login")].body["limit"],
            50
        );
    }
}
