//! A proof-of-work client: what an API or mobile client does to join a line whose deal asks
//! for one. Fetches `GET …/queue/challenge`, counts nonces up until SHA-256(`challenge ":"
//! nonce`) has the asked leading zero bits, and joins with `Flashgate-Pow`.

use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The nonce that solves `challenge` at `bits`, and how many hashes it took.
pub fn solve(challenge: &str, bits: u32) -> (u64, u64) {
    let mut nonce = 0u64;
    loop {
        let hash = Sha256::digest(format!("{challenge}:{nonce}").as_bytes());
        if leading_zeros(&hash) >= bits {
            return (nonce, nonce + 1);
        }
        nonce += 1;
    }
}

fn leading_zeros(hash: &[u8]) -> u32 {
    match hash.iter().position(|b| *b != 0) {
        Some(i) => i as u32 * 8 + hash[i].leading_zeros(),
        None => hash.len() as u32 * 8,
    }
}

/// Joins the line at `queue_url`, solving a challenge first when the deal asks for one.
pub async fn join(
    client: &reqwest::Client,
    queue_url: &str,
    token: &str,
) -> Result<reqwest::Response, reqwest::Error> {
    let first = client.post(queue_url).bearer_auth(token).send().await?;
    if first.status() != StatusCode::FORBIDDEN {
        return Ok(first);
    }
    let challenge: Value = client
        .get(format!("{queue_url}/challenge"))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    let (Some(text), Some(bits)) = (
        challenge["challenge"].as_str(),
        challenge["difficulty_bits"].as_u64(),
    ) else {
        return Ok(first);
    };
    let text = text.to_owned();
    let bits = u32::try_from(bits).unwrap_or(u32::MAX);
    let (nonce, _) = tokio::task::spawn_blocking({
        let text = text.clone();
        move || solve(&text, bits)
    })
    .await
    .unwrap_or((0, 0));
    client
        .post(queue_url)
        .bearer_auth(token)
        .header("Flashgate-Pow", format!("{text}:{nonce}"))
        .send()
        .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_solution_meets_the_difficulty() {
        let (nonce, hashes) = super::solve("challenge", 10);
        assert_eq!(hashes, nonce + 1);
        let hash = <sha2::Sha256 as sha2::Digest>::digest(format!("challenge:{nonce}").as_bytes());
        assert!(super::leading_zeros(&hash) >= 10);
    }
}
