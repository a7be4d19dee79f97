//! The admission hot path, piece by piece: every check a rejected request pays for.
//!
//! Run with `cargo bench --bench admission`.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flashgate::admission::client_ip::ClientIp;
use flashgate::admission::limits::RateLimits;
use flashgate::admission::soldout::SoldOut;
use flashgate::admission::token::{TokenVerifier, mint_token};
use flashgate::admission::user_share::{Answer, UserShares};
use flashgate::admission::{LimitSettings, RateSettings};
use flashgate::clock::{Clock, ManualClock};
use flashgate::domain::{OrderEvent, OrderStatus};
use flashgate::http::problem::Problem;
use flashgate::http::request_id::RequestId;
use flashgate::redis_link::{RedisHandle, RedisTimeouts};
use flashgate::waiting_room::{Challenges, Passes, challenge};

fn client_ip(c: &mut Criterion) {
    let resolver = ClientIp::new(vec![
        "10.0.0.0/8".parse().unwrap(),
        "127.0.0.1/32".parse().unwrap(),
    ]);
    let peer: IpAddr = "10.1.2.3".parse().unwrap();
    let header = b"203.0.113.50, 198.51.100.7, 10.9.9.9".as_slice();
    c.bench_function("client_ip/x_forwarded_for_trusted_peer", |b| {
        b.iter(|| resolver.resolve(black_box(peer), std::iter::once(black_box(header))))
    });
}

fn limiters(c: &mut Criterion) {
    let generous = RateSettings {
        rate_per_second: u32::MAX / 2,
        burst: u32::MAX / 2,
    };
    let limits = RateLimits::new(&LimitSettings {
        retain_interval_ms: 10_000,
        per_ip: generous,
        per_user: generous,
        per_deal: generous,
        global: flashgate::admission::GlobalLimitSettings {
            enabled: false,
            deal_slice: 1,
            slice_ttl_ms: 50,
            heartbeat_interval_ms: 1000,
            instance_ttl_ms: 5000,
            instances_assumed: 1,
            user_batch_max: 64,
            user_queue_max: 4096,
            user_share_percent: 50,
        },
    });
    let ips: Vec<IpAddr> = (0..1024u32)
        .map(|i| IpAddr::from((0xc000_0200u32 + i).to_be_bytes()))
        .collect();
    let mut i = 0;
    c.bench_function("limits/per_ip_1024_keys", |b| {
        b.iter(|| {
            i = (i + 1) % ips.len();
            limits.check_ip(black_box(ips[i]))
        })
    });
    c.bench_function("limits/per_user", |b| {
        b.iter(|| limits.check_user(black_box("user-42")))
    });
    c.bench_function("limits/per_deal", |b| {
        b.iter(|| limits.check_deal(black_box("concert")))
    });
    // A buyer's request decided from this instance's share of its budget, in memory: what
    // the shared per-user limit costs a purchase instead of a Redis script call.
    let clock = ManualClock::starting_now();
    let shares = UserShares::new(
        generous,
        50,
        Duration::from_secs(1),
        Duration::from_secs(5),
        clock.clock(),
    );
    // A lone instance spends its share from the heartbeat that publishes it, 4 s after
    // its first count.
    let alone = Answer {
        instances: 1,
        others_ppm: 0,
        acknowledged: true,
    };
    shares.to_publish();
    shares.counted(alone);
    clock.advance(Duration::from_secs(4));
    shares.to_publish();
    shares.counted(alone);
    let users: Vec<String> = (0..1024).map(|n| format!("buyer-{n}")).collect();
    c.bench_function("limits/user_share_1024_users", |b| {
        b.iter(|| {
            i = (i + 1) % users.len();
            shares.take(black_box(&users[i]))
        })
    });
}

fn tokens(c: &mut Criterion) {
    let verifier = TokenVerifier::new(
        "bench-secret",
        flashgate::auth::Audience::DEFAULT,
        0,
        128,
        Clock::system(),
    );
    let header = format!("Bearer {}", mint_token("bench-secret", "user-42", 3600)).into_bytes();
    c.bench_function("token/verify_hs256", |b| {
        b.iter(|| verifier.verify(black_box(Some(&header))))
    });
}

fn passes(c: &mut Criterion) {
    let passes = Passes::new("bench-pass-secret");
    let expires = chrono::Utc::now().timestamp() + 600;
    let pass = passes.mint("concert", "user-42", expires, "pass-1");
    let now = chrono::Utc::now().timestamp();
    c.bench_function("waiting_room/verify_pass", |b| {
        b.iter(|| passes.verify(black_box(Some(pass.as_bytes())), "concert", "user-42", now))
    });
    let signed = passes.mint_ed25519("concert", "user-42", expires, "pass-1");
    c.bench_function("waiting_room/verify_pass_ed25519", |b| {
        b.iter(|| {
            passes.verify(
                black_box(Some(signed.as_bytes())),
                "concert",
                "user-42",
                now,
            )
        })
    });
    c.bench_function("waiting_room/mint_pass_ed25519", |b| {
        b.iter(|| passes.mint_ed25519(black_box("concert"), "user-42", expires, "pass-1"))
    });
}

/// The server's cost to check a proof of work, and a client's cost to find one: the mean of
/// a solve is 2^bits hashes, so the per-hash figure (`pow/solve_8_bits` ÷ 256) gives the
/// expected client time at any difficulty.
fn proof_of_work(c: &mut Criterion) {
    let challenges = Challenges::new("bench-pass-secret", 120);
    let now = chrono::Utc::now().timestamp_millis();
    let issued = challenges.issue("concert", "user-42", 12, now);
    let solution = format!(
        "{}:{}",
        issued.challenge,
        challenge::solve(&issued.challenge, 12)
    );
    c.bench_function("pow/check_solution", |b| {
        b.iter(|| {
            challenges.check(
                black_box(Some(solution.as_bytes())),
                "concert",
                "user-42",
                12,
                now,
            )
        })
    });
    let mut round = 0u64;
    c.bench_function("pow/solve_8_bits", |b| {
        b.iter(|| {
            round += 1;
            let fresh = challenges.issue("concert", &round.to_string(), 8, now);
            challenge::solve(black_box(&fresh.challenge), 8)
        })
    });
}

fn sold_out_mirror(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Neither Redis nor PostgreSQL answers here: flags are set in memory only.
    let redis = RedisHandle::new(
        "redis://127.0.0.1:1",
        "bench:",
        RedisTimeouts {
            command: Duration::from_millis(1),
            unresponsive_after: Duration::from_millis(1),
        },
        Duration::from_secs(60),
    );
    let sold_out = SoldOut::new(redis, 1000, Duration::from_secs(60), Clock::system());
    runtime.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(1))
            .connect_lazy("postgres://bench@127.0.0.1:1/bench")
            .unwrap();
        for i in 0..1000 {
            sold_out.mark(&pool, &format!("deal-{i}")).await;
        }
    });
    c.bench_function("sold_out/mirror_hit", |b| {
        b.iter(|| sold_out.is_sold_out(black_box("deal-500")))
    });
    c.bench_function("sold_out/mirror_miss", |b| {
        b.iter(|| sold_out.is_sold_out(black_box("open-deal")))
    });
}

fn problem_json(c: &mut Criterion) {
    let id = RequestId::generate();
    c.bench_function("problem/render_overloaded", |b| {
        b.iter(|| {
            Problem::overloaded(black_box("no database capacity right now; retry shortly"))
                .into_response(&id)
        })
    });
    c.bench_function("request_id/generate", |b| b.iter(RequestId::generate));
}

fn transitions(c: &mut Criterion) {
    let events = [
        OrderEvent::Cancel,
        OrderEvent::Expire,
        OrderEvent::PaymentSucceeded,
        OrderEvent::RefundCompleted,
    ];
    c.bench_function("order/transition_all_pairs", |b| {
        b.iter(|| {
            OrderStatus::ALL
                .iter()
                .flat_map(|s| events.iter().map(move |e| s.transition(*e)))
                .filter(Result::is_ok)
                .count()
        })
    });
}

criterion_group!(
    benches,
    client_ip,
    limiters,
    tokens,
    passes,
    proof_of_work,
    sold_out_mirror,
    problem_json,
    transitions
);
criterion_main!(benches);
