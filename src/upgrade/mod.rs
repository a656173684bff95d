//! In-place upgrades (Plans): what a Plan means, as pure functions — its
//! hash ([`hash`]), the Job that upgrades one node ([`job`]), its time
//! window ([`window`]), which nodes apply next and what each needs
//! ([`schedule`]), what a pass keeps of the nodes between passes
//! ([`tally`]) — and the one piece of IO of its own, resolving a
//! channel URL to a version ([`channel`]). The Plan controller
//! (`controllers::plan`) gathers the facts and carries out the steps.

pub mod channel;
pub mod hash;
pub mod job;
pub mod schedule;
pub mod tally;
pub mod window;

/// The labels of upgrade Jobs and of a Plan's NodeMaintenances (the Plan
/// API's conventions, [`crate::api::plan::labels`]).
pub use crate::api::plan::labels;

/// A Kubernetes name made of `parts` joined by `-`, at most 63 characters:
/// a long one is cut and ends in a digest of the whole, so distinct inputs
/// stay distinct (the naming upstream's Jobs use).
pub fn safe_concat_name(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let full = parts.join("-");
    if full.len() < 64 {
        return full;
    }
    let digest = hex(&Sha256::digest(full.as_bytes()));
    // Cut where a name may end (a letter or digit), then the digest.
    let bytes = full.as_bytes();
    let c = bytes[56];
    if c.is_ascii_lowercase() || c.is_ascii_digit() {
        format!("{}-{}", &full[..57], &digest[..5])
    } else {
        format!("{}-{}", &full[..56], &digest[..6])
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cut_to_63_with_a_digest() {
        let table: &[(&[&str], usize)] = &[
            (&["apply", "p", "on", "n", "with", "abc"], 21),
            (
                &["apply", "k3os-latest", "on", "worker-1", "with", &"f".repeat(56)],
                63,
            ),
            (&["apply", "x", "", "y"], 9),
        ];
        for (parts, len) in table {
            let name = safe_concat_name(parts);
            assert_eq!(name.len(), *len, "{name}");
            assert!(name.len() <= 63);
        }
        let a = safe_concat_name(&["apply", "k3os-latest", "on", "worker-1", "with", &"a".repeat(56)]);
        let b = safe_concat_name(&["apply", "k3os-latest", "on", "worker-1", "with", &"b".repeat(56)]);
        assert_ne!(a, b, "distinct hashes give distinct names");
    }
}
