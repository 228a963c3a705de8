//! The `route` descriptor: a request's path matched against the gateway's path templates.
//!
//! Rules key on routes like `GET /v1/users/{id}`, not on raw paths: one counter per template,
//! not one per user id, and a client cannot dodge a route's limit by varying an id.

/// Why a path template was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    /// A template must be an absolute path.
    #[error("path template {0:?} does not start with '/'")]
    NotAbsolute(String),
    /// `{` and `}` may only wrap a whole segment (`/{id}`, not `/v{n}`).
    #[error("path template {0:?}: a parameter must be a whole segment, like /{{id}}")]
    Parameter(String),
}

/// One segment of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

/// One path template, split into segments.
#[derive(Debug, Clone)]
struct Template {
    text: String,
    segments: Vec<Segment>,
    literals: usize,
}

/// The configured path templates and the fallback for a path none matches.
#[derive(Debug, Clone)]
pub struct Routes {
    templates: Vec<Template>,
    fallback: String,
}

impl Routes {
    /// Parses `templates` (`/v1/users/{id}`); a path none matches is named `fallback` (`*`).
    pub fn new<I, S>(templates: I, fallback: &str) -> Result<Self, RouteError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let templates = templates
            .into_iter()
            .map(|t| parse(t.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Routes {
            templates,
            fallback: fallback.to_string(),
        })
    }

    /// No templates: every path is `fallback`.
    pub fn fallback_only(fallback: &str) -> Self {
        Routes {
            templates: Vec::new(),
            fallback: fallback.to_string(),
        }
    }

    /// The template `path` matches, or the fallback. When several match, the one with the
    /// most literal segments wins (`/v1/users/me` before `/v1/users/{id}`), then the first.
    pub fn path_template(&self, path: &str) -> &str {
        let mut best: Option<&Template> = None;
        for t in &self.templates {
            if matches(t, path) && best.is_none_or(|b| t.literals > b.literals) {
                best = Some(t);
            }
        }
        best.map_or(&self.fallback, |t| &t.text)
    }

    /// The `route` descriptor: `METHOD template`.
    pub fn route(&self, method: &http::Method, path: &str) -> String {
        format!("{} {}", method.as_str(), self.path_template(path))
    }
}

fn parse(text: &str) -> Result<Template, RouteError> {
    let Some(rest) = text.strip_prefix('/') else {
        return Err(RouteError::NotAbsolute(text.to_string()));
    };
    let mut segments = Vec::new();
    for seg in rest.split('/') {
        if seg.len() >= 2 && seg.starts_with('{') && seg.ends_with('}') {
            let inner = &seg[1..seg.len() - 1];
            if inner.contains(['{', '}']) {
                return Err(RouteError::Parameter(text.to_string()));
            }
            segments.push(Segment::Param);
        } else if seg.contains(['{', '}']) {
            return Err(RouteError::Parameter(text.to_string()));
        } else {
            segments.push(Segment::Literal(seg.to_string()));
        }
    }
    let literals = segments
        .iter()
        .filter(|s| matches!(s, Segment::Literal(_)))
        .count();
    Ok(Template {
        text: text.to_string(),
        segments,
        literals,
    })
}

fn matches(t: &Template, path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let mut parts = rest.split('/');
    for seg in &t.segments {
        match (seg, parts.next()) {
            (_, None) => return false,
            (Segment::Param, Some("")) => return false,
            (Segment::Param, Some(_)) => {}
            (Segment::Literal(l), Some(p)) if l != p => return false,
            (Segment::Literal(_), Some(_)) => {}
        }
    }
    parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn routes() -> Routes {
        Routes::new(
            [
                "/v1/users/{id}",
                "/v1/users/me",
                "/v1/orders/{id}/items/{item}",
                "/",
            ],
            "*",
        )
        .expect("valid")
    }

    #[test]
    fn a_parameter_matches_one_non_empty_segment() {
        let r = routes();
        assert_eq!(r.route(&Method::GET, "/v1/users/42"), "GET /v1/users/{id}");
        assert_eq!(
            r.route(&Method::POST, "/v1/orders/7/items/x"),
            "POST /v1/orders/{id}/items/{item}"
        );
        assert_eq!(r.path_template("/v1/users/"), "*");
        assert_eq!(r.path_template("/v1/users/42/extra"), "*");
        assert_eq!(r.path_template("/v1/users"), "*");
        assert_eq!(r.path_template("/"), "/");
    }

    #[test]
    fn literals_beat_parameters() {
        assert_eq!(routes().path_template("/v1/users/me"), "/v1/users/me");
    }

    #[test]
    fn no_template_gives_the_fallback() {
        let r = routes();
        assert_eq!(r.route(&Method::DELETE, "/admin"), "DELETE *");
        let none = Routes::new(Vec::<String>::new(), "*").expect("valid");
        assert_eq!(none.route(&Method::GET, "/v1/users/1"), "GET *");
    }

    #[test]
    fn bad_templates_are_refused() {
        assert_eq!(
            Routes::new(["v1/users"], "*").err(),
            Some(RouteError::NotAbsolute("v1/users".into()))
        );
        assert_eq!(
            Routes::new(["/v{n}/users"], "*").err(),
            Some(RouteError::Parameter("/v{n}/users".into()))
        );
    }
}
