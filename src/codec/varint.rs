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

/// Reads an Avro `long` from the front of `buf`, advancing it; `None` if it is truncated or longer
/// than 64 bits (a 10th byte above 1, or an 11th byte), never silently dropping bits.
pub fn get_long(buf: &mut &[u8]) -> Option<i64> {
    let mut z: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(10) {
        if i == 9 && b > 1 {
            return None; // bits beyond the 64th
        }
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
        // Ten bytes whose last carries bits beyond the 64th, or an eleventh byte: refused.
        let mut overlong: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(get_long(&mut overlong), None);
        let mut eleven: &[u8] = &[
            0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x00,
        ];
        assert_eq!(get_long(&mut eleven), None);
        let mut max: &[u8] = &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(get_long(&mut max), Some(i64::MAX));
    }
}
