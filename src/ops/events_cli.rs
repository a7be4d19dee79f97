//! `flashgate events …` and `flashgate event-endpoints …`: the pull feed and the endpoints
//! from the command line, straight on PostgreSQL through the same calls as the admin API
//! (`events::manage`), so they work with no gateway running. Output is JSON.

use clap::Subcommand;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::cli_settings::CliSettings;
use crate::events::endpoints::{Endpoint, EndpointView};
use crate::events::manage::{self, EndpointInput};
use crate::events::{EventSettings, TYPES, signing};
use crate::store::Pools;

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Events in commit order after a cursor (a `next`, or an event's id), oldest kept first.
    List {
        /// Where to go on from: a page's `next`, or the id of the last event seen.
        #[arg(long)]
        after: Option<String>,
        /// Most events to print.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
}

#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// Add an endpoint; prints its `whsec_` secret (shown this once).
    Create {
        /// Where events are sent (http or https).
        #[arg(long)]
        url: String,
        /// Only these types (repeat the option); every type when left out.
        #[arg(long = "event-type", value_name = "TYPE")]
        event_types: Vec<String>,
        /// Save it without sending anything yet.
        #[arg(long)]
        disabled: bool,
    },
    /// Every endpoint, with its state and backlog.
    List,
    /// One endpoint, with its state and backlog.
    Show {
        /// The endpoint's id.
        id: Uuid,
    },
    /// Change an endpoint's URL, types or enabled flag.
    Update {
        /// The endpoint's id.
        id: Uuid,
        /// Where events are sent from now on (http or https).
        #[arg(long)]
        url: Option<String>,
        /// Only these types from now on (repeat the option).
        #[arg(long = "event-type", value_name = "TYPE")]
        event_types: Vec<String>,
        /// Every type from now on.
        #[arg(long, conflicts_with = "event_types")]
        all_types: bool,
        /// `true` or `false`; enabling a failing endpoint makes it active again.
        #[arg(long)]
        enabled: Option<bool>,
    },
    /// Remove an endpoint (its events stay in the feed).
    Delete {
        /// The endpoint's id.
        id: Uuid,
    },
    /// A new secret; the old one keeps signing beside it for the overlap.
    RotateSecret {
        /// The endpoint's id.
        id: Uuid,
        /// Seconds the old secret keeps signing beside the new one.
        #[arg(long, default_value_t = 86400)]
        overlap_seconds: u64,
    },
    /// Send everything after a cursor again (every kept event without one), and take a
    /// failing endpoint back.
    Replay {
        /// The endpoint's id.
        id: Uuid,
        /// Send what came after this cursor (a `next`, or an event's id).
        #[arg(long)]
        after: Option<String>,
    },
}

async fn admin_pool(settings: &CliSettings) -> Result<PgPool, String> {
    Pools::connect(&settings.database)
        .await
        .map(|pools| pools.admin)
        .map_err(|e| e.to_string())
}

/// Runs one `flashgate events …` command.
pub async fn events(settings: &CliSettings, command: EventsCommand) -> Result<(), String> {
    let pool = admin_pool(settings).await?;
    let EventsCommand::List { after, limit } = command;
    let page = manage::page(&pool, &settings.events, after.as_deref(), Some(limit)).await;
    pool.close().await;
    let page = page.map_err(|e| e.to_string())?;
    let events: Vec<Value> = page.events.iter().map(|e| e.entry()).collect();
    super::output::json(&json!({"events": events, "next": page.next}))
}

/// Runs one `flashgate event-endpoints …` command.
pub async fn endpoints(settings: &CliSettings, command: EndpointsCommand) -> Result<(), String> {
    let pool = admin_pool(settings).await?;
    let answer = run(&pool, &settings.events, command).await;
    pool.close().await;
    super::output::json(&answer.map_err(|e| e.to_string())?)
}

async fn run(
    pool: &PgPool,
    settings: &EventSettings,
    command: EndpointsCommand,
) -> Result<Value, crate::events::EventError> {
    Ok(match command {
        EndpointsCommand::Create {
            url,
            event_types,
            disabled,
        } => {
            let input = EndpointInput {
                url: Some(url),
                event_types: Some((!event_types.is_empty()).then_some(event_types)),
                enabled: Some(!disabled),
            };
            let endpoint = manage::create(pool, settings, input).await?;
            let mut shown = endpoint_json(&endpoint);
            shown["secret"] = json!(signing::render(&endpoint.secret));
            shown
        }
        EndpointsCommand::List => {
            let views = manage::list(pool).await?;
            json!({"endpoints": views.iter().map(view_json).collect::<Vec<_>>()})
        }
        EndpointsCommand::Show { id } => view_json(&manage::show(pool, id).await?),
        EndpointsCommand::Update {
            id,
            url,
            event_types,
            all_types,
            enabled,
        } => {
            let types = match (all_types, event_types.is_empty()) {
                (true, _) => Some(None),
                (false, false) => Some(Some(event_types)),
                (false, true) => None,
            };
            let input = EndpointInput {
                url,
                event_types: types,
                enabled,
            };
            view_json(&manage::update(pool, settings, id, input).await?)
        }
        EndpointsCommand::Delete { id } => {
            manage::delete(pool, id).await?;
            json!({"id": id, "deleted": true})
        }
        EndpointsCommand::RotateSecret {
            id,
            overlap_seconds,
        } => {
            let secret = manage::rotate_secret(pool, settings, id, overlap_seconds).await?;
            json!({"id": id, "secret": signing::render(&secret)})
        }
        EndpointsCommand::Replay { id, after } => {
            view_json(&manage::replay(pool, id, after.as_deref()).await?)
        }
    })
}

fn endpoint_json(endpoint: &Endpoint) -> Value {
    let types: Vec<&str> = match &endpoint.event_types {
        Some(types) => types.iter().map(String::as_str).collect(),
        None => TYPES.to_vec(),
    };
    json!({"id": endpoint.id, "url": endpoint.url, "event_types": types, "enabled": endpoint.enabled})
}

fn view_json(view: &EndpointView) -> Value {
    let mut shown = endpoint_json(&view.endpoint);
    shown["state"] = json!(view.endpoint.state);
    shown["pending"] = json!(view.pending);
    shown["oldest_pending_seconds"] = json!(view.oldest_pending_seconds);
    shown["last_error"] = json!(view.endpoint.last_error);
    shown
}
