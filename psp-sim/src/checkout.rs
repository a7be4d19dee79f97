//! The hosted checkout pages: plain HTML with Pay and Decline buttons, and the page shown
//! after a browser submits one of them.

use super::model::PaymentIntent;

/// `GET /checkout/{id}`.
pub fn page(intent: &PaymentIntent) -> String {
    let id = escape(&intent.id);
    let buttons = if intent.status.as_str() == "requires_payment" {
        format!(
            "<form method=\"post\" action=\"/checkout/{id}/pay\"><button type=\"submit\">Pay</button></form>\n\
             <form method=\"post\" action=\"/checkout/{id}/decline\"><button type=\"submit\">Decline</button></form>"
        )
    } else {
        "<p>This payment can no longer be paid here.</p>".to_owned()
    };
    layout(
        "Checkout",
        &format!(
            "<h1>Pay {amount}</h1>\n\
             <dl>\n<dt>Amount</dt><dd data-amount-minor=\"{minor}\">{amount}</dd>\n\
             <dt>Currency</dt><dd>{currency}</dd>\n\
             <dt>Reference</dt><dd>{reference}</dd>\n\
             <dt>Status</dt><dd>{status}</dd>\n</dl>\n{buttons}",
            amount = amount(intent),
            minor = intent.amount_minor,
            currency = escape(&intent.currency),
            reference = escape(&intent.reference),
            status = intent.status.as_str(),
        ),
    )
}

/// What a browser sees after Pay or Decline.
pub fn result(intent: &PaymentIntent) -> String {
    let headline = match intent.status.as_str() {
        "succeeded" => "Paid",
        "requires_capture" => "Paid (authorised, awaiting capture)",
        "failed" => "Payment declined",
        other => other,
    };
    layout(
        headline,
        &format!(
            "<h1>{headline}</h1>\n<p>{amount} for {reference}</p>\n<p>Status: {status}</p>",
            amount = amount(intent),
            reference = escape(&intent.reference),
            status = intent.status.as_str(),
        ),
    )
}

fn layout(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{title}</title></head>\n\
         <body>\n{body}\n</body>\n</html>\n"
    )
}

/// `4999` `EUR` → `49.99 EUR`. Every currency is shown with two decimals; the simulator
/// does not know currency exponents.
fn amount(intent: &PaymentIntent) -> String {
    let minor = intent.amount_minor;
    format!(
        "{}.{:02} {}",
        minor / 100,
        minor % 100,
        escape(&intent.currency)
    )
}

/// Escapes text for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
