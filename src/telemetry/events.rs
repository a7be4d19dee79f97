//! The order and deal events' series: what the sequencer put in the feed, what each
//! endpoint was sent and how far behind it is.

use super::{
    EVENT_DELIVERIES, EVENT_DELIVERY_SECONDS, EVENT_ENDPOINT_FAILING,
    EVENT_ENDPOINT_OLDEST_PENDING, EVENT_ENDPOINT_PENDING, EVENTS, EVENTS_FEED_RATE,
    EVENTS_OLDEST_KEPT,
};

pub(super) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        EVENTS,
        "Events put in the feed (committed changes), by type."
    );
    describe_gauge!(
        EVENTS_OLDEST_KEPT,
        metrics::Unit::Seconds,
        "Age of the oldest event kept in the feed (events.retention_hours); 0 when none."
    );
    describe_gauge!(
        EVENTS_FEED_RATE,
        "Events the sequencer put in the feed a second, over the last second; deliveries give way to the sale above events.yield_above_per_second."
    );
    describe_counter!(
        EVENT_DELIVERIES,
        "Event deliveries attempted, by endpoint and outcome (accepted, refused, timeout, unreachable)."
    );
    describe_histogram!(
        EVENT_DELIVERY_SECONDS,
        metrics::Unit::Seconds,
        "Time one event delivery took, from sending to the receiver's answer."
    );
    describe_gauge!(
        EVENT_ENDPOINT_PENDING,
        "Events an endpoint has not yet accepted, by endpoint."
    );
    describe_gauge!(
        EVENT_ENDPOINT_OLDEST_PENDING,
        metrics::Unit::Seconds,
        "Age of the oldest event an endpoint has not yet accepted; 0 when none waits."
    );
    describe_gauge!(
        EVENT_ENDPOINT_FAILING,
        "1 when an endpoint failed past events.failing_after_seconds and is no longer tried, by endpoint."
    );
}
