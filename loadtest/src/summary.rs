//! The sale report as a few lines for people: throughput, latency per outcome, when the
//! stock ran out, the inventory, and the verdict in words with every reason it failed.

use serde_json::Value;

/// A few lines for people.
pub fn summary(report: &Value) -> String {
    let mut lines = vec![format!(
        "{} requests in {:.2} s = {:.0} req/s (stock {}, {} buckets, {} users, concurrency {}, rate {})",
        report["requests"],
        report["elapsed_seconds"].as_f64().unwrap_or(0.0),
        report["requests_per_second"].as_f64().unwrap_or(0.0),
        report["stock"],
        report["buckets"],
        report["users"],
        report["concurrency"],
        report["rate"],
    )];
    if let Some(outcomes) = report["latency_by_outcome"].as_object() {
        for (outcome, l) in outcomes {
            lines.push(format!(
                "  {outcome:>5}: {:>7} responses, p50 {} us, p90 {} us, p99 {} us, max {} us",
                l["count"], l["p50_us"], l["p90_us"], l["p99_us"], l["max_us"]
            ));
        }
    }
    lines.push(match report["sold_out_after_seconds"].as_f64() {
        Some(seconds) => format!("sold out after {seconds:.3} s"),
        None => "not sold out".to_owned(),
    });
    lines.push(format!(
        "inventory: available {} reserved {} sold {} invariant_holds {}",
        report["inventory"]["available"],
        report["inventory"]["reserved"],
        report["inventory"]["sold"],
        report["inventory"]["invariant_holds"]
    ));
    if let Some(paid) = report["paid_at_checkout"].as_u64() {
        lines.push(format!("paid at the checkout: {paid} orders"));
    }
    lines.extend(verdict(&report["verdict"]));
    lines.join("\n")
}

/// "verdict: PASS …" or "verdict: FAIL" followed by one line per reason.
fn verdict(verdict: &Value) -> Vec<String> {
    let created = verdict["created"].as_u64().unwrap_or(0);
    if verdict["ok"] == Value::Bool(true) {
        return vec![format!(
            "verdict: PASS: {created} orders acknowledged, none oversold, the inventory invariant holds"
        )];
    }
    let mut lines = vec![format!("verdict: FAIL ({created} orders acknowledged)")];
    let reasons = verdict["reasons"].as_array().cloned().unwrap_or_default();
    lines.extend(
        reasons
            .iter()
            .map(|reason| format!("  - {}", reason.as_str().unwrap_or_default())),
    );
    lines
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_verdict_reads_as_words() {
        let pass = summary(&json!({
            "sold_out_after_seconds": 0.412,
            "verdict": {"ok": true, "created": 10, "reasons": []},
        }));
        assert!(pass.contains("sold out after 0.412 s"), "{pass}");
        assert!(
            pass.contains("verdict: PASS: 10 orders acknowledged"),
            "{pass}"
        );
        assert!(!pass.contains('{'), "no JSON in the text: {pass}");

        let fail = summary(&json!({
            "sold_out_after_seconds": null,
            "verdict": {"ok": false, "created": 11, "reasons": ["oversold: 11 units held of 10"]},
        }));
        assert!(fail.contains("not sold out"), "{fail}");
        assert!(
            fail.contains(
                "verdict: FAIL (11 orders acknowledged)\n  - oversold: 11 units held of 10"
            ),
            "{fail}"
        );
    }
}
