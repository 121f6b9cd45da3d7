//! dispatcher: an XDP-assisted L4 + L7 dispatcher for clusters of Java application
//! servers with peer replicas.
//!
//! Where a packet goes: `dispatcher-ebpf` (the XDP program), fed by `dataplane`, which
//! writes the shared maps from `config`, with Maglev tables from `maglev`.
//! Where a request goes: `http` (listener -> proxy -> route -> pool), reading the
//! cluster's state (backends, clone table) from `state`; the HTTP/1.1 it speaks is
//! `http1` (heads, bodies, forwarded heads, our own answers, connection halves), which
//! the health checks, TLS and the admin endpoint use too. What decides that state:
//! `control` (health checks from `health`, failed requests, operator commands).
//! HTTPS: `tls` (termination on HTTP VIPs, TLS to backends), under `http1`'s `io` halves.
//! Running under systemd: `notify` (readiness, watchdog) and `logging` (journal format).
//! What happened to each request: `access_log` (written off the request path); the
//! last requests refused as malformed: `refusals`.
//! SIP logical names learned from the dialogs the XDP program saw: `sip_learn`.
//! A dead dispatcher's idle connections continued elsewhere: `takeover` (TCP_REPAIR).

pub(crate) mod access_log;
pub mod admin;
pub mod agent;
pub mod announce;
pub mod api;
pub(crate) mod capacity;
pub mod config;
pub(crate) mod control;
pub mod dataplane;
pub(crate) mod health;
pub(crate) mod http;
pub(crate) mod http1;
pub mod instance;
pub mod logging;
pub(crate) mod mac;
pub(crate) mod maglev;
pub(crate) mod metrics;
pub mod netif;
pub(crate) mod notify;
pub mod peers;
pub(crate) mod ratelimit;
pub(crate) mod refusals;
pub mod routes;
pub mod shared;
pub mod sip;
pub(crate) mod sip_learn;
pub mod state;
pub mod steering;
pub mod takeover;
pub mod tls;
