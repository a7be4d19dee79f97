//! The verifiable shuffle of a random-order line.
//!
//! Before a random-order sale opens, a seed (32 random bytes, written as 64 lower-case hex
//! digits) is drawn and its SHA-256 (of those 64 ASCII characters, hex) is published in the
//! public queue status as `seed_sha256`. When the sale opens, the `prequeue_size` tickets
//! taken so far (issue numbers 1..=n, the positions they were first given) are reordered and
//! the seed is published as `seed`. Ticket `i` gets position `1 + rank(i)`, where tickets are
//! ranked by `SHA-256("<seed>:<i>")` (the 32 bytes compared as big-endian numbers, ties by
//! `i`). Anyone can recompute the permutation from the seed; nobody, the operator included,
//! can pick the seed after seeing who queued, because its hash was public first.

use sha2::{Digest, Sha256};

/// A fresh seed: 32 random bytes as 64 hex digits.
pub fn new_seed() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// The published commitment to `seed`.
pub fn commitment(seed: &str) -> String {
    hex::encode(Sha256::digest(seed.as_bytes()))
}

/// `positions[i - 1]` is the new position of the ticket issued `i`-th, for `i` in `1..=n`:
/// a permutation of `1..=n`.
pub fn positions(seed: &str, n: u64) -> Vec<u64> {
    let mut keyed: Vec<([u8; 32], u64)> = (1..=n)
        .map(|i| (Sha256::digest(format!("{seed}:{i}")).into(), i))
        .collect();
    keyed.sort_unstable();
    let mut positions = vec![0; keyed.len()];
    for (rank, (_, issue)) in keyed.iter().enumerate() {
        positions[(issue - 1) as usize] = rank as u64 + 1;
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_and_reproducible() {
        let seed = new_seed();
        assert_eq!(seed.len(), 64);
        let first = positions(&seed, 1000);
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=1000).collect::<Vec<u64>>());
        assert_eq!(first, positions(&seed, 1000));
        assert_ne!(first, positions(&new_seed(), 1000));
        assert!(positions(&seed, 0).is_empty());
    }

    #[test]
    fn commitment_is_sha256_of_the_hex_text() {
        assert_eq!(
            commitment("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
