//! The admin API of the order and deal events: endpoints to push to, and the feed to pull.
//! Each handler parses, makes one call to `events::manage`, and renders.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::State;
use super::admin::admin_json;
use super::body::{self, Caching};
use super::guard::{record, require_admin};
use super::problem::Problem;
use crate::events::endpoints::{Endpoint, EndpointView};
use crate::events::manage::{self, EndpointInput};
use crate::events::{TYPES, signing};

type Reply = Result<Response<Full<Bytes>>, Problem>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointBody {
    #[serde(default)]
    url: Option<String>,
    /// Absent: unchanged (or every type, on create); `null`: every type.
    #[serde(default, deserialize_with = "present")]
    event_types: Option<Option<Vec<String>>>,
    #[serde(default)]
    enabled: Option<bool>,
}

/// Tells a field given as `null` from an absent one.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

impl From<EndpointBody> for EndpointInput {
    fn from(body: EndpointBody) -> Self {
        Self {
            url: body.url,
            event_types: body.event_types,
            enabled: body.enabled,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    #[serde(deserialize_with = "super::integer::exact")]
    overlap_seconds: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    after: Option<String>,
}

#[derive(Serialize)]
struct View<'a> {
    id: Uuid,
    url: &'a str,
    event_types: Vec<&'a str>,
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_pending_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<&'a str>,
}

impl<'a> View<'a> {
    fn of(endpoint: &'a Endpoint) -> Self {
        let event_types = match &endpoint.event_types {
            Some(types) => types.iter().map(String::as_str).collect(),
            None => TYPES.to_vec(),
        };
        Self {
            id: endpoint.id,
            url: &endpoint.url,
            event_types,
            enabled: endpoint.enabled,
            secret: None,
            state: None,
            pending: None,
            oldest_pending_seconds: None,
            last_error: None,
        }
    }

    fn with_backlog(view: &'a EndpointView) -> Self {
        Self {
            state: Some(&view.endpoint.state),
            pending: Some(view.pending),
            oldest_pending_seconds: Some(view.oldest_pending_seconds),
            last_error: view.endpoint.last_error.as_deref(),
            ..Self::of(&view.endpoint)
        }
    }
}

/// `POST /admin/event-endpoints`: 201 with the secret, shown this once.
pub async fn create(state: &State, request: Request<Incoming>) -> Reply {
    let (operator, asked): (_, EndpointBody) = admin_json(state, request).await?;
    let settings = &state.settings.events;
    let endpoint = manage::create(&state.pools.admin, settings, asked.into()).await?;
    let detail = serde_json::json!({"url": endpoint.url});
    record(
        state,
        &operator,
        "endpoint.created",
        &endpoint.id.to_string(),
        detail,
    )
    .await;
    let view = View {
        secret: Some(signing::render(&endpoint.secret)),
        ..View::of(&endpoint)
    };
    Ok(body::respond(StatusCode::CREATED, &view, Caching::Private))
}

/// `GET /admin/event-endpoints`.
pub async fn list<B>(state: &State, request: &Request<B>) -> Reply {
    require_admin(state, request).await?;
    let views = manage::list(&state.pools.admin).await?;
    let endpoints: Vec<View> = views.iter().map(View::with_backlog).collect();
    let answer = serde_json::json!({ "endpoints": endpoints });
    Ok(body::respond(StatusCode::OK, &answer, Caching::Private))
}

/// `GET`, `PATCH` and `DELETE /admin/event-endpoints/{id}`.
pub async fn one(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let method = request.method().clone();
    if method == Method::PATCH {
        let (operator, asked): (_, EndpointBody) = admin_json(state, request).await?;
        let id = endpoint_id(raw_id)?;
        let view =
            manage::update(&state.pools.admin, &state.settings.events, id, asked.into()).await?;
        let target = id.to_string();
        record(
            state,
            &operator,
            "endpoint.updated",
            &target,
            Value::Object(Default::default()),
        )
        .await;
        return Ok(body::respond(
            StatusCode::OK,
            &View::with_backlog(&view),
            Caching::Private,
        ));
    }
    let operator = require_admin(state, &request).await?;
    let id = endpoint_id(raw_id)?;
    if method == Method::DELETE {
        manage::delete(&state.pools.admin, id).await?;
        let target = id.to_string();
        record(
            state,
            &operator,
            "endpoint.deleted",
            &target,
            Value::Object(Default::default()),
        )
        .await;
        return Ok(body::text(
            StatusCode::NO_CONTENT,
            "text/plain",
            String::new(),
        ));
    }
    let view = manage::show(&state.pools.admin, id).await?;
    Ok(body::respond(
        StatusCode::OK,
        &View::with_backlog(&view),
        Caching::Private,
    ))
}

/// `POST /admin/event-endpoints/{id}/rotate-secret`.
pub async fn rotate(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, asked): (_, RotateBody) = admin_json(state, request).await?;
    let id = endpoint_id(raw_id)?;
    let overlap = u64::try_from(asked.overlap_seconds)
        .map_err(|_| Problem::invalid("overlap_seconds must not be negative"))?;
    let settings = &state.settings.events;
    let secret = manage::rotate_secret(&state.pools.admin, settings, id, overlap).await?;
    let detail = serde_json::json!({"overlap_seconds": overlap});
    record(
        state,
        &operator,
        "endpoint.secret_rotated",
        &id.to_string(),
        detail,
    )
    .await;
    let answer = serde_json::json!({ "secret": signing::render(&secret) });
    Ok(body::respond(StatusCode::OK, &answer, Caching::Private))
}

/// `POST /admin/event-endpoints/{id}/replay`.
pub async fn replay(state: &State, request: Request<Incoming>, raw_id: &str) -> Reply {
    let (operator, asked): (_, ReplayBody) = admin_json(state, request).await?;
    let id = endpoint_id(raw_id)?;
    let view = manage::replay(&state.pools.admin, id, asked.after.as_deref()).await?;
    let detail = serde_json::json!({"after": asked.after});
    record(
        state,
        &operator,
        "endpoint.replayed",
        &id.to_string(),
        detail,
    )
    .await;
    Ok(body::respond(
        StatusCode::OK,
        &View::with_backlog(&view),
        Caching::Private,
    ))
}

/// `GET /admin/events?after=<cursor>&limit=N`.
pub async fn feed<B>(state: &State, request: &Request<B>) -> Reply {
    require_admin(state, request).await?;
    let (mut after, mut limit) = (None, None);
    for (key, value) in url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
    {
        match key.as_ref() {
            "after" => after = Some(value.into_owned()),
            "limit" => {
                let parsed = value
                    .parse::<i64>()
                    .map_err(|_| Problem::invalid("limit must be an integer"))?;
                limit = Some(parsed);
            }
            other => {
                return Err(Problem::invalid(format!(
                    "unknown query parameter {other:?}"
                )));
            }
        }
    }
    let settings = &state.settings.events;
    let page = manage::page(&state.pools.admin, settings, after.as_deref(), limit).await?;
    let events: Vec<Value> = page.events.iter().map(|e| e.entry()).collect();
    let answer = serde_json::json!({ "events": events, "next": page.next });
    Ok(body::respond(StatusCode::OK, &answer, Caching::Private))
}

fn endpoint_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw).map_err(|_| Problem::not_found("no such endpoint"))
}
