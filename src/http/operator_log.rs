//! `GET /admin/operator-log?after=<cursor>&limit=N`: the operator log, oldest first, a
//! page at a time; `next` is the cursor to read on from.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use super::State;
use super::body::{self, Caching};
use super::guard::require_admin;
use super::problem::Problem;
use crate::operators::{self, PAGE_ENTRIES_DEFAULT, PAGE_ENTRIES_MAX};
use crate::store::StoreError;

/// Where to read from and how much, as the query string asks.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    after: i64,
    limit: i64,
}

fn parse(query: Option<&str>) -> Result<Asked, Problem> {
    let mut asked = Asked {
        after: 0,
        limit: PAGE_ENTRIES_DEFAULT,
    };
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => {
                asked.after = operators::parse_cursor(value).ok_or_else(|| {
                    Problem::invalid("after must be a cursor given back as `next`")
                })?;
            }
            "limit" => {
                asked.limit = value
                    .parse()
                    .ok()
                    .filter(|limit| (1..=PAGE_ENTRIES_MAX).contains(limit))
                    .ok_or_else(|| {
                        Problem::invalid(format!("limit must be 1-{PAGE_ENTRIES_MAX}"))
                    })?;
            }
            _ => {}
        }
    }
    Ok(asked)
}

pub async fn list<B>(
    state: &State,
    request: &Request<B>,
) -> Result<Response<Full<Bytes>>, Problem> {
    require_admin(state, request).await?;
    let asked = parse(request.uri().query())?;
    let page = operators::page(&state.pools.admin, asked.after, asked.limit)
        .await
        .map_err(StoreError::from)?;
    Ok(body::respond(StatusCode::OK, &page, Caching::Private))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cursor_and_the_limit() {
        assert_eq!(
            parse(None).unwrap(),
            Asked {
                after: 0,
                limit: 100
            }
        );
        assert_eq!(
            parse(Some("after=42&limit=5&x=1")).unwrap(),
            Asked {
                after: 42,
                limit: 5
            }
        );
        for bad in ["after=-1", "after=x", "limit=0", "limit=1001", "limit="] {
            assert!(parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
