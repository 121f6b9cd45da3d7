//! Reading a SIP message's affinity, one byte at a time.
//!
//! The same state machine runs in the XDP program (one `bpf_loop` step per byte of a
//! UDP datagram on a SIP VIP) and in the agent (the answers to its SIP health checks,
//! `ibmappid=` on HTTP requests), so both planes read an affinity ID identically.
//!
//! What it finds in the header section (up to the empty line):
//! - the start line: a request, or a response (`SIP/2.0 ...`); a start line without
//!   `SIP/2.0` is not SIP;
//! - `;ibmsid=` in any `Route` header (the first one found);
//! - `;ibmsid=` in the top `Via` (`v`) value: the first via-parm of the first Via;
//! - the `;tag=` of `To` (`t`) and `From` (`f`), outside `<...>` and quoted strings;
//! - the `Call-ID` (`i`) value.
//!
//! Header names are case-insensitive, may be followed by blanks before the colon, may
//! repeat (the first counts) and may fold (a line starting with a blank continues the
//! previous value). Parameter names are case-insensitive; blanks around `;` and `=` are
//! skipped. A CR is ignored: lines end at LF, so bare-LF messages read as well.
//!
//! A session ID is `LN.<digits>[.<digits>]_<digits>_<digits>`: the logical name is what
//! comes before the first `.` after which only digits, `.` and `_` follow, and that tail
//! must hold a `_`. A tag or ibmsid without that shape (an ordinary UA's random tag) is no
//! affinity. The hash of the logical name is `hash::cookie_hash` of its bytes, the key of
//! `CLONES`, as for clone IDs.

/// Bytes of a datagram's SIP message the XDP program reads at most. A message whose
/// header section does not end within them has no usable affinity (dropped, counted).
pub const SIP_SCAN_MAX: usize = 2048;

/// Where the affinity came from (`Scan::affinity`).
pub const SRC_NONE: u8 = 0;
pub const SRC_ROUTE: u8 = 1;
pub const SRC_VIA: u8 = 2;
pub const SRC_TO_TAG: u8 = 3;
pub const SRC_FROM_TAG: u8 = 4;
pub const SRC_CALL_ID: u8 = 5;

// Phases of a line.
const P_START: u8 = 0;
const P_LINE_BEGIN: u8 = 1;
const P_NAME: u8 = 2;
const P_NAME_END: u8 = 3;
const P_VALUE: u8 = 4;
const P_SKIP: u8 = 5;
const P_DONE: u8 = 6;

// Headers of interest.
const H_OTHER: u8 = 0;
const H_ROUTE: u8 = 1;
const H_VIA: u8 = 2;
const H_TO: u8 = 3;
const H_FROM: u8 = 4;
const H_CALL_ID: u8 = 5;

// `found` bits, one per source.
const F_ROUTE: u8 = 1 << SRC_ROUTE;
const F_VIA: u8 = 1 << SRC_VIA;
const F_TO: u8 = 1 << SRC_TO_TAG;
const F_FROM: u8 = 1 << SRC_FROM_TAG;
const F_CALL_ID: u8 = 1 << SRC_CALL_ID;

// `seen` bits: the first occurrence of a header was read (a repeated one is ignored).
const S_TO: u8 = 1;
const S_FROM: u8 = 2;
const S_CALL_ID: u8 = 4;
const S_VIA_TOP_DONE: u8 = 8;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A header name's first 8 bytes, lowercased, packed big-end first.
const fn pack(name: &[u8]) -> u64 {
    let mut v = 0u64;
    let mut i = 0;
    while i < name.len() {
        v = (v << 8) | name[i] as u64;
        i += 1;
    }
    v
}

const N_ROUTE: u64 = pack(b"route");
const N_VIA: u64 = pack(b"via");
const N_V: u64 = pack(b"v");
const N_TO: u64 = pack(b"to");
const N_T: u64 = pack(b"t");
const N_FROM: u64 = pack(b"from");
const N_F: u64 = pack(b"f");
const N_CALL_ID: u64 = pack(b"call-id");
const N_I: u64 = pack(b"i");

/// `;ibmsid=` and `;tag=`, matched a byte at a time (lowercase).
#[inline(always)]
fn ibmsid_at(i: u8) -> u8 {
    match i {
        0 => b';',
        1 => b'i',
        2 => b'b',
        3 => b'm',
        4 => b's',
        5 => b'i',
        6 => b'd',
        _ => b'=',
    }
}
const IBMSID_LEN: u8 = 8;

#[inline(always)]
fn tag_at(i: u8) -> u8 {
    match i {
        0 => b';',
        1 => b't',
        2 => b'a',
        3 => b'g',
        _ => b'=',
    }
}
const TAG_LEN: u8 = 5;

/// The scanner's state: zero is the start (`Default`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Logical-name hashes by source (valid where `found` says), and the Call-ID's hash.
    pub route: u64,
    pub via: u64,
    pub to: u64,
    pub from: u64,
    pub call_id: u64,
    /// The header name being read (packed), then the capture's running hash and the hash
    /// of its logical-name candidate.
    name: u64,
    cap_hash: u64,
    cap_ln: u64,
    /// Bytes read.
    pub len: u32,
    cap_len: u16,
    cap_ln_len: u16,
    phase: u8,
    header: u8,
    name_len: u8,
    /// Matcher position in `;ibmsid=` / `;tag=`.
    m: u8,
    /// What is being captured: 0, or a `SRC_*`.
    cap: u8,
    /// The capture's tail so far holds only digits, `.` and `_` (since `cap_ln`), and
    /// whether a `_` was among them.
    tail: u8,
    underscore: u8,
    /// Inside `<...>` or a quoted string of a To/From value.
    angle: u8,
    quote: u8,
    found: u8,
    seen: u8,
    /// Start line: position in "sip/2.0" matched so far, and whether it was seen (and
    /// whether at the very start: a response).
    ver_m: u8,
    pub sip: u8,
    pub response: u8,
    /// The header section ended (empty line).
    pub done: u8,
    _pad: [u8; 3],
}

#[inline(always)]
const fn lower(b: u8) -> u8 {
    if b.is_ascii_uppercase() {
        b | 0x20
    } else {
        b
    }
}

#[inline(always)]
const fn blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

impl Scan {
    /// Reads one byte. Returns false once the header section has ended (nothing more to
    /// read).
    #[inline(always)]
    pub fn step(&mut self, b: u8) -> bool {
        self.len += 1;
        if b == b'\r' {
            return true;
        }
        match self.phase {
            P_START => self.start_line(b),
            P_LINE_BEGIN => {
                if b == b'\n' {
                    self.phase = P_DONE;
                    self.done = 1;
                    return false;
                }
                if blank(b) {
                    // Folded: the previous header's value goes on.
                    self.phase = if self.header != H_OTHER { P_VALUE } else { P_SKIP };
                } else {
                    self.header = H_OTHER;
                    self.name = lower(b) as u64;
                    self.name_len = 1;
                    self.phase = P_NAME;
                }
            }
            P_NAME => {
                if b == b':' {
                    self.begin_value();
                } else if b == b'\n' {
                    self.phase = P_LINE_BEGIN;
                } else if blank(b) {
                    self.phase = P_NAME_END;
                } else if self.name_len < 8 {
                    self.name = (self.name << 8) | lower(b) as u64;
                    self.name_len += 1;
                } else {
                    // Longer than any name of interest.
                    self.name = 0;
                    self.name_len = 9;
                }
            }
            P_NAME_END => {
                if b == b':' {
                    self.begin_value();
                } else if b == b'\n' {
                    self.phase = P_LINE_BEGIN;
                } else if !blank(b) {
                    self.phase = P_SKIP;
                }
            }
            P_VALUE => self.value(b),
            P_SKIP => {
                if b == b'\n' {
                    self.phase = P_LINE_BEGIN;
                }
            }
            _ => return false,
        }
        true
    }

    #[inline(always)]
    fn start_line(&mut self, b: u8) {
        if b == b'\n' {
            self.phase = P_LINE_BEGIN;
            self.header = H_OTHER;
            return;
        }
        if self.sip != 0 {
            return;
        }
        let want = match self.ver_m {
            0 => b's',
            1 => b'i',
            2 => b'p',
            3 => b'/',
            4 => b'2',
            5 => b'.',
            _ => b'0',
        };
        let l = lower(b);
        if l == want {
            self.ver_m += 1;
            if self.ver_m == 7 {
                self.sip = 1;
                // "SIP/2.0" as the first bytes: a status line.
                if self.len == 7 {
                    self.response = 1;
                }
            }
        } else {
            self.ver_m = if l == b's' { 1 } else { 0 };
        }
    }

    #[inline(always)]
    fn begin_value(&mut self) {
        let n = self.name;
        let h = if self.name_len > 8 {
            H_OTHER
        } else if n == N_ROUTE {
            H_ROUTE
        } else if n == N_VIA || n == N_V {
            H_VIA
        } else if n == N_TO || n == N_T {
            H_TO
        } else if n == N_FROM || n == N_F {
            H_FROM
        } else if n == N_CALL_ID || n == N_I {
            H_CALL_ID
        } else {
            H_OTHER
        };
        // Only what can still be found is read; the rest of the line is skipped.
        let wanted = match h {
            H_ROUTE => self.found & F_ROUTE == 0,
            H_VIA => self.seen & S_VIA_TOP_DONE == 0,
            H_TO => self.seen & S_TO == 0,
            H_FROM => self.seen & S_FROM == 0,
            H_CALL_ID => self.seen & S_CALL_ID == 0,
            _ => false,
        };
        if !wanted {
            self.skip_line();
            return;
        }
        // The first occurrence is the one read.
        self.seen |= match h {
            H_VIA => S_VIA_TOP_DONE,
            H_TO => S_TO,
            H_FROM => S_FROM,
            H_CALL_ID => S_CALL_ID,
            _ => 0,
        };
        self.header = h;
        self.phase = P_VALUE;
        self.m = 0;
        self.angle = 0;
        self.quote = 0;
        if h == H_CALL_ID {
            self.begin_capture(SRC_CALL_ID);
        }
    }

    #[inline(always)]
    fn begin_capture(&mut self, what: u8) {
        self.cap = what;
        self.cap_hash = FNV_OFFSET;
        self.cap_ln = 0;
        self.cap_len = 0;
        self.cap_ln_len = 0;
        self.tail = 0;
        self.underscore = 0;
    }

    /// A byte of a header value of interest.
    #[inline(always)]
    fn value(&mut self, b: u8) {
        if b == b'\n' {
            self.end_capture();
            self.end_line();
            return;
        }
        if self.cap != 0 {
            self.capture(b);
            return;
        }
        let h = self.header;
        if h == H_VIA && b == b',' {
            // The top via-parm ends: later ones are other hops'.
            self.skip_line();
            return;
        }
        if h == H_TO || h == H_FROM {
            if b == b'"' && self.angle == 0 {
                self.quote ^= 1;
                return;
            }
            if self.quote != 0 {
                return;
            }
            if b == b'<' {
                self.angle = 1;
                self.m = 0;
                return;
            }
            if b == b'>' {
                self.angle = 0;
                return;
            }
            if self.angle != 0 {
                return;
            }
            self.matcher(b, TAG_LEN, if h == H_TO { SRC_TO_TAG } else { SRC_FROM_TAG });
            return;
        }
        self.matcher(b, IBMSID_LEN, if h == H_ROUTE { SRC_ROUTE } else { SRC_VIA });
    }

    /// Advances the parameter matcher; on a full match, starts capturing for `what`.
    #[inline(always)]
    fn matcher(&mut self, b: u8, len: u8, what: u8) {
        let l = lower(b);
        if self.m > 0 && blank(b) {
            return;
        }
        let want = if len == TAG_LEN { tag_at(self.m) } else { ibmsid_at(self.m) };
        if l == want {
            self.m += 1;
            if self.m == len {
                self.m = 0;
                self.begin_capture(what);
            }
        } else {
            self.m = if l == b';' { 1 } else { 0 };
        }
    }

    /// A byte of a captured value.
    #[inline(always)]
    fn capture(&mut self, b: u8) {
        if self.cap == SRC_CALL_ID {
            if blank(b) {
                if self.cap_len > 0 {
                    self.end_capture();
                    self.skip_line();
                }
                return;
            }
            self.cap_hash = (self.cap_hash ^ b as u64).wrapping_mul(FNV_PRIME);
            self.cap_len = self.cap_len.saturating_add(1);
            return;
        }
        if blank(b) && self.cap_len == 0 {
            return;
        }
        if matches!(b, b';' | b',' | b'>' | b'<' | b'?' | b'&' | b'"' | b' ' | b'\t') {
            self.end_capture();
            if self.header == H_VIA && b == b',' {
                self.skip_line();
            } else if b == b'>' {
                self.angle = 0;
            } else if b == b';' {
                // The next parameter may be the one (`;tag=` after an ibmsid-less tag...).
                self.m = 1;
            }
            return;
        }
        if b == b'.' {
            if self.tail == 0 {
                self.cap_ln = self.cap_hash;
                self.cap_ln_len = self.cap_len;
                self.tail = 1;
                self.underscore = 0;
            }
        } else if b == b'_' {
            if self.tail != 0 {
                self.underscore = 1;
            }
        } else if !b.is_ascii_digit() {
            self.tail = 0;
            self.underscore = 0;
        }
        self.cap_hash = (self.cap_hash ^ b as u64).wrapping_mul(FNV_PRIME);
        self.cap_len = self.cap_len.saturating_add(1);
    }

    /// Ends a capture in progress: records what it found.
    #[inline(always)]
    fn end_capture(&mut self) {
        let what = self.cap;
        if what == 0 {
            return;
        }
        self.cap = 0;
        if what == SRC_CALL_ID {
            if self.cap_len > 0 {
                self.call_id = self.cap_hash;
                self.found |= F_CALL_ID;
            }
            return;
        }
        if self.tail == 0 || self.underscore == 0 || self.cap_ln_len == 0 {
            return;
        }
        let ln = self.cap_ln;
        match what {
            SRC_ROUTE => {
                self.route = ln;
                self.found |= F_ROUTE;
            }
            SRC_VIA => {
                self.via = ln;
                self.found |= F_VIA;
            }
            SRC_TO_TAG => {
                self.to = ln;
                self.found |= F_TO;
            }
            _ => {
                self.from = ln;
                self.found |= F_FROM;
            }
        }
    }

    #[inline(always)]
    fn end_line(&mut self) {
        self.phase = P_LINE_BEGIN;
    }

    /// The rest of this line (and its folded continuation) says nothing of interest.
    #[inline(always)]
    fn skip_line(&mut self) {
        self.header = H_OTHER;
        self.phase = P_SKIP;
    }

    /// Whether the source was found.
    #[inline(always)]
    pub fn has(&self, src: u8) -> bool {
        self.found & (1 << src) != 0
    }

    /// The affinity of a complete SIP message: the logical name's hash and where it was
    /// found — a request by Route `ibmsid`, then To tag, then From tag; a response by its
    /// top Via `ibmsid`, then From tag, then To tag — else the Call-ID's hash
    /// (`SRC_CALL_ID`). `None`: not SIP, the header section did not end, or no Call-ID.
    #[inline(always)]
    pub fn affinity(&self) -> Option<(u8, u64)> {
        if self.done == 0 {
            return None;
        }
        self.affinity_so_far()
    }

    /// As `affinity`, from the headers read so far whether or not the header section
    /// ended: a datagram's first fragment, whose header section may go on in the next
    /// one (a Route or Via `ibmsid` past it is not seen; the Call-ID must have been).
    #[inline(always)]
    pub fn affinity_so_far(&self) -> Option<(u8, u64)> {
        if self.sip == 0 {
            return None;
        }
        let f = self.found;
        // RFC 3261 8.1.1: every request and response carries a Call-ID; a message without
        // one is not SIP, whatever names it carries.
        if f & F_CALL_ID == 0 {
            return None;
        }
        if self.response == 0 {
            if f & F_ROUTE != 0 {
                return Some((SRC_ROUTE, self.route));
            }
            if f & F_TO != 0 {
                return Some((SRC_TO_TAG, self.to));
            }
            if f & F_FROM != 0 {
                return Some((SRC_FROM_TAG, self.from));
            }
        } else {
            if f & F_VIA != 0 {
                return Some((SRC_VIA, self.via));
            }
            if f & F_FROM != 0 {
                return Some((SRC_FROM_TAG, self.from));
            }
            if f & F_TO != 0 {
                return Some((SRC_TO_TAG, self.to));
            }
        }
        Some((SRC_CALL_ID, self.call_id))
    }
}

/// Scans a whole message (host side: tests, the agent).
pub fn scan(msg: &[u8]) -> Scan {
    let mut s = Scan::default();
    for &b in msg.iter().take(SIP_SCAN_MAX) {
        if !s.step(b) {
            break;
        }
    }
    s
}

/// The logical name of a session ID (`LN.<digits>[.<digits>]_<digits>_<digits>`), by
/// the rule the scanner applies; `None` when the value has not that shape.
pub fn logical_name(session_id: &[u8]) -> Option<&[u8]> {
    let mut ln_end = None;
    let mut underscore = false;
    for (i, &b) in session_id.iter().enumerate() {
        if b == b'.' {
            if ln_end.is_none() {
                ln_end = Some(i);
                underscore = false;
            }
        } else if b == b'_' {
            underscore |= ln_end.is_some();
        } else if !b.is_ascii_digit() {
            ln_end = None;
            underscore = false;
        }
    }
    match ln_end {
        Some(end) if end > 0 && underscore => Some(&session_id[..end]),
        _ => None,
    }
}

/// The logical name whose hash (`hash::cookie_hash`, as the scanner computes it) is
/// `hash`, found among the `ibmsid=` and `tag=` parameter values of `msg` (host side: the
/// agent names what the XDP program reported by its hash). `None`: no such value.
pub fn logical_name_with_hash(msg: &[u8], hash: u64) -> Option<&[u8]> {
    let msg = &msg[..msg.len().min(SIP_SCAN_MAX)];
    let mut i = 0;
    while i < msg.len() {
        let rest = &msg[i..];
        let key = if rest.len() >= 7 && rest[..7].eq_ignore_ascii_case(b"ibmsid=") {
            7
        } else if rest.len() >= 4 && rest[..4].eq_ignore_ascii_case(b"tag=") {
            4
        } else {
            i += 1;
            continue;
        };
        let value = &rest[key..];
        let end = value
            .iter()
            .position(|b| matches!(b, b';' | b',' | b'>' | b'<' | b'?' | b'&' | b'"' | b' ' | b'\t' | b'\r' | b'\n'))
            .unwrap_or(value.len());
        if let Some(ln) = logical_name(&value[..end]) {
            if crate::hash::cookie_hash(ln) == hash {
                return Some(ln);
            }
        }
        i += key + end;
    }
    None
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::hash::cookie_hash;

    fn ln(s: &str) -> u64 {
        cookie_hash(s.as_bytes())
    }

    /// A first fragment's header section, cut anywhere: the affinity of what it holds, a
    /// value cut short never taken, and nothing without the Call-ID.
    #[test]
    fn a_header_section_cut_short_gives_the_affinity_of_what_it_holds() {
        let msg = b"BYE sip:x@h SIP/2.0\r\nCall-ID: cut-1\r\nTo: <sip:a@b>;tag=lnA.1_2_2\r\nRoute: <sip:p;lr>\r\n";
        let whole = scan(msg);
        assert_eq!(whole.affinity(), None, "no end of the header section: no complete message");
        assert_eq!(whole.affinity_so_far(), Some((SRC_TO_TAG, ln("lnA"))));
        // Cut inside the To tag: the tag is not taken (its end was not seen).
        let in_tag = msg.len() - "2_2\r\nRoute: <sip:p;lr>\r\n".len();
        assert_eq!(scan(&msg[..in_tag]).affinity_so_far().map(|a| a.0), Some(SRC_CALL_ID));
        // Cut inside the Call-ID: no Call-ID, no message.
        let in_call_id = "BYE sip:x@h SIP/2.0\r\nCall-ID: cu".len();
        assert_eq!(scan(&msg[..in_call_id]).affinity_so_far(), None);
        // A complete one reads the same either way.
        let done = scan(b"BYE sip:x@h SIP/2.0\r\nCall-ID: c\r\nTo: <sip:a@b>;tag=lnA.1_2_2\r\n\r\n");
        assert_eq!(done.affinity(), done.affinity_so_far());
    }

    const INVITE: &str = "INVITE sip:service@10.0.0.1:5060 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 10.0.0.9:5061;branch=z9hG4bK-1\r\n\
        From: sipp <sip:sipp@10.0.0.9:5061>;tag=1\r\n\
        To: sut <sip:service@10.0.0.1:5060>\r\n\
        Call-ID: 1-42@10.0.0.9\r\n\
        CSeq: 1 INVITE\r\n\
        Content-Length: 0\r\n\r\n";

    #[test]
    fn a_logical_name_is_found_by_its_hash_among_the_ibmsids_and_tags() {
        let m = b"BYE sip:x SIP/2.0\r\nRoute: <sip:h;IBMSID=lnR.1138119214953.4_2_2;lr>\r\nTo: <sip:a@b>;tag=lnT.1_2_3\r\nFrom: <sip:c@d>;tag=99\r\nCall-ID: c\r\n\r\n";
        assert_eq!(logical_name_with_hash(m, ln("lnR")), Some(&b"lnR"[..]));
        assert_eq!(logical_name_with_hash(m, ln("lnT")), Some(&b"lnT"[..]));
        assert_eq!(logical_name_with_hash(m, ln("99")), None, "a tag of another shape names no LN");
        assert_eq!(logical_name_with_hash(m, ln("lnX")), None);
        // What the scanner hashes is what is found.
        let s = scan(m);
        assert_eq!(logical_name_with_hash(m, s.route), Some(&b"lnR"[..]));
    }

    #[test]
    fn an_initial_request_goes_by_its_call_id() {
        let s = scan(INVITE.as_bytes());
        assert_eq!(s.affinity(), Some((SRC_CALL_ID, cookie_hash(b"1-42@10.0.0.9"))));
        assert_eq!(s.response, 0);
    }

    #[test]
    fn route_ibmsid_wins_for_requests() {
        let m = "BYE sip:x@h SIP/2.0\r\n\
            Via: SIP/2.0/UDP 10.0.0.9;branch=z9;ibmsid=other.1.2_3_4\r\n\
            Route: <sip:10.0.0.1:5060;transport=udp;ibmsid=sipcontainer1a.1138119214953.4_2_2;lr>\r\n\
            To: <sip:a@b>;tag=local.1132518053302_2_2\r\n\
            From: <sip:c@d>;tag=9\r\n\
            Call-ID: abc\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_ROUTE, ln("sipcontainer1a"))));
    }

    #[test]
    fn to_tag_then_from_tag_for_requests() {
        let m = "ACK sip:x@h SIP/2.0\r\nt: <sip:a@b>;tag=local.1132518053302_2_2\r\nf: <sip:c@d>;tag=remote.1_2_3\r\ni: abc\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_TO_TAG, ln("local"))));
        let m =
            "ACK sip:x@h SIP/2.0\r\nTO: <sip:a@b>;tag=a8f3bc\r\nFROM: <sip:c@d> ; TAG = remote.1_2_3\r\ni: abc\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_FROM_TAG, ln("remote"))), "a random tag is no session");
    }

    #[test]
    fn responses_go_by_the_top_via() {
        let m = "SIP/2.0 200 OK\r\n\
            v: SIP/2.0/UDP 9.51.252.69:5063;ibmsid=sipcontainer1.1153242645968.4_2_2;branch=z9, SIP/2.0/UDP h;ibmsid=x.1_2_3\r\n\
            Via: SIP/2.0/UDP 1.2.3.4;ibmsid=y.1_2_3\r\n\
            From: <sip:c@d>;tag=remote.1_2_3\r\n\
            Call-ID: abc\r\n\r\n";
        let s = scan(m.as_bytes());
        assert_eq!(s.response, 1);
        assert_eq!(s.affinity(), Some((SRC_VIA, ln("sipcontainer1"))));
        // Only the top via-parm counts: the ibmsid of a lower hop is not ours.
        let m = "SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z, SIP/2.0/UDP h;ibmsid=x.1_2_3\r\nCall-ID: c\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_CALL_ID, cookie_hash(b"c"))));
        let m = "SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z\r\nVia: SIP/2.0/UDP h;ibmsid=x.1_2_3\r\nCall-ID: c\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_CALL_ID, cookie_hash(b"c"))));
    }

    #[test]
    fn tags_inside_uris_and_quotes_do_not_count() {
        let m = "BYE sip:x@h SIP/2.0\r\nTo: \"x;tag=q.1_2_3\" <sip:a@b;tag=u.1_2_3>\r\nCall-ID: c\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_CALL_ID, cookie_hash(b"c"))));
    }

    #[test]
    fn folded_repeated_and_bare_lf() {
        let m = "BYE sip:x@h SIP/2.0\nRoute: <sip:a@b>,\n <sip:h;lr;ibmsid=ln2.1_2_3>\nCall-ID: c\n\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_ROUTE, ln("ln2"))));
        let m = "BYE sip:x@h SIP/2.0\r\nCall-ID: first\r\nCall-ID: second\r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_CALL_ID, cookie_hash(b"first"))));
        let m = "BYE sip:x@h SIP/2.0\r\nRecord-Route: <sip:h;ibmsid=rr.1_2_3;lr>\r\nCall-ID  : c \r\n\r\n";
        assert_eq!(scan(m.as_bytes()).affinity(), Some((SRC_CALL_ID, cookie_hash(b"c"))), "Record-Route is not Route");
    }

    #[test]
    fn what_is_not_a_complete_sip_message() {
        assert_eq!(scan(b"GET / HTTP/1.1\r\nCall-ID: c\r\n\r\n").affinity(), None, "not SIP");
        assert_eq!(scan(b"BYE sip:x SIP/2.0\r\nCall-ID: c\r\n").affinity(), None, "no end of headers");
        assert_eq!(scan(b"BYE sip:x SIP/2.0\r\nCSeq: 1 BYE\r\n\r\n").affinity(), None, "no Call-ID");
        let named = b"BYE sip:x SIP/2.0\r\nRoute: <sip:h;lr;ibmsid=ln2.1_2_3>\r\nTo: <sip:a@b>;tag=ln3.1_2_3\r\n\r\n";
        assert_eq!(scan(named).affinity(), None, "logical names without a Call-ID (RFC 3261 8.1.1)");
        assert_eq!(scan(b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP h;ibmsid=ln2.1_2_3\r\n\r\n").affinity(), None);
        assert_eq!(scan(b"").affinity(), None);
        assert_eq!(scan(&[0xffu8; 100]).affinity(), None);
        let mut long: Vec<u8> = b"BYE sip:x SIP/2.0\r\nX-Pad: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', SIP_SCAN_MAX));
        long.extend(b"\r\nCall-ID: c\r\n\r\n");
        assert_eq!(scan(&long).affinity(), None, "past the scan limit");
    }

    #[test]
    fn the_logical_name_rule() {
        assert_eq!(logical_name(b"sipcontainer1.1153242645968.4_2_2"), Some(&b"sipcontainer1"[..]));
        assert_eq!(logical_name(b"local.1132518053302_2_2"), Some(&b"local"[..]));
        assert_eq!(logical_name(b"my.host.1_2_3"), Some(&b"my.host"[..]));
        assert_eq!(logical_name(b"a8f3bc"), None);
        assert_eq!(logical_name(b"abc.123"), None, "no _");
        assert_eq!(logical_name(b".1_2_3"), None);
        let m = b"BYE sip:x SIP/2.0\r\nTo: <sip:a@b>;tag=my.host.1_2_3\r\nCall-ID: c\r\n\r\n";
        assert_eq!(scan(m).affinity(), Some((SRC_TO_TAG, ln("my.host"))), "scanner and rule agree");
    }
}
