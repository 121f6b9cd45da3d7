//! The status page (`GET /`): one HTML document, compiled into the binary, with its
//! style and script inline. It reads `GET /status` every two seconds from the same
//! origin and puts every value in the page as text (`textContent`): names come from a
//! configuration file and are treated as hostile.
//!
//! The Content-Security-Policy lets the page do nothing else: its own inline script and
//! style only (named by their SHA-256, so an injected `<script>` would not run), fetches
//! to the same origin only, no frames around it, no forms, no other resources.

use std::sync::LazyLock;

use base64::Engine as _;

/// The page, as served.
pub const HTML: &str = include_str!("page.html");

/// The text between `<tag>` and `</tag>`: what a browser hashes for the policy.
fn inline(tag: &str) -> &'static str {
    let open = format!("<{tag}>");
    let start = HTML.find(&open).map(|i| i + open.len()).unwrap_or(0);
    let end = HTML[start..].find(&format!("</{tag}>")).map_or(start, |i| start + i);
    &HTML[start..end]
}

/// `'sha256-...'` of a text, as a CSP source.
fn hash_source(text: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
    format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest.as_ref()))
}

/// The header fields the page is served with (complete lines).
pub fn fields() -> &'static str {
    static FIELDS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "Content-Security-Policy: default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n\
             Referrer-Policy: no-referrer\r\n",
            hash_source(inline("script")),
            hash_source(inline("style"))
        )
    });
    &FIELDS
}

pub const CONTENT_TYPE: &str = "text/html; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing is loaded from anywhere else: no URL with a scheme, no `src` or `href`
    /// at all, one inline script and one inline style (the policy names exactly those).
    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        let lower = HTML.to_ascii_lowercase();
        for bad in ["http://", "https://", "//cdn", "src=", "href=", "@import", "url(", "<link", "<iframe", "<object"] {
            assert!(!lower.contains(bad), "the page contains {bad:?}");
        }
        assert_eq!(lower.matches("<script").count(), 1, "one inline script");
        assert_eq!(lower.matches("<style").count(), 1, "one inline style");
        assert!(inline("script").contains("fetch(\"/status\""), "the script reads the status from the same origin");
    }

    /// Values go in as text: the script never parses strings as markup or code.
    #[test]
    fn the_script_inserts_values_as_text_only() {
        let js = inline("script");
        for bad in
            ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute"]
        {
            assert!(!js.contains(bad), "the script uses {bad}");
        }
        assert!(js.contains("textContent"));
        // Each table cell is made by one function that writes textContent.
        assert!(js.contains("td.textContent = value === undefined"));
        // Inline event handlers (` onload=`...) would need 'unsafe-inline'.
        let lower = HTML.to_ascii_lowercase();
        let handler = lower.match_indices(" on").any(|(i, _)| {
            let rest = &lower[i + 3..];
            let name = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_lowercase()).len();
            name > 0 && rest[name..].starts_with('=')
        });
        assert!(!handler, "no inline event handler attributes");
    }

    /// The policy names the page's own script and style by hash, and nothing permissive.
    #[test]
    fn the_policy_allows_only_the_pages_own_script_and_style() {
        let f = fields();
        let csp = f.lines().find_map(|l| l.strip_prefix("Content-Security-Policy: ")).expect("a policy");
        assert!(csp.contains(&format!("script-src {};", hash_source(inline("script")))), "{csp}");
        assert!(csp.contains("connect-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(csp.starts_with("default-src 'none';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert!(f.contains("Cache-Control: no-store\r\n") && f.contains("X-Content-Type-Options: nosniff\r\n"));
        // A known SHA-256 (of "abc"), in the form browsers compare against.
        assert_eq!(hash_source("abc"), "'sha256-ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0='");
    }
}
