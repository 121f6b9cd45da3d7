//! MAC addresses in their text form (`02:00:00:00:00:01`), as the configuration, the
//! shared store and the status views write them, and the rule for one a frame may be sent
//! to (one station's: not a group address, not zero).

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("`{s}` is not a MAC address (expected 6 hex pairs like 02:00:00:00:00:01)"));
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return Err(format!("`{s}` is not a MAC address"));
        }
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| format!("`{s}` is not a MAC address"))?;
    }
    Ok(mac)
}

/// A MAC a frame can be sent to as one station's: not all zeros, not a group
/// (multicast or broadcast: the least significant bit of the first byte).
pub fn check_unicast_mac(mac: &[u8; 6]) -> Result<(), String> {
    if *mac == [0; 6] {
        return Err("00:00:00:00:00:00 is no station's address".into());
    }
    if mac[0] & 1 == 1 {
        return Err("is a group (multicast or broadcast) address, not one station's".into());
    }
    Ok(())
}

/// The text form: six lower-case hex pairs.
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// One station's address: a frame sent to it reaches one host.
pub fn is_unicast(mac: &[u8; 6]) -> bool {
    check_unicast_mac(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_both_ways_and_the_unicast_rule() {
        assert_eq!(parse_mac("02:99:00:00:01:0a"), Ok([2, 0x99, 0, 0, 1, 10]));
        assert_eq!(format_mac(&[2, 0x99, 0, 0, 1, 10]), "02:99:00:00:01:0a");
        assert!(parse_mac("02:99:00:00:01").is_err());
        assert!(parse_mac("zz:99:00:00:01:0a").is_err());
        assert!(parse_mac("2:99:00:00:01:0a").is_err());
        assert!(is_unicast(&[2, 0, 0, 0, 0, 1]));
        assert!(!is_unicast(&[0xff; 6]));
        assert!(!is_unicast(&[1, 0, 0x5e, 0, 0, 1]));
        assert!(!is_unicast(&[0; 6]));
    }
}
