//! Integration tests: each test starts the real gateway on a free port against its own
//! PostgreSQL database and Redis key prefix, drives it over HTTP and checks the database.
//!
//! Needs PostgreSQL (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`),
//! Redis (`REDIS_URL`, default `redis://127.0.0.1:6379`) and `redis-server` on `PATH`.
//! Run with `cargo nextest run --test api` (one process per test).

mod helpers;

mod admin;
mod bad_requests;
mod batch_model;
mod cancel_expiry;
mod cli_deals;
mod cli_migrate;
mod cli_pipes;
mod clock_reads;
mod concurrency;
mod config_docs;
mod config_env;
mod dashboard_docs;
mod dashboard_render;
mod deals;
mod demo;
mod failover;
mod faults;
mod front;
mod gateway_dependencies;
mod global_limits;
mod grouping;
mod health;
mod idempotency;
mod lanes;
mod metrics_docs;
mod metrics_lifecycle;
mod model;
mod multi_process;
mod negative_cache;
mod oidc;
mod openapi_links;
mod ops_audit;
mod ops_cli;
mod ops_dashboard;
mod ops_listener;
mod ops_pause;
mod ops_queue_cli;
mod ops_rebalance;
mod orders;
mod ownership;
mod payments_breaker;
mod payments_capture_races;
mod payments_checkout;
mod payments_expiry;
mod payments_expiry_bound;
mod payments_manual_review;
mod payments_mismatch;
mod payments_provider_faults;
mod payments_refund_failures;
mod payments_secrets;
mod payments_snapshot;
mod payments_soak;
mod payments_tls;
mod payments_webhooks;
mod pipelining;
mod pooled_writes;
mod postgres_read_only;
mod problem_types;
mod rate_limits;
mod redis_health;
mod redis_outage;
mod request_id;
mod shutdown;
mod soldout_refresh;
mod source_sizes;
mod sql_functions;
mod startup_errors;
mod sweeper_crash;
mod tiers;
mod waiting_room;
mod waiting_room_adaptive;
mod waiting_room_edge;
mod waiting_room_idle;
mod waiting_room_keys;
mod waiting_room_multi;
mod waiting_room_page;
mod waiting_room_revoke;
