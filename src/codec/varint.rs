//! Avro's zig-zag variable-length integers.

/// Appends `n` as an Avro `long`.
pub fn put_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Reads an Avro `long` from the front of `buf`, advancing it.
pub fn get_long(buf: &mut &[u8]) -> Option<i64> {
    let mut z: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(10) {
        z |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_matches_the_spec_examples() {
        for (n, bytes) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 1]),
        ] {
            let mut out = Vec::new();
            put_long(&mut out, n);
            assert_eq!(out, bytes);
        }
        for n in [i64::MIN, -123_456_789, 0, 7, i64::MAX] {
            let mut out = Vec::new();
            put_long(&mut out, n);
            let mut s = &out[..];
            assert_eq!(get_long(&mut s), Some(n));
            assert!(s.is_empty());
        }
        let mut truncated: &[u8] = &[0x80, 0x80];
        assert_eq!(get_long(&mut truncated), None);
    }
}
