//! Routes a daemon adds to its admin listener beside the rule API (the decision log's
//! `GET /v1/decisions`), behind the same tokens: one auth layer, never a second copy.

use super::AdminState;
use super::auth::authenticate;
use axum::Router;
use axum::middleware;

/// `routes` behind the admin API's tokens (the read token for `GET`, the admin token for the
/// rest), ready to merge into [`router`](super::router)'s answer.
pub fn behind_tokens(state: &AdminState, routes: Router) -> Router {
    routes.layer(middleware::from_fn_with_state(state.clone(), authenticate))
}
