//! The OpenAPI document's links: each names an operation that exists and fills every path
//! parameter of it from the response it hangs on (or that response's request); and,
//! followed from the gateway's real answers for every kind of deal (without a waiting
//! room, with one, with a checkout URL, with late money held for review), none leads to a
//! 404 — a link promises its target exists for every response it hangs on.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use crate::helpers::{PayApp, Reply, send, spawn_pay_app_with, unique_suffix};
use crate::waiting_room::{join, order_with_pass, poll_until, room_deal};

const DOCUMENT: &str = include_str!("../../docs/openapi.yaml");

fn document() -> Value {
    serde_norway::from_str(DOCUMENT).expect("docs/openapi.yaml is YAML")
}

/// One operation of the document.
struct Operation {
    method: String,
    path: String,
    /// (name, location, required) of every parameter, references resolved.
    parameters: Vec<(String, String, bool)>,
    responses: Value,
    security: Vec<String>,
    body_required: bool,
}

/// One link: from `source`'s `status` answer to `target`, with its parameter expressions.
struct Link {
    name: String,
    source: String,
    status: String,
    target: String,
    parameters: serde_json::Map<String, Value>,
}

impl Link {
    fn label(&self) -> String {
        format!("{} {} -> {}", self.source, self.status, self.name)
    }
}

/// `$ref` targets inside the document, followed until a value that is not a reference.
fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    while let Some(reference) = value.get("$ref").and_then(Value::as_str) {
        let pointer = reference.strip_prefix('#').expect("a local reference");
        value = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("{reference} resolves"));
    }
    value
}

fn operations(doc: &Value) -> HashMap<String, Operation> {
    let mut found = HashMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            let Some(id) = operation["operationId"].as_str() else {
                continue;
            };
            let parameters = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| resolve(doc, p))
                .map(|p| {
                    let text = |key: &str| p[key].as_str().unwrap_or_default().to_owned();
                    (text("name"), text("in"), p["required"] == true)
                })
                .collect();
            let security = operation["security"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_object)
                .flat_map(|scheme| scheme.keys().cloned())
                .collect();
            let operation = Operation {
                method: method.to_uppercase(),
                path: path.clone(),
                parameters,
                responses: operation["responses"].clone(),
                security,
                body_required: operation["requestBody"]["required"] == true,
            };
            found.insert(id.to_owned(), operation);
        }
    }
    found
}

fn links(doc: &Value, operations: &HashMap<String, Operation>) -> Vec<Link> {
    let mut found = Vec::new();
    for (source, operation) in operations {
        for (status, response) in operation.responses.as_object().expect("responses") {
            let response = resolve(doc, response);
            for (name, link) in response["links"].as_object().into_iter().flatten() {
                found.push(Link {
                    name: name.clone(),
                    source: source.clone(),
                    status: status.clone(),
                    target: link["operationId"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{name} names its target by operationId"))
                        .to_owned(),
                    parameters: link["parameters"].as_object().cloned().unwrap_or_default(),
                });
            }
        }
    }
    found.sort_by_key(Link::label);
    found
}

/// Whether the JSON pointer `pointer` leads somewhere in `schema`: through properties, and
/// through array items for index tokens.
/// An `allOf` has what any of its parts has.
fn schema_has(doc: &Value, schema: &Value, pointer: &str) -> bool {
    let schema = resolve(doc, schema);
    if let Some(parts) = schema.get("allOf").and_then(Value::as_array) {
        return parts.iter().any(|part| schema_has(doc, part, pointer));
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return true;
    };
    let (token, rest) = rest.split_once('/').map_or((rest, ""), |(t, r)| (t, r));
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!("/{rest}")
    };
    let next = if token.parse::<usize>().is_ok() {
        schema.get("items")
    } else {
        schema.get("properties").and_then(|p| p.get(token))
    };
    next.is_some_and(|next| schema_has(doc, next, &rest))
}

/// Why `expression` cannot fill a parameter of `link`, if it cannot.
fn expression_fault(
    doc: &Value,
    ops: &HashMap<String, Operation>,
    link: &Link,
    expression: &str,
) -> Option<String> {
    let source = &ops[&link.source];
    if let Some(name) = expression.strip_prefix("$request.path.") {
        let known = source
            .parameters
            .iter()
            .any(|(n, at, _)| n == name && at == "path");
        return (!known).then(|| format!("{} has no path parameter {name}", link.source));
    }
    let Some(pointer) = expression.strip_prefix("$response.body#") else {
        return Some(format!(
            "{expression} is neither $request.path nor $response.body"
        ));
    };
    let response = resolve(doc, &source.responses[&link.status]);
    let schema = &response["content"]["application/json"]["schema"];
    (!schema_has(doc, schema, pointer))
        .then(|| format!("{pointer} is not in the {} answer", link.status))
}

#[test]
fn every_link_names_an_operation_and_fills_its_path_parameters_from_its_response() {
    let doc = document();
    let ops = operations(&doc);
    let links = links(&doc, &ops);
    assert!(!links.is_empty(), "the document has links");
    let mut faults = Vec::new();
    for link in &links {
        let Some(target) = ops.get(&link.target) else {
            faults.push(format!("{}: no operation {}", link.label(), link.target));
            continue;
        };
        for (name, at, required) in &target.parameters {
            if at == "path" && *required && !link.parameters.contains_key(name) {
                faults.push(format!(
                    "{}: path parameter {name} is not filled",
                    link.label()
                ));
            }
        }
        for (name, expression) in &link.parameters {
            if !target.parameters.iter().any(|(n, _, _)| n == name) {
                faults.push(format!("{}: {} takes no {name}", link.label(), link.target));
            }
            let expression = expression.as_str().unwrap_or_default();
            if let Some(fault) = expression_fault(&doc, &ops, link, expression) {
                faults.push(format!("{}: {name}: {fault}", link.label()));
            }
        }
    }
    assert!(faults.is_empty(), "{faults:#?}");
}

/// A real answer of a link's source operation, with what its request carried.
struct Answer {
    operation: &'static str,
    reply: Reply,
    /// The request's path parameters, for `$request.path.*`.
    path: HashMap<&'static str, String>,
    /// The user whose token made the request, for targets that need one.
    user: String,
}

impl Answer {
    fn new(
        operation: &'static str,
        reply: Reply,
        path: &[(&'static str, &str)],
        user: &str,
    ) -> Self {
        let path = path.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        Answer {
            operation,
            reply,
            path,
            user: user.to_owned(),
        }
    }
}

/// The kinds of deal a link may meet.
fn deal_kinds(suffix: &str) -> Vec<Value> {
    let deal = |id: &str| crate::helpers::new_deal(&format!("{id}{suffix}"), 50, 2);
    let room = |id: &str, terms: Value| {
        room_deal(
            &format!("{id}{suffix}"),
            50,
            terms,
            json!({"per_user_limit": 2}),
        )
    };
    let mut late = deal("late");
    late["reservation_ttl_seconds"] = json!(1);
    late["late_payment_policy"] = json!("manual_review");
    vec![
        deal("plain"),
        room("room", json!({"admit_per_second": 100})),
        room(
            "shop",
            json!({"admit_per_second": 100, "checkout_url": "https://shop.example/checkout"}),
        ),
        late,
    ]
}

async fn admin_post(app: &PayApp, path: &str, body: Value) -> Reply {
    let request = app.client.post(app.url(path)).bearer_auth(&app.admin_token);
    send(request.json(&body)).await
}

/// The answers of every link source for one deal: created, read, joined, ordered (with a
/// pass where the deal has a line), paid again, its buyer's session revoked, and its
/// outflow set by hand.
async fn answers_for(app: &PayApp, deal: &Value) -> Vec<Answer> {
    let id = deal["id"].as_str().unwrap();
    let user = format!("links-{id}");
    let mut answers = vec![
        Answer::new("createDeal", app.create_deal(deal).await, &[], &user),
        Answer::new("getDeal", app.get_deal(id).await, &[("deal_id", id)], &user),
    ];
    let joined = join(app, &user, id).await;
    let mut pass = None;
    if joined.status == 201 {
        let ticket = joined.json()["ticket"].as_str().unwrap().to_owned();
        let admitted = poll_until(
            app,
            &user,
            id,
            &ticket,
            &["admitted"],
            crate::helpers::SETTLE,
        )
        .await;
        pass = admitted["pass"].as_str().map(str::to_owned);
    }
    answers.push(Answer::new("joinQueue", joined, &[("deal_id", id)], &user));
    let placed = order_with_pass(app, &user, id, pass.as_deref()).await;
    let order = placed.json()["order_id"].as_str().map(str::to_owned);
    answers.push(Answer::new("placeOrder", placed, &[("deal_id", id)], &user));
    if let Some(order) = order {
        let request = app
            .client
            .post(app.url(&format!("/v1/orders/{order}/payments")));
        let request = request
            .bearer_auth(app.token(&user))
            .header("Idempotency-Key", unique_suffix());
        let paid = send(request).await;
        answers.push(Answer::new(
            "startPayment",
            paid,
            &[("order_id", order.as_str())],
            &user,
        ));
    }
    let path = format!("/admin/deals/{id}/queue/revoke");
    let revoked = admin_post(app, &path, json!({"user_id": user})).await;
    answers.push(Answer::new(
        "revokeQueueSession",
        revoked,
        &[("deal_id", id)],
        &user,
    ));
    let path = format!("/admin/deals/{id}/admission");
    let admission = admin_post(app, &path, json!({"mode": "fixed"})).await;
    answers.push(Answer::new(
        "setAdmission",
        admission,
        &[("deal_id", id)],
        &user,
    ));
    answers
}

/// The value of a link parameter's expression in `answer`, if it has one.
fn evaluate(answer: &Answer, expression: &str) -> Option<String> {
    if let Some(name) = expression.strip_prefix("$request.path.") {
        return answer.path.get(name).cloned();
    }
    let pointer = expression.strip_prefix("$response.body#")?;
    match answer.reply.json().pointer(pointer)? {
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// A body each link target that requires one accepts.
fn body_for(target: &str) -> Option<Value> {
    match target {
        "placeOrder" => Some(json!({"quantity": 1})),
        "adjustStock" => Some(json!({"delta": 1})),
        "rebalanceDeal" => Some(json!({"buckets": 2})),
        "setAdmission" => Some(json!({"mode": "fixed"})),
        "revokeQueueSession" => Some(json!({"user_id": "links-revoked"})),
        "issueAccessCodes" => Some(json!({"count": 1})),
        "receiveWebhook" => Some(json!({})),
        "updateEventEndpoint" | "replayEventEndpoint" => Some(json!({})),
        "rotateEventEndpointSecret" => Some(json!({"overlap_seconds": 60})),
        _ => None,
    }
}

/// Follows `link` from `answer`; the target's status, or None when the answer carries
/// nothing for a parameter (an empty review queue, say).
async fn follow(
    app: &PayApp,
    ops: &HashMap<String, Operation>,
    link: &Link,
    answer: &Answer,
) -> Option<u16> {
    let target = &ops[&link.target];
    let mut path = target.path.clone();
    for (name, expression) in &link.parameters {
        let value = evaluate(answer, expression.as_str().unwrap_or_default())?;
        path = path.replace(&format!("{{{name}}}"), &value);
    }
    let method = reqwest::Method::from_bytes(target.method.as_bytes()).unwrap();
    let mut request = app.client.request(method, app.url(&path));
    if target.security.iter().any(|s| s == "adminToken") {
        request = request.bearer_auth(&app.admin_token);
    } else if target.security.iter().any(|s| s == "userToken") {
        request = request.bearer_auth(app.token(&answer.user));
    }
    if target
        .parameters
        .iter()
        .any(|(n, _, r)| n == "Idempotency-Key" && *r)
    {
        request = request.header("Idempotency-Key", unique_suffix());
    }
    if target.body_required {
        let body = body_for(&link.target)
            .unwrap_or_else(|| panic!("{} needs a body: add one to body_for", link.target));
        request = request.json(&body);
    }
    Some(send(request).await.status)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_link_followed_from_real_answers_for_every_deal_kind_finds_its_target() {
    // Arrange: a gateway with payments at the simulator, late money held for review at once.
    let app = spawn_pay_app_with(|s| {
        crate::waiting_room_edge::fast_room(s);
        s.payments.expiry_grace_seconds = 0;
        // An event endpoint on loopback's discard port, which nothing is sent to.
        s.events.allow_private_targets = true;
    })
    .await;
    let doc = document();
    let ops = operations(&doc);
    let links = links(&doc, &ops);

    // Act: every kind of deal goes through every link source; late money waits for review.
    let suffix = unique_suffix();
    let mut answers = Vec::new();
    for deal in deal_kinds(&suffix) {
        answers.extend(answers_for(&app, &deal).await);
    }
    let late = format!("late{suffix}");
    crate::payments_manual_review::held_for_review(&app, "links-late-payer", &late).await;
    let queue = app.client.get(app.url("/admin/payments/review"));
    let queue = send(queue.bearer_auth(&app.admin_token)).await;
    answers.push(Answer::new("reviewQueue", queue, &[], "links-late-payer"));
    let endpoint = json!({"url": "http://127.0.0.1:9/links"});
    let created = admin_post(&app, "/admin/event-endpoints", endpoint).await;
    answers.push(Answer::new(
        "createEventEndpoint",
        created,
        &[],
        "links-operator",
    ));

    // Assert: every link, from every answer it hangs on, reaches its target; and every link
    // was followed at least once, so a new link cannot go unchecked.
    let mut followed = BTreeSet::new();
    let mut lost = Vec::new();
    for answer in &answers {
        let status = answer.reply.status.to_string();
        // A link that deletes its target is followed after the others from the same answer.
        let mut from_here: Vec<&Link> = links
            .iter()
            .filter(|l| l.source == answer.operation && l.status == status)
            .collect();
        from_here.sort_by_key(|l| ops[&l.target].method.eq_ignore_ascii_case("delete"));
        for link in from_here {
            match follow(&app, &ops, link, answer).await {
                Some(404) => lost.push(format!("{} from {}", link.label(), answer.reply.text)),
                Some(_) => {
                    followed.insert(link.label());
                }
                None => {}
            }
        }
    }
    assert!(lost.is_empty(), "links to nowhere: {lost:#?}");
    let unfollowed: Vec<_> = links
        .iter()
        .map(Link::label)
        .filter(|l| !followed.contains(l))
        .collect();
    assert!(
        unfollowed.is_empty(),
        "links this test never followed: {unfollowed:#?}"
    );
    app.cleanup().await;
}
