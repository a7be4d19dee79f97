//! The operator's actions on endpoints and the pull feed, each one call for the admin API
//! and the CLI: checks the input against the settings, then asks the owner of the rows.

use sqlx::PgPool;
use uuid::Uuid;

use super::endpoints::{self, Changes, Endpoint, EndpointView};
use super::feed::{self, Event};
use super::{EventError, EventSettings, target};

/// What an operator asks for when creating or changing an endpoint.
#[derive(Debug, Default, Clone)]
pub struct EndpointInput {
    pub url: Option<String>,
    /// `Some(None)`: every type.
    pub event_types: Option<Option<Vec<String>>>,
    pub enabled: Option<bool>,
}

impl EndpointInput {
    /// The checked changes: the URL's target, the types known.
    fn checked(self, settings: &EventSettings) -> Result<Changes, EventError> {
        if let Some(url) = &self.url {
            target::parse(url, settings.url_bytes_max, settings.allow_private_targets)?;
        }
        if let Some(Some(types)) = &self.event_types {
            endpoints::check_types(types)?;
        }
        Ok(Changes {
            url: self.url,
            event_types: self.event_types,
            enabled: self.enabled,
        })
    }
}

/// A page of the feed and the cursor to ask for next (`None` at the end).
#[derive(Debug)]
pub struct Page {
    pub events: Vec<Event>,
    pub next: Option<String>,
}

/// Adds an endpoint; its secret is in the answer.
pub async fn create(
    pool: &PgPool,
    settings: &EventSettings,
    input: EndpointInput,
) -> Result<Endpoint, EventError> {
    let url = input
        .url
        .clone()
        .ok_or_else(|| EventError::Invalid("url is required".into()))?;
    let changes = input.checked(settings)?;
    endpoints::create(pool, &url, &changes).await
}

/// Every endpoint with its backlog.
pub async fn list(pool: &PgPool) -> Result<Vec<EndpointView>, EventError> {
    let mut views = Vec::new();
    for endpoint in endpoints::list(pool).await? {
        views.push(endpoints::view(pool, endpoint).await?);
    }
    Ok(views)
}

/// One endpoint with its backlog.
pub async fn show(pool: &PgPool, id: Uuid) -> Result<EndpointView, EventError> {
    let endpoint = endpoints::get(pool, id).await?;
    Ok(endpoints::view(pool, endpoint).await?)
}

/// Changes an endpoint's URL, filter or enabled flag.
pub async fn update(
    pool: &PgPool,
    settings: &EventSettings,
    id: Uuid,
    input: EndpointInput,
) -> Result<EndpointView, EventError> {
    let changes = input.checked(settings)?;
    let endpoint = endpoints::update(pool, id, &changes).await?;
    Ok(endpoints::view(pool, endpoint).await?)
}

/// Removes an endpoint.
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<(), EventError> {
    endpoints::delete(pool, id).await
}

/// A new secret; the old one keeps signing for `overlap_seconds`.
pub async fn rotate_secret(
    pool: &PgPool,
    settings: &EventSettings,
    id: Uuid,
    overlap_seconds: u64,
) -> Result<Vec<u8>, EventError> {
    if overlap_seconds > settings.rotation_overlap_seconds_max {
        return Err(EventError::Invalid(format!(
            "overlap_seconds must be at most {} (events.rotation_overlap_seconds_max)",
            settings.rotation_overlap_seconds_max
        )));
    }
    endpoints::rotate(pool, id, overlap_seconds).await
}

/// Sends the endpoint every event after `after` again (all kept events without it), and
/// takes it back if it was failing.
pub async fn replay(
    pool: &PgPool,
    id: Uuid,
    after: Option<&str>,
) -> Result<EndpointView, EventError> {
    let position = match after {
        Some(cursor) => feed::resolve_cursor(pool, cursor).await?,
        None => 0,
    };
    let endpoint = endpoints::replay(pool, id, position).await?;
    Ok(endpoints::view(pool, endpoint).await?)
}

/// Up to `limit` events after the cursor (from the oldest kept without one).
pub async fn page(
    pool: &PgPool,
    settings: &EventSettings,
    after: Option<&str>,
    limit: Option<i64>,
) -> Result<Page, EventError> {
    let limit = limit.unwrap_or(100);
    if !(1..=settings.page_limit_max).contains(&limit) {
        return Err(EventError::Invalid(format!(
            "limit must be between 1 and {} (events.page_limit_max)",
            settings.page_limit_max
        )));
    }
    let position = match after {
        Some(cursor) => feed::resolve_cursor(pool, cursor).await?,
        None => 0,
    };
    let events = feed::after(pool, position, limit, None).await?;
    let next = (events.len() as i64 == limit)
        .then(|| events.last().map(|e| e.position.to_string()))
        .flatten();
    Ok(Page { events, next })
}
