//! The reservation engine against the real PostgreSQL: a batch of one order per statement
//! at 1, 8 and 32 buckets, and batches of 32 and 128 orders per statement (time per order).
//!
//! Needs PostgreSQL (`DATABASE_URL`, default the local `test` database); creates and drops
//! its own database. Run with `cargo bench --bench reservation`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flashgate::deals::{self, NewDeal};
use flashgate::domain::DealId;
use flashgate::orders::batch::{BatchOptions, Request, place_batch};
use flashgate::orders::fingerprint;
use tokio::runtime::Runtime;

#[path = "support/database.rs"]
mod database;

use database::BenchDatabase;

const STOCK: i64 = 100_000_000;

struct Bench {
    runtime: Runtime,
    database: BenchDatabase,
}

fn setup() -> Bench {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let database = runtime.block_on(BenchDatabase::create());
    Bench { runtime, database }
}

fn deal(bench: &Bench, id: &str, buckets: i32) -> Arc<deals::Deal> {
    let new = NewDeal {
        id: DealId::parse(id).unwrap(),
        name: id.into(),
        stock: STOCK,
        buckets,
        unit_price_minor: 100,
        currency: "EUR".into(),
        per_user_limit: 1,
        reservation_ttl_seconds: 3600,
        starts_at: None,
        ends_at: None,
        payment_terms: Default::default(),
        waiting_room: Default::default(),
    };
    Arc::new(
        bench
            .runtime
            .block_on(deals::create(&bench.database.pool, &new))
            .unwrap(),
    )
}

fn requests(counter: &AtomicU64, deal: &str, size: usize) -> Vec<Request> {
    (0..size)
        .map(|_| {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            Request {
                user_id: format!("u{n}"),
                key: "k".into(),
                quantity: 1,
                fingerprint: fingerprint(deal, 1),
            }
        })
        .collect()
}

fn single(c: &mut Criterion, bench: &Bench) {
    let counter = AtomicU64::new(0);
    for buckets in [1, 8, 32] {
        let deal = deal(bench, &format!("single-{buckets}"), buckets);
        c.bench_function(&format!("reservation/batch_of_1/{buckets}_buckets"), |b| {
            b.iter(|| {
                let batch = requests(&counter, &deal.id, 1);
                let options = BatchOptions::default();
                bench
                    .runtime
                    .block_on(place_batch(&bench.database.pool, &deal, &batch, &options))
                    .unwrap()
            })
        });
    }
}

fn batched(c: &mut Criterion, bench: &Bench) {
    let counter = AtomicU64::new(0);
    for size in [32usize, 128] {
        let deal = deal(bench, &format!("batched-{size}"), 32);
        c.bench_function(
            &format!("reservation/batch_of_{size}/32_buckets (time per order)"),
            |b| {
                b.iter_custom(|iterations| {
                    let batches = iterations.div_ceil(size as u64);
                    let started = Instant::now();
                    for _ in 0..batches {
                        let batch = requests(&counter, &deal.id, size);
                        let options = BatchOptions::default();
                        bench
                            .runtime
                            .block_on(place_batch(&bench.database.pool, &deal, &batch, &options))
                            .unwrap();
                    }
                    started
                        .elapsed()
                        .div_f64((batches * size as u64) as f64 / iterations as f64)
                })
            },
        );
    }
}

fn reservation(c: &mut Criterion) {
    let bench = setup();
    single(c, &bench);
    batched(c, &bench);
    bench.runtime.block_on(bench.database.drop());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = reservation
}
criterion_main!(benches);
