//! Unit tests of the request head parser and the replies.

use super::*;

#[test]
fn head_ends_at_a_blank_line_with_crlf_or_bare_lf() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Some(27));
    assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\n"), Some(24));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\nrest"), Some(17));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    assert_eq!(head_end(b""), None);
}

#[test]
fn head_end_skips_blank_lines_before_the_request_line() {
    assert_eq!(head_end(b"\r\n\nGET / HTTP/1.1\n\n"), Some(19));
    assert_eq!(head_end(b"\r\n\r\n"), None);
}

#[test]
fn get_and_head_of_the_path_get_the_page() {
    let get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(answer(get, "/metrics"), Answer::Page { body: true });
    let head = b"HEAD /metrics HTTP/1.0\n\n";
    assert_eq!(answer(head, "/metrics"), Answer::Page { body: false });
}

#[test]
fn query_strings_and_absolute_targets_reach_the_page() {
    for target in [
        "/metrics?x=1",
        "/metrics?",
        "/metrics#frag",
        "http://127.0.0.1:9100/metrics?module=kvm",
    ] {
        let head = format!("GET {target} HTTP/1.1\r\n\r\n");
        assert_eq!(
            answer(head.as_bytes(), "/metrics"),
            Answer::Page { body: true },
            "{target}"
        );
    }
}

#[test]
fn other_paths_are_not_found_whatever_the_method() {
    for line in [
        "GET / HTTP/1.1",
        "GET /metricsx HTTP/1.1",
        "POST /x HTTP/1.1",
    ] {
        let head = format!("{line}\r\n\r\n");
        assert_eq!(
            answer(head.as_bytes(), "/metrics"),
            Answer::NotFound,
            "{line}"
        );
    }
    assert_eq!(
        answer(b"GET http://h HTTP/1.1\n\n", "/metrics"),
        Answer::NotFound
    );
}

#[test]
fn other_methods_on_the_path_are_not_allowed() {
    for method in ["POST", "PUT", "DELETE", "OPTIONS", "get"] {
        let head = format!("{method} /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(
            answer(head.as_bytes(), "/metrics"),
            Answer::MethodNotAllowed,
            "{method}"
        );
    }
}

#[test]
fn malformed_request_lines_are_bad_requests() {
    for head in [
        &b"GET /metrics\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        b"GET /metrics FTP/1.0\r\n\r\n",
        b"\xff\xfe /metrics HTTP/1.1\r\n\r\n",
        b"",
    ] {
        assert_eq!(answer(head, "/metrics"), Answer::BadRequest, "{head:?}");
    }
    assert_eq!(
        answer(b"GET /metrics HTTP/2.0\r\n\r\n", "/metrics"),
        Answer::VersionNotSupported
    );
}

fn page() -> Page {
    Page {
        path: "/metrics",
        content_type: "text/plain; version=0.0.4; charset=utf-8",
        render: Box::new(|| Arc::new("a 1\n".to_string())),
    }
}

fn text(r: &Reply) -> String {
    let body = r.body.as_deref().map_or("", String::as_str);
    format!("{}{body}", String::from_utf8_lossy(&r.head))
}

#[test]
fn head_replies_carry_the_length_of_the_page_but_no_body() {
    let r = reply(Answer::Page { body: false }, &mut page());
    let t = text(&r);
    assert!(t.starts_with("HTTP/1.1 200 OK\r\n"), "{t}");
    assert!(t.contains("Content-Length: 4\r\n"), "{t}");
    assert!(
        t.contains("text/plain; version=0.0.4; charset=utf-8"),
        "{t}"
    );
    assert!(t.ends_with("\r\n\r\n"), "{t}");
}

#[test]
fn not_found_names_the_path_and_method_not_allowed_says_allow() {
    let t = text(&reply(Answer::NotFound, &mut page()));
    assert!(
        t.starts_with("HTTP/1.1 404") && t.contains("/metrics"),
        "{t}"
    );
    let t = text(&reply(Answer::MethodNotAllowed, &mut page()));
    assert!(
        t.starts_with("HTTP/1.1 405") && t.contains("Allow: GET, HEAD\r\n"),
        "{t}"
    );
}

#[test]
fn a_server_that_served_to_the_end_shuts_down_clean_and_a_panicked_one_says_so() {
    use std::io::{Read, Write};
    let any = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(any, "metrics-test", page()).unwrap();
    assert!(server.shutdown().is_ok());

    let panicking = Page {
        path: "/metrics",
        content_type: "text/plain",
        render: Box::new(|| panic!("render failed")),
    };
    let server = Server::start(any, "metrics-test", panicking).unwrap();
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // The thread panics while rendering: the connection closes unanswered.
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    assert!(reply.is_empty());
    assert!(matches!(server.shutdown(), Err(Error::Panicked)));
}
