//! The sale's verdict: what must hold after any sale, however it went — no unit sold
//! twice, the inventory invariant, every acknowledged order held in the inventory and, with
//! the database at hand, present there.

use serde_json::{Value, json};

/// What the database says about the orders behind the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbCheck {
    /// Orders of the deal holding units (pending or paid).
    pub holding_orders: i64,
    /// Units those orders hold.
    pub holding_units: i64,
    /// Acknowledged order ids (201s) that exist in the database.
    pub acknowledged_found: i64,
    pub acknowledged: i64,
    /// Buyers holding units, and the most units one of them holds (the per-user limit,
    /// checked across every gateway the sale went through).
    pub buyers_holding: i64,
    pub most_units_of_one_buyer: i64,
}

pub(crate) async fn check_database(
    url: &str,
    deal_id: &str,
    order_ids: &[String],
) -> Result<DbCheck, String> {
    let pool = sqlx::PgPool::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let (holding_orders, holding_units): (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(quantity), 0)::bigint FROM orders
          WHERE deal_id = $1 AND status IN ('PENDING_PAYMENT', 'PAID')",
    )
    .bind(deal_id)
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string())?;
    let ids: Vec<uuid::Uuid> = order_ids
        .iter()
        .filter_map(|id| uuid::Uuid::parse_str(id).ok())
        .collect();
    let found: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let (buyers_holding, most_units_of_one_buyer): (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(max(units), 0)::bigint
           FROM (SELECT sum(quantity) AS units FROM orders
                  WHERE deal_id = $1 AND status IN ('PENDING_PAYMENT', 'PAID')
                  GROUP BY user_id) per_buyer",
    )
    .bind(deal_id)
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string())?;
    pool.close().await;
    Ok(DbCheck {
        holding_orders,
        holding_units,
        acknowledged_found: found,
        acknowledged: order_ids.len() as i64,
        buyers_holding,
        most_units_of_one_buyer,
    })
}

/// Pass or fail, with every reason to fail.
pub fn verdict(
    stock: i64,
    per_user_limit: i64,
    created: u64,
    inventory: &Value,
    db: Option<&DbCheck>,
) -> (bool, Vec<String>) {
    let mut reasons = Vec::new();
    let field = |name: &str| inventory[name].as_i64();
    let (Some(available), Some(reserved), Some(sold), Some(total)) = (
        field("available"),
        field("reserved"),
        field("sold"),
        field("stock_total"),
    ) else {
        return (false, vec![format!("unreadable inventory: {inventory}")]);
    };
    if inventory["invariant_holds"] != json!(true) {
        reasons.push("the gateway reports the inventory invariant broken".to_owned());
    }
    if total != available + reserved + sold {
        reasons.push(format!(
            "stock_total {total} != available {available} + reserved {reserved} + sold {sold}"
        ));
    }
    if reserved + sold > stock {
        reasons.push(format!(
            "oversold: {} units held of {stock}",
            reserved + sold
        ));
    }
    if i64::try_from(created).unwrap_or(i64::MAX) != reserved + sold {
        reasons.push(format!(
            "{created} orders acknowledged but {} units held",
            reserved + sold
        ));
    }
    if let Some(db) = db {
        if db.acknowledged_found != db.acknowledged {
            reasons.push(format!(
                "{} acknowledged orders missing from the database",
                db.acknowledged - db.acknowledged_found
            ));
        }
        if db.most_units_of_one_buyer > per_user_limit {
            reasons.push(format!(
                "a buyer holds {} units; the per-user limit is {per_user_limit}",
                db.most_units_of_one_buyer
            ));
        }
        if db.holding_units != reserved + sold || db.holding_units > stock {
            reasons.push(format!(
                "orders hold {} units; inventory says {}",
                db.holding_units,
                reserved + sold
            ));
        }
    }
    (reasons.is_empty(), reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(available: i64, reserved: i64, sold: i64, total: i64, holds: bool) -> Value {
        json!({"available": available, "reserved": reserved, "sold": sold, "stock_total": total, "invariant_holds": holds})
    }

    #[test]
    fn a_clean_sale_passes() {
        let (ok, reasons) = verdict(10, 1, 10, &inventory(0, 10, 0, 10, true), None);
        assert!(ok, "{reasons:?}");
    }

    #[test]
    fn oversell_broken_invariant_and_lost_orders_fail() {
        assert!(
            !verdict(10, 1, 11, &inventory(0, 11, 0, 11, true), None).0,
            "oversell"
        );
        assert!(
            !verdict(10, 1, 9, &inventory(1, 9, 0, 11, true), None).0,
            "sum off"
        );
        assert!(
            !verdict(10, 1, 10, &inventory(0, 10, 0, 10, false), None).0,
            "gateway says broken"
        );
        assert!(
            !verdict(10, 1, 9, &inventory(0, 10, 0, 10, true), None).0,
            "acknowledged != held"
        );
        let lost = DbCheck {
            holding_orders: 9,
            holding_units: 9,
            acknowledged_found: 9,
            acknowledged: 10,
            buyers_holding: 9,
            most_units_of_one_buyer: 1,
        };
        assert!(
            !verdict(10, 1, 10, &inventory(0, 10, 0, 10, true), Some(&lost)).0,
            "lost order"
        );
        let greedy = DbCheck {
            holding_orders: 10,
            holding_units: 10,
            acknowledged_found: 10,
            most_units_of_one_buyer: 2,
            ..lost
        };
        assert!(
            !verdict(10, 1, 10, &inventory(0, 10, 0, 10, true), Some(&greedy)).0,
            "a buyer over the per-user limit"
        );
        assert!(!verdict(10, 1, 10, &json!({}), None).0, "unreadable");
    }
}
