//! A number picked by the value of one descriptor: the `{by, values, default}` shape in
//! which a rule writes its cost (units by route) and a fair share its table (a share by
//! plan). One type, so the lookup a request's cost and a tenant's share go through is the
//! same code.

/// `values[descriptor `by`]`, else `default`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ByValue {
    /// The descriptor whose value picks the number (`None`: `default` for every request).
    pub by: Option<String>,
    /// Numbers by the descriptor's value, in the order written.
    pub values: Vec<(String, u64)>,
    /// The number when the descriptor is absent or its value is not listed.
    pub default: u64,
}

impl ByValue {
    /// One number for every request.
    pub fn flat(n: u64) -> ByValue {
        ByValue {
            by: None,
            values: Vec::new(),
            default: n,
        }
    }

    /// The number for a request whose `by` descriptor has `value` (`None`: not carried).
    pub fn pick(&self, value: Option<&str>) -> u64 {
        value
            .and_then(|v| self.values.iter().find(|(k, _)| k == v))
            .map_or(self.default, |(_, n)| *n)
    }

    /// The largest number any request can get.
    pub fn max(&self) -> u64 {
        self.values
            .iter()
            .map(|(_, n)| *n)
            .fold(self.default, u64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_value_else_the_default() {
        let t = ByValue {
            by: Some("route".into()),
            values: vec![("GET /x".into(), 25), ("GET /y".into(), 1)],
            default: 2,
        };
        assert_eq!(t.pick(Some("GET /x")), 25);
        assert_eq!(t.pick(Some("GET /z")), 2);
        assert_eq!(t.pick(None), 2);
        assert_eq!(t.max(), 25);
        assert_eq!(ByValue::flat(3).pick(Some("GET /x")), 3);
        assert_eq!(ByValue::flat(3).max(), 3);
    }
}
