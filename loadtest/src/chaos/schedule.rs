//! The fault schedule: derived from the seed alone, so a failing run can be replayed.

use std::fmt;
use std::time::Duration;

/// SplitMix64: a tiny, well-mixed generator whose whole state is the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..high` (`low` when the range is empty).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.between(0, 100) < percent
    }
}

/// One fault, healed after `for_ms` (or at once for instantaneous ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a gateway, restart it after the pause.
    KillGateway { gateway: usize },
    /// SIGTERM every gateway one after the other, each restarted before the next.
    RollingRestart,
    /// Crash PostgreSQL (immediate stop) and start it again after the pause.
    RestartPostgres,
    /// Kill Redis; it comes back empty after the pause.
    KillRedis,
    /// SIGSTOP Redis, SIGCONT after the pause.
    FreezeRedis,
    /// Redis forgets everything at once (FLUSHALL).
    EmptyRedis,
    /// Every provider API call answers late.
    ProviderLatency,
    /// Every provider API call answers 503 (after taking effect on half of the runs).
    ProviderOutage { after_effect: bool },
    /// Webhooks duplicated and reordered, delivered to another gateway.
    WebhookStorm { gateway: usize },
}

/// A fault at a time after the sale opened.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub at: Duration,
    pub fault: Fault,
    pub lasts: Duration,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={:>6} ms  {:?} for {} ms",
            self.at.as_millis(),
            self.fault,
            self.lasts.as_millis()
        )
    }
}

/// Faults spread over the first three quarters of the sale, one at a time; the last
/// quarter runs clean so every outcome can settle.
pub fn schedule(seed: u64, duration: Duration, gateways: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let window_ms = (duration.as_millis() as u64 * 3 / 4).max(1);
    let mut steps = Vec::new();
    let mut at_ms = rng.between(500, 2_000);
    while at_ms < window_ms {
        let fault = pick(&mut rng, gateways);
        let lasts_ms = match fault {
            Fault::EmptyRedis => 0,
            Fault::RestartPostgres => rng.between(1_000, 4_000),
            _ => rng.between(500, 3_000),
        };
        steps.push(Step {
            at: Duration::from_millis(at_ms),
            fault,
            lasts: Duration::from_millis(lasts_ms),
        });
        at_ms += lasts_ms + rng.between(1_000, 3_000);
    }
    steps
}

fn pick(rng: &mut Rng, gateways: usize) -> Fault {
    let gateway = rng.between(0, gateways as u64) as usize;
    match rng.between(0, 9) {
        0 => Fault::KillGateway { gateway },
        1 => Fault::RollingRestart,
        2 => Fault::RestartPostgres,
        3 => Fault::KillRedis,
        4 => Fault::FreezeRedis,
        5 => Fault::EmptyRedis,
        6 => Fault::ProviderLatency,
        7 => Fault::ProviderOutage {
            after_effect: rng.chance(50),
        },
        _ => Fault::WebhookStorm { gateway },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = schedule(7, Duration::from_secs(60), 3);
        let b = schedule(7, Duration::from_secs(60), 3);
        let show = |s: &[Step]| s.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(show(&a), show(&b));
        assert!(a.len() >= 5, "{a:?}");
        assert_ne!(show(&a), show(&schedule(8, Duration::from_secs(60), 3)));
        for step in &a {
            assert!(step.at + step.lasts <= Duration::from_secs(45) + Duration::from_secs(4));
        }
    }
}
