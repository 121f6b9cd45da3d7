use super::*;
use crate::routes::Table;

const REALISTIC: &[u8] = include_bytes!("../testdata/plugin-cfg.xml");

fn wrap(inner: &str) -> String {
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Config>\n{inner}\n</Config>\n")
}

const CLUSTER: &str = r#"<ServerCluster Name="c1"><Server Name="s1" CloneID="x1"><Transport Hostname="10.0.0.1" Port="9080" Protocol="http"/></Server></ServerCluster>
<VirtualHostGroup Name="v"><VirtualHost Name="*:80"/></VirtualHostGroup>
<UriGroup Name="u"><Uri Name="/*"/></UriGroup>"#;

fn error(text: &str) -> Error {
    parse(text.as_bytes()).expect_err("accepted")
}

#[test]
fn the_realistic_file_is_read_whole() {
    let cfg = parse(REALISTIC).unwrap();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    assert_eq!(cfg.refresh_interval, 60);
    let names = |v: Vec<&str>| v.into_iter().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        cfg.virtual_host_groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>(),
        names(vec!["default_host", "shop_host", "admin_host"])
    );
    assert_eq!(cfg.virtual_host_groups[1].hosts, names(vec!["shop.example:*", "*:443"]));
    assert_eq!(cfg.server_clusters.len(), 3);
    let shop = &cfg.server_clusters[0];
    assert_eq!(
        (shop.name.as_str(), shop.load_balance, shop.retry_interval),
        ("shop_cluster", LoadBalance::RoundRobin, 60)
    );
    assert_eq!(shop.servers.len(), 4);
    let s1 = &shop.servers[0];
    assert_eq!(s1.name, "shopNode1_shop1");
    assert_eq!(s1.clone_id.as_deref(), Some("1a2b3c4d"));
    assert_eq!(
        (s1.weight, s1.connect_timeout, s1.server_io_timeout, s1.max_connections),
        (Some(2), Some(5), Some(900), Some(100))
    );
    assert_eq!(s1.transports.len(), 2);
    assert_eq!(s1.transports[1], Transport { hostname: "10.0.1.11".into(), port: 9443, protocol: Protocol::Https });
    assert_eq!(shop.servers[3].connect_timeout, None, "ConnectTimeout 0: none");
    assert_eq!(shop.servers[2].max_connections, None, "MaxConnections -1: no limit");
    assert_eq!(shop.primary, Some(names(vec!["shopNode1_shop1", "shopNode1_shop2", "shopNode2_shop3"])));
    assert_eq!(shop.backup, names(vec!["shopBackup_shop9"]));
    let admin = &cfg.server_clusters[1];
    assert_eq!((admin.load_balance, admin.retry_interval, admin.primary.is_none()), (LoadBalance::Random, 120, true));
    let uris = &cfg.uri_groups[0].uris;
    assert_eq!(uris[2].affinity_cookie, "SHOPSESSION");
    assert_eq!(uris[2].affinity_url_identifier, "shopsession");
    assert_eq!(
        (uris[3].affinity_cookie.as_str(), uris[3].affinity_url_identifier.as_str()),
        ("JSESSIONID", "jsessionid"),
        "defaults"
    );
    assert_eq!(uris[3].line, 72);
    assert_eq!(cfg.routes.len(), 3);
    assert_eq!(cfg.routes[2].server_cluster, "portal_cluster");
    assert_eq!(cfg.routes[0].line, 81);
}

#[test]
fn the_realistic_file_routes_each_request_to_its_cluster() {
    // The file's routes through the matcher: target = the cluster's index.
    let cfg = parse(REALISTIC).unwrap();
    let routes = cfg.table_routes();
    let t = Table::new(&routes).unwrap();
    let at = |host: &str, path: &str| t.find(Some(host), 80, path).map(|m| m.target);
    assert_eq!(at("shop.example", "/shop/cart;jsessionid=0000abc:1a2b3c4d"), Some(0));
    assert_eq!(at("shop.example", "/index.jsp"), Some(0), "*.jsp over /*");
    assert_eq!(at("shop.example:443", "/checkout/pay"), Some(0));
    assert_eq!(at("admin.example", "/admin/users"), Some(1));
    assert_eq!(at("admin.example", "/admin/x.do"), Some(1));
    assert_eq!(at("admin.example:8080", "/admin/users"), None, "admin.example:80 only, and no *:8080");
    assert_eq!(at("www.example", "/admin/users"), Some(2), "another host: the catch-all");
    assert_eq!(at("www.example", "/anything.jsp"), Some(2));
    assert!(t.shadowed().is_empty());
}

#[test]
fn latin1_is_decoded_and_other_encodings_are_refused_by_name() {
    let latin1 = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n<Config>\n<VirtualHostGroup Name=\"caf\xe9\"><VirtualHost Name=\"*:80\"/></VirtualHostGroup>\n</Config>";
    assert_eq!(parse(latin1).unwrap().virtual_host_groups[0].name, "café");
    let undeclared = b"<Config>\n\n<VirtualHostGroup Name=\"caf\xe9\"/>\n</Config>";
    let e = parse(undeclared).unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.message.contains("not UTF-8") && e.message.contains("ISO-8859-1"), "{e}");
    let utf8 = "<?xml version='1.0' encoding='utf-8'?><Config><VirtualHostGroup Name=\"café\"/></Config>";
    assert_eq!(parse(utf8.as_bytes()).unwrap().virtual_host_groups[0].name, "café");
    let e = parse(b"<?xml version=\"1.0\" encoding=\"Shift_JIS\"?><Config/>").unwrap_err();
    assert!(e.message.contains("\"SHIFT_JIS\" is not supported"), "{e}");
    let e = parse(b"\xff\xfe<\0C\0").unwrap_err();
    assert!(e.message.contains("UTF-16"), "{e}");
    assert!(parse(b"\xEF\xBB\xBF<Config/>").is_ok(), "a UTF-8 BOM is fine");
    let e = parse(b"<?xml version=\"1.0\" encoding=\"US-ASCII\"?>\n<Config>\xe9</Config>").unwrap_err();
    assert_eq!(e.line, 2, "{e}");
}

#[test]
fn billion_laughs_fails_fast_at_the_doctype() {
    let mut text = String::from("<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n<!ENTITY lol \"lol\">\n");
    for i in 1..10 {
        let prev = if i == 1 { "lol".to_string() } else { format!("lol{}", i - 1) };
        text.push_str(&format!("<!ENTITY lol{i} \"{}\">\n", format!("&{prev};").repeat(10)));
    }
    text.push_str("]>\n<Config RefreshInterval=\"&lol9;\"/>\n");
    let started = std::time::Instant::now();
    let e = error(&text);
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("DTD"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "expanded?");
    // An entity reference without a DTD is an error too, never text.
    let e = error(&wrap("<VirtualHostGroup Name=\"&lol;\"/>"));
    assert_eq!(e.line, 3, "{e}");
}

#[test]
fn size_nodes_depth_and_attributes_are_capped() {
    let big = vec![b' '; MAX_FILE_BYTES + 1];
    let e = parse(&big).unwrap_err();
    assert!(e.message.contains("at most"), "{e}");
    let many = wrap(&"<Log/>".repeat(MAX_NODES as usize));
    assert!(many.len() < MAX_FILE_BYTES);
    assert!(error(&many).message.contains("nodes"));
    let deep = wrap(&format!("{}{}", "<Log>".repeat(MAX_DEPTH), "</Log>".repeat(MAX_DEPTH)));
    let e = error(&deep);
    assert!(e.message.contains("deeper"), "{e}");
    assert_eq!(e.line, 3);
    let attrs: String = (0..=MAX_ATTRIBUTES).map(|i| format!(" a{i}=\"x\"")).collect();
    let e = error(&wrap(&format!("<Log{attrs}/>")));
    assert!(e.message.contains("attributes"), "{e}");
}

#[test]
fn unknown_elements_and_routing_attributes_are_warned_about_by_name() {
    let text = r#"<?xml version="1.0"?>
<Config VHostMatchingCompat="true" NewThing="1" IgnoreDNSFailures="true">
<Log LogLevel="Trace" Name="/tmp/x"/>
<ServerCluster Name="c1" IgnoreAffinityRequests="false" CloneSeparatorChange="false"><Server Name="s1" Mystery="2"><Transport Hostname="10.0.0.1" Port="9080" Protocol="http"/></Server>
<ClusterAddress Name="ca"/>
</ServerCluster>
<VirtualHostGroup Name="v"><VirtualHost Name="*:80"/></VirtualHostGroup>
<UriGroup Name="u"><Uri Name="/*" Extra="y"><Weight/></Uri></UriGroup>
<Route ServerCluster="c1" UriGroup="u" VirtualHostGroup="v"/>
<FutureElement/>
</Config>"#;
    let cfg = parse(text.as_bytes()).unwrap();
    let w: Vec<String> = cfg.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        [
            "line 2: <Config> VHostMatchingCompat=\"true\" changes routing and is not implemented: ignored",
            "line 2: <Config> attribute NewThing is unknown: ignored",
            "line 4: <ServerCluster> IgnoreAffinityRequests=\"false\" changes routing and is not implemented: ignored",
            "line 4: <Server> attribute Mystery is unknown: ignored",
            "line 5: <ClusterAddress> in <ServerCluster> is unknown: ignored with its content",
            "line 8: <Uri> attribute Extra is unknown: ignored",
            "line 8: <Weight> in <Uri> is unknown: ignored with its content",
            "line 10: <FutureElement> in <Config> is unknown: ignored with its content",
        ]
    );
}

#[test]
fn dangling_references_are_errors_with_their_line() {
    let e = error(&wrap(&format!("{CLUSTER}\n<Route ServerCluster=\"nope\" UriGroup=\"u\" VirtualHostGroup=\"v\"/>")));
    assert_eq!((e.line, e.message.as_str()), (6, "Route names ServerCluster \"nope\", which is not defined"));
    let e = error(&wrap(&format!("{CLUSTER}\n<Route ServerCluster=\"c1\" UriGroup=\"u\" VirtualHostGroup=\"w\"/>")));
    assert!(e.message.contains("VirtualHostGroup \"w\""), "{e}");
    let e = error(&wrap(
        "<ServerCluster Name=\"c\">\n<Server Name=\"s\"><Transport Hostname=\"h\" Port=\"1\" Protocol=\"http\"/></Server>\n<PrimaryServers>\n<Server Name=\"t\"/></PrimaryServers></ServerCluster>",
    ));
    assert_eq!(e.line, 6);
    assert!(e.message.contains("\"t\", which is not in cluster \"c\""), "{e}");
    let e = error(&wrap(&format!("{CLUSTER}\n{CLUSTER}")));
    assert_eq!(e.line, 6);
    assert!(e.message.contains("already defined at line 3"), "{e}");
}

#[test]
fn bad_values_are_errors_with_their_line() {
    let cases = [
        ("<UriGroup Name=\"u\">\n<Uri Name=\"/app*\"/></UriGroup>", 4, "Uri Name=\"/app*\""),
        ("<VirtualHostGroup Name=\"v\">\n<VirtualHost Name=\"a*b:80\"/></VirtualHostGroup>", 4, "VirtualHost"),
        ("<ServerCluster Name=\"c\" LoadBalance=\"Weighted\"/>", 3, "LoadBalance"),
        ("<ServerCluster Name=\"c\">\n<Server Name=\"s\"><Transport Hostname=\"h\" Port=\"0\" Protocol=\"http\"/></Server></ServerCluster>", 4, "Port"),
        ("<ServerCluster Name=\"c\">\n<Server Name=\"s\"><Transport Hostname=\"h\" Port=\"1\" Protocol=\"ftp\"/></Server></ServerCluster>", 4, "ftp"),
        ("<ServerCluster Name=\"c\">\n<Server Name=\"s\"/></ServerCluster>", 4, "no Transport"),
        ("<ServerCluster Name=\"c\">\n</ServerCluster>", 3, "no Server"),
        ("<Route UriGroup=\"u\"/>", 3, "needs ServerCluster"),
        ("\n<Unclosed>", 5, "not well-formed"),
    ];
    for (inner, line, what) in cases {
        let e = error(&wrap(inner));
        assert_eq!(e.line, line, "{inner}: {e}");
        assert!(e.to_string().contains(what), "{inner}: {e}");
    }
    let e = error("<?xml version=\"1.0\"?>\n<Konfig/>");
    assert_eq!((e.line, e.message.as_str()), (2, "the root element is <Konfig>, not <Config>"));
    let e = error("<Config RefreshInterval=\"soon\"/>");
    assert!(e.message.contains("RefreshInterval=\"soon\""), "{e}");
}

#[test]
fn a_clone_id_names_one_server() {
    let two = r#"<ServerCluster Name="c2"><Server Name="s2" CloneID="x1"><Transport Hostname="10.0.0.2" Port="9080" Protocol="http"/></Server></ServerCluster>"#;
    let e = error(&wrap(&format!("{CLUSTER}\n{two}")));
    assert_eq!(e.line, 6);
    assert!(e.message.contains("CloneID \"x1\" of server \"s2\" is already server \"s1\"'s (line 3)"), "{e}");
    // The same server in two clusters is one server.
    let same = r#"<ServerCluster Name="c2"><Server Name="s1" CloneID="x1"><Transport Hostname="10.0.0.1" Port="9080" Protocol="http"/></Server></ServerCluster>"#;
    assert!(parse(wrap(&format!("{CLUSTER}\n{same}")).as_bytes()).is_ok());
}

#[test]
fn a_route_over_an_empty_group_is_warned_about() {
    let text = wrap(&format!(
        "{CLUSTER}\n<UriGroup Name=\"none\"/>\n<Route ServerCluster=\"c1\" UriGroup=\"none\" VirtualHostGroup=\"v\"/>"
    ));
    let cfg = parse(text.as_bytes()).unwrap();
    assert_eq!(
        cfg.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["line 7: Route: UriGroup \"none\" is empty, the route matches nothing"]
    );
}

/// A small hostile file that would make the reader or the route table grow with the
/// square of its size is refused at the element that crosses the bound, with its line.
#[test]
fn counts_that_multiply_are_bounded() {
    // 400 VirtualHosts x 400 Uris in one Route: 160,000 pairs from a 20 KB file.
    let hosts: String = (0..400).map(|i| format!("<VirtualHost Name=\"h{i}:80\"/>")).collect();
    let uris: String = (0..400).map(|i| format!("<Uri Name=\"/u{i}/*\"/>")).collect();
    let text = wrap(&format!(
        "<ServerCluster Name=\"c1\"><Server Name=\"s1\"><Transport Hostname=\"10.0.0.1\" Port=\"9080\" Protocol=\"http\"/></Server></ServerCluster>\n\
         <VirtualHostGroup Name=\"v\">{hosts}</VirtualHostGroup>\n<UriGroup Name=\"u\">{uris}</UriGroup>\n\
         <Route ServerCluster=\"c1\" UriGroup=\"u\" VirtualHostGroup=\"v\"/>"
    ));
    let e = error(&text);
    assert_eq!(e.line, 6, "{e}");
    assert!(e.message.contains(&format!("more than {MAX_ROUTE_PAIRS} virtual hosts with URIs")), "{e}");
    // The same pairs through the matcher are refused too.
    let route = |n: usize| crate::routes::Route {
        hosts: (0..n).map(|i| format!("h{i}:80")).collect(),
        uris: (0..n).map(|i| format!("/u{i}/*")).collect(),
        target: 0,
    };
    assert!(matches!(Table::new(&[route(400)]), Err(crate::routes::PatternError::TooLarge { route: 0 })));
    assert!(Table::new(&[route(300)]).is_ok(), "90,000 pairs");

    // Servers: at most MAX_SERVERS in the file, the first one over is the error's line.
    let servers: String = (0..=MAX_SERVERS)
        .map(|i| {
            format!(
                "<Server Name=\"s{i}\"><Transport Hostname=\"10.0.0.1\" Port=\"9080\" Protocol=\"http\"/></Server>\n"
            )
        })
        .collect();
    let e = error(&wrap(&format!("<ServerCluster Name=\"c1\">\n{servers}</ServerCluster>")));
    assert_eq!((e.line as usize, e.message.as_str()), (MAX_SERVERS + 4, "more than 4096 servers in the file"));

    // Routes (and each other kind): at most MAX_OF_A_KIND.
    let routes = "<Route ServerCluster=\"c1\" UriGroup=\"u\" VirtualHostGroup=\"v\"/>\n".repeat(MAX_OF_A_KIND + 1);
    let e = error(&wrap(&format!("{CLUSTER}\n{routes}")));
    assert_eq!(e.message, format!("more than {MAX_OF_A_KIND} <Route> elements"));

    // Warnings: at most MAX_WARNINGS kept, and how many more were left out.
    let odd: String = (0..500).map(|i| format!("<Odd{i}/>\n")).collect();
    let cfg = parse(wrap(&format!("{CLUSTER}\n{odd}")).as_bytes()).unwrap();
    assert_eq!(cfg.warnings.len(), MAX_WARNINGS + 1);
    assert_eq!(cfg.warnings.last().unwrap().message, "and 400 more warnings");
}
