//! `[health]`.

use super::*;

impl Ctx<'_> {
    /// `[health]`.
    pub(super) fn health(&self, h: &RawHealth) -> HealthSettings {
        let kind = self.choice(
            &h.kind,
            "health.kind",
            CheckKind::Auto,
            &[("auto", CheckKind::Auto), ("http", CheckKind::Http), ("tcp", CheckKind::Tcp), ("sip", CheckKind::Sip)],
        );
        let mut s = HealthSettings { kind, ..HealthSettings::default() };
        if let Some(p) = &h.path {
            // A request target as the proxy's own parser accepts it (the check reads its
            // answer with that parser).
            if !p.get_ref().starts_with('/') || p.get_ref().bytes().any(|b| b <= b' ' || b == 0x7f || b == b'#') {
                self.report(p.span(), "health.path", "must start with / and contain no spaces, control bytes or '#'");
            } else {
                s.path = p.get_ref().clone();
            }
        }
        if let Some(e) = &h.expect_status {
            if !(100..=599).contains(e.get_ref()) {
                self.report(e.span(), "health.expect_status", "must be an HTTP status, 100..=599");
            } else {
                s.expect_status = *e.get_ref();
            }
        }
        if let Some(p) = &h.port {
            if *p.get_ref() == 0 {
                self.report(p.span(), "health.port", "must be 1..=65535");
            } else {
                s.port = Some(*p.get_ref());
            }
        }
        for (v, field, into) in [(&h.interval, "interval", &mut s.interval), (&h.timeout, "timeout", &mut s.timeout)] {
            if let Some(d) =
                v.as_ref().and_then(|v| self.duration(v, &format!("health.{field}"), Duration::from_millis(10)))
            {
                *into = d;
            }
        }
        for (v, field, into) in [(&h.rise, "rise", &mut s.rise), (&h.fall, "fall", &mut s.fall)] {
            if let Some(v) = v {
                if !(1..=100).contains(v.get_ref()) {
                    self.report(v.span(), &format!("health.{field}"), "must be 1..=100");
                } else {
                    *into = *v.get_ref();
                }
            }
        }
        if let Some(e) = &h.enabled {
            s.enabled = *e.get_ref();
        }
        if let Some(list) = &h.suspect_on_status {
            for st in list.get_ref() {
                if !(500..=599).contains(st.get_ref()) {
                    self.report(st.span(), "health.suspect_on_status", "only 5xx statuses can mark a backend suspect");
                } else {
                    s.suspect_on_status.push(*st.get_ref());
                }
            }
        }
        s
    }
}
