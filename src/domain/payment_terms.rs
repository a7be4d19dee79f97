//! How a deal takes money, as types: the capture method and what happens to money that
//! arrives after its order gave its units back. Stored as text (the tables' CHECK
//! constraints keep the same names); parsed once where rows and requests are read.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What happens to money that arrives after its order stopped holding units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatePaymentPolicy {
    /// Take the units again if any are left, else refund.
    #[default]
    ReserveOrRefund,
    /// Always refund.
    Refund,
    /// Park the order in MANUAL_REVIEW for an operator to fulfil or refund.
    ManualReview,
}

/// When the money is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    /// Charged at once.
    #[default]
    Automatic,
    /// Authorised, captured once the order is confirmed (a late one is voided instead).
    Manual,
}

impl LatePaymentPolicy {
    pub const ALL: [Self; 3] = [Self::ReserveOrRefund, Self::Refund, Self::ManualReview];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReserveOrRefund => "reserve_or_refund",
            Self::Refund => "refund",
            Self::ManualReview => "manual_review",
        }
    }
}

impl CaptureMethod {
    pub const ALL: [Self; 2] = [Self::Automatic, Self::Manual];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Automatic => "automatic",
            Self::Manual => "manual",
        }
    }
}

impl TryFrom<String> for LatePaymentPolicy {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL.into_iter().find(|p| p.as_str() == raw).ok_or(raw)
    }
}

impl TryFrom<String> for CaptureMethod {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::ALL.into_iter().find(|c| c.as_str() == raw).ok_or(raw)
    }
}

impl fmt::Display for LatePaymentPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for CaptureMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for policy in LatePaymentPolicy::ALL {
            assert_eq!(LatePaymentPolicy::try_from(policy.to_string()), Ok(policy));
            let json = serde_json::to_string(&policy).unwrap();
            assert_eq!(json, format!("\"{policy}\""));
        }
        for method in CaptureMethod::ALL {
            assert_eq!(CaptureMethod::try_from(method.to_string()), Ok(method));
        }
        assert!(LatePaymentPolicy::try_from("Refund".to_owned()).is_err());
        assert!(serde_json::from_str::<CaptureMethod>("\"later\"").is_err());
    }
}
