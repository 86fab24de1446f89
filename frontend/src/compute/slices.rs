//! Cutting a streaming write into runs of tensors that share one source
//! tensor (an FFN copied into experts, a delta applied to experts), so the
//! browser can yield between runs while each shared function still sees
//! whole groups and writes exactly the bytes of one uninterrupted call.

use std::ops::Range;

/// Consecutive ranges of `0..keys.len()` with equal keys (`None` keys
/// stand alone).
pub fn runs<K: PartialEq>(keys: &[Option<K>]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let joins = i > 0 && k.is_some() && keys[i - 1].as_ref() == k.as_ref();
        match out.last_mut() {
            Some(r) if joins => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_neighbours_share_a_run() {
        let keys = [None, Some("a"), Some("a"), Some("b"), None, None, Some("b")];
        assert_eq!(runs(&keys), vec![0..1, 1..3, 3..4, 4..5, 5..6, 6..7]);
        assert!(runs::<u8>(&[]).is_empty());
    }
}
