//! The route table: method and path to a [`Route`], which listener serves it, and the
//! template it is counted and logged under.

use http::Method;

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// Sale traffic: the public API only.
    Public,
    /// Operators: metrics, the admin API, the audit.
    Ops,
}

/// The most path segments of any route.
const SEGMENTS_MAX: usize = 5;

/// A matched route. Ids are raw path segments, parsed by the handlers.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    Readyz,
    Metrics,
    GetDeal(&'a str),
    PlaceOrder(&'a str),
    JoinQueue(&'a str),
    QueueStatus(&'a str),
    PollTicket(&'a str, &'a str),
    GetOrder(&'a str),
    CancelOrder(&'a str),
    StartPayment(&'a str),
    Webhook(&'a str),
    CreateDeal,
    AdjustStock(&'a str),
    Inventory(&'a str),
    PauseDeal(&'a str),
    AdminDeal(&'a str),
    DealReport(&'a str),
    SetAdmission(&'a str),
    IssueAccessCodes(&'a str),
    ResumeDeal(&'a str),
    Rebalance(&'a str),
    Audit,
    OperatorLog,
    OpenApi,
    QueueChallenge(&'a str),
    PassKeys,
    RevokedPasses,
    RevokeQueue(&'a str),
    WaitPage(&'a str),
    ReviewQueue,
    ReviewFulfil(&'a str),
    ReviewRefund(&'a str),
    EventEndpoints,
    CreateEventEndpoint,
    EventEndpoint(&'a str),
    RotateEventSecret(&'a str),
    ReplayEvents(&'a str),
    Events,
    WrongMethod {
        template: &'static str,
        allow: &'static str,
    },
    Unknown,
}

impl<'a> Route<'a> {
    pub fn of(method: &Method, path: &'a str) -> Self {
        // On the stack: no route has more segments, and this runs for every request.
        let mut segments = [""; SEGMENTS_MAX];
        let mut count = 0;
        for segment in path.trim_start_matches('/').split('/') {
            let Some(slot) = segments.get_mut(count) else {
                return Route::Unknown;
            };
            *slot = segment;
            count += 1;
        }
        let segments = &segments[..count];
        let get = method == Method::GET || method == Method::HEAD;
        let post = method == Method::POST;
        let (template, allow, route) = match segments {
            ["healthz"] => ("/healthz", "GET, HEAD", Route::Healthz),
            ["readyz"] => ("/readyz", "GET, HEAD", Route::Readyz),
            ["metrics"] => ("/metrics", "GET, HEAD", Route::Metrics),
            ["openapi.json"] => ("/openapi.json", "GET, HEAD", Route::OpenApi),
            ["v1", "deals", id] => ("/v1/deals/{id}", "GET, HEAD", Route::GetDeal(id)),
            ["v1", "deals", id, "orders"] => {
                ("/v1/deals/{id}/orders", "POST", Route::PlaceOrder(id))
            }
            ["v1", "deals", id, "queue"] if post => return Route::JoinQueue(id),
            ["v1", "deals", id, "queue"] => (
                "/v1/deals/{id}/queue",
                "GET, HEAD, POST",
                Route::QueueStatus(id),
            ),
            ["v1", "deals", id, "queue", "challenge"] => (
                "/v1/deals/{id}/queue/challenge",
                "GET, HEAD",
                Route::QueueChallenge(id),
            ),
            [".well-known", "flashgate-keys.json"] => (
                "/.well-known/flashgate-keys.json",
                "GET, HEAD",
                Route::PassKeys,
            ),
            [".well-known", "flashgate-revoked.json"] => (
                "/.well-known/flashgate-revoked.json",
                "GET, HEAD",
                Route::RevokedPasses,
            ),
            ["wait", id] => ("/wait/{deal_id}", "GET, HEAD", Route::WaitPage(id)),
            ["admin", "deals", id, "queue", "revoke"] => (
                "/admin/deals/{id}/queue/revoke",
                "POST",
                Route::RevokeQueue(id),
            ),
            ["v1", "deals", id, "queue", ticket] => (
                "/v1/deals/{id}/queue/{ticket}",
                "GET, HEAD",
                Route::PollTicket(id, ticket),
            ),
            ["v1", "orders", id] => ("/v1/orders/{id}", "GET, HEAD", Route::GetOrder(id)),
            ["v1", "orders", id, "cancel"] => {
                ("/v1/orders/{id}/cancel", "POST", Route::CancelOrder(id))
            }
            ["v1", "orders", id, "payments"] => {
                ("/v1/orders/{id}/payments", "POST", Route::StartPayment(id))
            }
            ["v1", "webhooks", provider] => {
                ("/v1/webhooks/{provider}", "POST", Route::Webhook(provider))
            }
            ["admin", "deals"] => ("/admin/deals", "POST", Route::CreateDeal),
            ["admin", "event-endpoints"] if post => return Route::CreateEventEndpoint,
            ["admin", "event-endpoints"] => (
                "/admin/event-endpoints",
                "GET, HEAD, POST",
                Route::EventEndpoints,
            ),
            ["admin", "event-endpoints", id]
                if get || method == Method::PATCH || method == Method::DELETE =>
            {
                return Route::EventEndpoint(id);
            }
            ["admin", "event-endpoints", _] => {
                return Route::WrongMethod {
                    template: "/admin/event-endpoints/{id}",
                    allow: "GET, HEAD, PATCH, DELETE",
                };
            }
            ["admin", "event-endpoints", id, "rotate-secret"] => (
                "/admin/event-endpoints/{id}/rotate-secret",
                "POST",
                Route::RotateEventSecret(id),
            ),
            ["admin", "event-endpoints", id, "replay"] => (
                "/admin/event-endpoints/{id}/replay",
                "POST",
                Route::ReplayEvents(id),
            ),
            ["admin", "events"] => ("/admin/events", "GET, HEAD", Route::Events),
            ["admin", "deals", id, "stock"] => {
                ("/admin/deals/{id}/stock", "POST", Route::AdjustStock(id))
            }
            ["admin", "deals", id, "inventory"] => (
                "/admin/deals/{id}/inventory",
                "GET, HEAD",
                Route::Inventory(id),
            ),
            ["admin", "deals", id] => ("/admin/deals/{id}", "GET, HEAD", Route::AdminDeal(id)),
            ["admin", "deals", id, "report"] => (
                "/admin/deals/{id}/report",
                "GET, HEAD",
                Route::DealReport(id),
            ),
            ["admin", "deals", id, "admission"] => (
                "/admin/deals/{id}/admission",
                "POST",
                Route::SetAdmission(id),
            ),
            ["admin", "deals", id, "access-codes"] => (
                "/admin/deals/{id}/access-codes",
                "POST",
                Route::IssueAccessCodes(id),
            ),
            ["admin", "deals", id, "pause"] => {
                ("/admin/deals/{id}/pause", "POST", Route::PauseDeal(id))
            }
            ["admin", "deals", id, "resume"] => {
                ("/admin/deals/{id}/resume", "POST", Route::ResumeDeal(id))
            }
            ["admin", "deals", id, "rebalance"] => {
                ("/admin/deals/{id}/rebalance", "POST", Route::Rebalance(id))
            }
            ["admin", "audit"] => ("/admin/audit", "GET, HEAD", Route::Audit),
            ["admin", "operator-log"] => ("/admin/operator-log", "GET, HEAD", Route::OperatorLog),
            ["admin", "payments", "review"] => {
                ("/admin/payments/review", "GET, HEAD", Route::ReviewQueue)
            }
            ["admin", "orders", id, "review", "fulfil"] => (
                "/admin/orders/{id}/review/fulfil",
                "POST",
                Route::ReviewFulfil(id),
            ),
            ["admin", "orders", id, "review", "refund"] => (
                "/admin/orders/{id}/review/refund",
                "POST",
                Route::ReviewRefund(id),
            ),
            _ => return Route::Unknown,
        };
        let allowed = if allow.starts_with("GET") { get } else { post };
        if allowed {
            route
        } else {
            Route::WrongMethod { template, allow }
        }
    }

    /// Whether a listener serves this route. Health checks and the API description are
    /// on both; anything else on one only, and the other answers 404 as for any unknown
    /// path (the public listener never tells a scanner that an admin API exists).
    pub(super) fn served_on(&self, face: Face) -> bool {
        let template = self.template();
        let operator = template == "/metrics" || template.starts_with("/admin/");
        match self {
            Route::Healthz | Route::Readyz | Route::OpenApi => true,
            Route::Unknown => face == Face::Public,
            _ => operator == (face == Face::Ops),
        }
    }

    /// The deal id segment of the path, for routes about one deal.
    pub(super) fn deal_id(&self) -> Option<&'a str> {
        match self {
            Route::GetDeal(id)
            | Route::PlaceOrder(id)
            | Route::JoinQueue(id)
            | Route::QueueStatus(id)
            | Route::PollTicket(id, _)
            | Route::AdjustStock(id)
            | Route::Inventory(id)
            | Route::PauseDeal(id)
            | Route::AdminDeal(id)
            | Route::DealReport(id)
            | Route::SetAdmission(id)
            | Route::IssueAccessCodes(id)
            | Route::ResumeDeal(id)
            | Route::Rebalance(id)
            | Route::QueueChallenge(id)
            | Route::RevokeQueue(id)
            | Route::WaitPage(id) => Some(id),
            _ => None,
        }
    }

    /// The bounded metric label.
    pub fn template(&self) -> &'static str {
        match self {
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Metrics => "/metrics",
            Route::GetDeal(_) => "/v1/deals/{id}",
            Route::PlaceOrder(_) => "/v1/deals/{id}/orders",
            Route::JoinQueue(_) | Route::QueueStatus(_) => "/v1/deals/{id}/queue",
            Route::PollTicket(..) => "/v1/deals/{id}/queue/{ticket}",
            Route::GetOrder(_) => "/v1/orders/{id}",
            Route::CancelOrder(_) => "/v1/orders/{id}/cancel",
            Route::StartPayment(_) => "/v1/orders/{id}/payments",
            Route::Webhook(_) => "/v1/webhooks/{provider}",
            Route::CreateDeal => "/admin/deals",
            Route::AdjustStock(_) => "/admin/deals/{id}/stock",
            Route::Inventory(_) => "/admin/deals/{id}/inventory",
            Route::PauseDeal(_) => "/admin/deals/{id}/pause",
            Route::AdminDeal(_) => "/admin/deals/{id}",
            Route::DealReport(_) => "/admin/deals/{id}/report",
            Route::SetAdmission(_) => "/admin/deals/{id}/admission",
            Route::IssueAccessCodes(_) => "/admin/deals/{id}/access-codes",
            Route::ResumeDeal(_) => "/admin/deals/{id}/resume",
            Route::Rebalance(_) => "/admin/deals/{id}/rebalance",
            Route::Audit => "/admin/audit",
            Route::OperatorLog => "/admin/operator-log",
            Route::OpenApi => "/openapi.json",
            Route::QueueChallenge(_) => "/v1/deals/{id}/queue/challenge",
            Route::PassKeys => "/.well-known/flashgate-keys.json",
            Route::RevokedPasses => "/.well-known/flashgate-revoked.json",
            Route::RevokeQueue(_) => "/admin/deals/{id}/queue/revoke",
            Route::WaitPage(_) => "/wait/{deal_id}",
            Route::ReviewQueue => "/admin/payments/review",
            Route::ReviewFulfil(_) => "/admin/orders/{id}/review/fulfil",
            Route::ReviewRefund(_) => "/admin/orders/{id}/review/refund",
            Route::EventEndpoints | Route::CreateEventEndpoint => "/admin/event-endpoints",
            Route::EventEndpoint(_) => "/admin/event-endpoints/{id}",
            Route::RotateEventSecret(_) => "/admin/event-endpoints/{id}/rotate-secret",
            Route::ReplayEvents(_) => "/admin/event-endpoints/{id}/replay",
            Route::Events => "/admin/events",
            Route::WrongMethod { template, .. } => template,
            Route::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            Route::of(&Method::GET, "/v1/deals/d1"),
            Route::GetDeal("d1")
        );
        assert_eq!(
            Route::of(&Method::POST, "/v1/deals/d1/orders"),
            Route::PlaceOrder("d1")
        );
        assert_eq!(
            Route::of(&Method::POST, "/admin/deals/d1/stock"),
            Route::AdjustStock("d1")
        );
        assert_eq!(
            Route::of(&Method::POST, "/v1/deals/d1/queue"),
            Route::JoinQueue("d1")
        );
        assert_eq!(
            Route::of(&Method::GET, "/v1/deals/d1/queue"),
            Route::QueueStatus("d1")
        );
        assert_eq!(
            Route::of(&Method::GET, "/v1/deals/d1/queue/t1"),
            Route::PollTicket("d1", "t1")
        );
        assert!(matches!(
            Route::of(&Method::DELETE, "/v1/deals/d1/queue"),
            Route::WrongMethod {
                allow: "GET, HEAD, POST",
                ..
            }
        ));
        assert_eq!(Route::of(&Method::GET, "/v1/deals/d1/x"), Route::Unknown);
        assert!(!Route::of(&Method::GET, "/metrics").served_on(Face::Public));
        assert!(Route::of(&Method::GET, "/metrics").served_on(Face::Ops));
        assert!(!Route::of(&Method::GET, "/admin/audit").served_on(Face::Public));
        assert!(!Route::of(&Method::DELETE, "/admin/deals").served_on(Face::Public));
        assert!(!Route::of(&Method::GET, "/v1/deals/d1").served_on(Face::Ops));
        assert!(Route::of(&Method::GET, "/readyz").served_on(Face::Public));
        assert!(Route::of(&Method::GET, "/readyz").served_on(Face::Ops));
        assert_eq!(Route::of(&Method::GET, "/"), Route::Unknown);
        assert!(matches!(
            Route::of(&Method::DELETE, "/v1/deals/d1"),
            Route::WrongMethod {
                allow: "GET, HEAD",
                ..
            }
        ));
        assert!(matches!(
            Route::of(&Method::GET, "/v1/deals/d1/orders"),
            Route::WrongMethod { allow: "POST", .. }
        ));
    }
}
