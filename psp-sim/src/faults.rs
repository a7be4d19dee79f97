//! Faults a test can switch on through `/control/faults`: slow, duplicated, reordered or
//! lost webhooks, and slow or failing API calls.

use serde::{Deserialize, Serialize};

/// Longest delay a fault may add, in milliseconds; larger values are answered 400 so a
/// typo cannot hang a test run.
pub const DELAY_MS_MAX: u64 = 120_000;
/// Most extra copies of one webhook.
pub const DUPLICATES_MAX: u32 = 100;

/// The faults in force. Everything off is the default.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Faults {
    /// Each webhook waits this long before its first attempt.
    pub webhook_delay_ms: u64,
    /// Extra copies of each webhook, same event id.
    pub webhook_duplicates: u32,
    /// Webhooks are held and each batch is sent newest first, on flush or after a second.
    pub webhook_reorder: bool,
    /// Webhooks are recorded but never sent.
    pub webhook_drop: bool,
    /// API calls take effect, then wait this long before answering.
    pub api_delay_ms: u64,
    /// API calls are answered with this status instead of their result.
    pub api_fail_status: Option<u16>,
    /// With `api_fail_status`: the call still takes effect before the failure is answered.
    pub api_fail_after_effect: bool,
    /// How many more API calls fail; 0 means every call while `api_fail_status` is set.
    pub api_fail_count: u32,
}

/// A `POST /control/faults` body: any subset of the fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    webhook_delay_ms: Option<u64>,
    webhook_duplicates: Option<u32>,
    webhook_reorder: Option<bool>,
    webhook_drop: Option<bool>,
    api_delay_ms: Option<u64>,
    /// `null` clears the status; absent leaves it.
    #[serde(default, with = "double_option")]
    api_fail_status: Option<Option<u16>>,
    api_fail_after_effect: Option<bool>,
    api_fail_count: Option<u32>,
}

mod double_option {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

/// What the API layer must do with one call, decided by [`Faults::take_api_fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiFault {
    /// Answer with this status instead of the result.
    pub fail_status: Option<u16>,
    /// Perform the operation even though the answer is a failure.
    pub perform: bool,
    /// Wait this long after the operation, before answering.
    pub delay_ms: u64,
}

impl Faults {
    /// Applies a patch; out-of-range values leave the faults unchanged.
    pub fn apply(&mut self, patch: FaultsPatch) -> Result<(), String> {
        let mut next = self.clone();
        let delay_ok = |ms: u64| ms <= DELAY_MS_MAX;
        if let Some(ms) = patch.webhook_delay_ms {
            next.webhook_delay_ms = ms;
        }
        if let Some(n) = patch.webhook_duplicates {
            next.webhook_duplicates = n;
        }
        if let Some(on) = patch.webhook_reorder {
            next.webhook_reorder = on;
        }
        if let Some(on) = patch.webhook_drop {
            next.webhook_drop = on;
        }
        if let Some(ms) = patch.api_delay_ms {
            next.api_delay_ms = ms;
        }
        if let Some(status) = patch.api_fail_status {
            next.api_fail_status = status;
        }
        if let Some(on) = patch.api_fail_after_effect {
            next.api_fail_after_effect = on;
        }
        if let Some(n) = patch.api_fail_count {
            next.api_fail_count = n;
        }
        if !delay_ok(next.webhook_delay_ms) || !delay_ok(next.api_delay_ms) {
            return Err(format!("delays must be at most {DELAY_MS_MAX} ms"));
        }
        if next.webhook_duplicates > DUPLICATES_MAX {
            return Err(format!(
                "webhook_duplicates must be at most {DUPLICATES_MAX}"
            ));
        }
        if let Some(status) = next.api_fail_status
            && !(400..=599).contains(&status)
        {
            return Err("api_fail_status must be a 4xx or 5xx status".to_owned());
        }
        *self = next;
        Ok(())
    }

    /// Decides the fault for one API call and counts it against `api_fail_count`.
    pub fn take_api_fault(&mut self) -> ApiFault {
        let fail_status = self.api_fail_status;
        if fail_status.is_some() && self.api_fail_count > 0 {
            self.api_fail_count -= 1;
            if self.api_fail_count == 0 {
                self.api_fail_status = None;
            }
        }
        ApiFault {
            fail_status,
            perform: fail_status.is_none() || self.api_fail_after_effect,
            delay_ms: self.api_delay_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(json: &str) -> FaultsPatch {
        serde_json::from_str(json).expect("valid patch")
    }

    #[test]
    fn fail_count_runs_out_then_calls_pass() {
        let mut faults = Faults::default();
        faults
            .apply(patch(r#"{"api_fail_status": 503, "api_fail_count": 2}"#))
            .expect("valid");
        assert_eq!(faults.take_api_fault().fail_status, Some(503));
        assert!(!faults.take_api_fault().perform);
        let third = faults.take_api_fault();
        assert_eq!(third.fail_status, None);
        assert!(third.perform);
    }

    #[test]
    fn count_zero_fails_every_call_and_null_clears() {
        let mut faults = Faults::default();
        faults
            .apply(patch(
                r#"{"api_fail_status": 500, "api_fail_after_effect": true}"#,
            ))
            .expect("valid");
        for _ in 0..5 {
            let fault = faults.take_api_fault();
            assert_eq!(fault.fail_status, Some(500));
            assert!(fault.perform);
        }
        faults
            .apply(patch(r#"{"api_fail_status": null}"#))
            .expect("valid");
        assert_eq!(faults.take_api_fault().fail_status, None);
    }

    #[test]
    fn out_of_range_patch_changes_nothing() {
        let mut faults = Faults::default();
        assert!(
            faults
                .apply(patch(r#"{"webhook_drop": true, "api_fail_status": 200}"#))
                .is_err()
        );
        assert_eq!(faults, Faults::default());
        assert!(serde_json::from_str::<FaultsPatch>(r#"{"typo": 1}"#).is_err());
    }
}
