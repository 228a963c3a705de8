//! The admin API's error answer: an HTTP status, a stable code, a message, the validation
//! problems if any and whether a retry may help, as `{"error": {...}}`; and how store and
//! commit errors map to it.

use crate::store::CommitError;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error answer: status, stable code, message, and the validation problems if any.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    pub(super) code: &'static str,
    message: String,
    problems: Option<Value>,
    retryable: bool,
}

impl ApiError {
    pub(super) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            problems: None,
            retryable: false,
        }
    }

    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }

    pub(super) fn internal(message: &str) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> ApiError {
        let retryable = e.is_retryable();
        let (status, code) = if retryable {
            (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "DATABASE_ERROR")
        };
        ApiError {
            retryable,
            ..ApiError::new(status, code, e.to_string())
        }
    }
}

impl From<CommitError> for ApiError {
    fn from(e: CommitError) -> ApiError {
        let message = e.to_string();
        match e {
            CommitError::Db(db) => db.into(),
            CommitError::NotFound(_) => ApiError::not_found(message),
            CommitError::BadRequest(_) => ApiError::bad(message),
            CommitError::Invalid(rules) => ApiError {
                problems: Some(Value::Array(
                    rules
                        .problems
                        .iter()
                        .map(|p| json!({"at": p.at, "field": p.field, "message": p.message}))
                        .collect(),
                )),
                ..ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "INVALID_RULES", message)
            },
            CommitError::Tightening(msgs) => ApiError {
                problems: Some(json!(msgs)),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "TIGHTENING_REFUSED",
                    message,
                )
            },
            CommitError::SamePrincipal(_) => {
                ApiError::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", message)
            }
            CommitError::Decided(_) => ApiError::new(StatusCode::CONFLICT, "CONFLICT", message),
            CommitError::Expired(_) => ApiError::new(StatusCode::GONE, "EXPIRED", message),
            CommitError::Conflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "CONFLICT", message)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut err =
            json!({"code": self.code, "message": self.message, "retryable": self.retryable});
        if let Some(p) = self.problems {
            err["problems"] = p;
        }
        let mut resp = (self.status, axum::Json(json!({"error": err}))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"sluice-admin\""),
            );
        }
        resp
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn ok(v: Value) -> ApiResult {
    Ok(axum::Json(v).into_response())
}
