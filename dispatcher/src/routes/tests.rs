use super::*;

fn route(hosts: &[&str], uris: &[&str], target: usize) -> Route {
    Route {
        hosts: hosts.iter().map(|s| s.to_string()).collect(),
        uris: uris.iter().map(|s| s.to_string()).collect(),
        target,
    }
}

fn target(t: &Table, host: Option<&str>, path: &str) -> Option<usize> {
    t.find(host, 80, path).map(|m| m.target)
}

/// The cell: `/shop/*` and `*.jsp` on shop.example to one cluster, `/admin/*` to
/// another, a catch-all to a third.
fn cell() -> Table {
    Table::new(&[
        route(&["shop.example:*"], &["/shop/*", "*.jsp"], 1),
        route(&["*:80", "*:443"], &["/admin/*"], 2),
        route(&["*:*"], &["/*"], 3),
        route(&["*:*"], &["/shop/cart"], 4),
    ])
    .unwrap()
}

#[test]
fn the_most_specific_uri_wins_whatever_the_order() {
    let t = cell();
    let shop = Some("shop.example");
    assert_eq!(target(&t, shop, "/shop/cart"), Some(4), "exact over prefix");
    assert_eq!(target(&t, shop, "/shop/list"), Some(1), "prefix");
    assert_eq!(target(&t, shop, "/shop"), Some(1), "a prefix matches its own path");
    assert_eq!(target(&t, shop, "/shopping"), Some(3), "a prefix ends at a segment");
    assert_eq!(target(&t, shop, "/admin/users"), Some(2), "prefix over extension's host");
    assert_eq!(target(&t, shop, "/admin/x.jsp"), Some(2), "prefix over extension");
    assert_eq!(target(&t, shop, "/other/x.jsp"), Some(1), "extension over catch-all");
    assert_eq!(target(&t, shop, "/other/x.jspx"), Some(3));
    assert_eq!(target(&t, Some("else.example"), "/other/x.jsp"), Some(3), "extension only on its host");
    assert_eq!(target(&t, Some("else.example"), "/shop/list"), Some(3));
}

#[test]
fn longer_prefixes_win_and_prefixed_extensions_rank_with_their_prefix() {
    let t = Table::new(&[
        route(&["*:*"], &["/app/*"], 1),
        route(&["*:*"], &["/app/admin/*"], 2),
        route(&["*:*"], &["/app/*.jsp"], 3),
        route(&["*:*"], &["*.do"], 4),
        route(&["*:*"], &["/app/admin/*.do"], 5),
    ])
    .unwrap();
    assert_eq!(target(&t, None, "/app/a/b"), Some(1));
    assert_eq!(target(&t, None, "/app/admin/a"), Some(2));
    assert_eq!(target(&t, None, "/app/x.jsp"), Some(3), "prefixed extension before its plain prefix");
    assert_eq!(target(&t, None, "/app/admin/x.jsp"), Some(2), "a longer prefix beats a shorter one's extension");
    assert_eq!(target(&t, None, "/app/admin/x.do"), Some(5));
    assert_eq!(target(&t, None, "/app/x.do"), Some(1), "a prefix beats an extension");
    assert_eq!(target(&t, None, "/elsewhere/x.do"), Some(4));
    assert_eq!(target(&t, None, "/app.jsp"), None, "/app/*.jsp applies under /app/ only");
    assert_eq!(target(&t, None, "/other"), None, "no catch-all: no route");
}

#[test]
fn the_longest_extension_is_tried_first() {
    let t = Table::new(&[route(&["*:*"], &["*.gz"], 1), route(&["*:*"], &["*.tar.gz"], 2)]).unwrap();
    assert_eq!(target(&t, None, "/a/b.tar.gz"), Some(2));
    assert_eq!(target(&t, None, "/a/b.gz"), Some(1));
    assert_eq!(target(&t, None, "/a.tar.gz/b"), None, "the extension is the last segment's");
}

#[test]
fn virtual_hosts_are_case_insensitive_and_take_the_port_from_host_or_the_vip() {
    let t = Table::new(&[
        route(&["Shop.Example:8080"], &["/*"], 1),
        route(&["shop.example"], &["/*"], 2),
        route(&["*.example.com:443"], &["/*"], 3),
        route(&["[::1]:*"], &["/*"], 4),
    ])
    .unwrap();
    assert_eq!(t.find(Some("SHOP.example:8080"), 80, "/").map(|m| m.target), Some(1));
    assert_eq!(t.find(Some("shop.example"), 8080, "/").map(|m| m.target), Some(1), "port from the VIP");
    assert_eq!(t.find(Some("shop.example"), 80, "/").map(|m| m.target), Some(2), "no port in the pattern: 80");
    assert_eq!(t.find(Some("shop.example:81"), 80, "/"), None);
    assert_eq!(t.find(Some("shop.example."), 80, "/").map(|m| m.target), Some(2), "trailing dot");
    assert_eq!(t.find(Some("a.b.EXAMPLE.com:443"), 80, "/").map(|m| m.target), Some(3));
    assert_eq!(t.find(Some("example.com:443"), 80, "/"), None, "*.example.com needs a label before");
    assert_eq!(t.find(Some("badexample.com:443"), 80, "/"), None);
    assert_eq!(t.find(Some("[::1]:9"), 80, "/").map(|m| m.target), Some(4));
    assert_eq!(t.find(None, 80, "/"), None, "no Host: only * hosts match");
    assert_eq!(t.find(Some("shop.example:x"), 8080, "/").map(|m| m.target), Some(1), "a bad port counts as none");
    let any = Table::new(&[route(&["*"], &["/*"], 7)]).unwrap();
    assert_eq!(any.find(None, 80, "/x"), Some(Match { route: 0, target: 7 }), "`*` is `*:80`");
    assert_eq!(any.find(None, 81, "/x"), None);
}

#[test]
fn at_the_same_uri_the_most_specific_host_wins_then_the_first_route() {
    let t = Table::new(&[
        route(&["*:*"], &["/app/*"], 1),
        route(&["*:80"], &["/app/*"], 2),
        route(&["*.example:80"], &["/app/*"], 3),
        route(&["shop.example:*"], &["/app/*"], 4),
        route(&["shop.example:80"], &["/app/*"], 5),
        route(&["shop.example:80"], &["/app/*"], 6),
    ])
    .unwrap();
    let at = |h: &str| t.find(Some(h), 80, "/app/x").map(|m| m.target);
    assert_eq!(at("shop.example"), Some(5), "exact host and port; the first of two identical");
    assert_eq!(at("shop.example:81"), Some(4), "exact host, any port");
    assert_eq!(at("a.example"), Some(3));
    assert_eq!(at("other"), Some(2), "any host, exact port");
    assert_eq!(at("other:81"), Some(1));
    assert_eq!(t.shadowed(), vec![Shadowed { route: 5, by: 4 }]);
}

#[test]
fn shadowed_reports_only_routes_that_can_never_win() {
    let t = Table::new(&[
        route(&["*:*"], &["/*"], 1),
        route(&["*:*"], &["*"], 2), // `*` is `/*`: identical to route 0's
        route(&["*:80"], &["/a/*", "/b/*"], 3),
        route(&["shop:80"], &["/a/*"], 4),     // a more specific host: wins there
        route(&["*:80", "x:*"], &["/a/*"], 5), // x:* is not covered by route 2's *:80
        route(&["*:*"], &["/b/*"], 6),         // more general than route 2's: wins on other ports
        route(&["*:80"], &["/b/*"], 7),        // identical to route 2's
        route(&["*.example:*"], &["*.jsp"], 8),
        route(&["*.EXAMPLE:*"], &["*.jsp"], 9),       // identical to route 7's
        route(&["a.shop.example:*"], &["*.jsp"], 10), // more specific than route 7's
    ])
    .unwrap();
    assert_eq!(
        t.shadowed(),
        vec![Shadowed { route: 1, by: 0 }, Shadowed { route: 6, by: 2 }, Shadowed { route: 8, by: 7 }]
    );
}

#[test]
fn the_path_is_normalised_before_matching() {
    let t = Table::new(&[
        route(&["*:*"], &["/admin/*"], 1),
        route(&["*:*"], &["/shop/cart"], 2),
        route(&["*:*"], &["/*"], 3),
    ])
    .unwrap();
    let at = |p: &str| target(&t, None, p);
    assert_eq!(at("/admin/x?y=/shop/cart"), Some(1), "query ignored");
    assert_eq!(at("/shop/cart;jsessionid=0001abc:clone1"), Some(2), "path parameter dropped");
    assert_eq!(at("/shop;v=1/cart"), Some(2), "on any segment");
    assert_eq!(at("/shop/cart?a;b"), Some(2));
    assert_eq!(at("//admin//x"), Some(1), "runs of slashes are one");
    assert_eq!(at("/shop/../admin/x"), Some(1), "dot segments resolved");
    assert_eq!(at("/./shop/./cart"), Some(2));
    assert_eq!(at("/../../admin/x"), Some(1), "never above the root");
    assert_eq!(at("/%61dmin/x"), Some(1), "unreserved characters decoded");
    assert_eq!(at("/shop/%2E%2E/admin/x"), Some(1), "encoded dots are dots");
    assert_eq!(at("/admin%2Fx"), Some(3), "%2F is not a separator");
    assert_eq!(at("/Admin/x"), Some(3), "paths are case-sensitive");
    assert_eq!(at(""), Some(3), "empty path is /");
    assert_eq!(at("*"), Some(3), "OPTIONS *: catch-all only");
    assert_eq!(normalize_path("/a/b"), Cow::Borrowed("/a/b"));
    assert!(matches!(normalize_path("/a/b"), Cow::Borrowed(_)), "a clean path is not copied");
    assert_eq!(normalize_path("/a/b/.."), "/a/");
    assert_eq!(normalize_path("/a/%zz%4"), "/a/%zz%4", "bad escapes kept as they are");
    assert_eq!(normalize_path("/a/%C3%A9"), "/a/%C3%A9", "only unreserved characters decoded");
    assert_eq!(normalize_path("/é/x"), "/é/x");
    assert_eq!(normalize_path("/a%2fb/%c3%a9"), "/a%2Fb/%C3%A9", "escapes upper-cased");
    assert_eq!(normalize_path("/%+4/%4"), "/%+4/%4");
    assert!(UriPattern::parse("/a%2fb").is_err(), "a lower-case escape never matches");
    assert!(UriPattern::parse("/a%2Fb").is_ok());
}

#[test]
fn exact_paths_and_prefixes_do_not_take_slash_variants_for_one_another() {
    let t = Table::new(&[route(&["*:*"], &["/a"], 1), route(&["*:*"], &["/a/"], 2)]).unwrap();
    assert_eq!(target(&t, None, "/a"), Some(1));
    assert_eq!(target(&t, None, "/a/"), Some(2));
    assert_eq!(target(&t, None, "/a//"), Some(2));
}

#[test]
fn patterns_outside_the_plugins_forms_are_refused() {
    for bad in [
        "/app*",
        "/a/*/b",
        "*.*",
        "*.",
        "app/*",
        "/a/*.jsp/x",
        "**",
        "/a?b",
        "*/x",
        "/a/**",
        "",
        "/app//*",
        "/a//b",
        "/a/./b",
        "/a/../b/*",
        "/a;x",
        "/%61/*",
    ] {
        assert!(UriPattern::parse(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(UriPattern::parse("/*.jsp"), Ok(UriPattern::Extension(".jsp".into())));
    assert_eq!(UriPattern::parse("*"), Ok(UriPattern::CatchAll));
    assert_eq!(UriPattern::parse("/"), Ok(UriPattern::Exact("/".into())));
    for p in ["/shop/cart", "/shop/*", "/shop/*.jsp", "*.jsp", "/*"] {
        assert_eq!(UriPattern::parse(p).unwrap().to_string(), p);
    }
    for bad in [
        "a*b:80",
        "*foo:80",
        "host:0",
        "host:x",
        "host:99999",
        ":80",
        "*.:80",
        "a:b:c",
        "shop example:80",
        "a/b",
        "[zz]:80",
    ] {
        assert!(HostPattern::parse(bad).is_err(), "{bad:?} accepted");
    }
    // Spaces around it are not part of it; a suffix's trailing dot is dropped, as from a
    // request's host; an [IPv6] literal is a host.
    let p = HostPattern::parse(" shop.example:80").unwrap();
    assert_eq!(p, HostPattern::parse("shop.example:80").unwrap());
    assert_eq!(HostPattern::parse("*.example.com.:*").unwrap().host, HostName::Suffix(".example.com".into()));
    assert!(HostPattern::parse("[fd00::5]:8080").is_ok());
    let err = Table::new(&[route(&["*"], &["/ok/*"], 0), route(&["*"], &["/x*"], 0)]).unwrap_err();
    assert!(matches!(err, PatternError::Uri { route: 1, .. }), "{err}");
    assert!(Table::new(&[route(&[], &["/*"], 0)]).is_err());
}

/// A path deeper than the longest prefix is looked up only at the prefixes' depths (a
/// hostile path of thousands of segments costs a bounded number of lookups, not one per
/// level, each hashing what is left) and still routes as the rule says.
#[test]
fn deep_paths_are_looked_up_only_as_deep_as_the_prefixes() {
    let t = Table::new(&[
        route(&["*"], &["/a/*"], 1),
        route(&["*"], &["/a/b/*"], 2),
        route(&["*"], &["/a/b/*.jsp"], 3),
        route(&["*"], &["/*"], 0),
    ])
    .unwrap();
    let deep = "/x".repeat(20_000);
    assert_eq!(target(&t, None, &format!("/a/b{deep}")), Some(2));
    assert_eq!(target(&t, None, &format!("/a/b{deep}/p.jsp")), Some(3));
    assert_eq!(target(&t, None, &format!("/a/bc{deep}")), Some(1), "/a/bc is not under /a/b");
    assert_eq!(target(&t, None, &format!("/a{deep}")), Some(1));
    assert_eq!(target(&t, None, &format!("/ab{deep}")), Some(0));
    assert_eq!(target(&t, None, "/a/b"), Some(2));
    assert_eq!(target(&t, None, "/a/"), Some(1));
    // Not ASCII at the cut: the cut is at a '/', never inside a character.
    assert_eq!(target(&t, None, "/a/\u{e9}\u{e9}\u{e9}/x"), Some(1));
    assert_eq!(target(&t, None, "/\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}/x"), Some(0));
    let no_prefix = Table::new(&[route(&["*"], &["/exact"], 1), route(&["*"], &["/*"], 0)]).unwrap();
    assert_eq!(target(&no_prefix, None, &deep), Some(0));
}

#[test]
fn many_routes_over_many_targets() {
    // 500 routes over 50 targets, each request finds its own.
    let routes: Vec<Route> = (0..500)
        .map(|i| {
            route(
                &[&format!("app{}.example:*", i % 7), "*:8080"],
                &[&format!("/ctx{i}/*"), &format!("/ctx{i}/x/*.jsp")],
                i % 50,
            )
        })
        .collect();
    let t = Table::new(&routes).unwrap();
    for i in 0..500 {
        let m = t.find(Some(&format!("APP{}.example", i % 7)), 80, &format!("/ctx{i}/x/y.jsp?q")).unwrap();
        assert_eq!((m.route, m.target), (i, i % 50));
        assert_eq!(t.find(Some("other"), 8080, &format!("/ctx{i}/a")).unwrap().route, i);
        assert_eq!(t.find(Some("other"), 80, &format!("/ctx{i}/a")), None);
    }
    assert!(t.shadowed().is_empty());
}
