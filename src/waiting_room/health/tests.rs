use super::*;

#[test]
fn p99_is_the_nearest_rank() {
    let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(p99(&mut hundred), 99.0);
    assert_eq!(p99(&mut [5.0]), 5.0);
    assert_eq!(p99(&mut []), 0.0);
}

#[test]
fn reports_merge_to_the_worst_p99_and_the_sum_of_refusals() {
    let reply: Vec<String> = [
        "1000",
        "42.5",
        "990,120.0,10,0,0,8,250,2,0.0",
        "995,800.0,3,2,0,2,250,1,350.0",
        "996,0.0,0,0,0,0,250,0",
        "999,0.0,0,1,1",
    ]
    .map(String::from)
    .to_vec();
    let reading = parse_reading(&reply).expect("parsed");
    assert_eq!(reading.now_ms, 1000);
    assert_eq!(reading.outflow, Some(42.5));
    assert_eq!(reading.health.p99_seconds, Some(0.8));
    assert_eq!(reading.health.overloaded, 3);
    assert!(reading.health.breaker_open);
    assert_eq!(
        reading.health.served_per_second,
        Some(40.0),
        "32 and 8 a second; the five-field report tells no rate"
    );
    assert_eq!(reading.health.under_way, Some(3));
    assert_eq!(
        reading.health.queued_seconds,
        Some(0.35),
        "the worst instance's own queue; none under way tells none"
    );
    assert_eq!(reading.health.window_seconds, Some(0.25));
    let none = parse_reading(&["5".into(), String::new()]).expect("parsed");
    assert_eq!((none.outflow, none.health), (None, Health::default()));
}

#[tokio::test(start_paused = true)]
async fn an_order_still_unanswered_counts_at_its_age() {
    let recorder = Arc::new(Recorder::default());
    let quick = recorder.begin("d");
    quick.finish(Served::Answered);
    let _stuck = recorder.begin("d");
    let refused = recorder.begin("d");
    tokio::time::advance(Duration::from_millis(700)).await;
    refused.finish(Served::Overloaded);
    let taken = recorder.take(250);
    assert_eq!(taken.len(), 1);
    let Taken {
        deal,
        p99_ms,
        orders,
        refused,
        answered,
        ..
    } = &taken[0];
    assert_eq!(
        (deal.as_str(), *orders, *refused, *answered),
        ("d", 2, 1, 1)
    );
    assert!((*p99_ms - 700.0).abs() < 1.0, "{p99_ms}");
}

#[tokio::test(start_paused = true)]
async fn a_window_going_quiet_is_reported_once_empty_then_dropped() {
    let recorder = Arc::new(Recorder::default());
    recorder.begin("d").finish(Served::Answered);
    recorder.take(250);
    tokio::time::advance(Duration::from_millis(250)).await;
    let quiet = recorder.take(250);
    assert_eq!(quiet.len(), 1, "the busy report is overwritten");
    assert_eq!(
        (quiet[0].answered, quiet[0].orders, quiet[0].window_ms),
        (0, 0, 250)
    );
    tokio::time::advance(Duration::from_millis(250)).await;
    assert!(recorder.take(250).is_empty(), "then nothing to tell");
}

#[tokio::test(start_paused = true)]
async fn each_report_covers_the_last_window_of_slices() {
    let recorder = Arc::new(Recorder::default());
    recorder.begin("d").finish(Served::Answered);
    let first = recorder.take(250);
    assert_eq!(first[0].window_ms, 0, "the first slice tells no rate");
    let _stuck = recorder.begin("d");
    let mut taken = Vec::new();
    for answers in 1..=6 {
        for _ in 0..answers {
            recorder.begin("d").finish(Served::Answered);
        }
        recorder.begin("d").finish(Served::Overloaded);
        tokio::time::advance(Duration::from_millis(50)).await;
        taken = recorder.take(250);
    }
    let Taken {
        answered,
        refused,
        window_ms,
        under_way,
        ..
    } = taken[0];
    assert_eq!(
        window_ms, 250,
        "five slices of 50 ms, the older ones dropped"
    );
    assert_eq!(answered, 2 + 3 + 4 + 5 + 6);
    assert_eq!((refused, under_way), (5, 1));
    assert!(
        (taken[0].p99_ms - 300.0).abs() < 1.0,
        "the order under way at its age"
    );
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_the_orders_under_way_over_the_rate_answered_since_the_oldest() {
    let recorder = Arc::new(Recorder::default());
    recorder.begin("d").finish(Served::Answered);
    let _oldest = recorder.begin("d");
    tokio::time::advance(Duration::from_millis(100)).await;
    let _next = recorder.begin("d");
    recorder.begin("d").finish(Served::Answered);
    let _newest = recorder.begin("d");
    tokio::time::advance(Duration::from_millis(100)).await;
    let taken = recorder.take(250);
    assert_eq!(taken[0].under_way, 3);
    assert!(
        (taken[0].queued_ms - 300.0).abs() < 1.0,
        "3 under way, one answer in the oldest's 200 ms and its own: {}",
        taken[0].queued_ms
    );
    drop((_oldest, _next, _newest));
    assert_eq!(recorder.take(250)[0].queued_ms, 0.0, "none under way");
}
