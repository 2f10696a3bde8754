//! The `/metrics` server as scrapers and careless clients use it: idle and
//! half-open connections do not hold up a scrape, and the HTTP side behaves
//! like an exporter (query strings, HEAD, 404, 405, bare newlines, limits).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kvmscope::metrics::{http, MetricsServer};
use kvmscope::sampler::{Sampler, SamplerConfig};
use kvmscope::vm::{Vm, VmConfig};

/// A scrape's bound: generous (CI machines are noisy), and far below the
/// 40 s the one-connection-at-a-time server took with 20 idle connections.
const SCRAPE_LIMIT: Duration = Duration::from_secs(15);

/// A VM (not started: the stats move anyway) with a sampler that has ticked,
/// and a metrics server on a loopback port.
struct Exporter {
    server: MetricsServer,
    _sampler: Sampler,
    _vm: Vm,
}

fn exporter() -> Exporter {
    let vm = Vm::new(VmConfig {
        memory: 32 << 20,
        ..VmConfig::default()
    })
    .unwrap();
    let config = SamplerConfig {
        interval: Duration::from_millis(5),
        ..SamplerConfig::default()
    };
    let vcpus = vm.vcpus().iter().map(|v| v.shared.clone()).collect();
    let sampler = Sampler::start(
        config,
        &vm.fd_file().unwrap(),
        vm.vcpu_fds(),
        vcpus,
        kvmscope::sampler::SampledVm {
            name: "test-vm".into(),
            memory: vm.config().memory,
        },
    )
    .unwrap();
    assert!(sampler.shared.wait_after(0, Duration::from_secs(5)));
    let server =
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&sampler.shared)).unwrap();
    Exporter {
        server,
        _sampler: sampler,
        _vm: vm,
    }
}

/// Sends `request` on a fresh connection and reads the reply to the end
/// (the server closes), bounded by `SCRAPE_LIMIT`.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(SCRAPE_LIMIT)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("no complete reply to {request:?}: {e}"));
    String::from_utf8(out).unwrap()
}

fn split(reply: &str) -> (&str, &str) {
    reply
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {reply:?}"))
}

/// `n` connections that never finish a request: half send nothing, half half a head.
fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            if i % 2 == 1 {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
            }
            s
        })
        .collect()
}

#[test]
fn a_scrape_with_twenty_idle_connections_open_completes_and_validates() {
    require_kvm!();
    let e = exporter();
    let _idle = idle_connections(e.server.addr, 20);
    let reply = exchange(e.server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (head, body) = split(&reply);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(body.contains("kvmscope_mapped_bytes{"), "{body}");
    common::check_with_promtool(body);
}

#[test]
fn more_idle_connections_than_the_server_holds_do_not_keep_a_scrape_out() {
    require_kvm!();
    let e = exporter();
    let _idle = idle_connections(e.server.addr, http::MAX_CONNECTIONS * 2);
    let reply = exchange(e.server.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
}

#[test]
fn query_strings_and_bare_newlines_get_the_page() {
    require_kvm!();
    let e = exporter();
    for request in [
        &b"GET /metrics?x=1&module=kvm HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\n\n",
        b"GET /metrics HTTP/1.1\nHost: x\n\n",
    ] {
        let reply = exchange(e.server.addr, request);
        let (head, body) = split(&reply);
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{request:?}: {head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(body.contains("kvmscope_info{"), "{request:?}");
    }
}

#[test]
fn head_gets_the_headers_of_the_page_and_no_body() {
    require_kvm!();
    let e = exporter();
    let reply = exchange(e.server.addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (head, body) = split(&reply);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .parse()
        .unwrap();
    assert!(length > 0, "the length of the page GET would get");
    assert_eq!(body, "", "HEAD has no body");
}

#[test]
fn other_paths_get_404_naming_metrics_and_other_methods_405_with_allow() {
    require_kvm!();
    let e = exporter();
    let reply = exchange(e.server.addr, b"GET / HTTP/1.1\r\n\r\n");
    let (head, body) = split(&reply);
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(body.contains("/metrics"), "{body}");
    let reply = exchange(
        e.server.addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    let (head, _) = split(&reply);
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    assert!(head.contains("\r\nAllow: GET, HEAD"), "{head}");
}

#[test]
fn a_head_that_never_ends_is_answered_408_and_closed() {
    require_kvm!();
    let e = exporter();
    let reply = exchange(e.server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
}

#[test]
fn a_head_over_the_limit_is_answered_431() {
    require_kvm!();
    let e = exporter();
    let mut request = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while request.len() <= http::MAX_HEAD {
        request.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let reply = exchange(e.server.addr, &request);
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
}
