//! WebSphere's generated `plugin-cfg.xml`, read into a model (roxmltree, never by hand).
//!
//! The file is untrusted input: at most [`MAX_FILE_BYTES`], [`MAX_NODES`] nodes,
//! [`MAX_DEPTH`] levels and [`MAX_ATTRIBUTES`] attributes per element; a DTD is refused
//! (roxmltree's default), so no entity is ever defined or expanded (billion laughs fails
//! at its `<!DOCTYPE`). The bytes are decoded by the XML declaration's encoding: UTF-8
//! (also without a declaration, the XML rule) or ISO-8859-1 (what WebSphere writes); any
//! other is refused. Every error names its line.
//!
//! What is read: `Config`'s `RefreshInterval`; `VirtualHostGroup`/`VirtualHost`;
//! `ServerCluster` (`LoadBalance`, `RetryInterval`), its `Server`s (`CloneID`,
//! `LoadBalanceWeight`, `ConnectTimeout`, `ServerIOTimeout`, `MaxConnections`,
//! `Transport`s), `PrimaryServers` and `BackupServers`; `UriGroup`/`Uri` (`AffinityCookie`,
//! `AffinityURLIdentifier`); `Route`. Ignored without a word, because they do not change
//! where a request goes: [`IGNORED_ELEMENTS`] (with everything inside them) and the
//! attributes in [`IGNORED_ATTRIBUTES`]. Attributes that change routing and are not
//! implemented are warned about when set to anything but their default
//! ([`DEFAULTED_ATTRIBUTES`]); anything else unknown is warned about by name.
//!
//! Refused, with the line: a Route naming an undefined ServerCluster, UriGroup or
//! VirtualHostGroup; a PrimaryServers/BackupServers entry naming no Server of its cluster;
//! a name defined twice; a CloneID shared by two servers; a URI or virtual host pattern
//! the matcher would refuse. Warned: a Route over an empty group (it matches nothing).

use std::{collections::HashMap, fmt};

use super::{HostPattern, UriPattern};

pub const MAX_FILE_BYTES: usize = 32 << 20;
pub const MAX_NODES: u32 = 1_000_000;
pub const MAX_DEPTH: usize = 16;
pub const MAX_ATTRIBUTES: usize = 64;
/// Servers in the whole file: the data plane's backend limit.
pub const MAX_SERVERS: usize = 4096;
/// (virtual host, URI) pairs over all Routes: what the route table holds per VIP.
pub const MAX_ROUTE_PAIRS: usize = super::MAX_PAIRS;
/// Routes, ServerClusters, VirtualHostGroups and UriGroups, each (a large cell has a few
/// hundred).
pub const MAX_OF_A_KIND: usize = 10_000;
/// Warnings kept; beyond, one says how many more there were.
pub const MAX_WARNINGS: usize = 100;

/// Elements skipped with their content: logging, plug-in properties (ESI, keyrings),
/// request metrics, the cluster address used by the plug-in's own failover to a proxy.
pub const IGNORED_ELEMENTS: &[&str] = &["Log", "Property", "RequestMetrics"];

/// (element, attribute) pairs that do not change where a request goes.
pub const IGNORED_ATTRIBUTES: &[(&str, &str)] = &[
    ("Config", "ASDisableNagle"),
    ("Config", "AcceptAllContent"),
    ("Config", "AppServerPortPreference"),
    ("Config", "ChunkedResponse"),
    ("Config", "FIPSEnable"),
    ("Config", "IISDisableNagle"),
    ("Config", "IISPluginPriority"),
    ("Config", "IgnoreDNSFailures"),
    ("Config", "ResponseChunkSize"),
    ("Config", "SSLConsumeUnusedData"),
    ("Config", "TrustedProxyEnable"),
    ("Config", "KillWebServerStartUpOnParseErr"),
    ("Config", "OS400ConvertQueryStringToJobCCSID"),
    ("ServerCluster", "PostSizeLimit"),
    ("ServerCluster", "PostBufferSize"),
    ("ServerCluster", "RemoveSpecialHeaders"),
    ("ServerCluster", "ServerIOTimeoutRetry"),
    ("Server", "ExtendedHandshake"),
    ("Server", "WaitForContinue"),
    ("Server", "ServerRole"),
];

/// Attributes that change routing, not implemented: warned about unless at the default.
pub const DEFAULTED_ATTRIBUTES: &[(&str, &str, &str)] = &[
    ("Config", "VHostMatchingCompat", "false"),
    ("ServerCluster", "CloneSeparatorChange", "false"),
    // The plug-in's default is true (affinity requests do not count against the weights),
    // which is what the dispatcher does: only "false" changes routing.
    ("ServerCluster", "IgnoreAffinityRequests", "true"),
    ("ServerCluster", "GetDWLMTable", "false"),
];

/// An error, with the line it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct Error {
    pub line: u32,
    pub message: String,
}

/// Something read and not used, by name, with its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub line: u32,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    /// Seconds between checks of the file (plug-in default 60).
    pub refresh_interval: u64,
    pub virtual_host_groups: Vec<VirtualHostGroup>,
    pub server_clusters: Vec<ServerCluster>,
    pub uri_groups: Vec<UriGroup>,
    pub routes: Vec<Route>,
    pub warnings: Vec<Warning>,
}

impl PluginConfig {
    /// The file's routes as the matcher takes them (`super::Table::new`), each to its
    /// ServerCluster's index; a Route naming an unknown group is left out (a file that
    /// has one is refused by `parse`).
    pub fn table_routes(&self) -> Vec<super::Route> {
        (self.resolved_routes())
            .map(|r| super::Route {
                hosts: r.hosts.hosts.clone(),
                uris: r.uris.uris.iter().map(|u| u.name.clone()).collect(),
                target: r.cluster,
            })
            .collect()
    }

    /// Each Route with what it names, looked up by name once (not a scan per Route); a
    /// Route naming something undefined is left out (`parse` refuses a file with one).
    pub fn resolved_routes(&self) -> impl Iterator<Item = Resolved<'_>> {
        fn index<T>(items: &[T], name: impl Fn(&T) -> &str) -> HashMap<&str, usize> {
            let mut m = HashMap::new();
            for (i, x) in items.iter().enumerate() {
                m.entry(name(x)).or_insert(i);
            }
            m
        }
        let hosts = index(&self.virtual_host_groups, |g| &g.name);
        let uris = index(&self.uri_groups, |g| &g.name);
        let clusters = index(&self.server_clusters, |c| &c.name);
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for r in &self.routes {
            *uses.entry(r.uri_group.as_str()).or_default() += 1;
        }
        self.routes.iter().filter_map(move |r| {
            Some(Resolved {
                route: r,
                group_shared: uses.get(r.uri_group.as_str()).is_some_and(|&n| n > 1),
                hosts: &self.virtual_host_groups[*hosts.get(r.virtual_host_group.as_str())?],
                uris: &self.uri_groups[*uris.get(r.uri_group.as_str())?],
                cluster: *clusters.get(r.server_cluster.as_str())?,
            })
        })
    }
}

/// A Route with its VirtualHostGroup, UriGroup and ServerCluster (an index into
/// `server_clusters`).
pub struct Resolved<'a> {
    pub route: &'a Route,
    /// Another Route uses its UriGroup too.
    pub group_shared: bool,
    pub hosts: &'a VirtualHostGroup,
    pub uris: &'a UriGroup,
    pub cluster: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualHostGroup {
    pub name: String,
    /// `VirtualHost Name`s, verbatim.
    pub hosts: Vec<String>,
    pub line: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadBalance {
    RoundRobin,
    Random,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCluster {
    pub name: String,
    pub load_balance: LoadBalance,
    /// Seconds before a failed server is tried again (plug-in default 60).
    pub retry_interval: u64,
    pub servers: Vec<Server>,
    /// `PrimaryServers` refs; None when the element is absent (then every server is one).
    pub primary: Option<Vec<String>>,
    pub backup: Vec<String>,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub name: String,
    pub clone_id: Option<String>,
    pub weight: Option<u32>,
    /// Seconds; 0 or absent: the system's own timeout.
    pub connect_timeout: Option<u64>,
    /// Seconds; absent or 0: none (negative values are the plug-in's variants: taken as
    /// their magnitude).
    pub server_io_timeout: Option<u64>,
    /// None when absent, 0 or -1 (no limit).
    pub max_connections: Option<u32>,
    pub transports: Vec<Transport>,
    pub line: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Https,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    pub hostname: String,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriGroup {
    pub name: String,
    pub uris: Vec<Uri>,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    /// The pattern, verbatim (checked by [`UriPattern::parse`]).
    pub name: String,
    /// Default `JSESSIONID`.
    pub affinity_cookie: String,
    /// Default `jsessionid`.
    pub affinity_url_identifier: String,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub server_cluster: String,
    pub uri_group: String,
    pub virtual_host_group: String,
    pub line: u32,
}

/// Decode the file's bytes by its XML declaration (see the module's doc).
pub fn decode(bytes: &[u8]) -> Result<String, Error> {
    let err = |line, message: String| Err(Error { line, message });
    if bytes.len() > MAX_FILE_BYTES {
        return err(1, format!("the file has {} bytes; at most {MAX_FILE_BYTES} are read", bytes.len()));
    }
    if bytes.starts_with(&[0xFE, 0xFF])
        || bytes.starts_with(&[0xFF, 0xFE])
        || bytes.starts_with(b"<\0")
        || bytes.starts_with(b"\0<")
    {
        return err(1, "UTF-16 is not supported: save the file as UTF-8 or ISO-8859-1".into());
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let encoding = declared_encoding(bytes).map(|e| e.to_ascii_uppercase());
    match encoding.as_deref() {
        None | Some("UTF-8" | "UTF8") => match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => {
                let line = line_at(bytes, e.valid_up_to());
                let hint = if encoding.is_none() {
                    " (no encoding declared: UTF-8; WebSphere declares encoding=\"ISO-8859-1\")"
                } else {
                    ""
                };
                err(line, format!("not UTF-8{hint}"))
            }
        },
        Some("ISO-8859-1" | "ISO8859-1" | "ISO_8859-1" | "LATIN1" | "LATIN-1") => {
            Ok(bytes.iter().map(|&b| char::from(b)).collect())
        }
        Some("US-ASCII" | "ASCII") => match bytes.iter().position(|b| !b.is_ascii()) {
            None => Ok(bytes.iter().map(|&b| char::from(b)).collect()),
            Some(at) => err(line_at(bytes, at), "a byte above 127 in a file declared US-ASCII".into()),
        },
        Some(other) => err(1, format!("encoding {other:?} is not supported (UTF-8 and ISO-8859-1 are)")),
    }
}

/// `encoding="..."` of a leading `<?xml ...?>`.
fn declared_encoding(bytes: &[u8]) -> Option<String> {
    let decl = bytes.strip_prefix(b"<?xml")?;
    let end = decl.windows(2).position(|w| w == b"?>")?;
    let decl = std::str::from_utf8(&decl[..end]).ok()?;
    let at = decl.find("encoding")?;
    let rest = decl[at + 8..].trim_start().strip_prefix('=')?.trim_start();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let rest = &rest[1..];
    Some(rest[..rest.find(quote)?].to_string())
}

fn line_at(bytes: &[u8], offset: usize) -> u32 {
    1 + bytes[..offset.min(bytes.len())].iter().filter(|&&b| b == b'\n').count() as u32
}

/// Read a plugin-cfg.xml from its bytes.
pub fn parse(bytes: &[u8]) -> Result<PluginConfig, Error> {
    let text = decode(bytes)?;
    parse_str(&text)
}

pub fn parse_str(text: &str) -> Result<PluginConfig, Error> {
    // Lines by binary search over the newlines' offsets, found once: a line per element
    // must not cost a scan of the file (that is quadratic in the file's size).
    let newlines: Vec<usize> = (text.bytes().enumerate()).filter(|(_, b)| *b == b'\n').map(|(i, _)| i).collect();
    let line_of = |offset: usize| 1 + newlines.partition_point(|&nl| nl < offset) as u32;
    let opts = roxmltree::ParsingOptions { allow_dtd: false, nodes_limit: MAX_NODES, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(text, opts).map_err(|e| match e {
        roxmltree::Error::DtdDetected => Error {
            line: text.find("<!DOCTYPE").map_or(1, line_of),
            message: "a DTD (<!DOCTYPE>) is refused: plugin-cfg.xml has none, and entities are never expanded".into(),
        },
        roxmltree::Error::NodesLimitReached => Error { line: 1, message: format!("more than {MAX_NODES} XML nodes") },
        e => Error { line: e.pos().row, message: format!("not well-formed XML: {e}") },
    })?;
    // Depth by node id (pre-order: a parent before its children), no recursion.
    let mut depths: Vec<u8> = Vec::new();
    for n in doc.root().descendants() {
        let depth = n.parent().map_or(0, |p| depths.get(p.id().get_usize()).copied().unwrap_or(0) + 1);
        if depths.len() <= n.id().get_usize() {
            depths.resize(n.id().get_usize() + 1, 0);
        }
        depths[n.id().get_usize()] = depth;
        if !n.is_element() {
            continue;
        }
        if usize::from(depth) > MAX_DEPTH {
            return Err(Error {
                line: line_of(n.range().start),
                message: format!("elements nested deeper than {MAX_DEPTH}"),
            });
        }
        if n.attributes().len() > MAX_ATTRIBUTES {
            return Err(Error {
                line: line_of(n.range().start),
                message: format!("<{}> has more than {MAX_ATTRIBUTES} attributes", n.tag_name().name()),
            });
        }
    }
    Reader { line_of: &line_of, warnings: Vec::new(), more_warnings: 0, servers: 0 }.config(doc.root_element())
}

struct Reader<'f> {
    line_of: &'f dyn Fn(usize) -> u32,
    warnings: Vec<Warning>,
    /// Warnings beyond `MAX_WARNINGS`, counted only.
    more_warnings: usize,
    /// Servers read so far, over every cluster.
    servers: usize,
}

type Node<'a, 'i> = roxmltree::Node<'a, 'i>;

impl Reader<'_> {
    fn line(&self, n: Node) -> u32 {
        (self.line_of)(n.range().start)
    }

    fn error<T>(&self, n: Node, message: impl Into<String>) -> Result<T, Error> {
        Err(Error { line: self.line(n), message: message.into() })
    }

    fn warn(&mut self, n: Node, message: String) {
        let line = self.line(n);
        self.push_warning(Warning { line, message });
    }

    fn push_warning(&mut self, w: Warning) {
        match self.warnings.len() < MAX_WARNINGS {
            true => self.warnings.push(w),
            false => self.more_warnings += 1,
        }
    }

    /// Warn about the element's attributes that are neither `known` nor ignored.
    fn attributes(&mut self, n: Node, known: &[&str]) {
        let elem = n.tag_name().name();
        for a in n.attributes() {
            let name = a.name();
            if known.contains(&name) || IGNORED_ATTRIBUTES.contains(&(elem, name)) {
                continue;
            }
            let message = match DEFAULTED_ATTRIBUTES.iter().find(|(e, at, _)| *e == elem && *at == name) {
                Some((_, _, default)) if a.value().eq_ignore_ascii_case(default) => continue,
                Some(_) => format!("<{elem}> {name}=\"{}\" changes routing and is not implemented: ignored", a.value()),
                None => format!("<{elem}> attribute {name} is unknown: ignored"),
            };
            let line = (self.line_of)(a.range().start);
            self.push_warning(Warning { line, message });
        }
    }

    /// The element children, with unknown ones warned about and ignored ones skipped.
    fn children<'a, 'i>(&mut self, n: Node<'a, 'i>, known: &[&str]) -> Vec<Node<'a, 'i>> {
        let mut out = Vec::new();
        for c in n.children().filter(|c| c.is_element()) {
            let name = c.tag_name().name();
            if known.contains(&name) {
                out.push(c);
            } else if !IGNORED_ELEMENTS.contains(&name) {
                self.warn(c, format!("<{name}> in <{}> is unknown: ignored with its content", n.tag_name().name()));
            }
        }
        out
    }

    fn required<'a>(&self, n: Node<'a, '_>, attr: &str) -> Result<&'a str, Error> {
        match n.attribute(attr) {
            Some(v) if !v.trim().is_empty() => Ok(v),
            _ => self.error(n, format!("<{}> needs {attr}", n.tag_name().name())),
        }
    }

    fn number<T: std::str::FromStr>(&self, n: Node, attr: &str) -> Result<Option<T>, Error> {
        match n.attribute(attr) {
            None => Ok(None),
            Some(v) => match v.trim().parse() {
                Ok(x) => Ok(Some(x)),
                Err(_) => self.error(n, format!("<{}> {attr}=\"{v}\" is not a number in range", n.tag_name().name())),
            },
        }
    }

    fn config(mut self, root: Node) -> Result<PluginConfig, Error> {
        if root.tag_name().name() != "Config" {
            return self.error(root, format!("the root element is <{}>, not <Config>", root.tag_name().name()));
        }
        self.attributes(root, &["RefreshInterval"]);
        let refresh_interval = self.number::<u64>(root, "RefreshInterval")?.unwrap_or(60);
        let mut cfg = PluginConfig {
            refresh_interval,
            virtual_host_groups: Vec::new(),
            server_clusters: Vec::new(),
            uri_groups: Vec::new(),
            routes: Vec::new(),
            warnings: Vec::new(),
        };
        let mut count: HashMap<&str, usize> = HashMap::new();
        for c in self.children(root, &["VirtualHostGroup", "ServerCluster", "UriGroup", "Route"]) {
            let n = count.entry(c.tag_name().name()).or_default();
            *n += 1;
            if *n > MAX_OF_A_KIND {
                return self.error(c, format!("more than {MAX_OF_A_KIND} <{}> elements", c.tag_name().name()));
            }
            match c.tag_name().name() {
                "VirtualHostGroup" => cfg.virtual_host_groups.push(self.virtual_host_group(c)?),
                "ServerCluster" => cfg.server_clusters.push(self.server_cluster(c)?),
                "UriGroup" => cfg.uri_groups.push(self.uri_group(c)?),
                _ => {
                    self.attributes(c, &["ServerCluster", "UriGroup", "VirtualHostGroup", "Name"]);
                    self.children(c, &[]);
                    cfg.routes.push(Route {
                        server_cluster: self.required(c, "ServerCluster")?.to_string(),
                        uri_group: self.required(c, "UriGroup")?.to_string(),
                        virtual_host_group: self.required(c, "VirtualHostGroup")?.to_string(),
                        line: self.line(c),
                    });
                }
            }
        }
        check_references(&cfg)?;
        if self.more_warnings > 0 {
            let line = self.warnings.last().map_or(1, |w| w.line);
            self.warnings.push(Warning { line, message: format!("and {} more warnings", self.more_warnings) });
        }
        cfg.warnings = self.warnings;
        cfg.warnings.extend(empty_routes(&cfg));
        cfg.warnings.sort_by_key(|w| w.line);
        Ok(cfg)
    }

    fn virtual_host_group(&mut self, n: Node) -> Result<VirtualHostGroup, Error> {
        self.attributes(n, &["Name"]);
        let mut hosts = Vec::new();
        for h in self.children(n, &["VirtualHost"]) {
            self.attributes(h, &["Name"]);
            self.children(h, &[]);
            let name = self.required(h, "Name")?;
            if let Err(reason) = HostPattern::parse(name) {
                return self.error(h, format!("VirtualHost Name=\"{name}\": {reason}"));
            }
            hosts.push(name.to_string());
        }
        Ok(VirtualHostGroup { name: self.required(n, "Name")?.to_string(), hosts, line: self.line(n) })
    }

    fn server_cluster(&mut self, n: Node) -> Result<ServerCluster, Error> {
        self.attributes(n, &["Name", "LoadBalance", "RetryInterval"]);
        let load_balance = match n.attribute("LoadBalance").map(str::trim) {
            None => LoadBalance::RoundRobin,
            Some(v) if v.eq_ignore_ascii_case("Round Robin") => LoadBalance::RoundRobin,
            Some(v) if v.eq_ignore_ascii_case("Random") => LoadBalance::Random,
            Some(v) => return self.error(n, format!("LoadBalance=\"{v}\": \"Round Robin\" or \"Random\"")),
        };
        let mut cluster = ServerCluster {
            name: self.required(n, "Name")?.to_string(),
            load_balance,
            retry_interval: self.number(n, "RetryInterval")?.unwrap_or(60),
            servers: Vec::new(),
            primary: None,
            backup: Vec::new(),
            line: self.line(n),
        };
        // The cluster's server names, for its PrimaryServers and BackupServers lists.
        let here: std::collections::HashSet<&str> =
            n.children().filter(|x| x.has_tag_name("Server")).filter_map(|x| x.attribute("Name")).collect();
        for c in self.children(n, &["Server", "PrimaryServers", "BackupServers"]) {
            match c.tag_name().name() {
                "Server" => {
                    self.servers += 1;
                    if self.servers > MAX_SERVERS {
                        return self.error(c, format!("more than {MAX_SERVERS} servers in the file"));
                    }
                    cluster.servers.push(self.server(c)?)
                }
                list => {
                    self.attributes(c, &[]);
                    let mut names = Vec::new();
                    for s in self.children(c, &["Server"]) {
                        self.attributes(s, &["Name"]);
                        self.children(s, &[]);
                        let name = self.required(s, "Name")?;
                        if !here.contains(name) {
                            return self.error(
                                s,
                                format!("<{list}> names server {name:?}, which is not in cluster {:?}", cluster.name),
                            );
                        }
                        names.push(name.to_string());
                    }
                    if list == "PrimaryServers" {
                        cluster.primary.get_or_insert_with(Vec::new).extend(names);
                    } else {
                        cluster.backup.extend(names);
                    }
                }
            }
        }
        if cluster.servers.is_empty() {
            return self.error(n, format!("ServerCluster {:?} has no Server", cluster.name));
        }
        let mut seen = HashMap::new();
        for s in &cluster.servers {
            if let Some(first) = seen.insert(s.name.as_str(), s.line) {
                return Err(Error {
                    line: s.line,
                    message: format!("server {:?} already defined at line {first}", s.name),
                });
            }
        }
        Ok(cluster)
    }

    fn server(&mut self, n: Node) -> Result<Server, Error> {
        self.attributes(
            n,
            &["Name", "CloneID", "LoadBalanceWeight", "ConnectTimeout", "ServerIOTimeout", "MaxConnections"],
        );
        let mut transports = Vec::new();
        for t in self.children(n, &["Transport"]) {
            self.attributes(t, &["Hostname", "Port", "Protocol"]);
            self.children(t, &[]);
            let protocol = match self.required(t, "Protocol")? {
                p if p.eq_ignore_ascii_case("http") => Protocol::Http,
                p if p.eq_ignore_ascii_case("https") => Protocol::Https,
                p => return self.error(t, format!("Transport Protocol=\"{p}\": http or https")),
            };
            let Some(port) = self.number::<u16>(t, "Port")?.filter(|p| *p > 0) else {
                return self.error(t, "Transport needs a Port from 1 to 65535");
            };
            transports.push(Transport { hostname: self.required(t, "Hostname")?.to_string(), port, protocol });
        }
        if transports.is_empty() {
            return self.error(n, format!("Server {:?} has no Transport", n.attribute("Name").unwrap_or("")));
        }
        let max_connections = self.number::<i64>(n, "MaxConnections")?;
        Ok(Server {
            name: self.required(n, "Name")?.to_string(),
            clone_id: n.attribute("CloneID").map(str::trim).filter(|c| !c.is_empty()).map(str::to_string),
            weight: self.number(n, "LoadBalanceWeight")?,
            connect_timeout: self.number::<u64>(n, "ConnectTimeout")?.filter(|t| *t > 0),
            server_io_timeout: self.number::<i64>(n, "ServerIOTimeout")?.map(i64::unsigned_abs).filter(|t| *t > 0),
            max_connections: match max_connections {
                Some(m) if m > 0 => Some(u32::try_from(m).unwrap_or(u32::MAX)),
                _ => None,
            },
            transports,
            line: self.line(n),
        })
    }

    fn uri_group(&mut self, n: Node) -> Result<UriGroup, Error> {
        self.attributes(n, &["Name"]);
        let mut uris = Vec::new();
        for u in self.children(n, &["Uri"]) {
            self.attributes(u, &["Name", "AffinityCookie", "AffinityURLIdentifier"]);
            self.children(u, &[]);
            let name = self.required(u, "Name")?;
            if let Err(reason) = UriPattern::parse(name) {
                return self.error(u, format!("Uri Name=\"{name}\": {reason}"));
            }
            uris.push(Uri {
                name: name.to_string(),
                affinity_cookie: u.attribute("AffinityCookie").unwrap_or("JSESSIONID").to_string(),
                affinity_url_identifier: u.attribute("AffinityURLIdentifier").unwrap_or("jsessionid").to_string(),
                line: self.line(u),
            });
        }
        Ok(UriGroup { name: self.required(n, "Name")?.to_string(), uris, line: self.line(n) })
    }
}

/// Unique names per kind, and every Route's references defined.
fn check_references(cfg: &PluginConfig) -> Result<(), Error> {
    fn unique<'a>(kind: &str, items: impl Iterator<Item = (&'a str, u32)>) -> Result<HashMap<&'a str, u32>, Error> {
        let mut seen = HashMap::new();
        for (name, line) in items {
            if let Some(first) = seen.insert(name, line) {
                return Err(Error { line, message: format!("{kind} {name:?} already defined at line {first}") });
            }
        }
        Ok(seen)
    }
    let clusters = unique("ServerCluster", cfg.server_clusters.iter().map(|c| (c.name.as_str(), c.line)))?;
    let uris = unique("UriGroup", cfg.uri_groups.iter().map(|c| (c.name.as_str(), c.line)))?;
    let vhosts = unique("VirtualHostGroup", cfg.virtual_host_groups.iter().map(|c| (c.name.as_str(), c.line)))?;
    let mut pairs = 0usize;
    let hosts_of: HashMap<&str, usize> =
        cfg.virtual_host_groups.iter().map(|g| (g.name.as_str(), g.hosts.len())).collect();
    let uris_of: HashMap<&str, usize> = cfg.uri_groups.iter().map(|g| (g.name.as_str(), g.uris.len())).collect();
    for r in &cfg.routes {
        let n_hosts = hosts_of.get(r.virtual_host_group.as_str()).copied().unwrap_or(0);
        let n_uris = uris_of.get(r.uri_group.as_str()).copied().unwrap_or(0);
        pairs = pairs.saturating_add(n_hosts.saturating_mul(n_uris));
        if pairs > MAX_ROUTE_PAIRS {
            return Err(Error {
                line: r.line,
                message: format!(
                    "the Routes pair more than {MAX_ROUTE_PAIRS} virtual hosts with URIs (each VirtualHost of a Route's group with each Uri of its UriGroup)"
                ),
            });
        }
        for (kind, name, names) in [
            ("ServerCluster", &r.server_cluster, &clusters),
            ("UriGroup", &r.uri_group, &uris),
            ("VirtualHostGroup", &r.virtual_host_group, &vhosts),
        ] {
            if !names.contains_key(name.as_str()) {
                return Err(Error {
                    line: r.line,
                    message: format!("Route names {kind} {name:?}, which is not defined"),
                });
            }
        }
    }
    // A clone ID names one server: the session cookie, the learned table and the map
    // shared with XDP are keyed by it alone. (One server in two clusters is one server.)
    let mut clone_ids: HashMap<&str, &Server> = HashMap::new();
    for s in cfg.server_clusters.iter().flat_map(|c| &c.servers) {
        let Some(id) = s.clone_id.as_deref() else { continue };
        match clone_ids.insert(id, s) {
            Some(first) if first.name != s.name => {
                return Err(Error {
                    line: s.line,
                    message: format!(
                        "CloneID {id:?} of server {:?} is already server {:?}'s (line {})",
                        s.name, first.name, first.line
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Routes that can match nothing: their group has no VirtualHost or no Uri.
fn empty_routes(cfg: &PluginConfig) -> Vec<Warning> {
    let mut out = Vec::new();
    let hosts_of: HashMap<&str, bool> =
        cfg.virtual_host_groups.iter().map(|g| (g.name.as_str(), g.hosts.is_empty())).collect();
    let uris_of: HashMap<&str, bool> = cfg.uri_groups.iter().map(|g| (g.name.as_str(), g.uris.is_empty())).collect();
    for r in &cfg.routes {
        let hosts = hosts_of.get(r.virtual_host_group.as_str()) == Some(&true);
        let uris = uris_of.get(r.uri_group.as_str()) == Some(&true);
        for (empty, what, name) in
            [(hosts, "VirtualHostGroup", &r.virtual_host_group), (uris, "UriGroup", &r.uri_group)]
        {
            if empty {
                out.push(Warning {
                    line: r.line,
                    message: format!("Route: {what} {name:?} is empty, the route matches nothing"),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
