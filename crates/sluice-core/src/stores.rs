//! Which counter store an applied rule's counts live in.
//!
//! A daemon may run named stores beside its main one (another Redis or Redis Cluster for a
//! tenant that is a large share of all traffic), so that tenant's load and its store's bad
//! day stay on its own shards. A rule names a store with `store:`, and an override can move
//! one identity's counts of a rule to another. Which store an applied rule uses is decided
//! here, once, so the daemon and anything else running the core choose alike.
//!
//! The core does not know the daemon's configuration: [`unknown`] lists the names a rule set
//! uses that a given configuration lacks, and the daemon refuses such a set as a whole.

use crate::hotkeys::{HotKeys, LeaseMode};
use crate::rules::{Override, Rule, RuleSet};

/// The main store's name: in metrics labels, and in `store: default`, which an override
/// uses to keep one identity on the main store when its rule names another.
pub const DEFAULT: &str = "default";

/// Whether `name` can name a store: 1 to 64 of `a-z 0-9 _ -` (it becomes a metrics label
/// value and a config key, so it is kept plain).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The problem with a written `store:` value, if any: the message validation reports under
/// the field `store`.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    (!valid_name(name))
        .then(|| format!("{name:?} is not a store name (1 to 64 characters of a-z 0-9 _ -)"))
}

/// The store an applied rule uses: the override's when it names one, else the rule's;
/// `None` is the main store (`store: default` included).
pub fn chosen<'a>(rule: &'a Rule, ov: Option<&'a Override>) -> Option<&'a str> {
    ov.and_then(|o| o.store.as_deref())
        .or(rule.store.as_deref())
        .filter(|s| *s != DEFAULT)
}

/// Why a rule's `hot_keys` block cannot count in a named store, if it cannot: leases,
/// the sync gate and local shares hand units to the store later, outside the request
/// that chose it, and those background calls reach only the main store.
pub(crate) fn hot_keys_conflict(h: &HotKeys) -> Option<&'static str> {
    if h.lease != LeaseMode::Off {
        Some("hot_keys.lease")
    } else if h.sync_interval.is_some() {
        Some("hot_keys.sync_interval")
    } else if h.local_share {
        Some("hot_keys.local_share")
    } else {
        None
    }
}

/// The sentence validation reports for [`hot_keys_conflict`].
pub(crate) fn hot_keys_message(what: &str) -> String {
    format!(
        "a named store cannot be used with {what}: its units reach the store in background calls, which go to the main store only"
    )
}

/// One place a rule set names a store other than the main one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use<'a> {
    /// The domain.
    pub domain: &'a str,
    /// `rule "pay"` or `override 2 (rule "pay")`.
    pub at: String,
    /// The store named.
    pub store: &'a str,
}

/// Every place `set` names a store other than [`DEFAULT`], in domain and file order.
pub fn uses(set: &RuleSet) -> Vec<Use<'_>> {
    let mut out = Vec::new();
    for (name, d) in &set.domains {
        for r in &d.rules {
            if let Some(s) = r.store.as_deref().filter(|s| *s != DEFAULT) {
                out.push(Use {
                    domain: name,
                    at: format!("rule {:?}", &*r.id),
                    store: s,
                });
            }
        }
        for (i, o) in d.overrides.iter().enumerate() {
            if let Some(s) = o.store.as_deref().filter(|s| *s != DEFAULT) {
                out.push(Use {
                    domain: name,
                    at: format!(
                        "overrides[{i}] (rule {:?})",
                        o.rule.as_deref().unwrap_or_default()
                    ),
                    store: s,
                });
            }
        }
    }
    out
}

/// Each place `set` names a store `known` does not have, as a sentence naming the domain,
/// the rule or override and the store: empty when the set can be served.
pub fn unknown(set: &RuleSet, known: impl Fn(&str) -> bool) -> Vec<String> {
    uses(set)
        .into_iter()
        .filter(|u| !known(u.store))
        .map(|u| {
            format!(
                "domain {:?}: {} names store {:?}, which this daemon's config does not define (stores:)",
                u.domain, u.at, u.store
            )
        })
        .collect()
}
