//! The HTTP/1.1 logic that `http_server.rs` (on `vt::net`) and `http_server_tokio.rs` (its
//! tokio twin, for `benches/wrk.sh`) share, so that the two differ only in their runtime:
//! parse with httparse, answer every complete request already read (pipelining), and say
//! whether the connection stays open.

use std::io::{self, Write};

/// The most headers a request may have, and the largest request head, in bytes.
const MAX_HEADERS: usize = 32;
const MAX_HEAD: usize = 16 * 1024;

/// Appends to `out` the answers to the complete requests at the front of `buf` and removes
/// them from it; a partial request stays for the next read. Returns false once a request asked
/// to close the connection (its answer is the last one in `out`). A malformed request is an
/// `InvalidData` error.
pub fn answer(buf: &mut Vec<u8>, out: &mut Vec<u8>) -> io::Result<bool> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let head = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(true),
            Ok(httparse::Status::Partial) => return Err(bad("request head too large")),
            Err(e) => return Err(bad(&format!("bad request: {e}"))),
        };
        let body = content_length(req.headers)?;
        if buf.len() < head + body {
            return Ok(true); // the body is still on its way
        }
        let keep_alive = match req.version {
            Some(1) => !has_token(req.headers, "connection", "close"),
            _ => has_token(req.headers, "connection", "keep-alive"), // HTTP/1.0
        };
        respond(out, req.method == Some("GET") && req.path == Some("/"), keep_alive);
        buf.drain(..head + body);
        if !keep_alive {
            return Ok(false);
        }
    }
}

/// Appends the response: "Hello, world!" or a 404.
fn respond(out: &mut Vec<u8>, found: bool, keep_alive: bool) {
    let (status, body) = if found { ("200 OK", "Hello, world!\n") } else { ("404 Not Found", "not found\n") };
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
        body.len()
    );
}

/// The request body's length (`Content-Length`, 0 without one); chunked bodies are refused.
fn content_length(headers: &[httparse::Header]) -> io::Result<usize> {
    if headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding")) {
        return Err(bad("chunked request bodies are not supported"));
    }
    match headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length")) {
        None => Ok(0),
        Some(h) => std::str::from_utf8(h.value)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("bad Content-Length")),
    }
}

/// Whether header `name` lists `token` (case-insensitive), as `Connection: close` does.
fn has_token(headers: &[httparse::Header], name: &str, token: &str) -> bool {
    headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).any(|h| {
        std::str::from_utf8(h.value).is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}
